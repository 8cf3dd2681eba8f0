"""Every rejected input: exit 2, one line that says what and where, and no job directory."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from conftest import SIMPLE_RECIPE

GOOD = b'{"text": "hello world"}\n{"text": "second row"}\n'

DATA_CASES = {
    "bom": (b"\xef\xbb\xbf" + GOOD, r"d.jsonl:1: starts with a UTF-8 byte-order mark"),
    "blank line": (b'{"text": "a"}\n\n{"text": "b"}\n', r"d.jsonl:2: blank line"),
    "whitespace line": (b'{"text": "a"}\n   \n', r"d.jsonl:2: blank line"),
    "invalid utf-8": (b'{"text": "a"}\n{"text": "\xff\xfe"}\n', r"d.jsonl:2: invalid UTF-8"),
    "truncated json": (b'{"text": "a"}\n{"text": "b\n', r"d.jsonl:2: malformed JSON"),
    "array row": (b'{"text": "a"}\n[1, 2]\n', r"d.jsonl:2: row is an array, not a JSON object"),
    "scalar row": (b'"just a string"\n', r"d.jsonl:1: row is a JSON str, not a JSON object"),
    "nan": (b'{"text": "a", "x": NaN}\n', r"d.jsonl:1: malformed JSON"),
    "media not a list": (b'{"text": "a", "images": "one.jpg"}\n', r"d.jsonl:1: field 'images' must be a list of strings or null"),
    "media not strings": (b'{"text": "a", "audios": [1]}\n', r"d.jsonl:1: field 'audios' must be a list of strings or null"),
    "reserved field": (b'{"text": "a", "__elastic_row__": 3}\n', r"d.jsonl:1: field '__elastic_row__' is reserved"),
    "type conflict": (
        b'{"text": "a", "n": 1}\n{"text": "b", "n": "1"}\n',
        r"field n is a string here but a number at .*d.jsonl:1",
    ),
    "empty file": (b"", r"the input has no rows"),
}

RECIPE_CASES = {
    "no process": ("dataset_path: {dataset}\n", r"no 'process' list"),
    "empty process": ("dataset_path: {dataset}\nprocess: []\n", r"'process' must be a non-empty list"),
    "unknown op": ("dataset_path: {dataset}\nprocess:\n  - no_such_mapper:\n", r"process\[0\] no_such_mapper: unknown operator"),
    "deduplicator": ("dataset_path: {dataset}\nprocess:\n  - document_deduplicator:\n", r"is a Deduplicator"),
    "ray deduplicator": ("dataset_path: {dataset}\nprocess:\n  - ray_document_deduplicator:\n", r"global operation|Deduplicator"),
    "selector": ("dataset_path: {dataset}\nprocess:\n  - random_selector:\n", r"is a Selector"),
    "grouper": ("dataset_path: {dataset}\nprocess:\n  - naive_grouper:\n", r"is a Grouper"),
    "aggregator": (
        "dataset_path: {dataset}\nprocess:\n  - meta_tags_aggregator:\n",
        r"is a Aggregator|is a Grouper|is an? Aggregator",
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
    "no dataset": ("process:\n  - text_length_filter:\n", r"no dataset_path; pass --dataset-path"),
    "unknown option": (
        "dataset_path: {dataset}\nexport_pth: x.jsonl\nprocess:\n  - text_length_filter:\n",
        r"config parser rejects the recipe: Option 'export_pth' is not accepted",
    ),
    "op skip_op_error not a recipe error": (
        "dataset_path: {dataset}\nprocess:\n  - document_deduplicator:\n      skip_op_error: true\n",
        r"is a Deduplicator",
    ),
}


def assert_rejected(tmp_path: Path, proc, pattern: str) -> None:
    import re

    assert proc.returncode == 2, proc.stderr
    lines = [l for l in proc.stderr.splitlines() if "error:" in l]
    assert len(lines) == 1, proc.stderr
    assert re.search(pattern, lines[0]), lines[0]
    leftovers = [p for p in os.listdir(tmp_path) if p.startswith((".job", "job"))]
    assert leftovers == [], leftovers


def prepare_rejected(tmp_path: Path, run_cli, data: bytes, recipe_body: str, pattern: str) -> None:
    dataset = tmp_path / "d.jsonl"
    dataset.write_bytes(data)
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(recipe_body.format(dataset=dataset))
    proc = run_cli("prepare", "--config", str(recipe), "--job-dir", str(tmp_path / "job"), "--num-shards", "1", cwd=tmp_path)
    assert_rejected(tmp_path, proc, pattern)


@pytest.mark.parametrize("case", sorted(DATA_CASES))
def test_bad_data(tmp_path, run_cli, case):
    data, pattern = DATA_CASES[case]
    prepare_rejected(tmp_path, run_cli, data, SIMPLE_RECIPE, pattern)


@pytest.mark.parametrize("case", sorted(RECIPE_CASES))
def test_bad_recipe(tmp_path, run_cli, case):
    body, pattern = RECIPE_CASES[case]
    prepare_rejected(tmp_path, run_cli, GOOD, body, pattern)


def test_bad_locations_and_parameters(tmp_path, run_cli):
    data = tmp_path / "data"
    data.mkdir()
    (data / "a.jsonl").write_bytes(GOOD)
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(SIMPLE_RECIPE.format(dataset=data))
    (tmp_path / "notes.txt").write_text("x")
    (tmp_path / "empty").mkdir()
    cases = [
        (["--job-dir", str(data / "job")], r"inside the dataset directory"),
        (["--dataset-path", str(tmp_path / "notes.txt")], r"notes.txt: not a .jsonl file"),
        (["--dataset-path", str(tmp_path / "missing.jsonl")], r"missing.jsonl: cannot access dataset"),
        (["--dataset-path", str(tmp_path / "empty")], r"empty: directory contains no .jsonl files"),
        (["--num-shards", "3"], r"--num-shards 3 exceeds the number of input rows \(2\)"),
        (["--num-shards", "0"], r"must be at least 1"),
        (["--lock-timeout-secs", "10", "--heartbeat-interval-secs", "6"], r"must be at most half"),
    ]
    for extra, pattern in cases:
        args = ["prepare", "--config", str(recipe), "--job-dir", str(tmp_path / "job"), "--num-shards", "1", *extra]
        proc = run_cli(*args)
        assert proc.returncode == 2, (extra, proc.stderr)
        assert __import__("re").search(pattern, proc.stderr), (extra, proc.stderr)
        assert not (tmp_path / "job").exists() and not (data / "job").exists()


def test_symlink_loop_dataset(tmp_path, run_cli):
    loop = tmp_path / "loop.jsonl"
    loop.symlink_to(loop)
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(SIMPLE_RECIPE.format(dataset=loop))
    proc = run_cli("prepare", "--config", str(recipe), "--job-dir", str(tmp_path / "job"), "--num-shards", "1")
    assert_rejected(tmp_path, proc, r"loop.jsonl: cannot access dataset: Too many levels of symbolic links")


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
