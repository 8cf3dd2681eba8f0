"""Property tests: any accepted input splits into exactly n contiguous non-empty shards and
round-trips byte for byte through prepare -> passthrough processing -> merge."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import orjson
from conftest import SIMPLE_RECIPE, fast_settings
from fakes import FakeRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from elastic_sharding.layout import JobLayout
from elastic_sharding.merge import merge
from elastic_sharding.prepare import PrepareRequest, prepare
from elastic_sharding.records import ROW_KEY
from elastic_sharding.worker import Worker, WorkerOptions

texts = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=200)
# Rows already in prepare's canonical shape (one key order, compact JSON) come back byte for byte.
rows_strategy = st.lists(
    st.builds(lambda t, n: {"text": t, "n": n}, texts, st.integers(-(2**53), 2**53)), min_size=1, max_size=25
)


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rows=rows_strategy, data=st.data())
def test_split_and_passthrough_roundtrip(rows, data):
    shards = data.draw(st.integers(1, len(rows)))
    tmp = Path(tempfile.mkdtemp(prefix="es-prop-"))
    try:
        dataset = tmp / "in.jsonl"
        dataset.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
        recipe = tmp / "recipe.yaml"
        recipe.write_text(SIMPLE_RECIPE.format(dataset=dataset))
        job = tmp / "job"
        manifest = prepare(PrepareRequest(recipe, None, job, shards, fast_settings())).manifest
        assert len(manifest.shards) == shards
        assert all(s.rows >= 1 for s in manifest.shards)
        assert [s.first_row for s in manifest.shards] == [sum(x.rows for x in manifest.shards[:i]) for i in range(shards)]
        for spec in manifest.shards:
            indices = [orjson.loads(line)[ROW_KEY] for line in (job / spec.path).read_bytes().splitlines()]
            assert indices == list(range(spec.first_row, spec.first_row + spec.rows))
        assert Worker(job, WorkerOptions(), runner=FakeRunner()).run() == 0
        out = tmp / "out.jsonl"
        merge(job, out)
        assert out.read_bytes() == dataset.read_bytes()
        assert JobLayout(job).merge_record.exists()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
