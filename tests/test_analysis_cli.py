"""`--analyze` at the command line: what `prepare` makes of a recipe, what it refuses up front,
and the flags every launcher passes on (no Ray: the stage itself is tests/test_analysis_stage.py,
the whole job tests/test_analysis_e2e.py)."""

from __future__ import annotations

import json

import yaml
from support.jobs import refused, sample_rows, write_jsonl

from elastic_sharding.cli.parser import build_parser, dlc_arguments

MIXED = """\
np: 1
text_keys: text
export_path: out/cleaned.jsonl
process:
  - whitespace_normalization_mapper:
  - text_length_filter:
      min_len: 5
  - document_deduplicator:
  - suffix_filter:
      suffixes: [".txt"]
  - words_num_filter:
      tokenization: false
      min_num: 2
  - usage_counter_mapper:
"""

MAPPERS_ONLY = """\
np: 1
text_keys: text
process:
  - whitespace_normalization_mapper:
  - clean_email_mapper:
"""


def recipe(tmp_path, text: str):
    path = tmp_path / "recipe.yaml"
    path.write_text(text)
    return path, write_jsonl(tmp_path / "data.jsonl", sample_rows(12))


def test_prepare_keeps_what_dj_analyze_runs_and_records_what_it_skips(tmp_path, run_cli):
    config, data = recipe(tmp_path, MIXED)
    job = tmp_path / "job"
    args = ("prepare", "--config", str(config), "--dataset-path", str(data), "--job-dir", str(job), "--num-shards", "3")
    assert run_cli(*args, "--analyze", "--percentiles", "0.01", "0.999").returncode == 0
    manifest = json.loads((job / "manifest.json").read_text())
    assert manifest["analysis"] == {
        "percentiles": [0.01, 0.999],
        "save_stats_in_one_file": False,
        "export_stem": "cleaned",
        "operators": ["process[1] text_length_filter", "process[4] words_num_filter", "process[5] usage_counter_mapper"],
        # suffix_filter computes no statistic (NON_STATS_FILTERS): dj-analyze skips it too
        "skipped": [
            "process[0] whitespace_normalization_mapper",
            "process[2] document_deduplicator",
            "process[3] suffix_filter",
        ],
    }
    assert manifest["request"]["analyze"] and manifest["segments"] == [{"index": 0, "first_op": 0, "end_op": 3, "dedup_op": None}]
    stored = yaml.safe_load((job / "recipe.yaml").read_text())
    assert [next(iter(op)) for op in stored["process"]] == ["text_length_filter", "words_num_filter", "usage_counter_mapper"]
    assert stored["percentiles"] == [0.01, 0.999]

    again = run_cli(*args)
    refused(again, "prepared with --analyze")
    other = run_cli(*args, "--analyze", "--percentiles", "0.5")
    refused(other, "--percentiles differs")


def test_the_recipes_percentiles_are_the_default(tmp_path, run_cli):
    config, data = recipe(tmp_path, MIXED + "percentiles: [0.1, 0.9]\n")
    job = tmp_path / "job"
    proc = run_cli("prepare", "--config", str(config), "--dataset-path", str(data), "--job-dir", str(job), "--num-shards", "2",
                   "--analyze")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert json.loads((job / "manifest.json").read_text())["analysis"]["percentiles"] == [0.1, 0.9]


def test_nothing_to_analyze_is_refused_before_anything_is_made(tmp_path, run_cli):
    config, data = recipe(tmp_path, MAPPERS_ONLY)
    job = tmp_path / "job"
    proc = run_cli("prepare", "--config", str(config), "--dataset-path", str(data), "--job-dir", str(job), "--num-shards", "2",
                   "--analyze")  # fmt: skip
    refused(proc, "nothing to analyze", "whitespace_normalization_mapper", "text_length_filter")
    assert not job.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["data.jsonl", "recipe.yaml"]


def test_percentiles_need_analyze_and_fractions(tmp_path, run_cli):
    config, data = recipe(tmp_path, MIXED)
    job = tmp_path / "job"
    base = ("prepare", "--config", str(config), "--dataset-path", str(data), "--job-dir", str(job), "--num-shards", "2")
    refused(run_cli(*base, "--percentiles", "0.5"), "--percentiles is an option of --analyze")
    bad = run_cli(*base, "--analyze", "--percentiles", "99.9")
    assert bad.returncode == 2 and "outside [0, 1]" in bad.stderr
    local = run_cli("local", "--config", str(config), "--dataset-path", str(data), "--job-dir", str(job), "--percentiles", "0.5")
    refused(local, "--percentiles is an option of --analyze")
    assert not job.exists()


def test_merge_of_an_analysis_refuses_another_format_before_any_work(tmp_path, run_cli):
    config, data = recipe(tmp_path, MIXED)
    job = tmp_path / "job"
    assert run_cli("prepare", "--config", str(config), "--dataset-path", str(data), "--job-dir", str(job), "--num-shards", "2",
                   "--analyze").returncode == 0  # fmt: skip
    proc = run_cli("merge", "--job-dir", str(job), "--output", str(tmp_path / "out"), "--output-format", "parquet")
    refused(proc, "--output-format parquet", "JSONL, as dj-analyze writes it")
    assert not (tmp_path / "out").exists() and not (job / "analysis-stage").exists()


def test_slurm_passes_analyze_and_percentiles_to_every_node():
    args = build_parser().parse_args(
        ["slurm", "--job-dir", "/shared/j", "--nodes", "2", "--analyze", "--percentiles", "0.01", "0.999", "--dry-run"]
    )
    argv = dlc_arguments(args)
    assert "--analyze" in argv
    at = argv.index("--percentiles")
    assert argv[at + 1 : at + 3] == ["0.01", "0.999"]
    node = build_parser().parse_args(["dlc", *argv])
    assert node.analyze and node.percentiles == [0.01, 0.999]
