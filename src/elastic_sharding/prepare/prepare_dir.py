"""A prepare under way, as a directory beside the job (`.<job>.preparing/`): what can be read
from it, and the end of its life.

Its own module because the directory is shared by every participant (`cooperate`) and outlives
each one's share of the work: any of them reads the plan and the units' results from it, and
whichever finds the job published sweeps it away.

The end of its life: once `manifest.json` exists in the job directory, nothing in
`.<job>.preparing/` has a use, and every participant on its way out sweeps it away (and whatever
an earlier removal left). Participants still at work meanwhile (a fenced straggler, a poller on a
node whose name cache still shows the old directory) may find their records gone, or write into
the directory being removed; since each one sweeps only after its own writers have stopped, the
last one out leaves nothing.
"""

from __future__ import annotations

import logging
import os
import shutil
import time
from pathlib import Path

from elastic_sharding import confined, fsops
from elastic_sharding.claims.protocol import new_token
from elastic_sharding.layout import PrepareLayout, preparing_dir
from elastic_sharding.records import PreparePlan, ScanResult, decode, load

log = logging.getLogger(__name__)

# How long another node's publish or removal may take to show here (a NAS client's name cache:
# GlusterFS's default entry timeout is 1 s) before a participant believes what it sees.
SETTLE_SECS = fsops.STALE_HANDLE_SECS
REMOVED = ".removed-"


class PrepareDir(PrepareLayout):
    """A prepare under way (`layout.PrepareLayout`) and what can be read from it."""

    @classmethod
    def of(cls, job_root: Path) -> PrepareDir:
        return cls(preparing_dir(job_root), job_root)

    def published(self) -> bool:
        """The job is published: its manifest is in the job directory. Nothing else is asked of
        the prepare directory, which another node may still show for a moment after it is gone."""
        return confined.kind(self.job_root / "manifest.json") == "file"

    def read_plan(self) -> PreparePlan | None:
        return fsops.read_record(self.plan, lambda data: decode(PreparePlan, data, self.plan))

    def scan_result(self, index: int) -> ScanResult:
        """The result record of scan unit `index`."""
        return load(ScanResult, self.result(f"scan-{index:05d}"))

    def remove(self) -> None:
        """Rename away first, so that nobody joins a directory half removed."""
        moved = self.root.with_name(f"{self.root.name}{REMOVED}{new_token()[:8]}")
        if fsops.rename_away(self.root, moved):
            _remove_tree(moved)

    def sweep(self) -> None:
        """Once the job is published: remove this prepare's directory and whatever an earlier
        removal left (a straggler's heartbeat or temporary file written into it meanwhile), and
        look again until nothing is left: a straggler on another node may still write into a
        directory being removed, and this node may list the parent a moment late. Gives up after
        `SETTLE_SECS`, with a warning naming what is left (the next prepare of the job sweeps
        it)."""
        if not self.published():
            return
        self.remove()
        deadline = time.monotonic() + SETTLE_SECS
        while True:
            left = self._leftovers()
            if not left:
                return
            if time.monotonic() >= deadline:
                log.warning("prepare: could not remove %s beside the job: %s", ", ".join(left), _describe(self.root.parent, left))
                return
            for name in left:
                if name == self.root.name:
                    self.remove()
                else:
                    _remove_tree(self.root.parent / name)
            time.sleep(0.05)

    def _leftovers(self) -> list[str]:
        """This prepare's directory and earlier removals' leftovers, as this node lists them now."""
        try:
            names = confined.list_dir(self.root.parent)
        except FileNotFoundError:
            return []
        removed = f"{self.root.name}{REMOVED}"
        return sorted(n for n, kind in names.items() if n == self.root.name or (n.startswith(removed) and kind == "dir"))


def _describe(parent: Path, names: list[str]) -> str:
    """The files under `names` (at most a few), for the warning of a sweep that gave up."""
    found: list[str] = []
    for name in names:
        for root, _dirs, files in os.walk(parent / name):
            found += [os.path.relpath(os.path.join(root, f), parent) for f in files]
    if not found:
        return "empty directories"
    more = f" and {len(found) - 8} more" if len(found) > 8 else ""
    return ", ".join(found[:8]) + more


def _remove_tree(path: Path) -> None:
    """rmtree that outlasts a writer racing it: a file created in a directory while it is being
    removed makes its rmdir fail, so go again until the tree is gone (or `SETTLE_SECS` passed)."""
    deadline = time.monotonic() + SETTLE_SECS
    while True:
        shutil.rmtree(path, ignore_errors=True)
        if not confined.lexists(path) or time.monotonic() >= deadline:
            return
        time.sleep(0.05)


__all__ = ["REMOVED", "SETTLE_SECS", "PrepareDir"]
