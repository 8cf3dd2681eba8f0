"""The quick benchmark runs end to end and reports every ratio as a number; the scaling model and
the bench's own helpers behave as documented.

The quick bench asserts nothing about timings or targets: on a shared CI box those are noise,
and a missed target is a finding to report, not a broken bench. CI runs a bounded subset with
no Ray runtime: prepare against both its baselines, the no-op prepare, merge to a file and to a
directory, and claims. The others (`e2e_ray` and `job_dir_bytes` on its job, `overhead`,
`shard_cost`, `e2e_partitioned`, `hetero`, `warm_ops`, `prepare_procs`, `prepare_coop`, `dedup`, `tail`,
`analyze`) each start Ray runtimes, `dj-process` or `dj-analyze` runs or more local jobs; `bench/run --quick`
runs them all, and `test_job_dir_size` measures a real run's job directory. The dedup rows' own parts
(their input, the memory sampler, the stage in the projection) and the analyze rows' (their input and
recipe, the overall.csv comparison, the PASS/FAIL row) are checked here without Data-Juicer.
"""

from __future__ import annotations

import dataclasses
import json
import math
import subprocess
import sys
from pathlib import Path

import orjson
import pytest
from support.jobs import REPO

sys.path.insert(0, str(REPO / "bench"))

import scale  # noqa: E402
from bench_measures import prepared_lines  # noqa: E402

NAMES = (
    "prepare",
    "prepare_original",
    "prepare_noop",
    "merge",
    "merge_dir",
    "claims",
)
NO_BASELINE = {"claims"}  # judged on a value of its own, not a ratio of two runs


@pytest.mark.e2e
def test_quick_bench_reports_every_ratio_it_measures(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    args = [sys.executable, str(REPO / "bench" / "elastic_bench.py"), "--quick", "--only", ",".join(NAMES), "--json", str(out),
            "--work-dir", str(tmp_path)]  # fmt: skip
    proc = subprocess.run(args, cwd=REPO, capture_output=True, text=True, timeout=1500)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-5000:]
    report = orjson.loads(out.read_bytes())
    assert set(report["results"]) == set(NAMES)
    for name in NAMES:
        result = report["results"][name]
        assert result["error"] is None, (name, result["error"])
        if result["details"].get("skipped"):
            # A row this checkout cannot measure (merge_dir before directory output exists).
            assert name == "merge_dir" and result["value"] is None and result["met"] is None, (name, result)
            continue
        for key in ("value", "ours_secs"):
            assert isinstance(result[key], float | int) and math.isfinite(result[key]) and result[key] > 0, (name, key, result)
        if name not in NO_BASELINE:
            assert result["ratio"] > 0 and result["baseline_secs"] > 0, (name, result)
        assert isinstance(result["met"], bool)
    for name in NAMES:
        assert any(line.startswith(report["results"][name]["label"]) for line in proc.stdout.splitlines()), name
    assert report["machine"]["cores"] >= 1
    # The scaling projection from this run's rates is printed and kept.
    assert "scale projection" in proc.stdout and report["scale"]["rows"][0]["nodes"] == 1
    assert report["scale"]["sources"]["prepare_mbps"].startswith("prepare")
    assert report["scale"]["sources"]["process_mbps"].startswith("assumed")  # no e2e_ray in this subset
    # The work directory is removed afterwards.
    assert not list(tmp_path.glob("elastic-bench-*"))


TODAY = {"prepare_mbps": 55.0, "process_mbps": 4.7, "merge_mbps": 380.0}  # ../shared/notes/prepare-floor.md


def test_scale_reproduces_the_single_process_prepare_figures() -> None:
    """The note's Amdahl figures: one prepare participant, file merge, no per-shard cost: 61 %
    serial at 16 nodes and a speed-up of ~6.9 of 16."""
    proj = scale.projection(scale.Rates(**TODAY, max_participants=1), scale.TB, 4096, scale.NODES)
    at16 = next(row for row in proj["rows"] if row["nodes"] == 16)
    assert at16["file"]["serial_fraction"] == pytest.approx(0.61, abs=0.005)
    assert at16["file"]["speedup"] == pytest.approx(6.85, abs=0.05)
    assert proj["target"]["met_file"] is False


def test_scale_formula_sanity() -> None:
    rates = scale.Rates(**TODAY, per_shard_secs=0.3, prepare_fixed_secs=3, node_startup_secs=12, merge_dir_secs=0.5)
    proj = scale.projection(rates, scale.TB, 4096, scale.NODES)
    rows = proj["rows"]
    for kind in ("file", "dir"):
        assert rows[0][kind]["serial_fraction"] == 0.0 and rows[0][kind]["speedup"] == pytest.approx(1.0)
        speedups = [row[kind]["speedup"] for row in rows]
        assert speedups == sorted(speedups) and all(s <= row["nodes"] for s, row in zip(speedups, rows))
        serial = [row[kind]["serial_fraction"] for row in rows]
        assert serial == sorted(serial) and all(0.0 <= f < 1.0 for f in serial)
        for row in rows:
            assert row[kind]["total_secs"] == pytest.approx(row["prepare_secs"] + row["process_secs"] + row[kind]["merge_secs"])
    # Every node a participant: only the merge is serial; a directory merge (0.5 s) almost nothing.
    at16 = rows[scale.NODES.index(16)]
    assert at16["participants"] == 16
    assert at16["file"]["serial_secs"] == pytest.approx(1e6 / 380)
    assert at16["dir"]["serial_fraction"] < 0.001
    # One participant: prepare is serial too, and the serial fraction grows.
    single = scale.projection(scale.Rates(**TODAY, max_participants=1), scale.TB, 4096, scale.NODES)
    assert all(s["file"]["serial_fraction"] >= r["file"]["serial_fraction"] for s, r in zip(single["rows"], rows))
    # Fewer shards than nodes cap the participants.
    assert scale.participants(rates, 64, 10) == 10


def test_bench_scale_command_prints_the_table_and_the_formula(tmp_path: Path) -> None:
    out = tmp_path / "scale.json"
    argv = [str(REPO / "bench" / "scale"), "--prepare-mbps", "55", "--process-mbps", "4.7", "--merge-mbps", "380",
            "--participants", "1", "--json", str(out)]  # fmt: skip
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=True)
    assert "T(n)        = prepare(n) + process(n) + merge" in proc.stdout
    assert "file output 61.0 % MISSED" in proc.stdout
    proj = json.loads(out.read_text())
    assert [row["nodes"] for row in proj["rows"]] == list(scale.NODES)
    bad = subprocess.run([*argv[:2], "0", *argv[3:]], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "must be positive" in bad.stderr


def test_scale_rates_from_a_run_say_what_they_assume() -> None:
    rates, sources = scale.rates_from_results({})
    assert rates.prepare_mbps == 55.0 and rates.max_participants == 1
    assert all(source.startswith("assumed") for source in sources.values())
    coop = {"name": "prepare_coop", "error": None, "details": {"cooperative_prepare": True}}
    rates, sources = scale.rates_from_results({"prepare_coop": coop})
    assert rates.max_participants is None and sources["max_participants"].startswith("every node")
    coop["details"]["cooperative_prepare"] = False
    assert scale.rates_from_results({"prepare_coop": coop})[0].max_participants == 1


def test_prepared_line_with_and_without_the_phase_time() -> None:
    log = (
        "2026-12-01 10:00:00 vm elastic-shard[1] INFO prepared /j/job: 500000 rows from 1 file(s) in 16 shard(s)\n"
        "2026-12-01 10:00:09 vm elastic-shard[2] INFO prepared /j/job: 500000 rows from 2 file(s) in 16 shard(s) in 8.25s by 2 participant(s)\n"
        "INFO prepared 16 shard(s), 500000 rows; starting 2 local worker process(es)\n"
        "INFO prepared /j/other: 3 rows from 1 file(s) in 1 shard(s) in 0.10s by 1 participant(s)"  # no newline yet: incomplete
    )  # fmt: skip
    lines = prepared_lines(log)
    assert [(line["rows"], line["files"], line["secs"], line["participants"]) for line in lines] == [
        (500000, 1, None, None),
        (500000, 2, 8.25, 2),
    ]
    assert lines[1]["job"] == "/j/job"


def test_prepare_baselines_floor_and_original(tmp_path: Path) -> None:
    rows = [{"id": i, "text": f"row {i} ü", "meta": {"k": i % 3}} for i in range(50)]
    data = tmp_path / "in.jsonl"
    data.write_bytes(b"".join(orjson.dumps(row) + b"\n" for row in rows))
    script = str(REPO / "bench" / "prepare_baselines.py")
    floor = json.loads(subprocess.run([sys.executable, script, "floor", str(data)], capture_output=True, check=True).stdout)
    assert floor["rows"] == 50 and floor["bytes"] == data.stat().st_size
    out = tmp_path / "shards"
    cmd = [sys.executable, script, "original", str(data), str(out), "7"]
    original = json.loads(subprocess.run(cmd, capture_output=True, check=True).stdout)
    assert original["rows"] == 50 and original["shards"] == 7 and original["raw_sha256"] == floor["sha256"]
    shards = sorted(out.glob("shard-*.jsonl"))
    written = [json.loads(line) for shard in shards for line in shard.read_bytes().splitlines()]
    assert len(shards) == 7 and all(shard.stat().st_size > 0 for shard in shards)
    assert [row["__elastic_row__"] for row in written] == list(range(50))
    assert [{k: v for k, v in row.items() if k != "__elastic_row__"} for row in written] == rows


# -- the dedup rows' helpers and the stage in the projection -----------------------------------------

STAGE = {
    "dedup": "simhash",
    "dedup_keys_mbps": 2.0,
    "dedup_bucket_recs_per_sec": 4e6,
    "dedup_round_secs_per_mrow": 1.5,
    "dedup_keep_mbps": 50.0,
    "dedup_fanout": 15.0,
    "dedup_rows_per_mb": 1100.0,
    "dedup_rounds": 4,
    "dedup_barrier_secs": 0.3,
    "dedup_procs_per_node": 2,
}


def test_scale_units_are_the_stage_plan():
    """bench/scale.py copies the stage's unit sizes (standard library only): they must agree."""
    from elastic_sharding.dedup import stage

    assert (scale.RECORDS_PER_BUCKET_UNIT, scale.ROWS_PER_NODE_PART, scale.MAX_PARTS) == (
        stage.RECORDS_PER_BUCKET_UNIT,
        stage.ROWS_PER_NODE_PART,
        stage.MAX_PARTS,
    )


def test_scale_with_a_dedup_stage():
    plain = scale.projection(scale.Rates(**TODAY, per_shard_secs=0.3), scale.TB, 4096, scale.NODES)
    rates = scale.Rates(**TODAY, per_shard_secs=0.3, **STAGE)
    proj = scale.projection(rates, scale.TB, 4096, scale.NODES)
    assert "dedup_secs" not in plain["rows"][0] and "dedup" not in plain["formula"]
    assert "dedup_serial(n)" in proj["formula"]
    phases = {p["phase"]: p for p in proj["dedup_phases"]}
    rows = 1e6 * 1100.0
    assert phases["keys"]["units"] == phases["keep"]["units"] == 4096
    assert phases["buckets"]["units"] == 4096  # 16.5 G records: capped at MAX_PARTS
    assert phases["components"]["units"] == math.ceil(rows / scale.ROWS_PER_NODE_PART) and phases["components"]["times"] == 4
    assert phases["keys"]["unit_secs"] == pytest.approx(1e6 / 4096 / 2.0)
    for before, row in zip(plain["rows"], proj["rows"]):
        n = row["nodes"]
        slots = 2 * n
        expected = sum(p["times"] * (math.ceil(p["units"] / slots) * p["unit_secs"] + 0.3) for p in phases.values())
        assert row["dedup_secs"] == pytest.approx(expected)
        serial = sum(p["times"] * (p["unit_secs"] + 0.3) for p in phases.values()) if n > 1 else 0.0
        assert row["dedup_serial_secs"] == pytest.approx(serial)
        for kind in ("file", "dir"):
            assert row[kind]["total_secs"] == pytest.approx(before[kind]["total_secs"] + expected)
            assert row[kind]["serial_secs"] == pytest.approx(before[kind]["serial_secs"] + serial)
    assert proj["rows"][0]["file"]["serial_fraction"] == 0.0
    # An exact stage has no components rounds.
    exact = scale.dedup_phases(scale.Rates(**TODAY, **{**STAGE, "dedup": "exact", "dedup_fanout": 1.0}), scale.TB, 4096)
    assert [p["phase"] for p in exact] == ["keys", "buckets", "keep"]


def test_bench_scale_command_with_a_dedup_stage(tmp_path: Path) -> None:
    argv = [str(REPO / "bench" / "scale"), "--prepare-mbps", "55", "--process-mbps", "4.7", "--merge-mbps", "380",
            "--dedup", "simhash", "--dedup-keys-mbps", "2", "--dedup-bucket-recs", "4e6", "--dedup-keep-mbps", "50",
            "--dedup-round-secs", "1.5", "--dedup-rounds", "4", "--dedup-fanout", "15", "--dedup-procs", "2"]  # fmt: skip
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=True)
    assert "dedup stage (simhash)" in proc.stdout and "dedup_serial(n)" in proc.stdout
    header = next(line for line in proc.stdout.splitlines() if line.lstrip().startswith("nodes"))
    assert [cell.strip() for cell in header.split("|")][:4] == ["nodes", "prepare", "process", "dedup"]
    bad = subprocess.run(argv[: argv.index("--dedup-keys-mbps")], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "--dedup needs a positive --dedup-keys-mbps" in bad.stderr


def test_scale_rates_from_a_run_take_the_measured_stage() -> None:
    rates, sources = scale.rates_from_results({})
    assert rates.dedup is None and "dedup" not in sources  # no dedup row in the run: no stage projected
    measured = {k.removeprefix("dedup_"): v for k, v in STAGE.items() if k != "dedup"}
    result = {"name": "dedup_exact_workers", "error": None, "details": {"recipe": "exact", "rows": 1000, "stage_rates": measured}}
    rates, sources = scale.rates_from_results({"dedup_exact_workers": result, "dedup_simhash": {**result, "error": "failed"}})
    assert rates.dedup == "exact" and rates.dedup_keys_mbps == 2.0 and rates.dedup_procs_per_node == 2
    assert sources["dedup"].startswith("dedup_exact_workers")
    simhash = {**result, "name": "dedup_simhash_rss", "details": {**result["details"], "recipe": "simhash"}}
    assert scale.rates_from_results({"dedup_exact": result, "dedup_simhash_rss": simhash})[0].dedup == "simhash"
    # The dedup rows' `local` runs logged a cooperative prepare: every node takes part.
    assert rates.max_participants == 1
    result["details"]["cooperative_prepare"] = True
    assert scale.rates_from_results({"dedup_exact_workers": result})[0].max_participants is None


def test_dedup_dataset_plants_duplicates_of_earlier_rows(tmp_path: Path) -> None:
    from bench_data import DEDUP_KINDS, write_dedup_dataset, write_prefix

    path = tmp_path / "dedup.jsonl"
    counts = write_dedup_dataset(path, 3000)
    again = write_dedup_dataset(tmp_path / "again.jsonl", 3000)
    assert counts == again and path.read_bytes() == (tmp_path / "again.jsonl").read_bytes()
    rows = [orjson.loads(line) for line in path.read_bytes().splitlines()]
    assert [row["id"] for row in rows] == list(range(3000)) and set(counts) == set(DEDUP_KINDS)
    assert sum(counts.values()) == 3000
    planted = counts["exact"] + counts["surface"] + counts["near"]
    assert 0.07 * 3000 < planted < 0.13 * 3000 and min(counts.values()) > 0
    texts = [row["text"] for row in rows]
    exact = sum(1 for i, text in enumerate(texts) if text in set(texts[:i]))
    assert exact >= counts["exact"]  # every exact copy repeats an earlier row
    half = write_prefix(path, tmp_path / "half.jsonl", 1500)
    assert half.read_bytes().splitlines() == path.read_bytes().splitlines()[:1500]


def test_tree_memory_finds_each_process_peak(tmp_path: Path) -> None:
    """A child whose own child touches 80 MB and exits: its peak is found in the tree, and the
    kernel's wait4 figure of the whole run is at least that."""
    from bench_lib import Bench

    grandchild = "import time; b = bytearray(80 << 20); b[::4096] = b'x' * len(b[::4096]); time.sleep(1.0)"
    child = f"import subprocess, sys, time; subprocess.run([sys.executable, '-c', {grandchild!r}], check=True); time.sleep(0.6)"
    bench = Bench(tmp_path / "work", "warm", timeout=60)
    try:
        wall, tree, largest = bench.run_with_memory("tree", [sys.executable, "-c", child])
    finally:
        bench.close(keep=False)
    assert wall > 1.0 and tree.root_key is not None
    everything = tree.subtree(tree.root_key)
    assert len(everything) == 2
    assert tree.peak_one(everything) >= 80 << 20 > tree.peak_one({tree.root_key})
    assert largest >= 80 << 20
    assert tree.peak_sum(everything) >= 80 << 20


# -- bench/parquet.py: its input, its floor and its prepare row ------------------------------------


def test_parquet_bench_input_floor_and_prepare_row(tmp_path: Path) -> None:
    """The generated Parquet corpus is deterministic, cached, of several files and row groups and at
    least the size asked; the floor reads every row group; the prepare row (no Ray) reports a ratio.
    The `job` and `job_dir_*` rows start Ray runtimes and a `dj-process`: `bench/parquet.py --quick`."""
    import parquet  # bench/parquet.py
    import pyarrow.parquet as pq

    size = 300_000
    first = parquet.ensure_corpus(tmp_path / "a", size, row_group_mb=0.05)
    again = parquet.ensure_corpus(tmp_path / "b", size, row_group_mb=0.05)
    files = sorted(first.data.iterdir())
    assert [f.read_bytes() for f in files] == [f.read_bytes() for f in sorted(again.data.iterdir())]
    assert parquet.ensure_corpus(tmp_path / "a", size, row_group_mb=0.05).info == first.info  # cached
    assert len(files) >= parquet.MIN_FILES and first.bytes == sum(f.stat().st_size for f in files) >= size
    assert first.info["row_groups"] > len(files) and first.info["rows"] == sum(pq.ParquetFile(f).metadata.num_rows for f in files)
    assert pq.read_schema(files[0]).names == ["id", "text", "url", "meta"]
    assert pq.ParquetFile(files[0]).metadata.row_group(0).column(1).compression == "SNAPPY"
    out = tmp_path / "floor.parquet"
    cmd = [sys.executable, str(REPO / "bench" / "parquet.py"), "floor", str(first.data), str(out), "zstd"]
    floor = json.loads(subprocess.run(cmd, capture_output=True, check=True, timeout=120).stdout)
    assert (floor["rows"], floor["row_groups"], floor["files"]) == (first.info["rows"], first.info["row_groups"], len(files))
    assert pq.read_table(out).equals(pq.read_table(first.data))
    assert pq.ParquetFile(out).metadata.row_group(0).column(1).compression == "ZSTD"

    report = tmp_path / "parquet.json"
    args = [sys.executable, str(REPO / "bench" / "parquet.py"), "--only", "prepare", "--size-gb", str(size / 1e9),
            "--row-group-mb", "0.05", "--shards", "4", "--repeats", "1", "--work-dir", str(tmp_path / "a"), "--json", str(report)]  # fmt: skip
    proc = subprocess.run(args, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-5000:]
    result = json.loads(report.read_text())["results"]["prepare"]
    assert result["error"] is None and isinstance(result["met"], bool), result
    assert result["ratio"] > 0 and result["ours_secs"] > 0 and result["baseline_secs"] > 0
    shards = result["details"]["prepared_shards"]
    assert (shards["count"], shards["format"]) == (4, "parquet") and shards["bytes"] > 0
    assert result["details"]["floor_read_every_row"] is True
    assert any(line.startswith(result["label"]) for line in proc.stdout.splitlines())
    assert not list((tmp_path / "a").glob("run-*"))  # the run directory is removed; the input stays cached


# -- the analyze rows' helpers: their input, recipe and overall.csv comparison ---------------------


def test_analyze_input_is_deterministic_prose_with_line_breaks(tmp_path: Path) -> None:
    from bench_data import PROSE_ROW_CHARS, write_prefix, write_prose_dataset

    path, source = write_prose_dataset(tmp_path / "a.jsonl", 400)
    again, _ = write_prose_dataset(tmp_path / "b.jsonl", 400)
    assert path.read_bytes() == again.read_bytes() and source
    rows = [orjson.loads(line) for line in path.read_bytes().splitlines()]
    assert [row["id"] for row in rows] == list(range(400))
    assert all(0 < len(row["text"]) <= PROSE_ROW_CHARS[1] for row in rows)
    if not source.startswith("seeded"):  # real prose has lines, so the line-length statistics vary
        assert sum("\n" in row["text"] for row in rows) > 200
    half = write_prefix(path, tmp_path / "half.jsonl", 200)
    assert half.read_bytes().splitlines() == path.read_bytes().splitlines()[:200]


def test_analyze_recipe_is_stats_filters_and_a_skipped_mapper() -> None:
    from bench_data import ANALYZE_OPS

    names = [next(iter(op)) for op in ANALYZE_OPS]
    assert len(set(names)) == len(names)
    assert sum(name.endswith("_filter") for name in names) >= 6 and names[0].endswith("_mapper")
    for op in ANALYZE_OPS:
        name, args = next(iter(op.items()))
        if name in ("words_num_filter", "word_repetition_filter"):
            assert args["tokenization"] is False, name  # True would download a tokenizer model
    assert not {"perplexity_filter", "language_id_score_filter", "stopwords_filter", "flagged_words_filter"} & set(names)


def _overall_csv(path: Path, columns: list[str], rows: dict[str, list[str]]) -> Path:
    path.write_text("\n".join([",".join(["", *columns]), *(",".join([label, *cells]) for label, cells in rows.items())]) + "\n")
    return path


def test_compare_overall_cell_by_cell(tmp_path: Path) -> None:
    from analyze_measure import cells_equal, compare_overall

    columns = ["text_len", "lang"]
    rows = {"count": ["2000.0", "2000"], "mean": ["1194.26", ""], "top": ["", "en"], "std": ["0.1", "nan"]}
    theirs = _overall_csv(tmp_path / "theirs.csv", columns, rows)
    same = compare_overall(_overall_csv(tmp_path / "same.csv", columns, rows), theirs)
    assert same["equal"] and same["cells"] == same["compared"] == 8 and same["mismatches"] == []
    close = {**rows, "mean": ["1194.2600000001", ""], "std": ["0.1000000000001", "nan"]}  # within 1e-9 relative
    result = compare_overall(_overall_csv(tmp_path / "close.csv", columns, close), theirs)
    assert result["equal"] and 0 < result["max_rel_diff"] < 1e-9
    far = {**rows, "mean": ["1194.2601", ""]}
    result = compare_overall(_overall_csv(tmp_path / "far.csv", columns, far), theirs)
    assert not result["equal"] and result["mismatch_count"] == 1 and "mean/text_len" in result["mismatches"][0]
    text = {**rows, "top": ["", "EN"]}  # strings exactly
    assert not compare_overall(_overall_csv(tmp_path / "text.csv", columns, text), theirs)["equal"]
    swapped = {label: cells[::-1] for label, cells in rows.items()}  # the same cells, columns in another order
    result = compare_overall(_overall_csv(tmp_path / "swapped.csv", columns[::-1], swapped), theirs)
    assert not result["equal"] and result["mismatches"][0].startswith("columns:") and result["mismatch_count"] == 1
    fewer = {label: cells for label, cells in rows.items() if label != "top"}
    result = compare_overall(_overall_csv(tmp_path / "fewer.csv", columns, fewer), theirs)
    assert not result["equal"] and result["mismatches"][0].startswith("row labels:")
    assert cells_equal("0", "0.0") and cells_equal("nan", "NaN") and not cells_equal("", "0") and not cells_equal("1e-8", "0")
    assert not compare_overall(_overall_csv(tmp_path / "empty.csv", [], {}), _overall_csv(tmp_path / "e2.csv", [], {}))["equal"]


def test_analyze_rows_are_selected_and_printed_pass_or_fail() -> None:
    import elastic_bench
    from bench_lib import Result

    args = elastic_bench._parse(["--quick", "--only", "analyze"])
    assert args.wanted == elastic_bench.GROUPS["analyze"] and args.sizes.analyze_rows == 20_000
    assert [names for names, _ in elastic_bench._plan(args.wanted)] == [args.wanted]
    assert elastic_bench._parse(["--only", "analyze_exact", "--analyze-rows", "1000"]).sizes.analyze_rows == 1000
    row = Result("analyze_exact", "overall.csv", None, None, None, 0.0, "cells", "all cells equal", True,
                 {"shown": {"ours": "8 stats x 8 rows", "baseline": "64 cells", "ratio": "PASS"}})  # fmt: skip
    machine = {"cores": 2, "ram_gib": 1.0, "cpu_model": "cpu", "date": "d", "load_avg_at_start": [0], "load_avg_at_end": [0],
               "git_commit": "c"}  # fmt: skip
    line = elastic_bench.table([row], machine, "warm").splitlines()[2]
    cells = [cell.strip() for cell in line.split("|")]
    assert cells == ["overall.csv", "8 stats x 8 rows", "64 cells", "PASS", "all cells equal", "met"]


def test_dj_analyze_script_refuses_a_wrong_command_line() -> None:
    proc = subprocess.run([sys.executable, str(REPO / "bench" / "dj_analyze.py")], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "usage: dj_analyze.py RECIPE" in proc.stderr


def test_stage_scale_rows_are_selected_sized_and_audited(tmp_path: Path) -> None:
    """The stage_scale and dlc_elections rows need the GlusterFS cluster (`bench/run --quick --only
    stage_scale_exact,stage_scale_minhash,dlc_elections`): here only their selection, their sizes,
    their input and the audit that fails a row whose unit was run twice or taken over."""
    import elastic_bench
    import stage_scale_measure as ssm

    args = elastic_bench._parse(["--quick", "--only", ",".join(ssm.NAMES)])
    assert args.wanted == ssm.NAMES and args.stage_scale == ssm.QUICK
    assert [names for names, _ in elastic_bench._plan(args.wanted)] == [ssm.NAMES]
    assert set(ssm.NAMES) <= set(elastic_bench.GROUPS["coordination"])
    flags = ["--only", "dlc_elections", "--stage-participants", "1,3", "--stage-mode", "strict", "--dlc-instances", "5"]
    sized = elastic_bench._parse(flags).stage_scale
    assert (sized.stage_participants, sized.mode, sized.dlc_instances, sized.stage_rows) == ((1, 3), "strict", 5, 1_000_000)

    planted = ssm.write_tiny_shards(tmp_path / "input", 300, 4)
    rows = [
        orjson.loads(line) for path in sorted((tmp_path / "input").glob("*.jsonl")) for line in path.read_bytes().splitlines()
    ]
    assert [row["id"] for row in rows] == list(range(300)) and sum(planted.values()) == 300 and planted["exact"] > 0
    assert min(len(row["text"].split()) for row in rows) >= 5  # every row has a minhash shingle

    def run(ran: list[list[str]], stale: int = 0) -> dict:
        owner = {name: [f"node{i + 1}", i + 1] for i, names in enumerate(ran) for name in names}
        units = {name: {"result": holder, "claim": holder, "stale_claims": 0} for name, holder in owner.items()}
        units["buckets-00000"]["stale_claims"] = stale
        reports = [{"host": f"node{i + 1}", "ran": [[name, 0.0, 1.0] for name in names], "record": {"rounds": 0}, "kept": 7, "kept_sha256": "x"}
                   for i, names in enumerate(ran)]  # fmt: skip
        return {"reports": reports, "audit": {"units": units, "stage_done": True}}

    clean = ssm._check_stage(run([["keys-00000"], ["keys-00001", "buckets-00000"]]))
    assert clean["problems"] == [] and clean["units"] == 3 and clean["units_run_once"] == 3
    twice = ssm._check_stage(run([["keys-00000", "buckets-00000"], ["keys-00001", "buckets-00000"]], stale=1))
    assert any("run more than once" in p for p in twice["problems"]) and any("taken over" in p for p in twice["problems"])


# Two bricks, as `gluster volume profile VOL info cumulative` prints them (GlusterFS 10.3), and an
# interval table that must not be counted again.
GLUSTER_PROFILE = """Brick: 10.200.1.1:/tmp/es-cluster-1-a/brick
--------------------------------------------------
Cumulative Stats:
   Block Size:                256b+                 512b+
 No. of Reads:                   51                     2
No. of Writes:                   81                    80
 %-latency   Avg-latency   Min-Latency   Max-Latency   No. of calls         Fop
 ---------   -----------   -----------   -----------   ------------        ----
      0.00       0.00 ns       0.00 ns       0.00 ns            309     RELEASE
      0.00       0.00 ns       0.00 ns       0.00 ns            192  RELEASEDIR
      0.96   45520.41 ns   18477.00 ns  483980.00 ns             81        READ
      4.42   81132.46 ns   36154.00 ns 2807319.00 ns            209       WRITE
     20.69   69040.55 ns   12959.00 ns 3846876.00 ns           1149      LOOKUP

    Duration: 7 seconds
   Data Read: 28015 bytes
Data Written: 78334 bytes

Interval 0 Stats:
 %-latency   Avg-latency   Min-Latency   Max-Latency   No. of calls         Fop
 ---------   -----------   -----------   -----------   ------------        ----
     20.69   69040.55 ns   12959.00 ns  3846876.00 ns          1149      LOOKUP

Brick: 10.200.1.1:/tmp/es-cluster-1-a/brick2
--------------------------------------------------
Cumulative Stats:
 %-latency   Avg-latency   Min-Latency   Max-Latency   No. of calls         Fop
 ---------   -----------   -----------   -----------   ------------        ----
      1.00   10.00 us       1.00 us       20.00 us              1      LOOKUP
      2.00   10.00 us       1.00 us       20.00 us              7      CREATE
"""


def test_coordination_rows_are_selected_and_the_gluster_profile_is_summed() -> None:
    import coordination_measure as coordination
    import elastic_bench

    args = elastic_bench._parse(["--quick", "--only", "coordination"])  # the group may hold other modules' rows too
    assert set(coordination.NAMES) <= set(args.wanted) == set(elastic_bench.GROUPS["coordination"])
    assert coordination.NAMES in [names for names, _ in elastic_bench._plan(args.wanted)]
    assert args.coordination == coordination.QUICK and max(coordination.QUICK.nodes) <= 8
    full = elastic_bench._parse(
        ["--only", "coordination_idle", "--coordination-mode", "strict", "--coordination-single-node-full"]
    )
    assert full.coordination.mode == "strict" and full.coordination.run_shards(1) == full.coordination.shards == 4000
    assert coordination.DEFAULT.run_shards(1) == 400 and coordination.DEFAULT.run_shards(32) == 4000
    assert elastic_bench._parse(["--quick", "--coordination-shards", "20"]).coordination.run_shards(1) == 20
    assert (coordination.DEFAULT.lease, coordination.DEFAULT.poll) == (600, 2)  # the launchers' settings
    with pytest.raises(SystemExit):
        elastic_bench._parse(["--only", "coordination", "--coordination-nodes", "1,2,3"])

    fops = coordination.parse_profile(GLUSTER_PROFILE)
    assert fops == {"RELEASE": 309, "RELEASEDIR": 192, "READ": 81, "WRITE": 209, "LOOKUP": 1150, "CREATE": 7}
    assert coordination.metadata_ops(fops) == 309 + 192 + 1150 + 7 and coordination.data_ops(fops) == 81 + 209
    with pytest.raises(RuntimeError):
        coordination.parse_profile("Volume es is not started\n")

    # 4 busy workers alone: 2 ops/s; 2 busy + 2 idle: 5 ops/s; 1 busy + 3 idle at the tail: 3.5 ops/s.
    figures = [
        {"busy_workers": b, "idle_workers": i, "metadata_ops_per_sec": r} for b, i, r in ((2, 2, 5.0), (4, 0, 2.0), (1, 3, 3.5))
    ]
    rates = coordination.idle_rates(*figures)
    assert rates == {"per_busy_worker": 0.5, "per_idle_worker": 2.0, "per_idle_worker_at_tail": 1.0}
    assert coordination.project(rates, 64) == {"mixed": 80.0, "all_busy": 32.0, "tail": 63.5}


def _coordination_results() -> dict[str, dict]:
    """Coordination rows as `coordination_measure` writes them (only the keys the projection
    reads, plus a few around them): 4,000 shards of 0.5 s; a worker spends 0.05 s per shard
    beyond its work at 8 nodes and 0.1 s at 32 (so the growth exponent is ln 2 / ln 4 = 0.5);
    the 16-node run failed; idle: 0.5 ops/s per busy worker, 2.0 per idle one, 1.0 at the tail."""

    def makespan(nodes: int, shards: int, cost: float, meta: float) -> dict:
        span = shards * (0.5 + cost) / nodes
        details = {"mode": "cached", "nodes": nodes, "shards": shards, "sleep_secs": 0.5, "makespan_secs": span,
                   "ideal_secs": shards * 0.5 / nodes, "claims_per_sec": shards / span, "metadata_ops_per_shard": meta,
                   "data_ops_per_shard": 3.0, "notes": []}  # fmt: skip
        name = f"coordination_makespan_{nodes}"
        return {"name": name, "error": None, "value": span / details["ideal_secs"], "details": details}

    rows = {r["name"]: r for r in (makespan(1, 400, 0.02, 140.0), makespan(8, 4000, 0.05, 146.1), makespan(32, 4000, 0.1, 154.5))}
    rows["coordination_makespan_16"] = {"name": "coordination_makespan_16", "error": "not measured", "details": {}}
    small, large = rows["coordination_makespan_8"]["details"], rows["coordination_makespan_32"]["details"]
    rows["coordination_fsops"] = {
        "name": "coordination_fsops",
        "error": None,
        "details": {
            "sizes": {"shards": 4000, "sleep": 0.5, "nodes": [1, 8, 16, 32]},
            "metadata_ops_per_shard": {"8": 146.1, "32": 154.5},
            "claims_per_sec": {"8": small["claims_per_sec"], "32": large["claims_per_sec"]},
        },
    }
    per_worker = {"per_busy_worker": 0.5, "per_idle_worker": 2.0, "per_idle_worker_at_tail": 1.0}
    rows["coordination_idle"] = {
        "name": "coordination_idle",
        "error": None,
        "details": {"at_nodes": 32, "per_worker_metadata_ops_per_sec": per_worker, "target_nodes": 64},
    }
    return rows


def test_scale_takes_the_coordination_terms_and_projects_the_nas_load() -> None:
    rates, sources = scale.rates_from_results(_coordination_results())
    assert rates.coord_nodes == 32 and rates.coord_secs_per_shard == pytest.approx(0.1)
    assert rates.coord_growth_exponent == pytest.approx(0.5)  # 32 vs 8 nodes; the one-node run is not used
    assert rates.coord_claims_per_sec == pytest.approx(4000 / 75) and rates.meta_ops_per_shard == 154.5
    assert rates.busy_ops_per_worker_per_sec == 0.5 and rates.idle_ops_per_worker_per_sec == 2.0  # the larger idle rate
    assert sources["coord_secs_per_shard"].startswith("coordination_makespan_32")
    assert sources["coord_growth_exponent"].startswith("coordination_makespan_32 vs coordination_makespan_8")
    assert sources["idle_ops_per_worker_per_sec"].startswith("coordination_idle")
    assert sources["process_mbps"].startswith("assumed")  # a coordination-only run
    # The fsops row alone (the makespan rows not kept) gives the same terms at 32 nodes.
    fsops_only = {k: v for k, v in _coordination_results().items() if not k.startswith("coordination_makespan")}
    alone, alone_sources = scale.rates_from_results(fsops_only)
    assert alone.coord_secs_per_shard == pytest.approx(0.1) and alone.coord_growth_exponent == pytest.approx(0.5)
    assert alone_sources["meta_ops_per_shard"].startswith("coordination_fsops")

    measured = dataclasses.replace(rates, **TODAY, per_shard_secs=0.3)
    unmeasured = dict.fromkeys(("coord_secs_per_shard", "coord_claims_per_sec", "meta_ops_per_shard"))
    unmeasured |= dict.fromkeys(("idle_ops_per_worker_per_sec", "busy_ops_per_worker_per_sec"))
    plain = scale.projection(dataclasses.replace(measured, **unmeasured), scale.TB, 4096, scale.NODES)
    proj = scale.projection(measured, scale.TB, 4096, scale.NODES)
    assert "nas" not in plain["rows"][0] and "coord(n)" not in plain["formula"] and "coord(n)" in proj["formula"]
    for before, row in zip(plain["rows"], proj["rows"]):
        n = row["nodes"]
        c = 0.1 * max(1.0, n / 32) ** 0.5
        assert row["coord_secs_per_shard"] == pytest.approx(c)
        assert row["process_secs"] == pytest.approx(before["process_secs"] + 4096 / n * c)
        nas = row["nas"]
        assert nas["claims_per_sec_needed"] == pytest.approx(4096 / row["process_secs"])
        assert nas["meta_ops_per_sec_processing"] == pytest.approx(4096 / row["process_secs"] * 154.5 + n * 0.5)
        assert nas["meta_ops_per_sec_idle"] == pytest.approx(n * 2.0)
        assert nas["claims_headroom"] == pytest.approx(4000 / 75 / nas["claims_per_sec_needed"])
    text = scale.render(proj, sources)
    assert "load on the shared filesystem" in text and "measured at 32" in text
    # No coordination row: every term stays "not measured" and nothing changes.
    assert scale.rates_from_results({})[0].coordinated is False


def test_bench_scale_from_json_takes_the_run_and_names_what_is_missing(tmp_path: Path) -> None:
    run = tmp_path / "results.json"
    run.write_text(json.dumps({"format": 1, "results": _coordination_results()}))
    argv = [str(REPO / "bench" / "scale"), "--from-json", str(run)]
    bad = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "measured no --prepare-mbps, --process-mbps, --merge-mbps" in bad.stderr
    out = tmp_path / "scale.json"
    argv += [
        "--prepare-mbps",
        "55",
        "--process-mbps",
        "4.7",
        "--merge-mbps",
        "380",
        "--idle-ops-per-worker",
        "3",
        "--json",
        str(out),
    ]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=True)
    assert "load on the shared filesystem" in proc.stdout and "meta ops/s idle" in proc.stdout
    proj = json.loads(out.read_text())
    assert proj["rates"]["meta_ops_per_shard"] == 154.5 and proj["rates"]["idle_ops_per_worker_per_sec"] == 3.0
    assert proj["sources"]["idle_ops_per_worker_per_sec"] == "command line"
    # What the run did not measure takes the flags' defaults, not bench/run's assumed figures.
    assert proj["rates"]["max_participants"] is None and proj["rates"]["node_startup_secs"] == 0.0
    assert proj["sources"]["coord_secs_per_shard"].startswith("coordination_makespan_32")
    assert proj["rows"][-1]["nas"]["meta_ops_per_sec_idle"] == pytest.approx(64 * 3.0)
    (tmp_path / "other.json").write_text("{}")
    other = subprocess.run([*argv[:2], str(tmp_path / "other.json")], capture_output=True, text=True, timeout=60)
    assert other.returncode == 2 and 'no "results"' in other.stderr
