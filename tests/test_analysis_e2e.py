"""`--analyze` end to end against one `dj-analyze` run of the same recipe over the same input.

The recipe is Data-Juicer's published pile-europarl refine recipe (tests/data/recipes/) with a
tagging operator appended (`usage_counter_mapper`, over rows that carry OpenAI-style usage), so
eleven stats-producing filters, five mappers and a deduplicator that the analysis skips, and meta
fields. The input is real English text (Python's documentation topics, `support/pydoc_corpus.py`)
with the stand-in models of `support/offline_models.py`. Real Data-Juicer + Ray on every worker:
three GlusterFS nodes with their own hostnames at one shard count, `local` with two workers at
another; `overall.csv` must equal dj-analyze's cell by cell (`support/overall_csv.py`), the same
figure files must exist, every histogram must hold exactly numpy's counts over all values, and
the stats export must hold dj-analyze's rows.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys

import numpy as np
import orjson
import pytest
from jsonschema import Draft202012Validator
from support.dj_analyze_run import dj_analyze
from support.e2e_support import SHARD_JOB
from support.jobs import REPO, STATUS_SCHEMA, TESTS
from support.offline_models import build_offline_models
from support.overall_csv import overall_differences
from support.pydoc_corpus import pydoc_corpus

pytestmark = [pytest.mark.e2e]

RECIPE = TESTS / "data" / "recipes" / "pile-europarl-refine.yaml"
BLOCKS = 500
PERCENTILES = ["0.01", "0.999"]
QUICK = ("--poll-interval-secs", "0.5", "--heartbeat-interval-secs", "1", "--ray-num-cpus", "1")
STATS, META = "__dj__stats__", "__dj__meta__"


def with_usage(index: int, row: dict) -> dict:
    """Every third row carries a response's token usage, as an agent trace would."""
    if index % 3 == 0:
        row["usage"] = {"prompt_tokens": 10 + index % 17, "completion_tokens": 3 * (index % 11)}
    return row


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("analysis-e2e")
    rows, _plan = pydoc_corpus(seed=14, limit=BLOCKS)
    data = root / "pydoc-topics.jsonl"
    data.write_bytes(b"".join(orjson.dumps(with_usage(i, row)) + b"\n" for i, row in enumerate(rows)))
    recipe = root / "recipe.yaml"
    recipe.write_text(RECIPE.read_text() + "  - usage_counter_mapper:\n")
    env = build_offline_models([row["text"] for row in rows], root / "stand-ins")
    with pytest.MonkeyPatch.context() as patch:
        for key, value in env.items():
            patch.setenv(key, value)
        reference = dj_analyze(recipe, data, root / "dj-analyze", np=2, percentiles=[float(p) for p in PERCENTILES])
        yield recipe, data, reference, root / "dj-analyze" / "export" / "reference_stats.jsonl"


def shard_job(*args: str, node=None) -> subprocess.CompletedProcess:
    command = [sys.executable, str(SHARD_JOB), *args]
    proc = (
        node.run(command, cwd=REPO, timeout=900)
        if node
        else subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=900)
    )
    assert proc.returncode == 0, f"{' '.join(args[:1])} exited {proc.returncode}\n{proc.stderr[-4000:]}"
    return proc


def close(got, want) -> bool:
    if isinstance(got, float) or isinstance(want, float):
        return (
            isinstance(got, (int, float))
            and isinstance(want, (int, float))
            and math.isclose(got, want, rel_tol=1e-9, abs_tol=1e-9)
        )
    if isinstance(got, dict) and isinstance(want, dict):
        return got.keys() == want.keys() and all(close(got[k], want[k]) for k in got)
    if isinstance(got, list) and isinstance(want, list):
        return len(got) == len(want) and all(close(g, w) for g, w in zip(got, want))
    return got == want


def check_analysis(directory, reference, reference_export) -> None:
    """The directory agrees with dj-analyze's: numbers, figure files, histograms, stats export."""
    assert overall_differences(directory / "overall.csv", reference / "overall.csv") == []
    theirs = {p.name for p in reference.iterdir()}
    ours = {p.name for p in directory.iterdir()}
    assert theirs <= ours, f"dj-analyze wrote {sorted(theirs - ours)} and we did not"
    assert ours - theirs == {"index.html", "figures.json", "dataset_stats.jsonl"}
    assert any(name.endswith("-wordcloud.png") for name in theirs), "the language id is a string statistic"

    want = [orjson.loads(line) for line in reference_export.read_bytes().splitlines()]
    got = [orjson.loads(line) for line in (directory / "dataset_stats.jsonl").read_bytes().splitlines()]
    assert len(got) == len(want) and all(close(g, w) for g, w in zip(got, want))
    assert sum("prompt_tokens" in row.get(META, {}) for row in got) == len(got), "the tagging operator ran on every row"

    figures = json.loads((directory / "figures.json").read_text())
    numeric = [name for name, data in figures.items() if data["plot"] == "numeric"]
    assert len(numeric) >= 10
    for name in numeric:
        cells = [row[STATS].get(name) for row in want]
        exploded = [v for cell in cells for v in (cell if isinstance(cell, list) else [cell])]
        length = sum(max(1, len(c)) if isinstance(c, list) else 1 for c in cells)
        values = np.array([v for v in exploded if v is not None], dtype=float)
        counts, edges = np.histogram(values, bins=max(int(math.sqrt(length)), 10))
        assert figures[name]["hist"]["counts"] == counts.tolist(), name
        assert np.allclose(figures[name]["hist"]["edges"], edges, rtol=1e-12, atol=0), name


@pytest.mark.cluster
def test_analysis_on_three_glusterfs_nodes_equals_dj_analyze(gluster, tmp_path, corpus):
    recipe, data, reference, reference_export = corpus
    cluster = gluster(nodes=3, mode="cached")
    a, b, c = cluster.nodes
    job, output = cluster.mount / "analysis" / "job", cluster.mount / "analysis" / "out"
    a.run(["mkdir", "-p", str(job.parent)], check=True)
    shard_job("prepare", "--config", str(recipe), "--dataset-path", str(data), "--job-dir", str(job), "--num-shards", "5",
              "--analyze", "--percentiles", *PERCENTILES, *QUICK, node=a)  # fmt: skip
    logs = {node.name: tmp_path / f"{node.name}.log" for node in cluster.nodes}
    workers = {}
    for node in cluster.nodes:
        with open(logs[node.name], "wb") as log:
            workers[node.name] = node.popen([sys.executable, str(SHARD_JOB), "worker", "--job-dir", str(job)], cwd=REPO,
                                            stdout=subprocess.DEVNULL, stderr=log)  # fmt: skip
    codes = {name: proc.wait(timeout=900) for name, proc in workers.items()}
    assert set(codes.values()) == {0}, {name: logs[name].read_text()[-3000:] for name in codes}
    text = "".join(log.read_text() for log in logs.values())
    assert text.count("analysis done here") == 3, "every worker took part in the analysis"
    shard_job("merge", "--job-dir", str(job), "--output", str(output), node=b)
    status = json.loads(shard_job("status", "--job-dir", str(job), "--json", node=c).stdout)
    assert status["complete"] and len({s["host"] for s in status["shards"]}) >= 2
    assert status["analysis"]["state"] == "done" and status["analysis"]["units"]["columns"] == {"done": 5, "held": 0, "total": 5}
    Draft202012Validator(STATUS_SCHEMA).validate(status)
    local = tmp_path / "analysis"  # the volume is mounted inside the nodes only
    c.run(["cp", "-r", str(output), str(local)], check=True)
    check_analysis(local, reference, reference_export)
    manifest = json.loads(c.read_bytes(job / "manifest.json"))
    assert manifest["analysis"]["skipped"][-1] == "process[16] document_simhash_deduplicator"
    assert len(manifest["analysis"]["operators"]) == 12


def test_local_analysis_at_another_shard_count_equals_dj_analyze(tmp_path, corpus):
    recipe, data, reference, reference_export = corpus
    job = tmp_path / "job"
    shard_job("local", "--config", str(recipe), "--dataset-path", str(data), "--job-dir", str(job), "--num-shards", "2",
              "--workers", "2", "--analyze", "--percentiles", *PERCENTILES, *QUICK)  # fmt: skip
    check_analysis(job / "analysis", reference, reference_export)
