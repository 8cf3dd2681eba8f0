"""Opening a report in a real headless browser (Debian's chromium), keeping what it showed."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from support.jobs import REPO

ARTIFACTS = REPO / "test-artifacts"
CHROMIUM = shutil.which("chromium")
needs_chromium = pytest.mark.skipif(
    CHROMIUM is None,
    reason="needs Debian's chromium: scripts/system-packages installs it (as root with apt-get) and could not here",
)


def chromium(page: Path, profile: Path, *args: str) -> subprocess.CompletedProcess:
    command = [
        str(CHROMIUM),
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--hide-scrollbars",
        "--no-first-run",
        f"--user-data-dir={profile}",
        "--virtual-time-budget=5000",
        *args,
        page.resolve().as_uri(),
    ]
    return subprocess.run(command, capture_output=True, text=True, timeout=60)


def open_report(page: Path, profile: Path, name: str) -> str:
    """Load `page`, check its script ran without an error, keep the page and a screenshot as
    test-artifacts/<name>.{html,png}; returns the DOM as the browser built it."""
    dom = chromium(page, profile, "--dump-dom")
    assert dom.returncode == 0, dom.stderr[-2000:]
    html_tag = re.search(r"<html[^>]*>", dom.stdout).group(0)  # type: ignore[union-attr]
    assert 'data-rendered="ok"' in html_tag and "data-errors" not in dom.stdout, html_tag
    ARTIFACTS.mkdir(exist_ok=True)
    shutil.copyfile(page, ARTIFACTS / f"{name}.html")
    screenshot = ARTIFACTS / f"{name}.png"
    screenshot.unlink(missing_ok=True)
    shot = chromium(page, profile, f"--screenshot={screenshot}", "--window-size=1400,1000")
    assert shot.returncode == 0, shot.stderr[-2000:]
    assert screenshot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and screenshot.stat().st_size > 10_000
    return dom.stdout
