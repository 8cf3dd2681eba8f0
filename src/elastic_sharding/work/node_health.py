"""A node that fails for reasons of its own must not spend the job's retries.

An attempt fails *node-locally* when its runner says so (the runtime did not start, died or hung;
a child killed by a signal) or when Data-Juicer's error is one of Ray's failures of the node
(out of memory, a dead worker or actor, a full object store). Once another node has claimed
shards of the job, such a failure makes the worker leave that shard to the others for a while
(`avoid_secs`), and NODE_FAILURE_LIMIT of them in a row make it stop claiming: it records why in
`refusals/<host>.json` (shown by `status`) and exits, instead of failing one shard after another
on a node that cannot run any while healthy nodes wait. A worker alone in its job goes on:
stepping aside would only stall the job, and its failures may be passing
(docs/concepts/claims-and-guarantees.md, "A node keeps failing for reasons of its own").
"""

from __future__ import annotations

import logging
import os
import re
import socket
import time

from elastic_sharding.errors import AttemptFailed
from elastic_sharding.layout import JobLayout
from elastic_sharding.records import NodeRefusal
from elastic_sharding.vocabulary import Refusal
from elastic_sharding.work.node_check import record_refusal

log = logging.getLogger(__name__)

NODE_FAILURE_LIMIT = 2
AVOID_MIN_SECS = 30.0
# Ray's exceptions that say the node failed the task, not the task's data.
_RAY_NODE_ERRORS = re.compile(
    r"\b(OutOfMemoryError|ObjectStoreFullError|OutOfDiskError|WorkerCrashedError|NodeDiedError|"
    r"RaySystemError|LocalRayletDiedError|ActorDiedError|ActorUnavailableError)\b"
)


def is_node_local(exc: AttemptFailed) -> bool:
    return exc.node_local or bool(_RAY_NODE_ERRORS.search(str(exc)))


def avoid_secs(poll_interval: float) -> float:
    """How long a worker leaves a shard it failed node-locally to the others: a few of their polls."""
    return max(AVOID_MIN_SECS, 3 * poll_interval)


class NodeHealth:
    """Counts this worker's node-local failures in a row; reset by any attempt that succeeds."""

    def __init__(self, layout: JobLayout, limit: int = NODE_FAILURE_LIMIT):
        self.layout = layout
        self.limit = limit
        self.in_a_row = 0
        self.last_error: str | None = None

    def succeeded(self) -> None:
        self.in_a_row, self.last_error = 0, None

    def failed(self, error: str) -> None:
        self.in_a_row += 1
        self.last_error = error

    @property
    def sick(self) -> bool:
        return self.in_a_row >= self.limit

    def stop_claiming(self) -> str:
        """Record (for status) and return why this worker stops claiming."""
        host = socket.gethostname()
        message = (
            f"{self.in_a_row} attempts in a row failed for reasons of this node (last: {self.last_error}); "
            "this worker stops claiming so the job's retries go to other nodes; fix the node and start a worker again"
        )
        record_refusal(self.layout, NodeRefusal(host, os.getpid(), time.time(), Refusal.NODE_FAILURES, message))
        return message
