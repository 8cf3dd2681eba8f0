"""A worker's node, checked against the job before it claims anything.

The job promises the same engine and the same libraries for every shard: the manifest records
Data-Juicer's version and every package the recipe's operators import (`dependencies`), and a
node that differs refuses to claim. Its refusal is left in `refusals/<host>.json` so that
`status` shows which node stays out and why; the next worker there that passes removes it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import time

from elastic_sharding import fsops
from elastic_sharding.dependencies.resolve import look_up, missing_line
from elastic_sharding.engine import engine_identity, python_identity
from elastic_sharding.errors import ElasticShardError, MissingPackagesError, VersionMismatchError
from elastic_sharding.layout import JobLayout
from elastic_sharding.records import Manifest, NodeRefusal, encode
from elastic_sharding.vocabulary import Refusal

log = logging.getLogger(__name__)

OVERRIDE = "--allow-version-mismatch"


def check_node(layout: JobLayout, manifest: Manifest, allow_mismatch: bool) -> None:
    """Refuse (and record the refusal) unless this node can run the job as it was prepared."""
    host = socket.gethostname()
    try:
        check_engine(manifest, allow_mismatch)
        check_packages(manifest, allow_mismatch)
    except (MissingPackagesError, VersionMismatchError) as exc:
        reason = Refusal.MISSING_PACKAGES if isinstance(exc, MissingPackagesError) else Refusal.VERSION_MISMATCH
        record_refusal(layout, NodeRefusal(host, os.getpid(), time.time(), reason, str(exc)))
        raise
    with contextlib.suppress(FileNotFoundError):
        os.unlink(layout.refusal(host))


def check_engine(manifest: Manifest, allow_mismatch: bool) -> None:
    """The engine the job was prepared with: Data-Juicer (version and commit), Ray, and Python's
    version up to its minor one (a patch release changes no row)."""
    mine = engine_identity()
    differences = []
    recorded = (manifest.data_juicer_version, manifest.data_juicer_commit)
    current = (mine.data_juicer_version, mine.data_juicer_commit)
    if recorded != current:
        differences.append(
            f"Data-Juicer {current[0]} (commit {current[1] or 'n/a'}) but the job was prepared with "
            f"{recorded[0]} (commit {recorded[1] or 'n/a'})"
        )
    if manifest.ray_version != mine.ray_version:
        differences.append(f"Ray {mine.ray_version} but the job was prepared with Ray {manifest.ray_version}")
    here = python_identity()
    if _minor(manifest.python_version) != _minor(here):
        differences.append(f"{here} but the job was prepared with {manifest.python_version}")
    if not differences:
        return
    message = "this worker runs " + "; and ".join(differences)
    if not allow_mismatch:
        raise VersionMismatchError(f"{message}; install the same version on every node or pass {OVERRIDE}")
    log.warning("%s; continuing because of %s", message, OVERRIDE)


def _minor(python: str) -> str:
    """'CPython 3.11.9' -> 'CPython 3.11'."""
    implementation, _, version = python.rpartition(" ")
    return f"{implementation} {'.'.join(version.split('.')[:2])}"


def check_packages(manifest: Manifest, allow_mismatch: bool) -> None:
    """Every package the job recorded: here (else MissingPackagesError, one line per package),
    and the version prepare saw (else VersionMismatchError, unless `allow_mismatch`)."""
    host = socket.gethostname()
    missing, differing = [], []
    for recorded in manifest.packages:
        present, _, version = look_up(recorded.package, recorded.module)
        if not present:
            line = missing_line(recorded, f"this node ({host})")
            if recorded.required:
                missing.append(line)
            else:
                log.warning("%s (needed only on a branch prepare could not decide)", line)
        elif recorded.version is not None and version != recorded.version:
            name = recorded.distribution or recorded.package
            differing.append(
                f"{name} {version or '(version unknown)'} here, {recorded.version} when the job was prepared "
                f"(used by {' and '.join(recorded.operators)})"
            )
    if missing:
        raise MissingPackagesError(
            "\n".join(missing) + "\nthis worker claims nothing; install the packages above on this node and start it again"
        )
    if differing:
        message = "this node's packages differ from the job's: " + "; ".join(differing)
        if not allow_mismatch:
            raise VersionMismatchError(f"{message}; install the same versions on every node or pass {OVERRIDE}")
        log.warning("%s; continuing because of %s", message, OVERRIDE)


def record_refusal(layout: JobLayout, refusal: NodeRefusal) -> None:
    """Leave a refusal for `status`; a failure to write it is only logged (the worker refuses anyway)."""
    try:
        fsops.ensure_dir(layout.refusals)
        fsops.replace_atomic(layout.refusal(refusal.host), encode(refusal))
    except (OSError, ElasticShardError) as exc:
        log.warning("could not record this node's refusal for status: %s", exc)
