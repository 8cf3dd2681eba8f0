"""Processes the tests start and wait for: a fake worker, a deadline poll, an unprivileged prefix."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from support.fake_worker import worker_command


def fake_worker(job: Path, *args: str) -> subprocess.Popen:
    return subprocess.Popen(worker_command(job, *args), stderr=subprocess.PIPE, text=True)


def wait_for(predicate, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def unprivileged_prefix(tmp_path: Path) -> list[str]:
    """A command prefix under which permission bits are enforced even for root (tests run as root
    in CI, where CAP_DAC_OVERRIDE lets every read through); skips the test where none works."""
    probe = tmp_path / "probe"
    probe.write_text("x")
    probe.chmod(0)
    prefix = []
    if os.geteuid() == 0:
        setpriv = shutil.which("setpriv")
        if setpriv is None:
            pytest.skip("running as root without setpriv: cannot drop CAP_DAC_OVERRIDE")
        prefix = [setpriv, "--bounding-set=-dac_override,-dac_read_search", "--"]
    if subprocess.run([*prefix, "cat", str(probe)], capture_output=True).returncode == 0:
        pytest.skip("permission bits are not enforced here")
    return prefix
