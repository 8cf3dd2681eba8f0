"""A whole-dataset operator's stage shared by several processes (`global_ops/cooperate.py`): a
participant killed at each crash point of each phase (keys, buckets, place, keep) is taken over
and the rows kept are still the operator's own `run` over one dataset; a row the operator cannot
take ends every participant with its error. Participants are real processes; the shards are
JSONL files as the segment before the stage left them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import orjson
import pytest
from support.exhaustive import exhaustive_only
from support.global_corpus import global_rows
from support.global_ops_reference import data_juicer_rows, no_model_cleanup  # noqa: F401 - an autouse fixture
from support.jobs import write_jsonl

from elastic_sharding.layout import StageLayout

CUTS = (0, 70, 150, 150, 240)  # four shards, the third one empty
LEASE_SECS = 10.0  # only a dead pid on this host is taken over here, at once
OPERATOR = ("key_value_grouper", {"group_by_keys": ["topic"]})  # every phase: keys, buckets, place, keep
CRASH_POINTS = [f"global-{phase}{end}" for phase in ("keys", "buckets", "place", "keep") for end in ("", "-done")]
# A ranking selector's buckets units merge every shard's sorted values into ranked partitions and
# list which shards send rows where; its place units read those partitions.
RANKING = ("topk_specified_field_selector", {"field_key": "meta.score", "top_ratio": 0.4})
RANKING_POINTS = [f"global-{phase}{end}" for phase in ("buckets", "place") for end in ("", "-done")]
KILLED = [(OPERATOR, point) for point in CRASH_POINTS] + [(RANKING, point) for point in RANKING_POINTS]
PARTICIPANT = r"""
import json, logging, os, sys
from pathlib import Path
import orjson
from elastic_sharding.errors import ElasticShardError
from elastic_sharding.global_ops.cooperate import GlobalParticipant
from elastic_sharding.global_ops.operators import StageContext
from elastic_sharding.global_ops.registry import build
from elastic_sharding.records import KeptShard

logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
spec = json.loads(Path(sys.argv[1]).read_text())
shards = [Path(s) for s in spec["shards"]]
out = Path(spec["out"])

def rows_of(i):
    return ((line, orjson.loads(line)) for line in shards[i].read_bytes().splitlines())

def keep(i, lines):
    data = b"".join(line + b"\n" for line in lines)
    out.mkdir(parents=True, exist_ok=True)
    temporary = out / f".{i}.{os.getpid()}"
    temporary.write_bytes(data)
    os.replace(temporary, out / f"{i}.jsonl")
    return KeptShard(f"keep-{i:05d}", f"s{i}", "a", "t", 0, "", data.count(b"\n"), len(data), "", "h", os.getpid(), 0.0, 0.0)

name, params = spec["operator"]
ctx = StageContext(Path(spec["root"]), len(shards), 1 << 30)
participant = GlobalParticipant(
    build(name, params), ctx, rows_of, lambda: [len(s.read_bytes().splitlines()) for s in shards], keep,
    spec["lease_secs"], 0.3, 0.05, what="stage",
)
try:
    participant.run()
except ElasticShardError as exc:
    print(exc, file=sys.stderr)
    sys.exit(exc.exit_code)
"""


@pytest.fixture(scope="module")
def corpus() -> list[dict]:
    return global_rows(CUTS[-1], seed=5)


def prepare_stage(tmp_path: Path, rows: list[dict], operator=OPERATOR) -> tuple[Path, Path]:
    shards = [write_jsonl(tmp_path / "shards" / f"{i}.jsonl", rows[a:b]) for i, (a, b) in enumerate(zip(CUTS, CUTS[1:]))]
    spec = {
        "root": str(tmp_path / "stage"),
        "out": str(tmp_path / "next"),
        "shards": [str(s) for s in shards],
        "operator": list(operator),
        "lease_secs": LEASE_SECS,
    }
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(spec))
    return path, tmp_path / "stage"


def start(spec: Path, crash_at: str | None = None) -> subprocess.Popen:
    env = {key: value for key, value in os.environ.items() if key != "ELASTIC_SHARD_CRASH_AT"}
    if crash_at:
        env["ELASTIC_SHARD_CRASH_AT"] = crash_at
    return subprocess.Popen([sys.executable, "-c", PARTICIPANT, str(spec)], stderr=subprocess.PIPE, text=True, env=env)


def finish(procs: list[subprocess.Popen]) -> list[tuple[int, str]]:
    errors = [proc.communicate(timeout=240)[1] for proc in procs]
    return [(proc.returncode, err) for proc, err in zip(procs, errors, strict=True)]


def kept_rows(tmp_path: Path) -> list[dict]:
    return [
        orjson.loads(line) for i in range(len(CUTS) - 1) for line in (tmp_path / "next" / f"{i}.jsonl").read_bytes().splitlines()
    ]


@pytest.mark.parametrize(
    ("operator", "point"),
    [
        pytest.param(op, p, marks=exhaustive_only if p.endswith("-done") or op is RANKING else (), id=f"{op[0]}-{p}")
        for op, p in KILLED
    ],
)  # CI: the grouper before each phase's work; the exhaustive suite also after it, and the ranking selector
def test_a_participant_killed_at_each_crash_point_is_taken_over(tmp_path, corpus, operator, point):
    spec, root = prepare_stage(tmp_path, corpus, operator)
    ((code, _),) = finish([start(spec, crash_at=point)])
    assert code == -9, f"the participant must die at {point}"
    results = finish([start(spec), start(spec)])
    assert [code for code, _ in results] == [0, 0], [err[-2000:] for _, err in results]
    assert "stage: took over" in "".join(err for _, err in results), "the dead participant's unit is taken over"
    assert kept_rows(tmp_path) == data_juicer_rows(*operator, corpus)
    assert len(list(StageLayout(root).units.glob("keep-*.json"))) == len(CUTS) - 1


def test_a_row_the_operator_cannot_take_ends_every_participant_with_its_error(tmp_path, corpus):
    rows = [dict(row) for row in corpus]
    rows[200]["meta"] = {"tags": {"lang": {"nested": "object"}}}
    spec, root = prepare_stage(tmp_path, rows, ("frequency_specified_field_selector", {"field_key": "meta.tags.lang", "topk": 2}))
    results = finish([start(spec), start(spec)])
    assert [code for code, _ in results] == [2, 2], [err[-2000:] for _, err in results]
    for _, err in results:
        assert "row 51 of shard 3: meta.tags.lang is a dict, not a string, number or null" in err, err
    assert StageLayout(root).failed.exists() and not StageLayout(root).done.exists()
