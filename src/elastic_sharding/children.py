"""What every child process of ours gets: this package importable, and a signal when its parent dies.

Launchers start workers and workers start runner children by module name (`python -m
elastic_sharding...`), wherever the parent was started from and whether or not the package is
installed, so the environment puts this package's source root first on PYTHONPATH.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
from pathlib import Path

_PR_SET_PDEATHSIG = 1
_PACKAGE_PARENT = str(Path(__file__).resolve().parents[1])


def child_env(extra: dict[str, str]) -> dict[str, str]:
    """This process's environment plus `extra`, with this package importable."""
    env = dict(os.environ)
    env.update(extra)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (_PACKAGE_PARENT, env.get("PYTHONPATH")) if p)
    return env


def set_parent_death_signal(sig: int) -> None:
    """In a child (preexec): receive `sig` when the parent dies (Linux; elsewhere a no-op)."""
    with contextlib.suppress(OSError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, sig)
