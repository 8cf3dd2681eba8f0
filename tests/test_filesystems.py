"""A job directory on a filesystem that cannot coordinate workers is refused up front, in one line.

The probe (`fsprobe`) runs the protocol's own primitives in a private directory before `prepare`,
the launchers or a worker write anything. Every guarantee it tries is broken here once, and each
time the refusal names the job directory, the filesystem, the step and its errno, and leaves
nothing behind. On a real FUSE mount without hard links (`rclone mount`, the way clusters mount
object storage), `prepare`, `worker`, `local` and `dlc` each refuse. And an OSError always names
the file the user knows: a failed claim publish names the claim, not a hidden temporary file;
a full disk while merging names the merged file, not a shard. (GlusterFS, both modes:
`test_cluster.py`.)
"""

from __future__ import annotations

import errno
import os
import shutil
import socket
import subprocess
from pathlib import Path

import pytest
from support.fake_worker import worker_command
from support.jobs import refused, snapshot
from support.launchers import launcher_args

from elastic_sharding import confined, fsops, fsprobe
from elastic_sharding.claims.submission import coordination_root
from elastic_sharding.errors import UnsuitableFilesystem

pytestmark = pytest.mark.usefixtures("own_log_handlers")
ADVICE = "put --job-dir on a NAS/NFS/CPFS mount that every node shares"


@pytest.fixture(autouse=True)
def probe_memory(monkeypatch):
    """Each test starts with no mount known to have passed (the process remembers passes)."""
    monkeypatch.setattr(fsprobe, "_passed", set())


def contents(root: Path) -> dict[str, bytes | None]:
    """Every entry under `root` with its bytes: what is there, not when a directory last changed
    (a probe inside a directory changes its mtime)."""
    return {name: content for name, (content, _) in snapshot(root).items()}


def probe_dirs(directory: Path) -> list[str]:
    return sorted(name for name in os.listdir(directory) if name.startswith(fsprobe.PROBE_PREFIX))


def test_the_probe_passes_on_the_local_disk_and_leaves_nothing(tmp_path, make_job):
    job = make_job(rows=10, shards=2)
    before = contents(tmp_path)
    assert fsprobe.probe(tmp_path) is None
    fsprobe.check_job_filesystem(tmp_path / "new-job", creating=True)  # probed in its parent
    fsprobe._passed.clear()
    fsprobe.check_job_filesystem(job)  # probed inside the job directory
    assert contents(tmp_path) == before


def test_the_mount_of_a_path_comes_from_mountinfo(tmp_path, monkeypatch):
    mountinfo = tmp_path / "mountinfo"
    mountinfo.write_text(
        "22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/vda rw\n"
        "30 22 0:40 / /mnt/with\\040space rw,nosuid - fuse.rclone remote:bucket rw,user_id=0\n"
        "31 22 0:41 / /mnt/nas rw shared:5 master:2 - nfs4 server:/export rw,vers=4.2\n"
        "32 31 0:42 / /mnt/nas rw - fuse.s3fs s3fs rw\n"
    )
    monkeypatch.setattr(fsprobe, "MOUNTINFO", mountinfo)
    assert fsprobe.mount_of(Path("/mnt/with space/jobs/a")) == fsprobe.Mount(
        "30", Path("/mnt/with space"), "fuse.rclone", "remote:bucket"
    )
    assert fsprobe.mount_of(Path("/mnt/nas/job")).fstype == "fuse.s3fs", "of mounts stacked on one point, the top one"
    assert fsprobe.mount_of(Path("/mnt/nas")).fstype == "fuse.s3fs"
    assert fsprobe.mount_of(Path("/mnt/nasty/job")).fstype == "ext4", "a mount point is a whole path component"
    monkeypatch.setattr(fsprobe, "MOUNTINFO", tmp_path / "missing")
    assert fsprobe.mount_of(Path("/mnt/nas")) is None
    with pytest.raises(UnsuitableFilesystem, match="filesystem type unknown .*ENOSPC"):
        monkeypatch.setattr(confined, "create_file", _raise(errno.ENOSPC))
        fsprobe.check_job_filesystem(tmp_path / "job", creating=True)


def _raise(code: int):
    def fail(*args, **kwargs):
        raise OSError(code, os.strerror(code))

    return fail


def _copy_link(source, target, **kwargs):
    """A link() that copies over whatever has the name: how an object store 'links'."""
    shutil.copyfile(source, target)


def _link_eperm_when_taken(real):
    def link(source, target, **kwargs):
        if os.path.lexists(target):
            raise PermissionError(errno.EPERM, os.strerror(errno.EPERM), source, None, target)
        return real(source, target)

    return link


def _replace_that_drops(source, target, **kwargs):
    os.unlink(source)


BROKEN = {
    "link fails with EIO (rclone)": (
        lambda mp: mp.setattr(os, "link", _raise(errno.EIO)),
        ["publishing a record by hard link (link): failed with EIO (Input/output error)"],
    ),
    "a second link overwrites (copy semantics)": (
        lambda mp: mp.setattr(os, "link", _copy_link),
        ["a second link to the same name: succeeded: two creators would both own one name"],
    ),
    "a second link fails with EPERM, not EEXIST (sshfs)": (
        lambda mp: mp.setattr(os, "link", _link_eperm_when_taken(os.link)),
        ["a second link to the same name: failed with EPERM (Operation not permitted) instead of EEXIST"],
    ),
    "exclusive create lets a second creator in": (
        lambda mp: mp.setattr(
            confined,
            "open_nofollow",
            lambda path, flags=os.O_RDONLY, mode=confined.FILE_MODE: os.open(path, flags & ~os.O_EXCL, mode),
        ),
        ["a second exclusive create of the same name: succeeded"],
    ),
    "a fresh open reads other bytes": (
        lambda mp: mp.setattr(confined, "read_bytes_nofollow", lambda path: b""),
        ["reading a written and fsynced file back through a fresh open: returned other bytes"],
    ),
    "rename does not replace": (
        lambda mp: mp.setattr(os, "replace", _replace_that_drops),
        ["replacing a record atomically (rename): the replaced record reads back with other bytes"],
    ),
    "a listing misses new names": (
        lambda mp: mp.setattr(confined, "list_dir", lambda path: {}),
        ["listing the directory: shows [] instead of ['created', 'linked']"],
    ),
}


@pytest.mark.parametrize("broken", list(BROKEN))
def test_each_broken_guarantee_is_refused_in_one_line_naming_the_step(tmp_path, monkeypatch, broken):
    patch, fragments = BROKEN[broken]
    job = tmp_path / "job"
    before = snapshot(tmp_path)
    fstype = fsprobe.mount_of(tmp_path).fstype
    with monkeypatch.context() as mp:
        patch(mp)
        with pytest.raises(UnsuitableFilesystem) as caught:
            fsprobe.check_job_filesystem(job, creating=True)
    message = str(caught.value)
    assert "\n" not in message
    for fragment in (f"{job}: the job directory's filesystem cannot coordinate workers ({fstype} mounted at", *fragments, ADVICE):
        assert fragment in message, (fragment, message)
    assert snapshot(tmp_path) == before, "the probe directory is removed whatever failed"
    assert caught.value.exit_code == 2


@pytest.mark.parametrize(
    ("code", "advice"),
    [
        (errno.EACCES, "check the directory's owner and mode"),
        (errno.EROFS, "mount it read-write on this node"),
        (errno.ENOSPC, "free some space"),
    ],
)
def test_a_directory_that_cannot_be_written_gets_its_own_advice(tmp_path, monkeypatch, code, advice):
    job = tmp_path / "job"
    monkeypatch.setattr(os, "mkdir", _raise(code))
    with pytest.raises(UnsuitableFilesystem) as caught:
        fsprobe.check_job_filesystem(job, creating=True)
    name = errno.errorcode[code]
    assert f"{job}: cannot write the job directory here (" in str(caught.value)
    assert f"creating a probe directory (mkdir): failed with {name} ({os.strerror(code)}); {advice}" in str(caught.value)


def test_a_probe_directory_that_cannot_be_removed_is_a_failure(tmp_path, monkeypatch):
    with monkeypatch.context() as mp:
        mp.setattr(os, "rmdir", _raise(errno.EBUSY))
        with pytest.raises(UnsuitableFilesystem, match=r"removing the probe directory: failed with EBUSY"):
            fsprobe.check_job_filesystem(tmp_path)
    assert len(probe_dirs(tmp_path)) == 1
    fsprobe.remove_stale_probes(tmp_path)  # its owner (this process) is alive: kept
    assert len(probe_dirs(tmp_path)) == 1


@pytest.mark.parametrize("fstype", ["fuse.rclone", "fuse.s3fs", "fuse.ossfs", "fuse.goofys", "fuse.gcsfuse"])
def test_a_known_object_storage_mount_is_refused_even_when_the_probe_passes(tmp_path, monkeypatch, fstype):
    mountinfo = tmp_path / "mountinfo"
    mountinfo.write_text(f"22 1 8:1 / / rw - ext4 /dev/vda rw\n99 22 0:99 / {tmp_path} rw - {fstype} bucket:/data rw\n")
    monkeypatch.setattr(fsprobe, "MOUNTINFO", mountinfo)
    assert fsprobe.probe(tmp_path) is None
    with pytest.raises(UnsuitableFilesystem) as caught:
        fsprobe.check_job_filesystem(tmp_path / "job", creating=True)
    message = str(caught.value)
    assert f"{tmp_path / 'job'}: the job directory is on {fstype} mounted at {tmp_path} from bucket:/data" in message
    assert "an object-storage mount" in message and "a probe passed here" in message and ADVICE in message
    assert "stage the job directory on such a POSIX mount" in message
    assert probe_dirs(tmp_path) == []


def test_a_mount_that_passed_is_not_probed_again_in_the_process_but_one_that_failed_is(tmp_path, monkeypatch):
    calls = []
    real = fsprobe.probe
    monkeypatch.setattr(fsprobe, "probe", lambda directory: calls.append(directory) or real(directory))
    with monkeypatch.context() as mp:
        mp.setattr(os, "link", _raise(errno.EIO))
        for _ in range(2):
            with pytest.raises(UnsuitableFilesystem):
                fsprobe.check_job_filesystem(tmp_path / "job", creating=True)
    fsprobe.check_job_filesystem(tmp_path / "job", creating=True)
    fsprobe.check_job_filesystem(tmp_path / "other", creating=True)
    assert len(calls) == 3


def test_a_killed_probe_leaves_its_directory_and_the_next_one_on_the_host_removes_it(make_job, tmp_path):
    job = make_job(rows=12, shards=3)
    worker = worker_command(job)
    killed = subprocess.run(worker, env={**os.environ, "ELASTIC_SHARD_CRASH_AT": "probing"}, capture_output=True, timeout=120)
    assert killed.returncode == -9
    left = probe_dirs(job)
    assert len(left) == 1 and left[0].startswith(f"{fsprobe.PROBE_PREFIX}{socket.gethostname()}."), left
    dead = subprocess.Popen(["true"])
    dead.wait()
    foreign = [
        f"{fsprobe.PROBE_PREFIX}another-host.{dead.pid}.0000",
        f"{fsprobe.PROBE_PREFIX}{socket.gethostname()}.{os.getpid()}.0000",
    ]
    for name in foreign:
        (job / name).mkdir()
    finished = subprocess.run(worker, capture_output=True, text=True, timeout=120)
    assert finished.returncode == 0, finished.stderr
    assert probe_dirs(job) == sorted(foreign), "the dead probe of this host is gone; another host's and a live one's stay"


# -- every OSError names the file it is about ------------------------------------------------------


def test_a_failed_claim_publish_names_the_claim_record(make_job, run_cli, monkeypatch):
    job = make_job(rows=12, shards=3)
    real = os.link

    def link(source, target, **kwargs):
        # A worker links relative to the claims directory it holds open (confined.anchored).
        where = os.readlink(f"/proc/self/fd/{kwargs['dst_dir_fd']}") if "dst_dir_fd" in kwargs else ""
        if "/state/locks/" in f"{where}/{target}":
            raise OSError(errno.EIO, os.strerror(errno.EIO), str(source), None, str(target))
        return real(source, target, **kwargs)

    monkeypatch.setattr(os, "link", link)
    line = refused(run_cli("worker", "--job-dir", str(job), "--runner", "process"))
    assert line.endswith(
        f"error: link() of its temporary file failed: Input/output error ({job}/state/locks/part-00000-of-00003.json)"
    ), line
    assert os.listdir(job / "state" / "locks") == [], "no temporary file is left"


def test_a_full_disk_while_merging_names_the_merged_file_not_a_shard(done_job, tmp_path, run_cli, monkeypatch):
    class FullDisk:
        def __init__(self, file):
            self.file = file

        def write(self, data):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

        def __getattr__(self, name):
            return getattr(self.file, name)

    real_init = fsops.AtomicOutput.__init__

    def init(self, *args, **kwargs):
        real_init(self, *args, **kwargs)
        self.file = FullDisk(self.file)

    monkeypatch.setattr(fsops.AtomicOutput, "__init__", init)
    monkeypatch.setattr(os, "copy_file_range", _raise(errno.ENOSPC))  # merge copies the shard outputs in the kernel
    monkeypatch.setattr(os, "pwrite", _raise(errno.ENOSPC))  # or decompresses them and writes each at its offset
    output = tmp_path / "out" / "merged.jsonl"
    line = refused(run_cli("merge", "--job-dir", str(done_job), "--output", str(output)))
    assert line.endswith(f"error: writing its temporary file failed: No space left on device ({output})"), line
    assert "part-" not in line
    assert not output.parent.exists(), "no temporary file, and the directory merge made is gone"


def test_record_errors_name_the_record_and_keep_their_class(tmp_path, monkeypatch):
    target = tmp_path / "record.json"
    with pytest.raises(FileNotFoundError) as caught:
        fsops.replace_atomic(tmp_path / "gone" / "record.json", b"{}")
    assert caught.value.filename == str(tmp_path / "gone" / "record.json")
    assert caught.value.strerror == "creating a temporary file for it failed: No such file or directory"
    monkeypatch.setattr(os, "replace", _raise(errno.EIO))
    with pytest.raises(OSError) as caught:
        fsops.replace_atomic(target, b"{}")
    assert (caught.value.filename, caught.value.strerror) == (
        str(target),
        "rename() of its temporary file failed: Input/output error",
    )
    assert os.listdir(tmp_path) == []


# -- a real FUSE mount without hard links ----------------------------------------------------------


def refusal_fragments(job: Path) -> tuple[str, ...]:
    return (
        f"{job}: the job directory is on fuse.rclone mounted at",
        "an object-storage mount (rclone mount)",
        "publishing a record by hard link (link): failed with EIO (Input/output error)",
        ADVICE,
    )


def test_prepare_and_worker_refuse_a_job_directory_on_an_rclone_mount(rclone_mount, make_job, recipe_file, tmp_path, run_cli):
    bucket = rclone_mount.parent / "bucket"
    failure = fsprobe.probe(rclone_mount)
    assert failure is not None and (failure.step, failure.errno) == ("publishing a record by hard link (link)", errno.EIO)
    assert os.listdir(rclone_mount) == [] and os.listdir(bucket) == []

    job = rclone_mount / "job"
    local = make_job(rows=12, shards=3)
    proc = run_cli("prepare", "--config", str(local / "recipe.yaml"), "--dataset-path", str(tmp_path / "job-input.jsonl"),
                   "--job-dir", str(job), "--num-shards", "3")  # fmt: skip
    refused(proc, *refusal_fragments(job))
    assert os.listdir(rclone_mount) == [] and os.listdir(bucket) == [], "no job, no staging, no probe directory"

    shutil.copytree(local, job)  # a job staged elsewhere and copied onto the mount
    before = snapshot(job)
    refused(run_cli("worker", "--job-dir", str(job)), *refusal_fragments(job))
    assert snapshot(job) == before, "the worker wrote nothing"
    assert probe_dirs(job) == [] and probe_dirs(bucket / "job") == []


@pytest.mark.parametrize("command", ["local", "dlc"])
def test_launchers_refuse_a_job_directory_on_an_rclone_mount(rclone_mount, tmp_path, launch, command):
    job = rclone_mount / "job"
    assert launch(command, "--job-dir", str(job), *launcher_args(command, tmp_path)) == [2]
    text = (tmp_path / f"{command}-0.log").read_text()
    refused(subprocess.CompletedProcess([], 2, "", text), *refusal_fragments(job))
    assert "prepared" not in text and "starting" not in text.lower()
    assert os.listdir(rclone_mount) == [] and os.listdir(rclone_mount.parent / "bucket") == []
    assert not coordination_root(job).exists()


def test_an_output_on_an_rclone_mount_is_refused_up_front_unless_merge_may_rename_it(
    rclone_mount, done_job, tmp_path, run_cli, launch
):
    output = rclone_mount / "results" / "merged.jsonl"
    why = f"--output {output}: cannot publish it create-once in {output.parent}: link() of its temporary file failed"
    refused(run_cli("merge", "--job-dir", str(done_job), "--output", str(output)), why, "merge --overwrite")
    assert os.listdir(rclone_mount) == [], "the directory it made is gone"
    assert launch("local", "--job-dir", str(tmp_path / "job2"), "--output", str(output), *launcher_args("local", tmp_path)) == [2]
    refused(subprocess.CompletedProcess([], 2, "", (tmp_path / "local-0.log").read_text()), why)
    assert not (tmp_path / "job2").exists(), "refused before anything started"
    assert run_cli("merge", "--job-dir", str(done_job), "--output", str(output), "--overwrite").returncode == 0
    here = tmp_path / "merged-here.jsonl"
    assert run_cli("merge", "--job-dir", str(done_job), "--output", str(here)).returncode == 0
    assert output.read_bytes() == here.read_bytes()


def test_a_temporary_name_that_exists_already_is_replaced_by_another(tmp_path, monkeypatch):
    """A NAS client that retried a create whose reply was lost reports our own new temporary
    file as existing (GlusterFS under load): that one is removed, another name taken."""
    real = os.open
    retried: list[str] = []

    def retrying_client(path, flags, *args, **kwargs):
        if flags & os.O_EXCL and not retried:
            retried.append(str(path))
            os.close(real(path, flags, *args, **kwargs))
            raise FileExistsError(17, "File exists", str(path))
        return real(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", retrying_client)
    assert fsops.publish_once(tmp_path / "record.json", b"{}\n")
    assert retried and (tmp_path / "record.json").read_bytes() == b"{}\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["record.json"]


def test_a_unique_directory_whose_mkdir_was_retried_is_taken_as_made(tmp_path, monkeypatch):
    """A retried mkdir of an attempt directory (its name carries a random token) reports the
    directory it made as existing (GlusterFS at 16 nodes): an empty directory there is ours; a
    name that holds anything else, or is not a directory, is not."""
    real = os.mkdir

    def retrying_client(path, *args, **kwargs):
        real(path, *args, **kwargs)
        raise FileExistsError(17, "File exists", str(path))

    monkeypatch.setattr(os, "mkdir", retrying_client)
    assert fsops.make_unique_dir(tmp_path / "attempt-1")
    assert not fsops.make_dir_exclusive(tmp_path / "attempt-2")
    monkeypatch.setattr(os, "mkdir", real)
    taken = tmp_path / "attempt-3"
    taken.mkdir()
    (taken / "attempt.json").write_bytes(b"{}")
    assert not fsops.make_unique_dir(taken)
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "attempt-4").symlink_to(tmp_path / "elsewhere")
    assert not fsops.make_unique_dir(tmp_path / "attempt-4")
    (tmp_path / "attempt-5").write_bytes(b"")
    assert not fsops.make_unique_dir(tmp_path / "attempt-5")


def test_a_unique_directory_that_mkdir_says_exists_before_it_shows_is_made(tmp_path, monkeypatch):
    """GlusterFS at 32 nodes: mkdir of an attempt directory says EEXIST to its lone creator while
    the directory does not show (yet); trying again makes it, and the attempt goes on."""
    real = os.mkdir
    told = []

    def flaky(path, *args, **kwargs):
        if not told:
            told.append(path)
            raise FileExistsError(17, "File exists", str(path))
        return real(path, *args, **kwargs)

    monkeypatch.setattr(os, "mkdir", flaky)
    assert fsops.make_unique_dir(tmp_path / "attempt-1")
    assert told and (tmp_path / "attempt-1").is_dir()
