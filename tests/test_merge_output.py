"""merge without a serial copy: the merged file built with copy_file_range (and its read/write
fallback), the directory output (one JSONL per shard, hard-linked or copied, an index written last,
renamed into place whole), existing directories and --overwrite, the launchers' finalize with a
directory output (fake runner, fast). The `job` fixture (tests/conftest.py): four shards, the third
with no rows left. `verify` of both forms is in test_verify.py, merge's refusals in test_merge.py."""

from __future__ import annotations

import errno
import hashlib
import os
import subprocess
from pathlib import Path

import orjson
import pytest
from support.jobs import cli, refused, snapshot
from support.launchers import launcher_args
from support.outputs import hidden_leftovers, keep, output_path, records, rewrite_output

import elastic_sharding.finish.directory_output as directory_mod
import elastic_sharding.finish.merge as merge_mod
from elastic_sharding import destination
from elastic_sharding.destination import INDEX_NAME
from elastic_sharding.errors import IntegrityError
from elastic_sharding.finish import parallel_copy
from elastic_sharding.finish.merge import merge
from elastic_sharding.finish.verify import verify
from elastic_sharding.layout import JobLayout

pytestmark = pytest.mark.usefixtures("own_log_handlers")


def parts(directory: Path) -> list[Path]:
    """The data files of a directory output, as a directory reader lists them (hidden ones skipped)."""
    return sorted(p for p in directory.iterdir() if not p.name.startswith("."))


def concatenated(directory: Path) -> bytes:
    return b"".join(p.read_bytes() for p in parts(directory))


def raising(code: int):
    def fail(*args, **kwargs):
        raise OSError(code, os.strerror(code))

    return fail


# -- the two forms ---------------------------------------------------------------------------------


def test_a_directory_output_is_the_merged_file_cut_at_shard_boundaries(job, tmp_path):
    single = merge(job, tmp_path / "merged.jsonl", quiet=True)
    merged = (tmp_path / "merged.jsonl").read_bytes()
    assert single.form == "file" and single.sha256 == hashlib.sha256(merged).hexdigest() and single.bytes == len(merged)
    assert [orjson.loads(line)["id"] for line in merged.splitlines()] == [i for i in range(40) if keep({"id": i})]

    out = tmp_path / "out"
    record = merge(job, f"{out}/", quiet=True)  # a trailing slash asks for a directory
    names = sorted(os.listdir(out))
    assert names == [INDEX_NAME, "part-00000-of-00004.jsonl", "part-00001-of-00004.jsonl", "part-00003-of-00004.jsonl"]
    assert concatenated(out) == merged, "the files in name order are the merged file, byte for byte"

    data = (out / INDEX_NAME).read_bytes()
    index = orjson.loads(data)
    assert index["job_id"] == JobLayout(job).load_manifest().job_id
    assert (index["rows"], index["bytes"], index["files"]) == (single.rows, single.bytes, 3)
    completions = records(job)
    for entry, done in zip(index["entries"], completions):
        assert (entry["shard_id"], entry["attempt_id"], entry["rows"], entry["bytes"], entry["sha256"]) == (
            done["shard_id"],
            done["attempt_id"],
            done["output_rows"],
            done["output_bytes"],
            done["output_sha256"],
        )
        if entry["name"] is not None:
            assert hashlib.sha256((out / entry["name"]).read_bytes()).hexdigest() == entry["sha256"]
    assert [e["name"] for e in index["entries"]][2] is None, "a shard without rows publishes no (empty) file"

    saved = orjson.loads(JobLayout(job).merge_record.read_bytes())
    assert (saved["form"], saved["output"], saved["index"]) == ("directory", str(out), str(out / INDEX_NAME))
    assert saved["sha256"] == hashlib.sha256(data).hexdigest() == record.sha256
    assert (saved["rows"], saved["bytes"]) == (single.rows, single.bytes)
    assert hidden_leftovers(tmp_path) == [], "no staging directory or temporary file is left"


def test_directory_files_are_hard_links_to_the_shard_outputs(job, tmp_path):
    out = tmp_path / "out"
    merge(job, f"{out}/", quiet=True)
    for done in records(job):
        if done["output_rows"]:
            published, source = os.stat(out / f"{done['shard_id']}.jsonl"), os.stat(output_path(job, done))
            assert (published.st_dev, published.st_ino) == (source.st_dev, source.st_ino), "zero copy"


def test_an_existing_directory_is_a_directory_output_and_the_cli_takes_a_trailing_slash(job, tmp_path, run_cli):
    empty = tmp_path / "empty"
    empty.mkdir()
    assert merge(job, empty, quiet=True).form == "directory", "an existing (empty) directory"
    assert len(parts(empty)) == 3
    new = tmp_path / "new" / "deeper"
    result = run_cli("merge", "--job-dir", str(job), "--output", f"{new}/", "--json")
    assert result.returncode == 0, result.stderr
    assert orjson.loads(result.stdout)["form"] == "directory" and concatenated(new) == concatenated(empty)


# -- copying instead of linking, and copy_file_range's fallback ------------------------------------


def test_a_copy_replaces_the_link_where_linking_fails_with_the_same_bytes(job, tmp_path, monkeypatch):
    merge(job, tmp_path / "merged.jsonl", quiet=True)

    monkeypatch.setattr(os, "link", raising(errno.EXDEV))
    out = tmp_path / "out"
    merge(job, f"{out}/", quiet=True)
    monkeypatch.undo()
    assert concatenated(out) == (tmp_path / "merged.jsonl").read_bytes()
    for done in records(job):
        if done["output_rows"]:
            assert os.stat(out / f"{done['shard_id']}.jsonl").st_ino != os.stat(output_path(job, done)).st_ino
    assert verify(job, output=out).form == "directory", "copied files are hashed by verify"


@pytest.mark.parametrize("how", ["ENOSYS", "EXDEV", "EINVAL", "EOPNOTSUPP", "copies nothing", "missing"])
def test_the_read_write_loop_takes_over_where_copy_file_range_cannot(job, tmp_path, monkeypatch, how):
    merge(job, tmp_path / "reference.jsonl", quiet=True)
    reference = (tmp_path / "reference.jsonl").read_bytes()
    calls = []

    def unsupported(*args):
        calls.append(args)
        if how == "copies nothing":
            return 0
        code = getattr(errno, how)
        raise OSError(code, os.strerror(code))

    if how == "missing":
        monkeypatch.delattr(os, "copy_file_range")
    else:
        monkeypatch.setattr(os, "copy_file_range", unsupported)
    monkeypatch.setattr(merge_mod, "BLOCK_SIZE", 5)  # many reads and writes per shard
    record = merge(job, tmp_path / "merged.jsonl", quiet=True)
    assert (tmp_path / "merged.jsonl").read_bytes() == reference
    assert record.sha256 == hashlib.sha256(reference).hexdigest()
    assert how == "missing" or calls, "copy_file_range was tried first"
    monkeypatch.setattr(os, "link", raising(errno.EPERM))  # e.g. protected_hardlinks: copied instead
    merge(job, f"{tmp_path / 'out'}/", quiet=True)
    assert concatenated(tmp_path / "out") == reference


def test_copy_range_copies_at_offsets_and_reports_which_side_failed(tmp_path, monkeypatch):
    source = tmp_path / "source"
    source.write_bytes(b"0123456789")
    fd, out = os.open(source, os.O_RDONLY), os.open(tmp_path / "out", os.O_RDWR | os.O_CREAT)
    try:
        assert parallel_copy.copy_range(fd, out, 4, 3, 6, 2) in (True, False)
        assert parallel_copy.copy_range(fd, out, 3, 0, 0, 2) in (True, False)
        assert os.pread(out, 10, 0) == b"012" + bytes(3) + b"3456"
        parallel_copy.start_writeback(out, 0, 10)  # best effort, never an error
        reader, writer = os.pipe()
        parallel_copy.start_writeback(writer, 0, 10)
        os.close(reader)
        os.close(writer)
        monkeypatch.setattr(os, "copy_file_range", lambda *a: 0)
        with pytest.raises(parallel_copy.SourceError, match="ended before"):
            parallel_copy.copy_range(fd, out, 20, 0, 0, 4)
        monkeypatch.setattr(os, "pwrite", raising(errno.ENOSPC))
        with pytest.raises(parallel_copy.DestinationError):
            parallel_copy.copy_range(fd, out, 4, 0, 0, 4)
    finally:
        os.close(fd)
        os.close(out)


def test_a_full_disk_in_the_read_write_loop_names_the_merged_file(job, tmp_path, run_cli, monkeypatch):
    monkeypatch.setattr(os, "copy_file_range", raising(errno.EXDEV))
    monkeypatch.setattr(os, "pwrite", raising(errno.ENOSPC))
    output = tmp_path / "out" / "merged.jsonl"
    line = refused(run_cli("merge", "--job-dir", str(job), "--output", str(output)))
    assert line.endswith(f"error: writing its temporary file failed: No space left on device ({output})"), line
    assert not output.parent.exists()


# -- nothing half-made -----------------------------------------------------------------------------


def test_a_failure_mid_publish_leaves_no_directory(job, tmp_path, monkeypatch):
    real = directory_mod.link_or_copy

    def fails_on_the_last_shard(source, identity, target, block, stop=None):
        if "part-00003" in target.name:
            raise parallel_copy.DestinationError(OSError(errno.EIO, os.strerror(errno.EIO)))
        return real(source, identity, target, block, stop)

    monkeypatch.setattr(directory_mod, "link_or_copy", fails_on_the_last_shard)
    out = tmp_path / "new" / "out"
    with pytest.raises(OSError, match="Input/output error") as caught:
        merge(job, f"{out}/", quiet=True)
    assert caught.value.filename == str(out / "part-00003-of-00004.jsonl")
    assert not (tmp_path / "new").exists(), "no directory, no staging directory, and the directories merge made are gone"
    assert not JobLayout(job).merge_record.exists()


def test_a_corrupt_shard_leaves_an_earlier_directory_output_untouched(job, tmp_path):
    out = tmp_path / "out"
    merge(job, f"{out}/", quiet=True)
    before = snapshot(tmp_path / "out")
    done = records(job)[1]
    # In place (the same inode): the published file, a hard link to it, changes too.
    rewrite_output(output_path(job, done), lambda lines: lines.replace(b"sample", b"SAMPLE", 1))
    with pytest.raises(IntegrityError, match=f"{done['shard_id']}: output .* does not match its completion record"):
        merge(job, f"{out}/", overwrite=True, quiet=True)
    after = snapshot(tmp_path / "out")
    assert after.keys() == before.keys() and hidden_leftovers(tmp_path) == []


def test_a_merge_killed_while_publishing_leaves_only_a_hidden_staging_directory(job, tmp_path):
    out = tmp_path / "out"
    proc = cli("merge", "--job-dir", str(job), "--output", f"{out}/", env={"ELASTIC_SHARD_CRASH_AT": "merging@2"})
    assert proc.returncode == -9, proc.stderr
    assert not out.exists(), "no reader sees a half-made directory"
    assert all(name.startswith(".out.staging-") for name in hidden_leftovers(tmp_path))
    assert cli("merge", "--job-dir", str(job), "--output", f"{out}/").returncode == 0
    assert len(parts(out)) == 3


# -- existing directories --------------------------------------------------------------------------


def test_an_existing_directory_is_refused_unless_overwrite_replaces_an_earlier_output(job, tmp_path, run_cli, monkeypatch):
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine\n")
    refused(
        run_cli("merge", "--job-dir", str(job), "--output", f"{out}/"), f"{out} already exists and is not empty", "--overwrite"
    )
    refused(
        run_cli("merge", "--job-dir", str(job), "--output", f"{out}/", "--overwrite"),
        "not an earlier directory output of merge",
        "notes.txt",
    )
    assert os.listdir(out) == ["notes.txt"], "nothing of it is touched"
    (out / "notes.txt").unlink()
    assert run_cli("merge", "--job-dir", str(job), "--output", f"{out}/").returncode == 0, "an empty directory is taken"
    refused(run_cli("merge", "--job-dir", str(job), "--output", f"{out}/"), "already exists", "--overwrite")
    inode = os.stat(out).st_ino
    assert run_cli("merge", "--job-dir", str(job), "--output", f"{out}/", "--overwrite").returncode == 0
    assert os.stat(out).st_ino != inode, "replaced by the new directory, not filled in place"
    monkeypatch.setattr(destination, "_exchange", lambda a, b: False)  # no RENAME_EXCHANGE: moved aside, then renamed
    assert run_cli("merge", "--job-dir", str(job), "--output", f"{out}/", "--overwrite").returncode == 0
    assert hidden_leftovers(tmp_path) == [] and len(parts(out)) == 3
    assert run_cli("verify", "--job-dir", str(job), "--output", str(out)).returncode == 0


def test_a_directory_output_may_not_be_the_job_directory_or_hold_it(job, tmp_path, run_cli):
    refused(run_cli("merge", "--job-dir", str(job), "--output", f"{job}/", "--overwrite"), "is or contains the job directory")
    refused(
        run_cli("merge", "--job-dir", str(job), "--output", f"{tmp_path}/", "--overwrite"), "is or contains the job directory"
    )
    refused(run_cli("merge", "--job-dir", str(job), "--output", f"{job / 'state'}/"), "inside the job's own state")
    (tmp_path / "file").write_text("x\n")
    refused(run_cli("merge", "--job-dir", str(job), "--output", f"{tmp_path / 'file'}/"), "is a file")


# -- readers of the directory ----------------------------------------------------------------------


def test_directory_readers_skip_the_index(job, tmp_path):
    """Hugging Face `datasets` (data_dir), Ray Data and Data-Juicer list only the part files."""
    out = tmp_path / "out"
    merge(job, f"{out}/", quiet=True)
    expected = [str(p) for p in parts(out)]
    data_files = pytest.importorskip("datasets.data_files")
    assert sorted(data_files.resolve_pattern("**", str(out))) == expected
    file_utils = pytest.importorskip("data_juicer.utils.file_utils")
    found = file_utils.find_files_with_suffix(out, list(destination.JSON_SUFFIXES))
    assert sorted(path for paths in found.values() for path in paths) == expected
    assert Path(INDEX_NAME).suffix not in destination.JSON_SUFFIXES
    meta = pytest.importorskip("ray.data.datasource.file_meta_provider")
    pyarrow_fs = pytest.importorskip("pyarrow.fs")
    assert [path for path, _ in meta._expand_directory(str(out), pyarrow_fs.LocalFileSystem())] == expected


# -- the launchers ---------------------------------------------------------------------------------


@pytest.mark.parametrize("command", ["dlc", "mpi", "local"])
def test_launchers_publish_a_directory_output_and_keep_it_on_a_rerun(tmp_path, launch, command):  # noqa: F811
    job, out = tmp_path / "job", tmp_path / "published"
    extra = launcher_args(command, tmp_path)
    codes = launch(command, "--job-dir", str(job), "--output", f"{out}/", *extra)
    assert codes == [0], (tmp_path / f"{command}-0.log").read_text()[-3000:]
    assert [orjson.loads(line)["id"] for line in concatenated(out).splitlines()] == list(range(12))
    assert orjson.loads(JobLayout(job).merge_record.read_bytes())["form"] == "directory"
    before = snapshot(out)
    assert launch(command, "--job-dir", str(job), "--output", str(out), *extra) == [0], "a rerun keeps its own directory"
    assert snapshot(out) == before, "and does not rewrite it"
    if command != "local":
        return  # the refusal below is preflight's, the same for every launcher
    assert "is already this job's verified merge" in (tmp_path / "local-0.log").read_text()
    other = tmp_path / "other"
    other.mkdir()
    (other / "x.jsonl").write_text("{}\n")
    (tmp_path / f"{command}-0.log").unlink()
    assert launch(command, "--job-dir", str(job), "--output", f"{other}/", *extra) == [2]
    text = (tmp_path / f"{command}-0.log").read_text()
    refused(subprocess.CompletedProcess([], 2, "", text), f"--output {other} already exists and is not this job's merge")
    assert os.listdir(other) == ["x.jsonl"]
