"""Every rejected input: exit 2, one line that says what and where, and no job directory.

Inputs prepare accepts on purpose are pinned at the end: CRLF line ends (JSON whitespace), colons
and escaped quotes in strings (no false duplicate keys), lines exactly at the length limit.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tracemalloc
from pathlib import Path

import orjson
import pytest
from support.jobs import SIMPLE_RECIPE
from support.processes import unprivileged_prefix

import elastic_sharding
from elastic_sharding.errors import InputError
from elastic_sharding.prepare.jsonl import HashingLineReader
from elastic_sharding.prepare.recipe import DEFAULT_READ_BLOCK_SIZE

GOOD = b'{"text": "hello world"}\n{"text": "second row"}\n'
# A recipe whose engine reads blocks of 1000 bytes: lines over 1000 bytes are refused.
SMALL_BLOCKS_RECIPE = SIMPLE_RECIPE + "read_options:\n  block_size: 1000\n"


def nested(depth: int) -> bytes:
    """A row whose field `d` nests objects so that the row is `depth` objects deep."""
    return b'{"text": "a", "d": ' + b'{"a":' * (depth - 1) + b"1" + b"}" * (depth - 1) + b"}\n"


DATA_CASES = {
    "bom": (b"\xef\xbb\xbf" + GOOD, r"d.jsonl:1: starts with a UTF-8 byte-order mark"),
    "utf-16 with bom": ('{"text": "a"}\n'.encode("utf-16"), r"d.jsonl:1: starts with a UTF-16 byte-order mark"),
    "utf-16 without bom": ('{"text": "a"}\n'.encode("utf-16-le"), r"d.jsonl:1: NUL byte at byte 1: not UTF-8 JSON text"),
    "blank line": (b'{"text": "a"}\n\n{"text": "b"}\n', r"d.jsonl:2: blank line"),
    "whitespace line": (b'{"text": "a"}\n   \n', r"d.jsonl:2: blank line"),
    "invalid utf-8": (b'{"text": "a"}\n{"text": "\xff\xfe"}\n', r"d.jsonl:2: invalid UTF-8 at byte 10"),
    "truncated json": (b'{"text": "a"}\n{"text": "b\n', r"d.jsonl:2: malformed JSON"),
    "truncated last line": (b'{"text": "a"}\n{"text": "b', r"d.jsonl:2: malformed JSON: unexpected end of data"),
    "object then garbage": (
        b'{"text": "a"}\n{"a":1} x\n',
        r"d.jsonl:2: malformed JSON: unexpected content after document \(column 9\)",
    ),
    "two objects on a line": (b'{"text": "a"}{"text": "b"}\n', r"d.jsonl:1: malformed JSON: unexpected content after document"),
    "array row": (b'{"text": "a"}\n[1, 2]\n', r"d.jsonl:2: row is an array, not a JSON object"),
    "scalar row": (b'"just a string"\n', r"d.jsonl:1: row is a string, not a JSON object"),
    "null row": (b'{"text": "a"}\nnull\n', r"d.jsonl:2: row is null, not a JSON object"),
    "nan": (b'{"text": "a", "x": NaN}\n', r"d.jsonl:1: malformed JSON: NaN is not a JSON number \(column 20\)"),
    "infinity": (b'{"text": "a", "x": Infinity}\n', r"d.jsonl:1: malformed JSON: Infinity is not a JSON number \(column 20\)"),
    "-infinity": (b'{"text": "a", "x": -Infinity}\n', r"d.jsonl:1: malformed JSON: -Infinity is not a JSON number \(column 20\)"),
    "number overflowing a double": (b'{"text": "a", "x": 1e400}\n', r"d.jsonl:1: malformed JSON: number is infinity"),
    "lone surrogate escape": (b'{"text": "\\ud800"}\n', r"d.jsonl:1: malformed JSON: no low surrogate"),
    "control character in string": (b'{"text": "a\tb"}\n', r"d.jsonl:1: malformed JSON"),
    "duplicate key": (b'{"text": "a"}\n{"text": "a", "n": 1, "n": 2}\n', r"d.jsonl:2: duplicate key 'n'"),
    "duplicate key nested": (b'{"text": "a", "m": {"x": 1, "y": {"z": 1, "z": 1}}}\n', r"d.jsonl:1: duplicate key 'm.y.z'"),
    "duplicate key in a list": (b'{"text": "a", "l": [{"k": 1}, {"k": 1, "k": 2}]}\n', r"d.jsonl:1: duplicate key 'l\[1\].k'"),
    # Spaces before the colons, and an escaped quote before a colon inside a string: a count of
    # '":' would see one key here, as many as the parser keeps.
    "duplicate key hidden from a naive count": (b'{"text" : "a", "text" : "\\":"}\n', r"d.jsonl:1: duplicate key 'text'"),
    "duplicate key before another error": (
        b'{"text": "a", "n": 1, "n": 2}\n{"text": "b", "n": "x"}\n',
        r"d.jsonl:1: duplicate key 'n'",
    ),
    "duplicate key first in a bigger file": (
        b'{"text": "ok"}\n' * 999 + b'{"text": "a", "text": "b"}\n' + b'{"text": "ok"}\n' * 1000,
        r"d.jsonl:1000: duplicate key 'text'",
    ),
    "nested too deeply to write": (nested(255), r"d.jsonl:1: objects and lists nested too deeply to write back as JSON"),
    "nested too deeply to read": (nested(1025), r"d.jsonl:1: malformed JSON: depth limit exceeded"),
    "line over the default limit": (
        GOOD + b'{"text": "' + b"x" * DEFAULT_READ_BLOCK_SIZE + b'"}\n' + GOOD,
        rf"d.jsonl:3: line is {DEFAULT_READ_BLOCK_SIZE + 12} bytes, over the limit of {DEFAULT_READ_BLOCK_SIZE}: "
        r"the engine's JSON reader .* raise read_options.block_size in the recipe",
    ),
    "media not a list": (b'{"text": "a", "images": "one.jpg"}\n', r"d.jsonl:1: field 'images' must be a list of strings or null"),
    "media not strings": (b'{"text": "a", "audios": [1]}\n', r"d.jsonl:1: field 'audios' must be a list of strings or null"),
    "media with a null item": (b'{"text": "a", "videos": ["a.mp4", null]}\n', r"d.jsonl:1: field 'videos' must be a list"),
    "reserved field": (b'{"text": "a", "__elastic_row__": 3}\n', r"d.jsonl:1: field '__elastic_row__' is reserved"),
    "type conflict": (
        b'{"text": "a", "n": 1}\n{"text": "b", "n": "1"}\n',
        r"d.jsonl:2: field n is a string here but a number at .*d.jsonl:1",
    ),
    "nested type conflict": (
        b'{"text": "a", "m": {"k": [1]}}\n{"text": "b", "m": {"k": {"x": 1}}}\n',
        r"d.jsonl:2: field m.k is an object here but a list at .*d.jsonl:1",
    ),
    "empty file": (b"", r"d.jsonl: the input has no rows"),
}

SMALL_LIMIT_CASES = {
    "line over the recipe's limit": (
        GOOD + b'{"text": "' + b"x" * 5000 + b'"}\n',
        r"d.jsonl:3: line is 5012 bytes, over the limit of 1000",
    ),
    "endless last line": (GOOD + b'{"text": "' + b"x" * 100_000, r"d.jsonl:3: line is 100010 bytes, over the limit of 1000"),
    "shard line over the limit": (
        # 997 bytes in, but the shard line adds "__elastic_row__":0, and a null for the missing "n".
        b'{"text": "' + b"x" * 985 + b'"}\n{"text": "a", "n": 1}\n',
        r"d.jsonl:1: the row's shard line \(null-filled missing fields, absolute media paths, row number added\) "
        rf"is {len(orjson.dumps({'__elastic_row__': 0, 'text': 'x' * 985, 'n': None}))} bytes, over the limit of 1000",
    ),
    "bad line before a long one": (
        b'{"text": "a"}\n{"text": \n{"text": "' + b"x" * 5000 + b'"}\n',
        r"d.jsonl:2: malformed JSON",
    ),
}

RECIPE_CASES = {
    "no process": ("dataset_path: {dataset}\n", r"no 'process' list"),
    "empty process": ("dataset_path: {dataset}\nprocess: []\n", r"'process' must be a non-empty list"),
    "unknown op": ("dataset_path: {dataset}\nprocess:\n  - no_such_mapper:\n", r"process\[0\] no_such_mapper: unknown operator"),
    "op not a mapping": ("dataset_path: {dataset}\nprocess:\n  - [a, b]\n", r"process\[0\] must be an operator name"),
    "deduplicator not run across shards": (
        "dataset_path: {dataset}\nprocess:\n  - document_minhash_deduplicator_with_uid:\n",
        r"process\[0\] document_minhash_deduplicator_with_uid: keeps rows by a __dj__uid column .* use "
        r"document_minhash_deduplicator",
    ),
    "simhash distance not below its blocks": (
        "dataset_path: {dataset}\nprocess:\n  - document_simhash_deduplicator:\n      num_blocks: 4\n      hamming_distance: 4\n",
        r"process\[0\] document_simhash_deduplicator: .*hamming_distance \(4\) must be at least 1 and less than num_blocks \(4\)",
    ),
    "ray deduplicator": (
        "dataset_path: {dataset}\nprocess:\n  - ray_document_deduplicator:\n",
        r"process\[0\] ray_document_deduplicator: is Data-Juicer's Ray-only deduplicator, .* use document_deduplicator in its place",
    ),
    "selector after a deduplicator": (
        "dataset_path: {dataset}\nprocess:\n  - document_deduplicator:\n  - image_ohem_selector:\n      topk: 10\n",
        r"process\[1\] image_ohem_selector: scores every row with a model .* topk_specified_field_selector",
    ),
    "grouper": ("dataset_path: {dataset}\nprocess:\n  - naive_grouper:\n", r"naive_grouper: puts the whole dataset into one row"),
    "reverse grouper exporting its batch meta": (
        "dataset_path: {dataset}\nprocess:\n  - naive_reverse_grouper:\n      batch_meta_export_path: /tmp/m.jsonl\n",
        r"process\[0\] naive_reverse_grouper: naive_reverse_grouper: batch_meta_export_path writes one file",
    ),
    "stats_export_path": (
        "dataset_path: {dataset}\nstats_export_path: /tmp/s.jsonl\nprocess:\n  - text_length_filter:\n",
        r"stats_export_path is not allowed",
    ),
    "op stats_export_path": (
        "dataset_path: {dataset}\nprocess:\n  - text_length_filter:\n      stats_export_path: s.jsonl\n",
        r"stats_export_path is not allowed",
    ),
    "executor": (
        "dataset_path: {dataset}\nexecutor_type: ray_partitioned\nprocess:\n  - text_length_filter:\n",
        r"executor_type 'ray_partitioned' is not supported",
    ),
    "bad yaml": ("dataset_path: {dataset}\nprocess: [\n", r"recipe.yaml:\d+: invalid YAML"),
    "not a mapping": ("- just\n- a list\n", r"a recipe must be a YAML mapping"),
    "custom op path": (
        "dataset_path: {dataset}\ncustom_operator_paths: [does/not/exist.py]\nprocess:\n  - text_length_filter:\n",
        r"custom_operator_paths entry does not exist",
    ),
    "custom op that fails to import": (
        "dataset_path: {dataset}\ncustom_operator_paths: [broken_op.py]\nprocess:\n  - text_length_filter:\n",
        r"cannot load custom operators: .*deliberately broken",
    ),
    "no dataset": ("process:\n  - text_length_filter:\n", r"no dataset_path; pass --dataset-path"),
    "unknown option": (
        "dataset_path: {dataset}\nexport_pth: x.jsonl\nprocess:\n  - text_length_filter:\n",
        r"config parser rejects the recipe: Option 'export_pth' is not accepted",
    ),
    "op skip_op_error not a recipe error": (
        "dataset_path: {dataset}\nprocess:\n  - naive_grouper:\n      skip_op_error: true\n",
        r"naive_grouper: puts the whole dataset into one row",
    ),
    "read_options not a mapping": (
        "dataset_path: {dataset}\nread_options: 7\nprocess:\n  - text_length_filter:\n",
        r"recipe.yaml: read_options must be a mapping",
    ),
    "read block size not a number": (
        "dataset_path: {dataset}\nread_options:\n  block_size: 1MB\nprocess:\n  - text_length_filter:\n",
        r"recipe.yaml: read_options.block_size must be a number of bytes from 1 to 2147483647",
    ),
    "read block size over pyarrow's int32": (
        "dataset_path: {dataset}\nread_options:\n  block_size: 4294967296\nprocess:\n  - text_length_filter:\n",
        r"read_options.block_size must be a number of bytes",
    ),
}


def assert_rejected(tmp_path: Path, proc, pattern: str, where: Path | None = None) -> None:
    assert proc.returncode == 2, proc.stderr
    lines = [l for l in proc.stderr.splitlines() if "error:" in l]
    assert len(lines) == 1, proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    assert re.search(pattern, lines[0]), lines[0]
    for root in (tmp_path, where or tmp_path):
        leftovers = [p for p in os.listdir(root) if p.startswith((".job", "job"))]
        assert leftovers == [], leftovers


def prepare_rejected(tmp_path: Path, run_cli, data: bytes, recipe_body: str, pattern: str) -> None:
    dataset = tmp_path / "d.jsonl"
    dataset.write_bytes(data)
    (tmp_path / "broken_op.py").write_text("raise RuntimeError('deliberately broken')\n")
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(recipe_body.format(dataset=dataset))
    proc = run_cli("prepare", "--config", str(recipe), "--job-dir", str(tmp_path / "job"), "--num-shards", "1", cwd=tmp_path)
    assert_rejected(tmp_path, proc, pattern)


@pytest.mark.parametrize("case", sorted(DATA_CASES))
def test_bad_data(tmp_path, run_cli, case):
    data, pattern = DATA_CASES[case]
    prepare_rejected(tmp_path, run_cli, data, SIMPLE_RECIPE, pattern)


@pytest.mark.parametrize("case", sorted(SMALL_LIMIT_CASES))
def test_lines_over_the_engine_limit(tmp_path, run_cli, case):
    data, pattern = SMALL_LIMIT_CASES[case]
    prepare_rejected(tmp_path, run_cli, data, SMALL_BLOCKS_RECIPE, pattern)


@pytest.mark.parametrize("case", sorted(RECIPE_CASES))
def test_bad_recipe(tmp_path, run_cli, case):
    body, pattern = RECIPE_CASES[case]
    prepare_rejected(tmp_path, run_cli, GOOD, body, pattern)


def _fifo(path: Path) -> Path:
    os.mkfifo(path)
    return path


def _dir(root: Path, files: dict[str, bytes]) -> Path:
    for name, data in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(data)
    root.mkdir(exist_ok=True)
    return root


# name -> (build the dataset under tmp_path, expected error). Each runs with --dataset-path.
DATASET_CASES = {
    "not a .jsonl file": (lambda t: _dir(t, {"notes.txt": GOOD}) / "notes.txt", r"notes.txt: not an input file"),
    "a JSON array file": (lambda t: _dir(t, {"d.json": b"[{}]"}) / "d.json", r"d.json: not an input file"),
    "truncated gzip": (
        lambda t: _dir(t, {"d.jsonl.gz": b"\x1f\x8b"}) / "d.jsonl.gz",
        r"d.jsonl.gz:1: the gzip stream is truncated",
    ),
    "other compression": (
        lambda t: _dir(t, {"d.jsonl.bz2": b"BZh"}) / "d.jsonl.bz2",
        r"d.jsonl.bz2: not an input file.*\.jsonl\.zst",
    ),
    "missing": (lambda t: t / "missing.jsonl", r"missing.jsonl: cannot access dataset: No such file or directory"),
    "empty directory": (lambda t: _dir(t / "empty", {}), r"empty: directory contains no input files"),
    "directory without .jsonl files": (
        lambda t: _dir(t / "data", {"a.json": GOOD, "b.txt": GOOD}),
        r"data: directory contains no",
    ),
    "directory of empty files": (lambda t: _dir(t / "data", {"a.jsonl": b"", "b/c.jsonl": b""}), r"data: the input has no rows"),
    "a .jsonl that is an empty directory": (lambda t: _dir(t / "x.jsonl", {}), r"x.jsonl: directory contains no input files"),
    "a FIFO named x.jsonl": (lambda t: _fifo(t / "x.jsonl"), r"x.jsonl: not a regular file or directory but a FIFO"),
    "a FIFO in a directory": (
        lambda t: _fifo(_dir(t / "data", {"a.jsonl": GOOD}) / "b.jsonl").parent,
        r"data/b.jsonl: not a regular file but a FIFO",
    ),
    "bad file among good ones": (
        lambda t: _dir(t / "data", {"a.jsonl": GOOD * 3, "sub/b.jsonl": GOOD * 2 + b'{"text": \n' + GOOD, "z.jsonl": GOOD}),
        r"data/sub/b.jsonl:5: malformed JSON: unexpected end of data",
    ),
    "type conflict across files": (
        lambda t: _dir(t / "data", {"a.jsonl": b'{"text": "a", "n": 1}\n', "b.jsonl": GOOD + b'{"text": "b", "n": [1]}\n'}),
        r"data/b.jsonl:3: field n is a list here but a number at .*data/a.jsonl:1",
    ),
    "duplicate key in a second file": (
        lambda t: _dir(t / "data", {"a.jsonl": GOOD, "b.jsonl": GOOD + b'{"text": "a", "x": {"y": 1, "y": 2}}\n'}),
        r"data/b.jsonl:3: duplicate key 'x.y'",
    ),
}


def _symlink_loop(root: Path) -> Path:
    loop = root / "loop.jsonl"
    loop.symlink_to(loop)
    return loop


def _link_in_dir(root: Path, target: str) -> Path:
    data = _dir(root / "data", {"a.jsonl": GOOD})
    (data / "l.jsonl").symlink_to(data / target)
    return data


DATASET_CASES.update(
    {
        "symlink loop": (_symlink_loop, r"loop.jsonl: cannot access dataset: Too many levels of symbolic links"),
        "symlink loop in a directory": (
            lambda t: _link_in_dir(t, "l.jsonl"),
            r"data/l.jsonl: cannot access: Too many levels of symbolic links",
        ),
        "broken symlink in a directory": (
            lambda t: _link_in_dir(t, "gone.jsonl"),
            r"data/l.jsonl: cannot access: No such file or directory",
        ),
    }
)


@pytest.mark.parametrize("case", sorted(DATASET_CASES))
def test_bad_dataset(tmp_path, run_cli, case):
    build, pattern = DATASET_CASES[case]
    dataset = build(tmp_path)
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(SIMPLE_RECIPE.format(dataset="unused.jsonl"))
    args = ["--config", str(recipe), "--dataset-path", str(dataset), "--job-dir", str(tmp_path / "job"), "--num-shards", "1"]
    proc = run_cli("prepare", *args)
    assert_rejected(tmp_path, proc, pattern)


def test_bad_locations_and_parameters(tmp_path, run_cli):
    data = _dir(tmp_path / "data", {"a.jsonl": GOOD})
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(SIMPLE_RECIPE.format(dataset=data))
    cases = [
        (["--job-dir", str(data / "job")], r"--job-dir .*/data/job is inside the dataset directory"),
        (["--job-dir", str(data)], r"is inside the dataset directory"),
        (["--job-dir", str(tmp_path / "job"), "--dataset-path", str(tmp_path / "job" / "d.jsonl")], r"is inside --job-dir"),
        (["--job-dir", str(tmp_path / "no" / "job")], r"the parent directory of --job-dir does not exist"),
        (["--job-dir", str(tmp_path / "job"), "--num-shards", "3"], r"--num-shards 3 exceeds the number of input rows \(2\)"),
        (["--job-dir", str(tmp_path / "job"), "--num-shards", "0"], r"must be at least 1"),
        (["--job-dir", str(tmp_path / "job"), "--num-shards", "100000"], r"--num-shards 100000 is more than 99999"),
        (
            ["--job-dir", str(tmp_path / "job"), "--lock-timeout-secs", "10", "--heartbeat-interval-secs", "6"],
            r"must be at most half",
        ),
    ]
    for extra, pattern in cases:
        args = ["prepare", "--config", str(recipe), "--num-shards", "1", *extra]
        proc = run_cli(*args)
        assert_rejected(tmp_path, proc, pattern, where=data)
        assert sorted(os.listdir(data)) == ["a.jsonl"]


@pytest.mark.parametrize(
    "launcher",
    [
        ["prepare"],
        ["local", "--workers", "1"],
        ["dlc", "--run-id", "r1"],
        ["mpi", "--np", "2"],
        ["slurm", "--nodes", "2", "--dry-run"],
    ],
)
def test_every_launcher_refuses_a_job_dir_whose_parent_is_missing_and_says_why(tmp_path, run_cli, launcher):
    """A missing parent on a shared filesystem usually means the share is not mounted on this node:
    every launcher refuses before it writes anything, and the message says why it creates nothing."""
    data = _dir(tmp_path / "data", {"a.jsonl": GOOD})
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(SIMPLE_RECIPE.format(dataset=data))
    proc = run_cli(*launcher, "--config", str(recipe), "--num-shards", "1", "--job-dir", str(tmp_path / "no" / "job"))
    assert_rejected(tmp_path, proc, r"the parent directory of --job-dir does not exist: .*/no\. .*not mounted on this node")
    assert not (tmp_path / "no").exists()


def test_an_mpi_rank_on_a_node_without_the_share_stops_at_once(tmp_path, run_cli, monkeypatch):
    """`mpi` starts its workers to share the prepare (JOIN_ENV) once it has seen the job
    directory's parent: a rank that does not see it is on a node without the share, and says so
    instead of waiting for a prepare it can never see."""
    from elastic_sharding.prepare.cooperate import JOIN_ENV

    monkeypatch.setenv(JOIN_ENV, "1")
    proc = run_cli("worker", "--job-dir", str(tmp_path / "unmounted" / "job"))
    assert_rejected(tmp_path, proc, r"does not exist on this node .*the shared filesystem is not mounted here")


def test_dataset_disappearing_between_passes(tmp_path, run_cli, monkeypatch):
    import elastic_sharding.prepare.job as prep

    data = _dir(tmp_path / "data", {"a.jsonl": GOOD, "b.jsonl": GOOD})
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(SIMPLE_RECIPE.format(dataset=data))
    original = prep._write_shards

    def remove_then_write(*args, **kwargs):
        (data / "b.jsonl").unlink()
        return original(*args, **kwargs)

    monkeypatch.setattr(prep, "_write_shards", remove_then_write)
    proc = run_cli("prepare", "--config", str(recipe), "--job-dir", str(tmp_path / "job"), "--num-shards", "2")
    assert_rejected(tmp_path, proc, r"data/b.jsonl: cannot access: No such file or directory \(the input changed while prepare")


def test_file_replaced_by_a_fifo_after_listing_is_refused_not_waited_on(tmp_path):
    """The reader opens without blocking, so a pipe swapped in after discovery cannot hang prepare."""
    path = _fifo(tmp_path / "x.jsonl")
    with pytest.raises(InputError, match=r"x.jsonl: not a regular file \(a FIFO \(named pipe\)\)"):
        list(HashingLineReader(path).blocks())


# Run by one unprivileged interpreter: Data-Juicer is imported once for all three cases.
_UNREADABLE_DRIVER = """
import contextlib, io, json, sys
from elastic_sharding.cli import main
results = []
for args in json.loads(sys.argv[1]):
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        code = main(args)
    results.append([code, err.getvalue()])
print(json.dumps(results))
"""


def test_unreadable_inputs(tmp_path):
    prefix = unprivileged_prefix(tmp_path)
    single = _dir(tmp_path / "single", {"d.jsonl": GOOD}) / "d.jsonl"
    in_dir = _dir(tmp_path / "in_dir", {"a.jsonl": GOOD, "sub/b.jsonl": GOOD, "z.jsonl": GOOD})
    closed_dir = _dir(tmp_path / "closed_dir", {"a.jsonl": GOOD, "sub/b.jsonl": GOOD})
    single.chmod(0)
    (in_dir / "sub" / "b.jsonl").chmod(0)
    (closed_dir / "sub").chmod(0)
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(SIMPLE_RECIPE.format(dataset="unused.jsonl"))
    expected = {
        single: r"single/d.jsonl: cannot read: Permission denied",
        in_dir: r"in_dir/sub/b.jsonl: cannot read: Permission denied",
        closed_dir: r"closed_dir/sub: cannot list directory: Permission denied",
    }
    runs = [
        ["--log-level", "WARNING", "prepare", "--config", str(recipe), "--dataset-path", str(dataset)]
        + ["--job-dir", str(tmp_path / "job"), "--num-shards", "1", "--quiet"]
        for dataset in expected
    ]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(Path(elastic_sharding.__file__).parents[1]), *sys.path]))
    try:
        proc = subprocess.run(
            [*prefix, sys.executable, "-c", _UNREADABLE_DRIVER, json.dumps(runs)],
            capture_output=True,
            text=True,
            env=env,
            timeout=300,
        )
    finally:
        for path in (single, in_dir / "sub" / "b.jsonl", closed_dir / "sub"):
            path.chmod(0o755)
    assert proc.returncode == 0, proc.stderr
    for (code, stderr), pattern in zip(json.loads(proc.stdout.splitlines()[-1]), expected.values()):
        assert_rejected(tmp_path, subprocess.CompletedProcess([], code, "", stderr), pattern)


def test_endless_line_is_cut_off_at_the_limit_not_buffered(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_bytes(b'{"text": "a"}\n' + b"x" * (64 << 20))
    reader = HashingLineReader(path, max_line=1 << 20)
    tracemalloc.start()
    try:
        with pytest.raises(InputError, match=rf"d.jsonl:2: line is {64 << 20} bytes, over the limit of {1 << 20}"):
            for _ in reader.blocks():
                pass
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 24 << 20, f"peak {peak >> 20} MiB: the line was buffered"


def test_lines_before_a_long_one_are_given_out_first(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_bytes(b"a\nbb\n" + b"x" * 50 + b"\nc\n")
    reader = HashingLineReader(path, block_size=1 << 20, max_line=10)
    got = []
    with pytest.raises(InputError, match=r"d.jsonl:3: line is 50 bytes, over the limit of 10"):
        for first, lines in reader.blocks():
            got.append((first, lines, bytes(reader.block)))
    assert got == [(1, [b"a", b"bb"], b"a\nbb\n")]


def test_default_line_limit_is_pyarrows_block_size():
    import pyarrow.json

    assert pyarrow.json.ReadOptions().block_size == DEFAULT_READ_BLOCK_SIZE


# ---- accepted on purpose -------------------------------------------------------------------


def test_accepted_edge_cases(tmp_path, run_cli):
    """CRLF line ends are JSON whitespace and accepted (shard lines are rewritten without CR);
    colons, escaped quotes and ' :' inside strings or keys are no duplicate keys, and neither is
    an index key prepare adds to rows that lack it."""
    rows = [
        {"text": "crlf ends", "n": 1},
        {"text": 'say \\": "hi" : ok', "n": 2, "url": "http://x/y?a=b:c"},
        {"text": "Remarque : un espace", 'k\\":': 1, "n": 3},
    ]
    data = b"".join(json.dumps(r).encode() + b"\r\n" for r in rows) + b'{"text" : "spaced" , "n" : 4}\n'
    dataset = tmp_path / "d.jsonl"
    dataset.write_bytes(data)
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(
        SIMPLE_RECIPE.replace("      max_len: 100000\n", "      max_len: 100000\n      index_key: idx\n").format(dataset=dataset)
    )
    proc = run_cli("prepare", "--config", str(recipe), "--job-dir", str(tmp_path / "job"), "--num-shards", "2")
    assert proc.returncode == 0, proc.stderr
    got = [orjson.loads(line) for p in sorted((tmp_path / "job" / "shards").iterdir()) for line in p.read_bytes().splitlines()]
    assert [(r["n"], r["idx"]) for r in got] == [(1, 0), (2, 1), (3, 2), (4, 3)]
    assert got[1]["text"] == rows[1]["text"] and got[2]['k\\":'] == 1
    assert all(b"\r" not in p.read_bytes() for p in (tmp_path / "job" / "shards").iterdir())


def test_a_link_to_a_directory_inside_a_directory_input_is_not_read_and_says_so(tmp_path, run_cli):
    data = tmp_path / "data"
    (data / "real").mkdir(parents=True)
    (data / "real" / "a.jsonl").write_bytes(GOOD)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "b.jsonl").write_bytes(GOOD)
    (data / "linked").symlink_to(elsewhere)
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(SIMPLE_RECIPE.format(dataset=data))
    proc = run_cli("prepare", "--config", str(recipe), "--job-dir", str(tmp_path / "job"), "--num-shards", "1")
    assert proc.returncode == 0, proc.stderr
    assert f"not reading {data / 'linked'}: a link to a directory" in proc.stderr
    assert json.loads((tmp_path / "job" / "manifest.json").read_text())["total_rows"] == 2


def test_lines_at_the_limit_pass(tmp_path, run_cli):
    """The limit is on both the input line (newline not counted, a CR before it counted) and the
    shard line prepare writes."""
    prefix = b'{"__elastic_row__":0,"text":"'
    at_limit_in_shard = b'{"text": "' + b"y" * (1000 - len(prefix) - 2) + b'"}'
    at_limit_as_input = b'{"text": "z"}'.ljust(1000)  # trailing whitespace is JSON whitespace
    dataset = tmp_path / "d.jsonl"
    dataset.write_bytes(at_limit_in_shard + b"\n" + at_limit_as_input + b"\n")
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(SMALL_BLOCKS_RECIPE.format(dataset=dataset))
    proc = run_cli("prepare", "--config", str(recipe), "--job-dir", str(tmp_path / "job"), "--num-shards", "1")
    assert proc.returncode == 0, proc.stderr
    assert [len(line) for line in (tmp_path / "job" / "shards").glob("*.jsonl").__next__().read_bytes().splitlines()][0] == 1000
    dataset.write_bytes(at_limit_as_input + b"\r\n")
    proc = run_cli("prepare", "--config", str(recipe), "--job-dir", str(tmp_path / "job2"), "--num-shards", "1")
    assert_rejected(tmp_path / "job", proc, r"d.jsonl:1: line is 1001 bytes, over the limit of 1000")
    assert not (tmp_path / "job2").exists()


def test_reader_lines_keep_their_carriage_return(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_bytes(b"{}\r\n{}\r\n")
    assert [lines for _, lines in HashingLineReader(path).blocks()] == [[b"{}\r", b"{}\r"]]


def test_commands_on_a_missing_job_dir(tmp_path, run_cli):
    for command in (
        ["status"],
        ["worker"],
        ["retry", "--all-failed"],
        ["merge", "--output", str(tmp_path / "o.jsonl")],
        ["verify"],
    ):
        proc = run_cli(*command, "--job-dir", str(tmp_path / "nope"))
        assert proc.returncode == 2 and "job directory does not exist" in proc.stderr, (command, proc.stderr)
