"""Running the launchers (dlc, mpi, local) with the fake runner, as several tests do."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from support.fake_worker import launch_command
from support.jobs import sample_rows, write_jsonl

LAUNCH_RECIPE = """\
project_name: destination-test
dataset_path: {dataset}
process:
  - whitespace_normalization_mapper:
"""
QUICK = ("--poll-interval-secs", "0.1", "--lock-timeout-secs", "5", "--heartbeat-interval-secs", "0.5")


def launcher_runner(tmp_path: Path):
    """launch(command, *args, count=1, prefix=()) -> exit codes of `count` instances run with the fake runner
    (the `launch` fixture)."""
    dataset = write_jsonl(tmp_path / "input.jsonl", sample_rows(12))
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(LAUNCH_RECIPE.format(dataset=dataset))

    def run(command: str, *args: str, count: int = 1, prefix: tuple[str, ...] = (), script: tuple[str, ...] = ()) -> list[int]:
        argv = launch_command(*script, command, "--config", str(recipe), *QUICK, *args)
        procs = []
        for i in range(count):
            with open(tmp_path / f"{command}-{i}.log", "ab") as log:
                procs.append(subprocess.Popen([*(p.format(i=i) for p in prefix), *argv], stdout=subprocess.DEVNULL, stderr=log))
        return [proc.wait(timeout=300) for proc in procs]

    return run


def launcher_args(command: str, tmp_path: Path) -> list[str]:
    if command == "dlc":
        return ["--run-id", "r1", "--num-shards", "3"]
    if command == "mpi":
        if shutil.which("mpirun") is None:
            pytest.skip("needs OpenMPI's mpirun (apt-get install openmpi-bin)")
        hostfile = tmp_path / "hostfile"
        hostfile.write_text("localhost slots=1\n")
        return ["--hostfile", str(hostfile), "--num-shards", "3"]
    return ["--workers", "2", "--num-shards", "3"]
