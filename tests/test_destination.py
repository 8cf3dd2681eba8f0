"""`--output` in a directory that does not exist yet, for every command that takes one (`merge`,
`report`, `dlc`, `mpi`, `local`, the two-node wrapper): the missing directories are created with the
tool's modes and the job succeeds; a place that cannot take the file (a file in the way, a
read-only mount, permission denied) is refused in one line before any work, leaving nothing
behind; an existing output is still refused without `--overwrite` (fake runner, fast)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import orjson
import pytest
from support.e2e_support import needs_unshare
from support.jobs import refused, snapshot
from support.launchers import launcher_args
from support.processes import unprivileged_prefix

import elastic_sharding
from elastic_sharding import confined, fsops
from elastic_sharding.claims.submission import coordination_root
from elastic_sharding.destination import prepare_destination

pytestmark = pytest.mark.usefixtures("own_log_handlers")

NEW = Path("new") / "deeper"  # two levels that do not exist yet


def created_mode() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return confined.DIR_MODE & ~mask


def assert_made(root: Path, output: Path) -> None:
    """`output` exists, and every directory between `root` and it was made with the tool's mode."""
    assert output.is_file()
    directory = output.parent
    while directory != root:
        assert directory.stat().st_mode & 0o7777 == created_mode(), directory
        directory = directory.parent


@pytest.fixture
def places(tmp_path: Path):
    """Places where an output cannot be created, each with the words its refusal must contain."""
    blocker = tmp_path / "a-file"
    blocker.write_text("in the way\n")
    dangling = tmp_path / "dangling"
    dangling.symlink_to(tmp_path / "nowhere")
    return {
        "file in the way": (blocker / "sub" / "out.jsonl", [f"{blocker} is not a directory"]),
        "file as the directory": (blocker / "out.jsonl", [f"{blocker} is not a directory"]),
        "broken link": (dangling / "out.jsonl", [f"{dangling} is a broken symbolic link"]),
    }


@pytest.fixture
def read_only(tmp_path: Path):
    """A read-only tmpfs (root only), unmounted afterwards."""
    mount = tmp_path / "read-only"
    mount.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=64k", "tmpfs", str(mount)]).returncode:
        pytest.skip("needs root to mount a read-only tmpfs")
    yield mount
    subprocess.run(["umount", "-l", str(mount)], check=True)


def cannot_create(tmp_path: Path, places: dict, read_only: Path) -> dict:
    cases = dict(places)
    cases["read-only mount, new directory"] = (read_only / "sub" / "out.jsonl", [f"{read_only}/sub", "Read-only file system"])
    cases["read-only mount, existing directory"] = (read_only / "out.jsonl", [f"cannot write in {read_only}", "Read-only"])
    return cases


# -- merge and report ----------------------------------------------------------------------------


def test_merge_creates_the_missing_directories_of_output(done_job, tmp_path, run_cli):
    output = tmp_path / NEW / "merged.jsonl"
    result = run_cli("merge", "--job-dir", str(done_job), "--output", str(output), "--json")
    assert result.returncode == 0, result.stderr
    assert_made(tmp_path, output)
    assert json.loads(result.stdout)["output"] == str(output)
    assert [orjson.loads(line)["id"] for line in output.read_bytes().splitlines()] == list(range(20))
    assert sorted(p.name for p in output.parent.iterdir()) == ["merged.jsonl"], "no temporary file is left"
    refused(run_cli("merge", "--job-dir", str(done_job), "--output", str(output)), f"{output} already exists", "--overwrite")
    assert run_cli("merge", "--job-dir", str(done_job), "--output", str(output), "--overwrite").returncode == 0


def test_merge_and_report_refuse_a_place_that_cannot_be_created_before_any_work(done_job, tmp_path, run_cli, places, read_only):
    before = snapshot(tmp_path)
    for what, (output, fragments) in cannot_create(tmp_path, places, read_only).items():
        for command in ("merge", "report"):
            line = refused(
                run_cli(command, "--job-dir", str(done_job), "--output", str(output)), f"--output {output}", *fragments
            )
            assert "Traceback" not in line, what
    assert snapshot(tmp_path) == before, "nothing was written: no directory, no temporary file, no merge.json"


def test_merge_removes_the_directories_it_made_when_it_fails(done_job, tmp_path, run_cli):
    (done_job / "attempts").rename(tmp_path / "moved-attempts")  # the shard outputs are gone
    (done_job / "attempts").mkdir()
    output = tmp_path / NEW / "merged.jsonl"
    refused(run_cli("merge", "--job-dir", str(done_job), "--output", str(output)))
    assert not (tmp_path / "new").exists()


def test_report_creates_the_missing_directories_of_output(done_job, tmp_path, run_cli):
    output = tmp_path / NEW / "report.html"
    assert run_cli("report", "--job-dir", str(done_job), "--output", str(output)).returncode == 0
    assert_made(tmp_path, output)
    assert output.read_text().startswith("<!DOCTYPE html>")


def test_permission_denied_is_refused_in_one_line(done_job, tmp_path):
    prefix = unprivileged_prefix(tmp_path)
    closed = tmp_path / "closed"
    closed.mkdir(mode=0o555)
    cases = {
        "merge": closed / "sub" / "merged.jsonl",
        "report": closed / "report.html",
    }
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(Path(elastic_sharding.__file__).parents[1]), *sys.path]))
    before = snapshot(tmp_path)
    try:
        for command, output in cases.items():
            proc = subprocess.run(
                [*prefix, sys.executable, "-m", "elastic_sharding", command, "--job-dir", str(done_job), "--output", str(output)],
                capture_output=True, text=True, env=env, timeout=120,
            )  # fmt: skip
            refused(proc, f"--output {output}", "Permission denied")
    finally:
        closed.chmod(0o755)
    assert snapshot(tmp_path) == before


def test_an_output_may_not_take_the_name_of_the_jobs_own_files(done_job, run_cli):
    before = snapshot(done_job)
    for name in ("manifest.json", "merge.json", "shards/x.jsonl", "state/out.jsonl", "attempts/y/z.jsonl"):
        output = done_job / name
        refused(run_cli("merge", "--job-dir", str(done_job), "--output", str(output), "--overwrite"), "inside the job's own")
    assert snapshot(done_job) == before
    inside = done_job / "outputs" / "merged.jsonl"  # a directory of the user's own inside the job directory
    assert run_cli("merge", "--job-dir", str(done_job), "--output", str(inside)).returncode == 0 and inside.is_file()


# -- the launchers -------------------------------------------------------------------------------


@pytest.mark.parametrize("command", ["dlc", "mpi", "local"])
def test_launchers_create_the_missing_directories_of_output(tmp_path, launch, command):
    job, output = tmp_path / "job", tmp_path / NEW / "merged.jsonl"
    count = 3 if command == "dlc" else 1  # three dlc instances create the same directories at once
    codes = launch(command, "--job-dir", str(job), "--output", str(output), *launcher_args(command, tmp_path), count=count)
    assert codes == [0] * count, (tmp_path / f"{command}-0.log").read_text()[-3000:]
    assert_made(tmp_path, output)
    assert [orjson.loads(line)["id"] for line in output.read_bytes().splitlines()] == list(range(12))
    assert not (job / "merged.jsonl").exists()


@pytest.mark.parametrize("command", ["dlc", "mpi", "local"])
def test_launchers_refuse_a_place_that_cannot_be_created_before_anything_starts(tmp_path, launch, command, places, read_only):
    job, extra, log = tmp_path / "job", launcher_args(command, tmp_path), tmp_path / f"{command}-0.log"
    before = snapshot(tmp_path)
    for what, (output, fragments) in cannot_create(tmp_path, places, read_only).items():
        assert launch(command, "--job-dir", str(job), "--output", str(output), *extra) == [2], what
        text = log.read_text()
        log.unlink()
        refused(subprocess.CompletedProcess([], 2, "", text), f"--output {output}", *fragments)
        assert "prepared" not in text and "Starting DLC worker" not in text, what
        assert not job.exists() and not coordination_root(job).exists(), what
        assert snapshot(tmp_path) == before, what


@pytest.mark.parametrize("command", ["dlc", "local"])
def test_launchers_refuse_an_existing_output_up_front_but_keep_their_own_merge(tmp_path, launch, command):
    job, output = tmp_path / "job", tmp_path / "out.jsonl"
    output.write_text("somebody else's file\n")
    extra = launcher_args(command, tmp_path)
    assert launch(command, "--job-dir", str(job), "--output", str(output), *extra) == [2]
    text = (tmp_path / f"{command}-0.log").read_text()
    refused(subprocess.CompletedProcess([], 2, "", text), f"--output {output} already exists and is not this job's merge")
    assert not job.exists() and output.read_text() == "somebody else's file\n"
    output.unlink()
    assert launch(command, "--job-dir", str(job), "--output", str(output), *extra) == [0]
    merged = snapshot(tmp_path)["out.jsonl"]
    assert launch(command, "--job-dir", str(job), "--output", str(output), *extra) == [0], "a rerun keeps its own merge"
    assert snapshot(tmp_path)["out.jsonl"] == merged, "and does not rewrite it"
    other = tmp_path / "other.jsonl"
    other.write_bytes(output.read_bytes())
    assert launch(command, "--job-dir", str(job), "--output", str(other), *extra) == [2]
    assert f"this job was merged into {output}" in (tmp_path / f"{command}-0.log").read_text()


@needs_unshare
def test_two_node_wrapper_creates_the_missing_directories_of_output(tmp_path, launch):
    job, output = tmp_path / "two-node", tmp_path / NEW / "two-node.jsonl"
    hosts = ("unshare", "--uts", "sh", "-c", 'hostname "node-{i}" && exec "$@"', "sh")
    blocker = tmp_path / "a-file"
    blocker.write_text("in the way\n")
    blocked = blocker / "sub" / "two-node.jsonl"
    codes = launch(
        "dlc", f"--job-dir={job}", "--output", str(blocked), "--num-shards", "2", "--run-id", "t", script=("--two-node",)
    )
    text = (tmp_path / "dlc-0.log").read_text()
    (tmp_path / "dlc-0.log").unlink()
    assert codes == [2] and not job.exists() and not coordination_root(job).exists()
    refused(subprocess.CompletedProcess([], 2, "", text), f"--output {blocked}", f"{blocker} is not a directory")
    codes = launch("dlc", f"--job-dir={job}", "--output", str(output), "--num-shards", "2", "--run-id", "t",
                   count=2, prefix=hosts, script=("--two-node",))  # fmt: skip
    assert codes == [0, 0], (tmp_path / "dlc-0.log").read_text()[-3000:]
    assert "PASS: 2 shards were completed by 2 node(s)" in (tmp_path / "dlc-1.log").read_text()
    assert_made(tmp_path, output)
    assert not (job / "two-node-merged.jsonl").exists()


# -- the primitive -------------------------------------------------------------------------------


def test_make_dirs_races_and_follows_links(tmp_path):
    target = tmp_path / "a" / "b" / "c"
    made: list[list[Path]] = []
    errors: list[BaseException] = []

    def make() -> None:
        try:
            made.append(fsops.make_dirs(target))
        except BaseException as exc:  # noqa: BLE001 - reported by the assertion below
            errors.append(exc)

    threads = [threading.Thread(target=make) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == [] and len(made) == 8
    assert target.is_dir() and sorted(p for created in made for p in created) == [tmp_path / "a", target.parent, target]
    (tmp_path / "link").symlink_to(tmp_path / "a")
    assert fsops.make_dirs(tmp_path / "link" / "b" / "c" / "d") == [tmp_path / "link" / "b" / "c" / "d"]


def test_make_dirs_waits_out_a_stale_handle_and_gives_up_after_a_while(tmp_path, monkeypatch):
    """A caching NAS client whose cached handle another node replaced gets ESTALE until the entry
    expires (seen on GlusterFS when participants create a stage directory together)."""
    import errno

    real_mkdir = os.mkdir
    stale = {"left": 3}

    def mkdir(path, mode=0o777):
        if Path(path).name == "stage" and stale["left"]:
            stale["left"] -= 1
            raise OSError(errno.ESTALE, "Stale file handle", str(path))
        return real_mkdir(path, mode)

    monkeypatch.setattr(os, "mkdir", mkdir)
    assert fsops.make_dirs(tmp_path / "stage" / "units") == [tmp_path / "stage", tmp_path / "stage" / "units"]
    stale["left"] = 10**9
    monkeypatch.setattr(fsops, "STALE_HANDLE_SECS", 0.1)
    with pytest.raises(OSError, match="Stale file handle"):
        fsops.make_dirs(tmp_path / "other" / "stage")
    assert not (tmp_path / "other").exists(), "what it made is removed again"


def test_make_dirs_removes_what_it_made_when_a_level_fails(tmp_path, monkeypatch):
    real_mkdir = os.mkdir

    def mkdir(path, mode=0o777):
        if Path(path).name == "c":
            raise PermissionError(13, "Permission denied", str(path))
        real_mkdir(path, mode)

    monkeypatch.setattr(os, "mkdir", mkdir)
    with pytest.raises(PermissionError) as caught:
        fsops.make_dirs(tmp_path / "a" / "b" / "c" / "d")
    assert caught.value.filename == str(tmp_path / "a" / "b" / "c")
    assert not (tmp_path / "a").exists()


@pytest.mark.parametrize("make", [fsops.ensure_dir, fsops.make_dirs], ids=["ensure_dir", "make_dirs"])
def test_a_directory_that_mkdir_says_exists_before_it_shows_is_waited_for(tmp_path, monkeypatch, make):
    """GlusterFS's caching mode (seen in the fault matrix): mkdir says EEXIST, and the directory
    shows on this node only a moment later."""
    real_mkdir = os.mkdir
    target = tmp_path / "shard"
    told = threading.Event()

    def mkdir(path, mode=0o777):
        if Path(path) != target:
            return real_mkdir(path, mode)
        if not told.is_set():  # "created" on the server: shows here in 0.1 s, EEXIST meanwhile
            told.set()
            threading.Timer(0.1, real_mkdir, (path, mode)).start()
        raise FileExistsError(17, "File exists", str(path))

    monkeypatch.setattr(os, "mkdir", mkdir)
    make(target)
    assert told.is_set() and target.is_dir()
    never = tmp_path / "never"
    monkeypatch.setattr(
        os, "mkdir", lambda path, mode=0o777: (_ for _ in ()).throw(FileExistsError(17, "File exists", str(path)))
    )
    with pytest.raises(FileExistsError, match="never shows"):
        make(never)


def test_mkdir_told_enoent_in_a_parent_that_shows_is_tried_again(tmp_path, monkeypatch):
    """CI, Slurm array tasks on a caching GlusterFS volume: two nodes opened one coordination
    directory at once; the one whose mkdir said EEXIST saw the directory and was then told ENOENT
    creating `stale` inside it, failing its task. A parent that does not show still fails at once."""
    real_mkdir = os.mkdir
    parent = tmp_path / "generation"
    parent.mkdir()
    calls = []

    def settling_mkdir(path, mode=0o777):
        calls.append(path)
        if len(calls) < 3:
            raise FileNotFoundError(2, "No such file or directory", str(path))
        return real_mkdir(path, mode)

    monkeypatch.setattr(os, "mkdir", settling_mkdir)
    fsops.ensure_dir(parent / "stale")
    assert len(calls) == 3 and (parent / "stale").is_dir()
    calls.clear()
    with pytest.raises(FileNotFoundError):
        fsops.ensure_dir(tmp_path / "gone" / "stale")
    assert len(calls) == 1


def test_a_directory_that_reads_missing_for_a_moment_after_a_racing_mkdir_is_tried_again(tmp_path, monkeypatch):
    """CI, a caching GlusterFS volume: three `dlc` instances created one --output directory at
    once, and the loser of the mkdir race saw it and was then told ENOENT when it created a file
    in it, until its client's cache settled; it failed at once and the other two waited for it."""
    output = tmp_path / NEW / "merged.jsonl"
    real_probe, calls = fsops.probe_create, []

    def settling_probe(target, create_once=False):
        calls.append(target)
        if len(calls) < 3:
            raise FileNotFoundError(2, "No such file or directory", str(target.parent / ".probe"))
        real_probe(target, create_once)

    monkeypatch.setattr(fsops, "probe_create", settling_probe)
    destination = prepare_destination(output, create_once=True)
    assert len(calls) == 3 and output.parent.is_dir()
    assert destination.created == [tmp_path / "new", tmp_path / NEW]
