"""The analysis of a `--analyze` job shared by several processes (`analysis/cooperate.py`): the
units claimed through `claims/units.py`, a participant killed at each crash point, a failing
unit, a completed stage. Each participant is a real process over shard outputs written here as a
worker collects them (each row's statistics and meta fields, `fakes.fake_analysis` of prose); the
reference is one clean in-process run over the same rows cut into other shards: the analysis is
byte-identical whatever the cut."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path

import pytest
from support.dedup_corpus import prose_rows
from support.fakes import STATS_FIELD, FakeRunner, fake_analysis, fake_recipe_keep
from support.jobs import write_jsonl

from elastic_sharding.analysis.cooperate import AnalysisParticipant
from elastic_sharding.layout import AnalysisLayout
from elastic_sharding.records import ROW_KEY, STATS_EXPORT_FIELDS, AnalysisSpec
from elastic_sharding.work.collect import collect
from elastic_sharding.work.runners import AttemptContext

ROWS, CUTS = 400, (0, 90, 200, 200, 310, 400)  # five shards, the third one empty
REFERENCE_CUTS = (0, 57, 251, 400)  # three shards, cut elsewhere
SPEC = AnalysisSpec(percentiles=[0.1, 0.9], save_stats_in_one_file=False, export_stem="prose", operators=[], skipped=[])
LEASE_SECS = 10.0  # only a dead pid on this host is taken over here, at once: a long lease keeps a busy one safe
CRASH_POINTS = [f"analysis-{phase}{end}" for phase in ("columns", "plan", "stats", "report") for end in ("", "-done")]
# One participant: takes part until the analysis is complete and prints the stage record; a
# failure prints its message on stderr and exits with its exit code (`dedup_node.py`'s contract).
PARTICIPANT = r"""
import json, logging, sys
from pathlib import Path
import orjson
from elastic_sharding.analysis.cooperate import AnalysisParticipant
from elastic_sharding.errors import ElasticShardError
from elastic_sharding.layout import AnalysisLayout
from elastic_sharding.records import AnalysisSpec

logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
spec = json.loads(Path(sys.argv[1]).read_text())
shards = [Path(s) for s in spec["shards"]]
participant = AnalysisParticipant(
    AnalysisLayout(Path(spec["root"])), AnalysisSpec(**spec["analysis"]), len(shards),
    lambda i: (orjson.loads(line) for line in shards[i].read_bytes().splitlines()),
    spec["lease_secs"], spec["heartbeat_secs"], spec["poll_secs"],
)
try:
    done = participant.run()
except ElasticShardError as exc:
    print(exc, file=sys.stderr)
    sys.exit(exc.exit_code)
print(json.dumps(done))
"""


def stats_rows(rows: list[dict]) -> list[dict]:
    """What a worker's collect keeps of a stats-only shard: the statistics and meta fields only."""
    return [fake_analysis(row) for row in rows]


@pytest.fixture(scope="module")
def corpus() -> list[dict]:
    return stats_rows(prose_rows(ROWS, seed=11))


@pytest.fixture(scope="module")
def reference(corpus, tmp_path_factory) -> dict[str, bytes]:
    """The files of one clean in-process run over the same rows in other shards, which every run
    must publish byte for byte (`index.html` too: these participants give it no notes, and so no
    shard count)."""
    root = tmp_path_factory.mktemp("reference") / "stage"
    shards = [corpus[a:b] for a, b in zip(REFERENCE_CUTS, REFERENCE_CUTS[1:])]
    done = AnalysisParticipant(AnalysisLayout(root), SPEC, len(shards), lambda i: iter(shards[i]), LEASE_SECS, 0.3, 0.05).run()
    return published(root, done)


def published(root: Path, done: dict) -> dict[str, bytes]:
    """The analysis directory the finish copies out of the stage: every file the record names,
    which must be all the report holds (no temporary left)."""
    report = AnalysisLayout(root).report
    assert sorted(p.name for p in report.iterdir()) == sorted(done["files"])
    return {name: (report / name).read_bytes() for name in done["files"]}


def prepare_stage(tmp_path: Path, rows: list[dict], root: Path | None = None) -> tuple[Path, Path]:
    """Shard outputs of `rows` and a spec for PARTICIPANT; the spec and the stage's directory."""
    shards = [write_jsonl(tmp_path / "shards" / f"{i}.jsonl", rows[a:b]) for i, (a, b) in enumerate(zip(CUTS, CUTS[1:]))]
    root = root or tmp_path / "stage"
    spec = {
        "root": str(root),
        "shards": [str(s) for s in shards],
        "analysis": asdict(SPEC),
        "lease_secs": LEASE_SECS,
        "heartbeat_secs": 0.3,
        "poll_secs": 0.05,
    }
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(spec))
    return path, root


def start(spec: Path, crash_at: str | None = None) -> subprocess.Popen:
    env = dict(os.environ)
    env.pop("ELASTIC_SHARD_CRASH_AT", None)
    if crash_at:
        env["ELASTIC_SHARD_CRASH_AT"] = crash_at
    argv = [sys.executable, "-c", PARTICIPANT, str(spec)]
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def finish(procs: list[subprocess.Popen]) -> list[tuple[int, str, str]]:
    outputs = [proc.communicate(timeout=240) for proc in procs]
    return [(proc.returncode, out, err) for proc, (out, err) in zip(procs, outputs, strict=True)]


def test_the_shard_outputs_are_what_a_stats_only_attempt_of_the_fake_collects(tmp_path):
    """The fake processor's stats-only attempt, collected as a worker collects it: every row (its
    recipe drops none in an analysis), in input order, with only its statistics and meta fields."""
    rows = prose_rows(40, seed=3)
    shard = write_jsonl(tmp_path / "shard.jsonl", [{ROW_KEY: 100 + i, **row} for i, row in enumerate(rows)])
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(f"executor_type: ray\nskip_op_error: false\ndataset_path: {shard}\n")
    ctx = AttemptContext("part-0", tmp_path, recipe, tmp_path / "log", tmp_path / "ray-output", {}, stats_only=True)
    FakeRunner(keep=fake_recipe_keep).run(ctx)
    collect(ctx.ray_output, tmp_path / "processed.jsonl", 100, len(rows), fields=STATS_EXPORT_FIELDS)
    lines = (tmp_path / "processed.jsonl").read_bytes().splitlines()
    assert [json.loads(line) for line in lines] == stats_rows(rows)


def test_three_processes_share_the_units_and_each_unit_is_done_once(tmp_path, corpus, reference):
    spec, root = prepare_stage(tmp_path, corpus)
    results = finish([start(spec) for _ in range(3)])
    assert [code for code, _, _ in results] == [0, 0, 0], [err[-2000:] for _, _, err in results]
    records = {out for _, out, _ in results}
    assert len(records) == 1, "every participant reports the one published stage record"
    done = json.loads(records.pop())
    assert done["rows"] == ROWS and done["shards"] == len(CUTS) - 1
    assert done["columns"] == list(corpus[0][STATS_FIELD])
    assert published(root, done) == reference
    units = sorted(p.name for p in AnalysisLayout(root).units.glob("*.json"))
    assert len(units) == (len(CUTS) - 1) + 1 + len(done["columns"]) + 1
    assert not list(AnalysisLayout(root).units.glob("*.lock.stale-*")), "nobody died: nothing was taken over"
    assert not any("took over" in err for _, _, err in results)


@pytest.mark.parametrize("point", CRASH_POINTS)
def test_a_participant_killed_at_each_crash_point_is_taken_over(tmp_path, corpus, reference, point):
    spec, root = prepare_stage(tmp_path, corpus)
    ((code, _, _),) = finish([start(spec, crash_at=point)])
    assert code == -9, f"the participant must die at {point}"
    assert not AnalysisLayout(root).done.exists()
    results = finish([start(spec), start(spec)])
    assert [code for code, _, _ in results] == [0, 0], [err[-2000:] for _, _, err in results]
    assert "analysis: took over" in "".join(err for _, _, err in results), "the dead participant's unit is taken over"
    assert published(root, json.loads(results[0][1])) == reference


def test_a_unit_that_fails_ends_every_participant_with_its_error_naming_the_column(tmp_path, corpus):
    """A statistic of strings with numbers in one shard is an object column to pandas: the plan
    refuses it, and the participant waiting for the plan ends with the same error."""
    rows = [{STATS_FIELD: {**row[STATS_FIELD], "tag": "short" if i % 2 else "long"}} for i, row in enumerate(corpus)]
    for row in rows[250:260]:
        row[STATS_FIELD]["tag"] = 7
    spec, root = prepare_stage(tmp_path, rows)
    results = finish([start(spec), start(spec)])
    assert [code for code, _, _ in results] == [2, 2], [err[-2000:] for _, _, err in results]
    for _, _, err in results:
        assert "cannot analyse stats column 'tag': it mixes strings with other values" in err, err
        assert "(in plan-00000 on host=" in err, err
    assert AnalysisLayout(root).failed.exists() and not AnalysisLayout(root).done.exists()


def test_a_completed_stage_is_not_run_again(tmp_path, corpus):
    spec, root = prepare_stage(tmp_path, corpus)
    ((code, first, _),) = finish([start(spec)])
    assert code == 0
    before = {p: p.stat().st_mtime_ns for p in root.rglob("*")}
    ((code, again, _),) = finish([start(spec)])
    assert code == 0 and again == first
    assert {p: p.stat().st_mtime_ns for p in root.rglob("*")} == before


def test_the_fault_matrix_compares_index_html_without_its_shard_count(tmp_path):
    """The `analysis-job` fault kind compares each trial with one clean run at another shard count:
    its digest of `index.html` leaves out the note that names the count, and nothing else."""
    from types import SimpleNamespace

    from support.fault_matrix import ANALYSIS_INSPECT

    from elastic_sharding.analysis import html_index
    from elastic_sharding.work.analysis import analysis_notes

    def digests(name: str, shards: int, rows: int = ROWS) -> dict[str, str]:
        directory = tmp_path / name
        directory.mkdir()
        (directory / "overall.csv").write_text(",a\ncount,3.0\nmean,1.5\n")
        manifest = SimpleNamespace(total_rows=rows, dataset_root="/data/in.jsonl", shards=[None] * shards, analysis=SPEC)
        html_index.write_index(directory, directory / "overall.csv", ["overall.csv"], "Analysis", analysis_notes(manifest))
        assert f"in {shards} shard(s)" in (directory / "index.html").read_text()
        inspect = subprocess.run(
            [sys.executable, "-c", ANALYSIS_INSPECT, str(directory)], capture_output=True, text=True, check=True
        )
        return json.loads(inspect.stdout)

    three = digests("three", 3)
    assert digests("five", 5) == three
    assert digests("other-rows", 3, ROWS + 1)["index.html"] != three["index.html"]
