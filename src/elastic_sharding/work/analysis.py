"""A worker's part in the analysis of a `--analyze` job, after the recipe's only segment.

The analysis reads every shard's published output (each row's statistics and meta fields, as
`attempt.py` collected them), checked against its completion record's sha256 as it is read
(`stages.SegmentOutput`), so no unit summarizes rows that are not the published ones. While the
last shards are processed, an idle worker summarizes the finished ones (`help`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator

import orjson

from elastic_sharding.analysis.cooperate import AnalysisParticipant
from elastic_sharding.layout import AnalysisLayout, JobLayout
from elastic_sharding.records import Manifest, SegmentSpec
from elastic_sharding.settings import Settings
from elastic_sharding.work.stages import SegmentOutput

log = logging.getLogger(__name__)


def analysis_notes(manifest: Manifest) -> list[str]:
    """What the analysis page says about where its numbers come from."""
    spec = manifest.analysis
    notes = [f"{manifest.total_rows:,} rows of {manifest.dataset_root} in {len(manifest.shards)} shard(s)"]
    if spec is not None:
        notes.append("analysed: " + ", ".join(spec.operators))
        if spec.skipped:
            notes.append("skipped, as dj-analyze skips them: " + ", ".join(spec.skipped))
    return notes


class AnalysisWork:
    """The analysis of a job, as one process takes part in it."""

    def __init__(self, layout: JobLayout, manifest: Manifest, segment: SegmentSpec, settings: Settings, stop: Callable[[], bool]):
        if manifest.analysis is None:
            raise ValueError("not a --analyze job")
        self.output = SegmentOutput(layout, segment, manifest)
        self.participant = AnalysisParticipant(
            AnalysisLayout(layout.analysis_stage),
            manifest.analysis,
            len(manifest.shards),
            self._rows,
            settings.lock_timeout_secs,
            settings.heartbeat_interval_secs,
            min(settings.poll_interval_secs, 0.5),
            stop,
            notes=lambda: analysis_notes(manifest),
        )

    def help(self) -> bool:
        """Summarize one finished shard, if one is waiting; False if none is."""
        return self.participant.help(self.output.is_ready)

    def run(self) -> None:
        started = time.monotonic()
        done = self.participant.run()
        log.info(
            "analysis done here in %.1fs: %d statistic(s) of %d rows",
            time.monotonic() - started,
            len(done["columns"]),
            done["rows"],
        )

    def _rows(self, shard_index: int) -> Iterator[dict]:
        return (orjson.loads(line) for line in self.output.lines(shard_index))
