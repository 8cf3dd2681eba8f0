"""What failed, fenced or superseded attempts leave behind, and its removal.

Ray's raw export is removed as soon as it is collected, before the completion is published (and
when an attempt fails). An attempt killed between collecting and that removal leaves its raw
export behind (and one killed later, or fenced, its unused `processed.jsonl`); once the shard's
completion is published, when no other attempt's output can matter any more, the worker that
published it removes every such leftover of the shard's other attempts. A raw export whose
removal failed (a runner may still be writing it) is removed again once the runner is closed.
"""

from __future__ import annotations

import logging
from pathlib import Path

from elastic_sharding import confined
from elastic_sharding.errors import JobStateError
from elastic_sharding.layout import JobLayout, attempt_files, attempt_ids
from elastic_sharding.records import CompletionRecord, load
from elastic_sharding.work.collect import remove_raw_output, remove_unused_output

log = logging.getLogger(__name__)


class AttemptLeftovers:
    """The removal of attempts' leftovers, as a part of `Worker`."""

    layout: JobLayout
    _raw_leftovers: set[Path]

    def _remove_raw(self, ray_output: Path, again_at_exit: bool = False) -> None:
        """Remove one of this worker's raw exports (it has been collected, or will never be)."""
        if not remove_raw_output(ray_output) or again_at_exit:
            self._raw_leftovers.add(ray_output)

    def _sweep_leftovers(self, shard_id: str, published: str | None = None) -> None:
        """Remove the raw exports the attempts of a completed shard left behind, and the collected
        output of every attempt but the one its completion record names (`published`; read from
        the record when not given: unreadable, only raw exports are removed).

        Only once the completion is published: before, an attempt not yet superseded (or one newer
        than the sweeper's) may still be collecting, and a part removed before it lists them
        would be silently missing from an output it may still publish."""
        if published is None:
            try:
                published = load(CompletionRecord, self.layout.done(shard_id)).attempt_id
            except (JobStateError, OSError) as exc:
                log.warning("%s: %s; only raw outputs are removed from its attempts", shard_id, exc)
        try:
            root = self.layout.attempts_dir(shard_id)
            names = attempt_ids(root)
        except OSError as exc:
            log.warning("cannot look for what the attempts of %s left behind: %s", shard_id, exc)
            return
        for name in names:
            files = attempt_files(root / name)
            if confined.lexists(files["ray_output"]):
                log.info("removing the raw output %s, left behind by an attempt", files["ray_output"])
                self._remove_raw(files["ray_output"])
            if published is not None and name != published:
                remove_unused_output(root / name)

    def _remove_raw_leftovers(self) -> None:
        leftovers, self._raw_leftovers = self._raw_leftovers, set()
        for raw in sorted(leftovers):
            if not remove_raw_output(raw):
                log.warning("the raw output %s is left behind; nothing reads it, it can be removed", raw)
