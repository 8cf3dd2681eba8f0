"""What a shard is, from its records: the one rule the worker, the launchers and status share."""

from __future__ import annotations

from elastic_sharding.records import ClaimRecord
from elastic_sharding.vocabulary import ClaimStatus, ShardState


def shard_state(claim: ClaimRecord | None, completed: bool, failed: bool) -> ShardState:
    """The state of a shard from its claim record and whether its completion and failure
    records exist.

    A terminal status in the claim wins (P6). A published completion or failure counts even when
    its owner died before recording it in the claim. Otherwise a claimed shard is RUNNING: whether
    it is live or stale is the observer's judgement (a worker's `takeover.ShardScanner` watches
    its heartbeat for a lease; a one-shot `status` estimates from the heartbeat's time).
    """
    if claim is not None and claim.status == ClaimStatus.DONE:
        return ShardState.DONE
    if claim is not None and claim.status == ClaimStatus.FAILED:
        return ShardState.FAILED
    if completed:
        return ShardState.DONE
    if failed:
        return ShardState.FAILED
    return ShardState.PENDING if claim is None else ShardState.RUNNING
