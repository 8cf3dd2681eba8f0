"""Identity of the processing engine (Data-Juicer and Ray), read without importing them.

Workers compare this with the manifest before claiming anything, and `status` must stay fast,
so nothing here imports Data-Juicer or Ray.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import platform
import subprocess
import sys
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path


@dataclass(frozen=True)
class EngineIdentity:
    data_juicer_version: str
    data_juicer_commit: str | None
    ray_version: str


def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def _git_commit(package_dir: Path) -> str | None:
    """The commit of a Data-Juicer source checkout (package at <checkout>/data_juicer); None
    for an installed wheel, whose version already identifies it."""
    checkout = package_dir.parent
    if not (checkout / ".git").exists():
        return None
    try:
        out = subprocess.run(
            ["git", "-C", str(checkout), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10, check=True
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


def python_identity() -> str:
    """As the manifest records it: 'CPython 3.11.9'."""
    return f"{platform.python_implementation()} {sys.version.split()[0]}"


@lru_cache(maxsize=1)
def engine_identity() -> EngineIdentity:
    spec = importlib.util.find_spec("data_juicer")
    commit = None
    if spec is not None and spec.origin:
        commit = _git_commit(Path(spec.origin).parent)
    return EngineIdentity(_version("py-data-juicer"), commit, _version("ray"))
