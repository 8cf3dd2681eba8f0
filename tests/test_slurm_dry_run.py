"""`elastic-shard slurm` checks before it submits, runs or prints: `--dry-run` makes the checks a
submission makes and exits as it would, off-cluster too (no `sbatch` here), and leaves nothing
behind; a submission makes them before it looks for `sbatch`; inside an allocation the dry run
checks the same, and `--nodes` may not ask for more nodes than the allocation has. In this
process (`run_cli`), with Slurm's variables and tools taken away."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest
from support.jobs import refused, sample_rows, write_jsonl
from support.launchers import LAUNCH_RECIPE

from elastic_sharding.destination import check_destination, prepare_destination
from elastic_sharding.errors import ElasticShardError, InputError, MissingPackagesError, RecipeError, UsageError

pytestmark = pytest.mark.usefixtures("own_log_handlers")

SLURM_PREFIXES = ("SLURM_", "SBATCH_", "SRUN_", "SALLOC_")


@pytest.fixture
def off_cluster(monkeypatch):
    """No Slurm job around this process and no Slurm tools on PATH."""
    for name in list(os.environ):
        if name.startswith(SLURM_PREFIXES):
            monkeypatch.delenv(name)
    dirs = os.environ.get("PATH", "").split(os.pathsep)
    keep = [d for d in dirs if d and not any(Path(d, tool).exists() for tool in ("sbatch", "srun"))]
    monkeypatch.setenv("PATH", os.pathsep.join(keep))


@pytest.fixture
def allocation(off_cluster, monkeypatch):
    """Inside salloc's shell of a 4-node allocation (no srun here: a dry run needs none)."""
    monkeypatch.setenv("SLURM_JOB_ID", "88")
    monkeypatch.setenv("SLURM_JOB_NUM_NODES", "4")
    monkeypatch.setenv("SLURM_NNODES", "4")


@pytest.fixture
def shared(tmp_path: Path) -> Path:
    """A recipe, its input and the parent of the job directory, as on the shared filesystem."""
    dataset = write_jsonl(tmp_path / "input.jsonl", sample_rows(12))
    (tmp_path / "recipe.yaml").write_text(LAUNCH_RECIPE.format(dataset=dataset))
    (tmp_path / "unknown-op.yaml").write_text(LAUNCH_RECIPE.format(dataset=dataset) + "  - no_such_mapper:\n")
    (tmp_path / "cc.yaml").write_text(LAUNCH_RECIPE.format(dataset=dataset) + "  - chinese_convert_mapper:\n      mode: t2s\n")
    (tmp_path / "jobs").mkdir()
    return tmp_path


def args(root: Path, *flags: str, **override: str) -> list[str]:
    """`slurm` with a good request; `override` replaces a flag's value (config=..., output=...)."""
    values = {
        "config": str(root / "recipe.yaml"),
        "job-dir": str(root / "jobs" / "j"),
        "num-shards": "8",
        "output": str(root / "out" / "sub" / "result.jsonl"),
        "log-dir": str(root / "logs"),
    }
    values.update({name.replace("_", "-"): value for name, value in override.items()})
    return ["slurm", *(part for name, value in values.items() for part in (f"--{name}", value)), *flags]


def tree(root: Path) -> set[str]:
    return {str(path.relative_to(root)) for path in root.rglob("*")}


def message(result) -> str:
    return refused(result).split(": error: ", 1)[1]


@pytest.mark.parametrize("shape", [("--nodes", "4"), ("--array", "4")], ids=["allocation", "array"])
def test_a_good_dry_run_prints_the_script_and_leaves_nothing(shared, off_cluster, run_cli, shape):
    before = tree(shared)
    result = run_cli(*args(shared, *shape, "--dry-run"))
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("#!/bin/bash\n#SBATCH --job-name=es-j\n")
    assert tree(shared) == before  # no job directory, no log directory, no directory of --output


BAD = {
    "missing recipe": (RecipeError, {"config": "{root}/nowhere.yaml"}, (), "cannot read recipe"),
    "missing input": (InputError, {"dataset_path": "{root}/nowhere.jsonl"}, (), "cannot access dataset"),
    "strict arithmetic": (UsageError, {"num_shards": "6"}, ("--require-all-nodes",), "impossible to guarantee"),
    "missing job-dir parent": (UsageError, {"job_dir": "{root}/unmounted/j"}, (), "the parent directory of --job-dir"),
    "a file in the way of --output": (UsageError, {"output": "{root}/recipe.yaml/sub/out.jsonl"}, (), "is not a directory"),
    "unknown operator": (RecipeError, {"config": "{root}/unknown-op.yaml"}, (), "process[1] no_such_mapper: unknown operator"),
    "missing operator package": (
        MissingPackagesError,
        {"config": "{root}/cc.yaml"},
        (),
        "process[1] chinese_convert_mapper needs the Python package opencc",
    ),
}


@pytest.mark.parametrize("case", list(BAD), ids=list(BAD))
def test_a_dry_run_refuses_what_the_submission_refuses_with_its_exit_code(shared, off_cluster, run_cli, case):
    error, override, flags, fragment = BAD[case]
    if case == "missing operator package" and importlib.util.find_spec("opencc") is not None:
        pytest.skip("the project's environment must lack opencc for this case")
    override = {name: value.format(root=shared) for name, value in override.items()}
    before = tree(shared)
    dry = run_cli(*args(shared, "--nodes", "4", *flags, "--dry-run", **override))
    assert dry.returncode == error.exit_code and fragment in message(dry)
    assert dry.stdout == "" and tree(shared) == before  # no script, nothing left
    real = run_cli(*args(shared, "--nodes", "4", *flags, **override))  # off-cluster: the real error, not "sbatch not found"
    assert real.returncode == error.exit_code and message(real) == message(dry)
    assert "sbatch" not in real.stderr and real.stdout == ""


def test_the_strict_mode_refusal_is_the_one_dlc_gives(shared, off_cluster, run_cli):
    strict = ("--nodes", "4", "--num-shards", "6", "--require-all-nodes")
    job = ("--config", str(shared / "recipe.yaml"), "--job-dir", str(shared / "jobs" / "j"))
    dlc = run_cli("dlc", *job, "--run-id", "x", *strict)
    slurm = run_cli(*args(shared, *strict, "--dry-run"))
    assert message(slurm) == message(dlc) and "--nodes 4 and --num-shards 6" in message(dlc)
    array = run_cli(*args(shared, "--array", "4", "--num-shards", "6", "--require-all-nodes", "--dry-run"))
    assert message(array) == f"--array 4 starts 4 Workers: {message(dlc)}"


def test_off_cluster_a_good_submission_is_refused_for_the_missing_sbatch_only(shared, off_cluster, run_cli):
    result = run_cli(*args(shared, "--nodes", "4"))
    assert "'sbatch' not found" in message(result)
    assert not (shared / "logs").exists() and not (shared / "jobs" / "j").exists()


def test_inside_an_allocation_nodes_beyond_it_are_refused_and_fewer_are_used(shared, allocation, run_cli):
    for flags in (("--nodes", "8", "--dry-run"), ("--nodes", "8")):
        text = message(run_cli(*args(shared, *flags)))
        assert "--nodes 8: this allocation (Slurm job 88) has 4 node(s)" in text
        assert "drop --nodes" in text and "pass --submit to submit a new job of 8 nodes" in text
    fewer = run_cli(*args(shared, "--nodes", "2", "--dry-run"))
    assert fewer.returncode == 0 and fewer.stdout.startswith("srun --nodes=2 --ntasks=2 --ntasks-per-node=1 ")
    every = run_cli(*args(shared, "--dry-run"))
    assert every.returncode == 0 and every.stdout.startswith("srun --nodes=4 --ntasks=4 ")
    new_job = run_cli(*args(shared, "--nodes", "8", "--submit", "--dry-run"))
    assert new_job.returncode == 0 and "#SBATCH --nodes=8\n" in new_job.stdout


def test_inside_an_allocation_the_dry_run_makes_the_same_checks(shared, allocation, run_cli):
    before = tree(shared)
    recipe = run_cli(*args(shared, "--dry-run", config=str(shared / "nowhere.yaml")))
    assert recipe.returncode == RecipeError.exit_code and "cannot read recipe" in message(recipe) and recipe.stdout == ""
    strict = run_cli(*args(shared, "--num-shards", "6", "--require-all-nodes", "--dry-run"))
    assert "--nodes 4 and --num-shards 6" in message(strict)  # the allocation's 4 nodes
    data = run_cli(*args(shared, "--dry-run", dataset_path=str(shared / "nowhere.jsonl")))
    assert data.returncode == InputError.exit_code and "cannot access dataset" in message(data)
    assert tree(shared) == before


@pytest.mark.parametrize("where", ["afile/out.jsonl", "afile/sub/out.jsonl", "new/sub/out.jsonl", "out.jsonl"])
def test_check_destination_refuses_as_prepare_destination_does_and_creates_nothing(tmp_path, where):
    (tmp_path / "afile").write_text("x")
    output = tmp_path / "dry" / where
    (tmp_path / "dry").mkdir()
    (tmp_path / "dry" / "afile").write_text("x")

    def outcome(check) -> str | None:
        try:
            check(output, create_once=True)
        except ElasticShardError as exc:
            return str(exc)
        return None

    before = tree(tmp_path)
    checked = outcome(check_destination)
    assert tree(tmp_path) == before
    assert checked == outcome(prepare_destination)
    assert (checked is None) == where.startswith(("new", "out"))
