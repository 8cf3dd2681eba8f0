"""Launchers without Data-Juicer processing: parameter rules, run identity, the two-node wrapper,
and `dlc` coordination across real processes (fake runner), including failures and takeovers."""

from __future__ import annotations

import os
import shlex
import subprocess
import time
from pathlib import Path

import orjson
import pytest
from support.e2e_support import needs_unshare
from support.fake_worker import launch_command
from support.jobs import sample_rows, write_jsonl

from elastic_sharding.claims.submission import Generation, coordination_root
from elastic_sharding.errors import UsageError
from elastic_sharding.launch.dlc import strict_claim_cap
from elastic_sharding.launch.scheduler import detect, resolve_run_id
from elastic_sharding.launch.two_node import with_two_node_defaults
from elastic_sharding.observe.status import Status
from elastic_sharding.observe.status_text import status_text
from elastic_sharding.records import Outcome, PhaseLock, decode, encode

# -- strict participation mode -------------------------------------------------------------------


@pytest.mark.parametrize(("nodes", "shards", "cap"), [(3, 6, 2), (2, 3, 2), (1, 1, 1), (4, 4, 1), (2, 4, 2), (3, 7, 3)])
def test_strict_mode_accepts_combinations_where_every_worker_gets_a_shard(nodes, shards, cap):
    assert strict_claim_cap(nodes, shards, require_all_nodes=True) == cap


@pytest.mark.parametrize(("nodes", "shards"), [(4, 6), (3, 4), (3, 2), (5, 16)])
def test_strict_mode_refuses_combinations_that_could_leave_a_worker_idle(nodes, shards):
    with pytest.raises(UsageError, match="impossible to guarantee"):
        strict_claim_cap(nodes, shards, require_all_nodes=True)


def test_strict_mode_needs_nodes_and_elastic_mode_has_no_cap():
    with pytest.raises(UsageError, match="--require-all-nodes needs --nodes"):
        strict_claim_cap(None, 4, require_all_nodes=True)
    assert strict_claim_cap(None, 4, require_all_nodes=False) is None
    assert strict_claim_cap(8, 4, require_all_nodes=False) is None


# -- run identity --------------------------------------------------------------------------------


def test_run_id_comes_from_the_flag_then_the_scheduler_environment():
    def run_id(explicit, env):
        return resolve_run_id(explicit, detect(env, hostname="h"))

    env = {"PAI_JOB_ID": "pai", "DLC_JOB_ID": "dlc", "JOB_ID": "job"}
    assert run_id("mine", env) == "mine"
    assert run_id(None, env) == "pai"
    assert run_id(None, {"DLC_JOB_ID": "dlc", "JOB_ID": "job"}) == "dlc"
    assert run_id(None, {"JOB_ID": "job"}) == "job"
    with pytest.raises(UsageError, match="pass --run-id"):
        run_id(None, {})
    with pytest.raises(UsageError, match="single-line"):
        run_id("a\nb", {})


def test_each_run_id_has_its_own_generation_beside_the_job_dir(tmp_path):
    a, b = Generation(tmp_path / "job-1", "run-a"), Generation(tmp_path / "job-1", "run-b")
    assert a.root.parent == b.root.parent == tmp_path / ".job-1.dlc-coordination"
    assert a.root != b.root


# -- the two-node wrapper ------------------------------------------------------------------------


@pytest.mark.parametrize("style", ["separate", "equals"])
def test_two_node_wrapper_adds_only_missing_defaults(style):
    def opt(name: str, value: str) -> list[str]:
        return [f"{name}={value}"] if style == "equals" else [name, value]

    argv = with_two_node_defaults(["dlc", *opt("--job-dir", "/s/job")])
    assert argv == [
        "dlc",
        *opt("--job-dir", "/s/job"),
        "--nodes",
        "2",
        "--require-all-nodes",
        "--output",
        "/s/job/two-node-merged.jsonl",
    ]
    argv = with_two_node_defaults(
        ["--log-level", "DEBUG", "dlc", *opt("--job-dir", "/j"), *opt("--nodes", "4"), *opt("--output", "/o")]
    )
    assert argv == [
        "--log-level",
        "DEBUG",
        "dlc",
        *opt("--job-dir", "/j"),
        *opt("--nodes", "4"),
        *opt("--output", "/o"),
        "--require-all-nodes",
    ]
    assert with_two_node_defaults(["worker", *opt("--job-dir", "/j")])[-2:] == ["--max-shards", "2"]
    assert (
        with_two_node_defaults(["worker", *opt("--job-dir", "/j"), *opt("--max-shards", "5")]).count(
            "--max-shards" if style == "separate" else "--max-shards=5"
        )
        == 1
    )
    assert with_two_node_defaults(["verify", *opt("--job-dir", "/j")])[-2:] == ["--expect-nodes", "2"]
    assert with_two_node_defaults(["status", *opt("--job-dir", "/j")]) == ["status", *opt("--job-dir", "/j")]


# -- dlc across processes (fake runner) ----------------------------------------------------------

RECIPE = """\
project_name: launch-test
dataset_path: {dataset}
export_path: /tmp/ignored.jsonl
process:
  - whitespace_normalization_mapper:
"""


def dlc_instance(tmp_path: Path, name: str, *args: str, env: dict | None = None) -> subprocess.Popen:
    full_env = dict(os.environ, **(env or {}))
    log = open(tmp_path / f"{name}.log", "w")
    return subprocess.Popen(launch_command("dlc", *args), stdout=subprocess.DEVNULL, stderr=log, env=full_env)


def run_instances(tmp_path: Path, count: int, *args: str, env: dict | None = None, tag: str = "") -> list[int]:
    procs = [dlc_instance(tmp_path, f"{tag}instance-{i}", *args, env=env) for i in range(count)]
    return [proc.wait(timeout=300) for proc in procs]


def logs(tmp_path: Path, tag: str = "") -> str:
    return "".join(path.read_text() for path in sorted(tmp_path.glob(f"{tag}instance-*.log")))


@pytest.fixture
def dlc_job(tmp_path):
    dataset = write_jsonl(tmp_path / "input.jsonl", sample_rows(30))
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(RECIPE.format(dataset=dataset))
    job = tmp_path / "job"

    def args(run_id: str, *extra: str) -> list[str]:
        return [
            "--config", str(recipe), "--job-dir", str(job), "--num-shards", "3", "--run-id", run_id,
            "--poll-interval-secs", "0.1", "--lock-timeout-secs", "5", "--heartbeat-interval-secs", "0.5",
            "--coordinator-lease-secs", "1", "--max-retries", "0", *extra,
        ]  # fmt: skip

    return job, dataset, args


def merged_rows(path: Path) -> list[dict]:
    return [orjson.loads(line) for line in path.read_bytes().splitlines()]


def test_dlc_instances_elect_one_coordinator_per_phase_and_all_succeed(tmp_path, dlc_job):
    job, _, args = dlc_job
    assert run_instances(tmp_path, 3, *args("run-1")) == [0, 0, 0]
    text = logs(tmp_path)
    assert text.count("elected as DLC prepare coordinator") == 1
    assert text.count("elected as DLC finalize coordinator") == 1
    assert text.count("Starting DLC worker on hostname=") == 3
    assert text.count("PASS: 3 shards were completed by 1 node(s)") == 3
    assert merged_rows(job / "merged.jsonl") == sample_rows(30)
    gen = Generation(job, "run-1")
    assert not gen.path("abort.json").exists() and gen.result("finalize").ok
    runs = Status(job).as_json()["launcher_runs"]
    assert [(r["run_id"], r["prepare"]["state"], r["finalize"]["state"], r["abort"]) for r in runs] == [
        ("run-1", "ok", "ok", None)
    ]
    # The same submission again is a no-op that still ends with PASS (the merge is re-verified).
    assert run_instances(tmp_path, 1, *args("run-1"), tag="again-") == [0]
    assert "PASS: 3 shards" in logs(tmp_path, "again-")


def test_only_the_prepare_coordinator_hashes_the_input_again_and_a_changed_input_fails_every_instance(tmp_path, dlc_job):
    from support.jobs import edit_in_place

    job, dataset, args = dlc_job
    assert run_instances(tmp_path, 3, *args("run-1")) == [0, 0, 0]
    assert "checking that the" not in logs(tmp_path), "a new job is hashed while it is split, not again"
    assert run_instances(tmp_path, 3, *args("run-2"), tag="again-") == [0, 0, 0]
    assert logs(tmp_path, "again-").count("checking that the 1 input file(s) are unchanged (sha256)") == 1
    edit_in_place(dataset, b"sample number 3", b"sample NUMBER 3")
    assert run_instances(tmp_path, 3, *args("run-3"), tag="changed-") == [2, 2, 2]
    abort = Generation(job, "run-3").abort_record()
    assert abort.phase == "prepare" and f"{dataset}: its content changed since the job was prepared" in abort.reason


def test_a_failed_shard_ends_every_instance_with_one_code_and_a_new_run_id_recovers(tmp_path, dlc_job):
    job, _, args = dlc_job
    codes = run_instances(tmp_path, 3, *args("run-1"), env={"FAKE_FAIL_SHARDS": "part-00001-of-00003"})
    assert codes == [2, 2, 2]
    gen = Generation(job, "run-1")
    abort = decode(Outcome, gen.path("abort.json").read_bytes(), "abort.json")
    assert "part-00001-of-00003 failed" in abort.reason and abort.exit_code == 2
    assert not gen.lock_path("finalize").exists() and not (job / "merged.jsonl").exists()
    for log in sorted(tmp_path.glob("instance-*.log")):
        # Every instance reports the one published failure, whichever instance saw it first.
        assert "run run-1 failed during work" in log.read_text(), log.read_text()[-2000:]
    (run,) = Status(job).as_json()["launcher_runs"]
    assert run["finalize"]["state"] == "not started" and run["abort"]["phase"] == "work"
    assert "dlc run run-1: prepare ok" in status_text(Status(job), False) and "FAILED in work" in status_text(Status(job), False)
    # The same run id stays failed; a new submission after "fixing" the cause requeues and passes.
    assert run_instances(tmp_path, 1, *args("run-1"), tag="same-") == [2]
    assert run_instances(tmp_path, 2, *args("run-2"), tag="new-") == [0, 0]
    assert "requeued 1 shard(s) that failed in an earlier run" in logs(tmp_path, "new-")
    assert merged_rows(job / "merged.jsonl") == sample_rows(30)


def test_a_prepare_failure_ends_every_instance_and_leaves_no_job(tmp_path, dlc_job):
    job, dataset, args = dlc_job
    good = dataset.read_bytes()
    dataset.write_bytes(good + b"{not json\n")
    assert run_instances(tmp_path, 3, *args("run-1")) == [2, 2, 2]
    assert not job.exists()
    gen = Generation(job, "run-1")
    result = gen.result("prepare")
    assert result is not None and not result.ok and "input.jsonl:31" in result.message
    assert gen.abort_record() is not None and gen.abort_record().phase == "prepare"
    assert not gen.lock_path("finalize").exists()
    dataset.write_bytes(good)
    assert run_instances(tmp_path, 2, *args("run-2"), tag="new-") == [0, 0]
    assert merged_rows(job / "merged.jsonl") == sample_rows(30)


@pytest.mark.parametrize("phase", ["prepare", "finalize"])
def test_a_dead_coordinator_is_taken_over_within_one_coordinator_lease(tmp_path, dlc_job, phase):
    job, _, args = dlc_job
    gen = Generation(job, "run-1")
    gen.open()
    # A coordinator that died right after it was elected: its lock, and no heartbeat ever.
    dead = PhaseLock("run-1", phase, "f" * 32, "gone-host", 999999, time.time())
    gen.lock_path(phase).write_bytes(encode(dead))
    started = time.monotonic()
    assert run_instances(tmp_path, 2, *args("run-1")) == [0, 0]
    assert time.monotonic() - started < 60, "must not wait for --wait-timeout-secs"
    text = logs(tmp_path)
    assert f"DLC {phase} coordinator host=gone-host pid=999999 did not heartbeat" in text
    assert text.count(f"elected as DLC {phase} coordinator") == 1
    assert merged_rows(job / "merged.jsonl") == sample_rows(30)


def test_waiting_past_wait_timeout_fails_every_instance(tmp_path, dlc_job):
    job, _, args = dlc_job
    gen = Generation(job, "run-1")
    gen.open()
    gen.lock_path("prepare").write_bytes(encode(PhaseLock("run-1", "prepare", "e" * 32, "slow-host", 1, time.time())))
    codes = run_instances(tmp_path, 2, *args("run-1", "--wait-timeout-secs", "1", "--coordinator-lease-secs", "3600"))
    assert codes == [2, 2]
    assert (
        "timed out after 1s (--wait-timeout-secs) waiting for the prepare coordinator host=slow-host" in gen.abort_record().reason
    )


def test_parameter_errors_are_refused_before_anything_is_written(tmp_path, run_cli):
    job = tmp_path / "job"
    result = run_cli("dlc", "--job-dir", str(job), "--nodes", "4", "--num-shards", "6", "--require-all-nodes", "--run-id", "x")
    assert result.returncode == 2 and "impossible to guarantee" in result.stderr
    result = run_cli("dlc", "--job-dir", str(job), "--nodes", "3", "--num-shards", "4", "--require-all-nodes", "--run-id", "x")
    assert result.returncode == 2 and "impossible to guarantee" in result.stderr
    env_ids = {name: os.environ.pop(name, None) for name in ("PAI_JOB_ID", "DLC_JOB_ID", "JOB_ID")}
    try:
        result = run_cli("dlc", "--job-dir", str(job))
    finally:
        os.environ.update({k: v for k, v in env_ids.items() if v is not None})
    assert result.returncode == 2 and "pass --run-id" in result.stderr
    data_dir = tmp_path / "data"
    write_jsonl(data_dir / "part.jsonl", sample_rows(5))
    inside = data_dir / "job"
    result = run_cli("dlc", "--job-dir", str(inside), "--dataset-path", str(data_dir), "--run-id", "x")
    assert result.returncode == 2 and "is inside the dataset directory" in result.stderr
    result = run_cli("dlc", "--job-dir", str(job), "--config", str(tmp_path / "missing.yaml"), "--run-id", "x")
    assert result.returncode == 2 and "missing.yaml" in result.stderr
    blocker = tmp_path / "a-file"
    blocker.write_text("in the way of --output's directory\n")
    for command in ("dlc", "local", "mpi"):
        extra = ["--run-id", "x"] if command == "dlc" else ["--np", "1"] if command == "mpi" else []
        result = run_cli(command, "--job-dir", str(job), "--output", str(blocker / "no" / "out.jsonl"), *extra)
        assert result.returncode == 2 and f"{blocker} is not a directory" in result.stderr, (command, result.stderr)
    for job_dir in (job, inside):
        assert not job_dir.exists() and not coordination_root(job_dir).exists()


def test_local_launcher_hands_back_the_claims_of_a_worker_it_saw_die(make_job):
    """The local launcher reaped the worker, so it knows the owner is dead: no lease to wait."""
    from support.processes import fake_worker, wait_for

    from elastic_sharding.claims.protocol import read_claim
    from elastic_sharding.launch.local import _release_claims_of
    from elastic_sharding.launch.steps import JobRequest
    from elastic_sharding.layout import JobLayout, attempt_files
    from elastic_sharding.records import SupersededRecord

    job = make_job(rows=10, shards=2, lock_timeout_secs=3600)
    layout = JobLayout(job)
    victim = fake_worker(job, "--delay", "60")
    wait_for(lambda: read_claim(layout, "part-00000-of-00002") is not None)
    victim.kill()
    victim.communicate()
    request = JobRequest(job, None, None, 2, None)  # type: ignore[arg-type]
    assert _release_claims_of(request, victim.pid + 1) == []
    assert _release_claims_of(request, victim.pid) == ["part-00000-of-00002"]
    assert read_claim(layout, "part-00000-of-00002") is None
    attempt = next(layout.attempts_dir("part-00000-of-00002").iterdir())
    note = decode(SupersededRecord, attempt_files(attempt)["superseded"].read_bytes(), "superseded.json")
    assert f"worker process {victim.pid}" in note.reason


def test_mpi_command_places_one_worker_per_host(tmp_path):
    from elastic_sharding.launch.mpi import hostfile_hosts, mpirun_command

    hostfile = tmp_path / "hostfile"
    hostfile.write_text("# DLC MPIJob workers\nworker-0 slots=8\nworker-1 slots=8 # gpu\n\nworker-0 slots=8\n")
    assert hostfile_hosts(hostfile) == ["worker-0", "worker-1"]
    command = mpirun_command("mpirun", 2, hostfile, ["--mca", "btl", "tcp,self"], ["python", "-m", "w"], {"PYTHONPATH": "/x"})
    assert command[command.index("-np") : command.index("-np") + 4] == ["-np", "2", "-npernode", "1"]
    assert command[command.index("--hostfile") + 1] == str(hostfile)
    assert command[command.index("-x") + 1] == "PYTHONPATH" and command[-6:] == ["--mca", "btl", "tcp,self", "python", "-m", "w"]
    empty = tmp_path / "empty"
    empty.write_text("# nothing\n")
    with pytest.raises(UsageError, match="names no hosts"):
        hostfile_hosts(empty)


def test_an_instance_started_with_a_different_command_fails_the_submission(tmp_path, dlc_job):
    job, _, args = dlc_job
    slow = {"FAKE_DELAY": "1"}  # the mismatch is found right after prepare, long before the end
    procs = [
        dlc_instance(tmp_path, "instance-0", *args("run-1"), env=slow),
        dlc_instance(tmp_path, "instance-1", *args("run-1", "--max-retries", "2"), env=slow),
    ]
    assert [proc.wait(timeout=300) for proc in procs] == [2, 2]
    abort = Generation(job, "run-1").abort_record()
    assert abort is not None and "differs from the one the job was prepared with" in abort.reason
    assert "the claim/retry/poll/Ray settings differ" in abort.reason


def test_success_and_failure_are_decided_once(tmp_path):
    """A failure that races a finishing finalize: whichever outcome is published first stands."""
    gen = Generation(tmp_path / "job", "run-1")
    gen.open()
    assert gen.publish_success("PASS") is None
    assert gen.publish_abort("work", 2, "late failure") is None, "a late failure does not undo a success"
    assert gen.abort_record() is None and gen.outcome().ok

    gen = Generation(tmp_path / "job", "run-2")
    gen.open()
    first = gen.publish_abort("work", 2, "first failure")
    assert first is not None and first.reason == "first failure"
    assert gen.publish_abort("finalize", 3, "second failure").reason == "first failure"
    late = gen.publish_success("PASS")
    assert late is not None and late.reason == "first failure"
    # The deciding instance died before writing abort.lock/abort.json: the outcome still tells.
    gen = Generation(tmp_path / "job", "run-3")
    gen.open()
    gen._decide(gen._outcome(False, "prepare", 2, "decided, then died"))
    assert gen.abort_record().reason == "decided, then died"


def test_sigterm_drains_an_instance_without_failing_the_submission(tmp_path, dlc_job):
    import signal

    from support.processes import wait_for

    from elastic_sharding.claims.protocol import read_claim
    from elastic_sharding.layout import JobLayout

    job, _, args = dlc_job
    proc = dlc_instance(tmp_path, "instance-0", *args("run-1"), env={"FAKE_DELAY": "60"})
    layout = JobLayout(job)
    wait_for(lambda: job.exists() and read_claim(layout, "part-00000-of-00003") is not None, timeout=60)
    proc.send_signal(signal.SIGTERM)
    code = proc.wait(timeout=60)
    log = (tmp_path / "instance-0.log").read_text()
    assert code == 2, log[-3000:]
    assert read_claim(layout, "part-00000-of-00003") is None, "the shard is handed back at once\n" + log[-3000:]
    gen = Generation(job, "run-1")
    assert gen.abort_record() is None and gen.outcome() is None, "a drained instance does not fail the others"
    assert "received SIGTERM" in log, log[-3000:]
    # Another instance of the same submission finishes the job.
    rest = run_instances(tmp_path, 1, *args("run-1"), tag="rest-")
    assert rest == [0], logs(tmp_path, "rest-")[-3000:]
    assert merged_rows(job / "merged.jsonl") == sample_rows(30)


def test_dlc_job_prepare_then_dlc_is_one_and_the_same_job(tmp_path, dlc_job, monkeypatch):
    """`dlc_job.py prepare` uses the launchers' defaults, so `dlc` afterwards finds its own job."""
    from elastic_sharding.cli import main

    job, _, args = dlc_job
    recipe = args("x")[1]
    monkeypatch.chdir(tmp_path)
    assert main(["prepare", "--config", recipe, "--job-dir", str(job)], profile="dlc") == 0
    code = subprocess.run(
        launch_command("dlc", "--config", recipe, "--job-dir", str(job), "--run-id", "r"),
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert code.returncode == 0, code.stderr[-3000:]
    assert "already prepared with this exact request" in code.stderr and "PASS: 4 shards" in code.stderr


def test_mpi_refuses_more_ranks_than_hosts(tmp_path, run_cli):
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("a\nb\n")
    result = run_cli("mpi", "--job-dir", str(tmp_path / "job"), "--hostfile", str(hostfile), "--np", "3")
    assert result.returncode == 2 and "--np 3 is more than the 2 host(s)" in result.stderr
    assert not (tmp_path / "job").exists()


DEDUP_RECIPE = """\
project_name: launch-dedup
dataset_path: {dataset}
export_path: /tmp/ignored.jsonl
process:
  - whitespace_normalization_mapper:
  - document_deduplicator:
  - text_length_filter:
      min_len: 1
"""


@needs_unshare
@pytest.mark.parametrize("strict", [False, True], ids=["elastic", "strict"])
def test_dlc_instances_carry_a_recipe_with_a_deduplicator_through_its_stage(tmp_path, strict):
    """Three instances with their own hostnames; in strict mode each is capped per segment and
    still takes part in the stage and the segment after it."""
    rows = sample_rows(24) + [{"id": 24 + i, "text": sample_rows(24)[i * 3]["text"]} for i in range(6)]
    dataset = write_jsonl(tmp_path / "input.jsonl", rows)
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(DEDUP_RECIPE.format(dataset=dataset))
    job = tmp_path / "job"
    args = [
        "--config", str(recipe), "--job-dir", str(job), "--num-shards", "6", "--run-id", "run-1",
        "--poll-interval-secs", "0.1", "--lock-timeout-secs", "5", "--heartbeat-interval-secs", "0.5",
        "--coordinator-lease-secs", "1", "--nodes", "3", *(["--require-all-nodes"] if strict else []),
    ]  # fmt: skip
    command = " ".join(shlex.quote(part) for part in launch_command("dlc", *args))
    procs = [
        subprocess.Popen(["unshare", "--uts", "sh", "-c", f"hostname dlc-node-{i} && exec {command}"],
                         stdout=subprocess.DEVNULL, stderr=open(tmp_path / f"instance-{i}.log", "w"))
        for i in range(3)
    ]  # fmt: skip
    assert [proc.wait(timeout=300) for proc in procs] == [0, 0, 0], logs(tmp_path)
    assert merged_rows(job / "merged.jsonl") == rows[:24]
    done_hosts = {orjson.loads(p.read_bytes())["host"] for p in (job / "stages" / "1" / "state" / "done").iterdir()}
    if strict:
        assert done_hosts == {"dlc-node-0", "dlc-node-1", "dlc-node-2"}, "every capped instance must work in segment 1"
