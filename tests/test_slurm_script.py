"""`elastic-shard slurm` without a cluster: the batch script of both shapes, the `dlc` command it runs
on every node (rebuilt from the parser, so no flag is lost), the refusals, and the submission
environment (an enclosing job's SLURM_* never leaks: datatrove #248). `sbatch` and `srun` here are
stand-ins on PATH that record what they were given; `tests/test_slurm_e2e.py` runs the real Slurm."""

from __future__ import annotations

import json
import os
import shlex
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from support.jobs import REPO, sample_rows, write_jsonl
from support.launchers import LAUNCH_RECIPE

from elastic_sharding.cli.parser import build_parser

RECORD = """#!/bin/sh
python3 - "$0" "$@" <<'PY'
import json, os, sys
json.dump({"argv": sys.argv[2:], "env": dict(os.environ), "stdin": ""}, open(os.environ["RECORD_TO"], "w"))
PY
echo "4242;t"
"""


def run(args: list[str], tmp_path: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    base = {
        "PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}",
        "PYTHONPATH": str(REPO / "src"),
        "RECORD_TO": str(tmp_path / "record.json"),
    }
    return subprocess.run(
        [sys.executable, "-m", "elastic_sharding", *args],
        cwd=tmp_path,
        env={**base, **(env or {})},
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.fixture
def recipe(tmp_path: Path) -> Path:
    dataset = write_jsonl(tmp_path / "input.jsonl", sample_rows(12))
    path = tmp_path / "recipe.yaml"
    path.write_text(LAUNCH_RECIPE.format(dataset=dataset))
    (tmp_path / "bin").mkdir()
    for tool in ("sbatch", "srun"):
        stand_in = tmp_path / "bin" / tool
        stand_in.write_text(RECORD)
        stand_in.chmod(stand_in.stat().st_mode | stat.S_IXUSR)
    return path


def dlc_line(script: str) -> list[str]:
    step = next(line for line in script.splitlines() if line.startswith("srun "))
    argv = shlex.split(step.rstrip(" &"))
    return argv[argv.index("-m") + 2 :]  # after `python -m elastic_sharding`


def test_an_allocation_script_runs_one_dlc_per_node_with_every_flag_it_was_given(tmp_path, recipe):
    (tmp_path / "jobs").mkdir()  # the parent of --job-dir must exist (on the shared filesystem)
    out = run(
        [
            "slurm",
            "--config",
            str(recipe),
            "--job-dir",
            "jobs/j1",
            "--num-shards",
            "8",
            "--nodes",
            "4",
            "--partition",
            "gpu",
            "--account",
            "lab",
            "--time",
            "2:00:00",
            "--gpus-per-node",
            "8",
            "--mem",
            "200G",
            "--sbatch-arg=--constraint=a100",
            "--setup",
            "module load cuda",
            "--export",
            "HF_HOME=/mnt/hf cache",
            "--lock-timeout-secs",
            "900",
            "--output",
            "out/",
            "--runner",
            "process",
            "--require-all-nodes",
            "--log-dir",
            "logs",
            "--dry-run",
        ],
        tmp_path,
    )
    assert out.returncode == 0, out.stderr
    script = out.stdout
    directives = [line.split(" ", 1)[1] for line in script.splitlines() if line.startswith("#SBATCH")]
    assert directives[:2] == ["--job-name=es-j1", "--nodes=4"]
    for expected in (
        "--ntasks-per-node=1",
        "--exclusive",
        "--partition=gpu",
        "--account=lab",
        "--time=2:00:00",
        "--gpus-per-node=8",
        "--mem=200G",
        "--requeue",
        "--signal=B:USR1@120",
        "--open-mode=append",
        f"--output={tmp_path / 'logs'}/%x-%j.out",
        "--constraint=a100",
    ):
        assert expected in directives
    assert "module load cuda" in script and "export HF_HOME='/mnt/hf cache'" in script
    step = next(line for line in script.splitlines() if line.startswith("srun "))
    assert "--nodes=${SLURM_JOB_NUM_NODES} --ntasks=${SLURM_JOB_NUM_NODES} --ntasks-per-node=1 --cpu-bind=none" in step
    assert "--job-name=es-j1.workers" in step and "--gpus-per-node=8" in step
    args = build_parser().parse_args(dlc_line(script))
    assert args.command == "dlc" and args.nodes is None and args.run_id is None  # Slurm says both
    assert args.job_dir == tmp_path / "jobs/j1" and args.config == recipe and args.num_shards == 8
    assert args.lock_timeout_secs == 900 and args.output == f"{tmp_path / 'out'}/" and args.runner == "process"
    assert args.require_all_nodes
    assert "scontrol requeue" in script
    assert subprocess.run(["bash", "-n"], input=script, text=True).returncode == 0
    assert not (tmp_path / "jobs/j1").exists() and not (tmp_path / "logs").exists()  # a dry run writes nothing
    assert not (tmp_path / "out").exists()  # nor the directory of --output


def test_an_array_script_is_k_single_node_tasks_and_its_options_follow_the_flags(tmp_path, recipe):
    out = run(
        [
            "slurm",
            "--config",
            str(recipe),
            "--job-dir",
            "j2",
            "--array",
            "16",
            "--max-running",
            "4",
            "--cpus-per-node",
            "32",
            "--no-requeue",
            "--job-name",
            "curate.web",
            "--dry-run",
        ],
        tmp_path,
    )
    assert out.returncode == 0, out.stderr
    directives = [line.split(" ", 1)[1] for line in out.stdout.splitlines() if line.startswith("#SBATCH")]
    assert "--array=0-15%4" in directives and "--nodes=1" in directives and "--cpus-per-task=32" in directives
    assert "--exclusive" not in directives and "--no-requeue" in directives
    assert f"--output={tmp_path}/%x-%A_%a.out" in directives and "--job-name=curate.web" in directives
    assert "scontrol requeue" not in out.stdout
    assert "srun --nodes=1 --ntasks=1 " in out.stdout
    out = run(["slurm", "--config", str(recipe), "--job-dir", "j2", "--array", "2", "--signal-secs", "0", "--dry-run"], tmp_path)
    assert "--signal=" not in out.stdout and "scontrol requeue" not in out.stdout


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        ([], "pass --nodes N"),
        (["--nodes", "2", "--array", "2"], "not allowed with argument"),
        (["--nodes", "2", "--max-running", "1"], "--max-running limits the tasks of an --array job"),
        (["--array", "2", "--max-running", "3"], "--max-running 3 is more than --array 2"),
        (["--array", "4", "--max-running", "2", "--require-all-nodes"], "never runs them all at once"),
        (["--nodes", "2", "--export", "NOVALUE"], "--export 'NOVALUE': write NAME=VALUE"),
        (["--nodes", "2", "--sbatch-arg", "constraint=a100"], "give one sbatch option"),
        (["--nodes", "2", "--job-name", "a b"], "use letters, digits"),
    ],
)
def test_impossible_requests_are_refused_before_anything_is_submitted(tmp_path, recipe, flags, message):
    out = run(["slurm", "--config", str(recipe), "--job-dir", "j", *flags], tmp_path)
    assert out.returncode == 2 and message in out.stderr
    assert not (tmp_path / "record.json").exists() and not (tmp_path / "j").exists()


def test_submitting_from_inside_a_job_leaves_its_variables_behind_and_prints_the_job_id(tmp_path, recipe):
    inherited = {
        "SLURM_JOB_ID": "77",
        "SLURM_STEP_ID": "0",
        "SLURM_CPU_BIND": "quiet,mask_cpu:0x3",
        "SLURM_CPU_BIND_LIST": "0x3",
        "SBATCH_PARTITION": "old",
        "SRUN_CPUS_PER_TASK": "1",
        "KEEP_ME": "1",
        "SLURM_CONF": "/etc/slurm/slurm.conf",
    }
    out = run(["slurm", "--config", str(recipe), "--job-dir", "j3", "--nodes", "2", "--log-dir", "logs"], tmp_path, inherited)
    assert out.returncode == 0, out.stderr
    assert out.stdout == "4242\n"
    record = json.loads((tmp_path / "record.json").read_text())
    assert record["argv"] == ["--parsable", str(tmp_path / "logs" / "es-j3.sbatch")]
    assert [n for n in record["env"] if n.startswith(("SLURM_", "SBATCH_", "SRUN_"))] == ["SLURM_CONF"]
    assert record["env"]["KEEP_ME"] == "1"
    assert (tmp_path / "logs" / "es-j3.sbatch").read_text().startswith("#!/bin/bash\n#SBATCH --job-name=es-j3")
    assert "squeue --name es-j3" in out.stderr


def test_inside_an_allocation_it_runs_the_step_over_the_allocations_nodes_unbound(tmp_path, recipe):
    allocation = {
        "SLURM_JOB_ID": "88",
        "SLURM_JOB_NUM_NODES": "3",
        "SLURM_CPU_BIND": "mask_cpu:0x1",
        "SLURM_STEP_ID": "4294967290",
    }
    out = run(["slurm", "--config", str(recipe), "--job-dir", "j4", "--dry-run"], tmp_path, allocation)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("srun --nodes=3 --ntasks=3 --ntasks-per-node=1 --cpu-bind=none")
    out = run(["slurm", "--config", str(recipe), "--job-dir", "j4"], tmp_path, allocation)
    assert out.returncode == 0, out.stderr
    record = json.loads((tmp_path / "record.json").read_text())
    assert record["argv"][:4] == ["--nodes=3", "--ntasks=3", "--ntasks-per-node=1", "--cpu-bind=none"]
    assert "SLURM_CPU_BIND" not in record["env"] and record["env"]["SLURM_JOB_ID"] == "88"
    out = run(["slurm", "--config", str(recipe), "--job-dir", "j4", "--array", "2", "--dry-run"], tmp_path, allocation)
    assert out.returncode == 2 and "pass --submit" in out.stderr
    out = run(
        ["slurm", "--config", str(recipe), "--job-dir", "j4", "--array", "2", "--submit", "--dry-run"], tmp_path, allocation
    )
    assert out.returncode == 0 and "#SBATCH --array=0-1" in out.stdout


def test_the_guides_worked_script_is_what_the_guides_command_writes(tmp_path, recipe):
    """docs/guides/slurm.md shows a command and its batch script: they must not drift from the code.
    The dry run checks the recipe, the input and the job directory's parent, so the guide's share
    /mnt/shared is made here under tmp_path, and its paths are put back in the script."""
    text = (REPO / "docs" / "guides" / "slurm.md").read_text()
    blocks = [block.split("```", 1)[0] for block in text.split("```bash\n")[1:]]
    command = next(b for b in blocks if b.startswith("elastic-shard slurm"))
    script = next(b for b in blocks if b.startswith("#!/bin/bash\n#SBATCH --job-name"))
    shared = tmp_path / "mnt" / "shared"
    (shared / "jobs").mkdir(parents=True)
    (shared / "recipes").mkdir()
    (shared / "recipes" / "my_process.yaml").write_text(recipe.read_text())
    write_jsonl(shared / "input" / "my_dataset.jsonl", sample_rows(12))
    argv = shlex.split(command.replace("\\\n", " ").replace("/mnt/shared/", f"{shared}/"))[1:]
    python = "/mnt/shared/elastic-sharding/.venv/bin/python"
    out = run([*argv, "--python", python, "--dry-run"], tmp_path)
    assert out.returncode == 0, out.stderr
    printed = out.stdout.replace(f"{shared}/", "/mnt/shared/")
    assert printed == script.replace(" \\\n  ", " "), "update the guide's batch script (and its zh twin) from --dry-run"
    assert sorted(p.name for p in shared.iterdir()) == ["input", "jobs", "recipes"]  # no job, log or output directory
    assert not any((shared / "jobs").iterdir())
    assert script in (REPO / "docs" / "zh" / "guides" / "slurm.md").read_text(), "the zh guide shows the same script"
