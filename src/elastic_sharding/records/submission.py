"""Launcher coordination records (`.<job-dir>.dlc-coordination/<run-hash>/`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class RunRecord:
    """Which submission a coordination generation belongs to (written once, for humans)."""

    run_id: str
    job_dir: str
    created_by: str
    created_at: float


@dataclass
class PhaseLock:
    """The coordinator lease of one phase (prepare or finalize) of one submission."""

    run_id: str
    phase: str
    token: str
    host: str
    pid: int
    acquired_at: float
    took_over_from: str | None = None


@dataclass
class PhaseResult:
    """The outcome of a phase, published once; every instance acts on the same one."""

    run_id: str
    phase: str
    ok: bool
    exit_code: int
    message: str
    host: str
    at: float
    details: dict[str, Any] = field(default_factory=dict)


@dataclass
class Outcome:
    """How a submission ended. The finalize coordinator's success and the first failure race
    for one create-once `outcome.json`, so no instance exits 0 while another exits 2; a failure
    is also kept as `abort.lock`/`abort.json`, and every instance exits with its `exit_code`."""

    run_id: str
    ok: bool
    phase: str
    exit_code: int
    reason: str
    host: str
    pid: int
    at: float
