"""`prepare --install-missing`: the one install a job may make, asked for, before it is published.

It runs on the preparing node only, once, with this interpreter's pip and the requirements
Data-Juicer asks for; every other node still checks its own environment when its worker starts.
"""

from __future__ import annotations

import importlib
import logging
import subprocess
import sys

from elastic_sharding.dependencies import resolve
from elastic_sharding.errors import MissingPackagesError

log = logging.getLogger(__name__)


def install(wanted: list[str]) -> None:
    """pip-install the requirements `wanted` into this interpreter's environment."""
    if not wanted:
        log.info("--install-missing: every package the recipe's operators need is installed")
        return
    command = [sys.executable, "-m", "pip", "install", "--disable-pip-version-check", *wanted]
    log.warning("--install-missing: installing %s into %s (%s)", ", ".join(wanted), sys.prefix, " ".join(command))
    try:
        done = subprocess.run(command, stdout=sys.stderr, stderr=sys.stderr, check=False)
    except OSError as exc:
        raise MissingPackagesError(f"--install-missing could not run pip: {exc}; install {' '.join(wanted)} yourself") from None
    if done.returncode != 0:
        raise MissingPackagesError(
            f"--install-missing: pip exited with {done.returncode} installing {' '.join(wanted)}; nothing was prepared; "
            f"install them yourself ({resolve.install_command(wanted)}) and run prepare again"
        )
    importlib.invalidate_caches()
    resolve.forget_installed()
