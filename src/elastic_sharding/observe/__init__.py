"""Watching a job without writing to it: one read of its records (`snapshot`), the metrics derived
from it (`metrics`), and its views: `status` (text and JSON), `watch`, `prometheus`, and the HTML
timeline of `report` (`html_report`)."""
