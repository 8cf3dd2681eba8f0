from __future__ import annotations

import hashlib
import os
import re
import shlex
import subprocess
from pathlib import Path

import orjson
import pytest
from support.jobs import SIMPLE_RECIPE, edit_in_place, fast_settings, sample_rows, write_jsonl

from elastic_sharding.errors import InputError, JobStateError, MissingPackagesError, UsageError
from elastic_sharding.layout import JobLayout
from elastic_sharding.prepare.job import PrepareRequest, prepare
from elastic_sharding.records import ROW_KEY


def shard_rows(job: Path) -> list[list[dict]]:
    manifest = JobLayout(job).load_manifest()
    return [[orjson.loads(l) for l in (job / s.path).read_bytes().splitlines()] for s in manifest.shards]


def test_exact_contiguous_nonempty_balanced_shards(make_job):
    job = make_job(rows=200, shards=7)
    manifest = JobLayout(job).load_manifest()
    assert [s.shard_id for s in manifest.shards] == [f"part-{i:05d}-of-00007" for i in range(7)]
    rows = shard_rows(job)
    flat = [r[ROW_KEY] for shard in rows for r in shard]
    assert flat == list(range(200))
    assert all(shard for shard in rows)
    sizes = [s.bytes for s in manifest.shards]
    assert max(sizes) < 1.5 * (sum(sizes) / len(sizes))
    for spec, shard in zip(manifest.shards, rows):
        assert spec.first_row == shard[0][ROW_KEY] and spec.rows == len(shard)


def test_split_is_deterministic(make_job):
    a = make_job(rows=100, shards=5, name="a")
    b = make_job(rows=100, shards=5, name="b")
    ma, mb = JobLayout(a).load_manifest(), JobLayout(b).load_manifest()
    assert [s.sha256 for s in ma.shards] == [s.sha256 for s in mb.shards]
    assert ma.normalized_sha256 == mb.normalized_sha256


def test_as_many_shards_as_rows_and_one_huge_row(make_job, tmp_path):
    data = sample_rows(6)
    data[1]["text"] = "y" * 100_000
    job = make_job(shards=6, data=data)
    assert [len(s) for s in shard_rows(job)] == [1] * 6


def test_more_shards_than_rows_is_refused(make_job, tmp_path):
    with pytest.raises(UsageError, match="exceeds the number of input rows"):
        make_job(rows=3, shards=4)
    assert not (tmp_path / "job").exists()


def test_directory_input_is_recursive_and_sorted(tmp_path, recipe_file):
    root = tmp_path / "data"
    write_jsonl(root / "b.jsonl", [{"text": "from b file"}])
    write_jsonl(root / "a" / "z.jsonl", [{"text": "from a/z file"}])
    write_jsonl(root / "a.jsonl", [{"text": "from a file"}])
    (root / "notes.txt").write_text("ignored")
    job = tmp_path / "job"
    manifest = prepare(PrepareRequest(recipe_file(root), root, job, 1, fast_settings())).manifest
    assert [f.relpath for f in manifest.inputs] == ["a.jsonl", "a/z.jsonl", "b.jsonl"]
    assert [r["text"] for r in shard_rows(job)[0]] == ["from a file", "from a/z file", "from b file"]


def test_media_paths_are_normalized(tmp_path, recipe_file):
    data = [
        {"text": "one", "images": ["img/1.jpg", "/abs/2.jpg", "https://x/3.jpg", "s3://b/4.jpg"]},
        {"text": "two", "images": None, "videos": ["../v.mp4"]},
    ]
    dataset = write_jsonl(tmp_path / "in" / "d.jsonl", data)
    job = tmp_path / "job"
    prepare(PrepareRequest(recipe_file(dataset), None, job, 1, fast_settings()))
    rows = shard_rows(job)[0]
    base = str(tmp_path / "in")
    assert rows[0]["images"] == [f"{base}/img/1.jpg", "/abs/2.jpg", "https://x/3.jpg", "s3://b/4.jpg"]
    assert rows[1]["videos"] == [str(tmp_path / "v.mp4")]
    assert rows[1]["images"] is None and rows[0]["videos"] is None


def test_renamed_media_key_from_recipe_is_checked(tmp_path, recipe_file):
    dataset = write_jsonl(tmp_path / "d.jsonl", [{"text": "one", "pics": "not-a-list.jpg"}])
    body = "image_key: pics\n" + SIMPLE_RECIPE
    with pytest.raises(InputError, match=r"d.jsonl:1: field 'pics' must be a list of strings or null"):
        prepare(PrepareRequest(recipe_file(dataset, body), None, tmp_path / "job", 1, fast_settings()))


def test_index_key_filled_with_global_row_index(tmp_path, recipe_file):
    body = """\
dataset_path: {dataset}
process:
  - text_length_filter:
      min_len: 1
      index_key: idx
"""
    data = [{"text": "a"}, {"text": "b", "idx": 99}, {"text": "c"}]
    dataset = write_jsonl(tmp_path / "d.jsonl", data)
    job = tmp_path / "job"
    prepare(PrepareRequest(recipe_file(dataset, body), None, job, 2, fast_settings()))
    rows = [r for shard in shard_rows(job) for r in shard]
    assert [r["idx"] for r in rows] == [0, 99, 2]


def test_schema_union_fills_missing_fields_in_first_seen_order(make_job):
    data = [
        {"text": "aaaaaa", "id": 1, "meta": {"a": 1}},
        {"id": 2, "text": "bbbbbb", "n": 2.5, "meta": {"b": "x"}},
        {"id": 3, "text": "cccccc", "n": 3},
    ]
    job = make_job(shards=3, data=data)
    rows = [r for shard in shard_rows(job) for r in shard]
    assert [list(r) for r in rows] == [[ROW_KEY, "text", "id", "meta", "n"]] * 3
    assert rows[0]["meta"] == {"a": 1, "b": None}
    assert rows[2]["n"] == 3.0 and isinstance(rows[2]["n"], float)
    assert rows[2]["meta"] is None


def test_type_conflict_names_both_places(make_job, tmp_path):
    with pytest.raises(InputError, match=r"field meta.a is a string here but a number at .*job-input.jsonl:1"):
        make_job(shards=1, data=[{"text": "t", "meta": {"a": 1}}, {"text": "u", "meta": {"a": "s"}}])


def test_identical_request_is_a_noop_and_different_one_refused(tmp_path, recipe_file):
    dataset = write_jsonl(tmp_path / "d.jsonl", sample_rows(10))
    recipe = recipe_file(dataset)
    job = tmp_path / "job"
    first = prepare(PrepareRequest(recipe, None, job, 2, fast_settings()))
    assert first.created
    again = prepare(PrepareRequest(recipe, None, job, 2, fast_settings()))
    assert not again.created and again.manifest.job_id == first.manifest.job_id
    with pytest.raises(JobStateError, match="--num-shards differs"):
        prepare(PrepareRequest(recipe, None, job, 3, fast_settings()))
    write_jsonl(dataset, sample_rows(11))
    with pytest.raises(JobStateError, match="input files changed"):
        prepare(PrepareRequest(recipe, None, job, 2, fast_settings()))


def prepare_cli(run_cli, recipe: Path, job: Path, *extra: str, shards: int = 2):
    return run_cli("prepare", "--config", str(recipe), "--job-dir", str(job), "--num-shards", str(shards), *extra)


def test_an_in_place_edit_keeping_size_and_mtime_is_refused(tmp_path, recipe_file, run_cli):
    dataset = write_jsonl(tmp_path / "d.jsonl", sample_rows(10))
    recipe, job = recipe_file(dataset), tmp_path / "job"
    assert prepare_cli(run_cli, recipe, job).returncode == 0
    again = prepare_cli(run_cli, recipe, job)
    assert again.returncode == 0 and "already prepared with this exact request: nothing to do" in again.stderr
    before = {p: p.read_bytes() for p in job.rglob("*") if p.is_file()}
    edit_in_place(dataset, b"sample number 7", b"sample NUMBER 7")
    refused = prepare_cli(run_cli, recipe, job)
    assert refused.returncode == 2
    error = refused.stderr.strip().splitlines()[-1]
    assert f"{dataset}: its content changed since the job was prepared" in error and "Use a new --job-dir" in error, error
    assert {p: p.read_bytes() for p in job.rglob("*") if p.is_file()} == before, "the job is left as it was"


def test_a_changed_mtime_alone_is_refused_and_restoring_it_as_told_is_a_noop(tmp_path, recipe_file, run_cli):
    """The contract's identity of an input includes its mtime: a `touch` is refused even with the
    same bytes. The message names the recorded time as a `touch -d` command; since the bytes are
    then hashed, restoring the time is safe."""
    dataset = write_jsonl(tmp_path / "d.jsonl", sample_rows(10))
    recipe, job = recipe_file(dataset), tmp_path / "job"
    assert prepare_cli(run_cli, recipe, job).returncode == 0
    recorded = dataset.stat().st_mtime_ns
    os.utime(dataset, ns=(recorded + 5 * 10**9, recorded + 5 * 10**9))
    refused = prepare_cli(run_cli, recipe, job)
    assert refused.returncode == 2 and f"{dataset}: its modification time changed" in refused.stderr
    command = re.search(r"`(touch -d \S+ \S+)`", refused.stderr).group(1)
    subprocess.run(shlex.split(command), check=True)
    assert dataset.stat().st_mtime_ns == recorded
    assert prepare_cli(run_cli, recipe, job).returncode == 0


def test_every_file_of_a_directory_input_is_hashed_again(tmp_path, recipe_file, run_cli):
    root = tmp_path / "data"
    for name in ("a.jsonl", "sub/b.jsonl", "sub/c.jsonl", "z.jsonl"):
        write_jsonl(root / name, sample_rows(5))
    recipe, job = recipe_file(root), tmp_path / "job"
    assert prepare_cli(run_cli, recipe, job).returncode == 0
    assert prepare_cli(run_cli, recipe, job).returncode == 0
    edit_in_place(root / "sub" / "c.jsonl", b"sample number 4", b"sample number 9")
    refused = prepare_cli(run_cli, recipe, job)
    assert refused.returncode == 2 and f"{root / 'sub' / 'c.jsonl'}: its content changed" in refused.stderr


def test_sha256_files_hashes_many_files_at_once_in_order(tmp_path):
    from elastic_sharding.prepare.fingerprints import READ_SIZE, sha256_files

    paths = []
    for i in range(9):
        path = tmp_path / f"f{i}"
        path.write_bytes(os.urandom(i * READ_SIZE // 3))
        paths.append(path)
    assert sha256_files(paths, quiet=True) == [hashlib.sha256(p.read_bytes()).hexdigest() for p in paths]
    paths[4].unlink()
    with pytest.raises(InputError, match=r"f4: cannot access: No such file"):
        sha256_files(paths, quiet=True)


def test_sha256_files_hashes_two_files_at_the_same_time(tmp_path, monkeypatch):
    """Each file's hashing waits until another file is being hashed too: only hashing in parallel passes."""
    import threading

    from elastic_sharding.prepare import fingerprints

    if (os.cpu_count() or 1) < 2:
        pytest.skip("one core: files are hashed one at a time")
    together = threading.Barrier(2, timeout=30)
    original = fingerprints._sha256_file

    def meet_then_hash(path, advance):
        together.wait()
        return original(path, advance)

    monkeypatch.setattr(fingerprints, "_sha256_file", meet_then_hash)
    paths = [tmp_path / "a", tmp_path / "b"]
    for path in paths:
        path.write_bytes(b"x" * 1000)
    assert fingerprints.sha256_files(paths, quiet=True) == [hashlib.sha256(b"x" * 1000).hexdigest()] * 2


def test_relative_paths_resolve_from_the_working_directory(tmp_path, monkeypatch):
    write_jsonl(tmp_path / "data" / "d.jsonl", sample_rows(4))
    (tmp_path / "r.yaml").write_text("dataset_path: data/d.jsonl\nprocess:\n  - whitespace_normalization_mapper:\n")
    monkeypatch.chdir(tmp_path)
    manifest = prepare(PrepareRequest(Path("r.yaml"), None, Path("job"), 2, fast_settings())).manifest
    assert manifest.request.dataset_path == str(tmp_path / "data" / "d.jsonl")
    assert manifest.request.config_path == str(tmp_path / "r.yaml")
    assert (tmp_path / "job" / "recipe.yaml").read_text().startswith(f"dataset_path: {tmp_path}/data/d.jsonl")


def test_failed_prepare_leaves_nothing(tmp_path, recipe_file):
    dataset = write_jsonl(tmp_path / "d.jsonl", sample_rows(5))
    with open(dataset, "ab") as handle:
        handle.write(b"{broken\n")
    with pytest.raises(InputError, match=r"d.jsonl:6: malformed JSON"):
        prepare(PrepareRequest(recipe_file(dataset), None, tmp_path / "job", 2, fast_settings()))
    assert sorted(os.listdir(tmp_path)) == ["d.jsonl", "recipe.yaml"]


@pytest.mark.parametrize("name", ["demo.yaml", "gpu_demo.yaml", "gpu_demo_4gpu.yaml"])
def test_bundled_recipes_pass_prepare_without_a_gpu(tmp_path, monkeypatch, name):
    """The GPU demos need PyTorch and transformers (their models' operators import them): where
    those are missing, as in CI, prepare names them and creates nothing."""
    import importlib.util

    from support.jobs import REPO

    monkeypatch.chdir(REPO)
    recipe = REPO / "demos" / "elastic_sharding" / "configs" / name
    request = PrepareRequest(recipe, None, tmp_path / "job", 4, fast_settings())
    missing = [] if name == "demo.yaml" else [m for m in ("torch", "transformers") if importlib.util.find_spec(m) is None]
    if missing:
        with pytest.raises(MissingPackagesError) as refused:
            prepare(request)
        for module in missing:
            assert f"the Python package {module} (import {module}), which is not installed here" in str(refused.value)
        assert "text_pair_similarity_filter" in str(refused.value)
        assert not (tmp_path / "job").exists()
        return
    manifest = prepare(request).manifest
    expected = "demo-dataset.jsonl" if name == "demo.yaml" else "gpu-demo-dataset.jsonl"
    assert manifest.request.dataset_path.endswith(expected)
    assert manifest.total_rows == (240 if name == "demo.yaml" else 4)


def test_input_changed_between_passes_is_detected(tmp_path, recipe_file, monkeypatch):
    import elastic_sharding.prepare.job as prep

    dataset = write_jsonl(tmp_path / "d.jsonl", sample_rows(10))
    original = prep._write_shards

    def change_then_write(*args, **kwargs):
        with open(dataset, "ab") as handle:
            handle.write(b'{"id": 99, "text": "appended meanwhile"}\n')
        return original(*args, **kwargs)

    monkeypatch.setattr(prep, "_write_shards", change_then_write)
    with pytest.raises(InputError, match="while prepare was reading it"):
        prepare(PrepareRequest(recipe_file(dataset), None, tmp_path / "job", 2, fast_settings()))
    assert not (tmp_path / "job").exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []
