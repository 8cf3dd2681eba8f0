"""Named crash points, for fault-injection tests only (in the spirit of SQLite's crash tests).

A real `kill -9` lands wherever the process happens to be; to prove that a crash at *each* step
of the protocol loses nothing, the fault matrix also needs to stop a process exactly between two
steps. `ELASTIC_SHARD_CRASH_AT=<point>[@<n>][:stop]` makes this process SIGKILL itself the n-th time
(default: the first) it reaches `point` (with `:stop`, SIGSTOP itself there instead: frozen
exactly where it holds something, until the test sends SIGCONT). Without that variable, which nobody sets in production,
`reached()` is one comparison.

Points: `claimed` (a claim was published, nothing else yet), `staged` (attempt directory, record
and heartbeat exist), `processing` (the engine is mid-shard; the test runner reaches it),
`collecting` (part of processed.jsonl is written), `publishing` (output complete, completion not
yet published), `published` (completion published, claim not yet marked done), `merging` (part of
the merged output is written), `prepare-<phase>` and `prepare-<phase>-done` (a cooperative
prepare's participant holds a unit of `scan`, `cut`, `write`, `recipe` or `final`: before / after
its work, result not published), `dedup-<phase>` and `dedup-<phase>-done` (the same for a
deduplication stage's units: `keys`, `buckets`, `components`, `keep`), `analysis-<phase>` and
`analysis-<phase>-done` (the analysis units: `columns`, `plan`, `stats`, `report`), `prepare-staged` (prepare wrote everything but has not published
the job), `prepare-rehashing` (a repeated prepare is about to hash the input again to prove it
unchanged), `probing` (a filesystem probe made its directory, not yet removed),
`phase-locked:<phase>` and `phase-done:<phase>` (a `dlc` coordinator holds the phase / finished
its work but has not published the result).
"""

from __future__ import annotations

import os
import signal

ENV = "ELASTIC_SHARD_CRASH_AT"


def _parse(spec: str | None) -> tuple[str, int, signal.Signals] | None:
    if not spec:
        return None
    stop = spec.endswith(":stop")
    point, _, nth = spec.removesuffix(":stop").partition("@")
    return point, int(nth) if nth else 1, signal.SIGSTOP if stop else signal.SIGKILL


_target = _parse(os.environ.get(ENV))
_seen = 0


def reached(point: str) -> None:
    """SIGKILL (or SIGSTOP) this process if it is the configured crash point's n-th visit."""
    global _seen
    if _target is None or point != _target[0]:
        return
    _seen += 1
    if _seen == _target[1]:
        os.kill(os.getpid(), _target[2])
