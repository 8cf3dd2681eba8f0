"""A deduplication stage shared by several processes (`dedup/cooperate.py`): the units claimed
through `claims/units.py`, a participant killed at each crash point, a failing unit, a completed
stage. Real Data-Juicer operators (no Ray); the reference is `support.dj_dedup_reference`."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from support.dedup_corpus import prose_rows
from support.dedup_node import node_command, stage_spec
from support.dj_dedup_reference import dj_kept
from support.jobs import write_jsonl

from elastic_sharding.layout import StageLayout

MINHASH = ("document_minhash_deduplicator", {"num_bands": 8, "num_rows_per_band": 4, "num_permutations": 32})
SIMHASH = ("document_simhash_deduplicator", {})
SHARDS, BUCKET_PARTS, NODE_PARTS = 5, 3, 2
CRASH_POINTS = [f"dedup-{phase}{end}" for phase in ("keys", "buckets", "components") for end in ("", "-done")]


@pytest.fixture(scope="module")
def corpus() -> list[dict]:
    return prose_rows(1200, seed=11)


def start(spec: Path, crash_at: str | None = None) -> subprocess.Popen:
    env = dict(os.environ)
    env.pop("ELASTIC_SHARD_CRASH_AT", None)
    if crash_at:
        env["ELASTIC_SHARD_CRASH_AT"] = crash_at
    return subprocess.Popen(node_command(spec), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def finish(procs: list[subprocess.Popen]) -> list[tuple[int, str, str]]:
    outputs = [proc.communicate(timeout=240) for proc in procs]
    return [(proc.returncode, out, err) for proc, (out, err) in zip(procs, outputs, strict=True)]


def prepare_stage(
    tmp_path: Path, rows: list[dict], operator: tuple[str, dict], root: Path | None = None, **kw
) -> tuple[Path, Path]:
    """Shards of `rows` and a stage spec for `dedup_node.py`; the spec and the stage's directory."""
    cut = [0, *(len(rows) * i // SHARDS for i in range(1, SHARDS)), len(rows)]
    shards = [write_jsonl(tmp_path / "shards" / f"{i}.jsonl", rows[cut[i] : cut[i + 1]]) for i in range(SHARDS)]
    root = root or tmp_path / "stage"
    return stage_spec(tmp_path / "spec.json", root, *operator, shards, BUCKET_PARTS, NODE_PARTS, **kw), root


@pytest.mark.parametrize("operator", [SIMHASH, MINHASH], ids=["simhash", "minhash"])
def test_three_processes_share_a_stage_and_keep_exactly_data_juicers_rows(tmp_path, corpus, operator):
    spec, root = prepare_stage(tmp_path, corpus, operator)
    results = finish([start(spec) for _ in range(3)])
    assert [code for code, _, _ in results] == [0, 0, 0], [err[-2000:] for _, _, err in results]
    records = {out for _, out, _ in results}
    assert len(records) == 1, "every participant reports the one published stage record"
    done = json.loads(records.pop())
    assert done["kept"] == dj_kept(*operator, corpus)
    units = sorted(p.name for p in StageLayout(root).units.glob("*.json"))
    assert len(units) == SHARDS + BUCKET_PARTS + NODE_PARTS * done["rounds"]
    assert not list(StageLayout(root).units.glob("*.lock.stale-*")), "nobody died: nothing was taken over"


@pytest.mark.parametrize("point", CRASH_POINTS)
def test_a_participant_killed_at_each_crash_point_costs_one_unit(tmp_path, corpus, point):
    spec, root = prepare_stage(tmp_path, corpus, MINHASH)
    ((code, _, _),) = finish([start(spec, crash_at=point)])
    assert code == -9, f"the participant must die at {point}"
    assert not StageLayout(root).done.exists()
    results = finish([start(spec), start(spec)])
    assert [code for code, _, _ in results] == [0, 0], [err[-2000:] for _, _, err in results]
    assert "dedup: took over" in "".join(err for _, _, err in results), "the dead participant's unit is taken over"
    assert json.loads(results[0][1])["kept"] == dj_kept(*MINHASH, corpus)


def test_a_unit_that_fails_ends_every_participant_with_its_error_naming_the_row(tmp_path, corpus):
    rows = [dict(row) for row in corpus[:300]]
    rows[130] = {"id": rows[130]["id"], "body": "no text field"}
    spec, root = prepare_stage(tmp_path, rows, SIMHASH)
    results = finish([start(spec), start(spec)])
    assert [code for code, _, _ in results] == [2, 2]
    for _, _, err in results:
        assert "compute_hash failed on row 11 of shard 2: " in err and "; fix the data or the recipe (in keys-00002" in err, err
    assert not StageLayout(root).done.exists()


def test_a_completed_stage_is_not_run_again(tmp_path, corpus):
    spec, root = prepare_stage(tmp_path, corpus[:400], SIMHASH)
    ((code, first, _),) = finish([start(spec)])
    assert code == 0
    before = {p: p.stat().st_mtime_ns for p in root.rglob("*")}
    ((code, again, _),) = finish([start(spec)])
    assert code == 0 and again == first
    assert {p: p.stat().st_mtime_ns for p in root.rglob("*")} == before


@pytest.mark.cluster
def test_participants_on_three_nodes_of_a_caching_volume_take_over_a_dead_nodes_unit(gluster, tmp_path, corpus):
    """Separate hosts: a dead participant's claim is taken over only once its heartbeat stood
    still for a whole lease, as another node observes it (no pid to check across hosts)."""
    cluster = gluster(nodes=3, mode="cached")
    expected = dj_kept(*MINHASH, corpus)
    for point in ("dedup-keys@2", "dedup-buckets-done", "dedup-components"):
        case = tmp_path / point
        spec, root = prepare_stage(case, corpus, MINHASH, root=cluster.mount / point, lease_secs=3.0)
        env = {"ELASTIC_SHARD_CRASH_AT": point}
        victim = cluster.nodes[0].popen(node_command(spec), env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert victim.wait(timeout=240) == -9, f"the participant on node 0 must die at {point}"
        survivors = [node.popen(node_command(spec), env={}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                     for node in cluster.nodes[1:]]  # fmt: skip
        results = finish(survivors)
        assert [code for code, _, _ in results] == [0, 0], [err[-2000:] for _, _, err in results]
        assert f"from host={cluster.nodes[0].name}" in "".join(err for _, _, err in results)
        assert all(json.loads(out)["kept"] == expected for _, out, _ in results), point
