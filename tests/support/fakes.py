"""A fast stand-in for Data-Juicer, for tests of the claim/lease state machine only.

It behaves like Ray's exporter where it matters to the worker: it writes a directory of part
files whose order is NOT the input order (rows inside a part stay in order), and it can be told
to drop rows, fail, or take a while; and it can tell a waiting test that it started processing.
An attempt of a `--analyze` job (`ctx.stats_only`) is what Data-Juicer's stats-only run exports:
every row, none dropped, each with the statistics `fake_analysis` computes from it. A Parquet shard (a job prepared from Parquet input) is read with pyarrow and its rows are the
lines Data-Juicer's Ray export writes for it (`parquet_lines`), byte for byte.
"""

from __future__ import annotations

import io
import time
import warnings
import zlib
from collections.abc import Callable
from pathlib import Path

import orjson
import yaml

from elastic_sharding import crashpoints
from elastic_sharding.errors import AttemptFailed
from elastic_sharding.work.runners import AttemptContext


def fake_recipe_keep(row: dict) -> bool:
    """A stand-in recipe for multi-process tests: drops every row whose id is 3 modulo 7."""
    return row["id"] % 7 != 3


STEP_SECS = 0.01
STATS_FIELD, META_FIELD = "__dj__stats__", "__dj__meta__"
FAKE_LANGS = ("en", "en", "de", "fr", "zh")


def fake_analysis(row: dict) -> dict:
    """The fields a stats-only run adds to `row`: statistics of the kinds Data-Juicer's filters
    write (an int length, a ratio rounded to 10 decimals as Ray's JSON export writes floats, a
    string, a list), a function of the row alone so that any shard count or crash history gives
    the same values; and a meta field named without `__dj__` (exported, not analysed, as
    `usage_counter_mapper`'s) that names the row, so lost and duplicated rows can be counted."""
    text = str(row.get("text", ""))
    alnum = sum(char.isalnum() for char in text)
    stats = {
        "text_len": len(text),
        "alnum_ratio": round(alnum / len(text), 10) if text else 0.0,
        "lang": FAKE_LANGS[zlib.crc32(text.encode()) % len(FAKE_LANGS)],
        "word_lens": [len(word) for word in text.split()[:3]],
    }
    return {STATS_FIELD: stats, META_FIELD: {"row_id": row.get("id")}}


def parquet_lines(path: Path) -> list[bytes]:
    """The JSON lines Data-Juicer's Ray export writes for the rows of the Parquet file `path`
    (without their newlines), in order.

    `RayExporter.write_json` calls `dataset.write_json(path, force_ascii=False)`, and Ray's
    `JSONDatasink` writes each block as `block.to_pandas().to_json(file, orient="records",
    lines=True, force_ascii=False)`; Ray 2.60's `ArrowBlockAccessor.to_pandas` converts with
    `ignore_metadata=False` and Arrow-backed pandas dtypes (`_arrow_backed_pandas_dtype`, here
    `_arrow_dtype`). Rows are written one per line, independently of the block they are in, so
    the whole file as one block gives the same lines: floats to 10 decimal places, timestamps
    as epoch milliseconds, structs as objects, nulls as null.
    """
    import pyarrow.parquet as pq

    table = pq.read_table(path)
    frame = table.to_pandas(ignore_metadata=False, types_mapper=_arrow_dtype)
    out = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # pandas' notice that its default date format will change
        frame.to_json(out, orient="records", lines=True, force_ascii=False)
    return out.getvalue().splitlines() if table.num_rows else []


def _arrow_dtype(kind):
    """Ray's `_arrow_backed_pandas_dtype`: standard Arrow types as `pd.ArrowDtype`, others as pandas'
    default conversion makes them."""
    import pandas as pd
    import pyarrow as pa

    if isinstance(kind, pa.BaseExtensionType) or pa.types.is_dictionary(kind) or pa.types.is_null(kind):
        return None
    return pd.ArrowDtype(kind)


class FakeRunner:
    name = "fake"

    def __init__(
        self,
        delay: float = 0.0,
        fail: Callable[[str], bool] | None = None,
        keep: Callable[[dict], bool] | None = None,
        ready: Path | None = None,
        shard_delays: dict[str, float] | None = None,
        node_local: bool = False,
        stats: Callable[[dict], dict] = fake_analysis,
    ):
        self.delay = delay
        self.shard_delays = shard_delays or {}  # a slower (or faster) shard: a straggler on this node
        self.node_local = node_local  # failures say the node failed (a runtime that did not start)
        self.fail = fail or (lambda shard_id: False)
        self.keep = keep or (lambda row: True)
        self.ready = ready  # touched when a shard starts processing: a test's barrier, not a sleep
        self.stats = stats  # the fields a stats-only attempt adds to each row (`keep` is not applied)
        self.calls: list[str] = []
        self.configs: list[dict] = []
        self.envs: list[dict] = []

    def close(self) -> None:
        self.closed = True

    def run(self, ctx: AttemptContext) -> None:
        self.calls.append(ctx.shard_id)
        config = yaml.safe_load(ctx.recipe_path.read_bytes())
        self.configs.append(config)
        self.envs.append(dict(ctx.env))
        assert config["executor_type"] == "ray" and config["skip_op_error"] is False
        ctx.set_phase("processing")
        if self.ready is not None:
            self.ready.touch()
        # The delay is work done in short steps, not a deadline: time in which the process was
        # stopped (a straggler's duty cycle) does not count, as real processing would not advance;
        # a step that merely overslept on a loaded box counts whole, so the delay stays the delay.
        delay = self.shard_delays.get(ctx.shard_id, self.delay)
        done, halfway = 0.0, False
        while done < delay:
            if ctx.stop_reason() is not None:
                raise AttemptFailed(f"stopped: {ctx.stop_reason()}")
            if not halfway and done >= delay / 2:
                halfway = True
                crashpoints.reached("processing")
            began = time.monotonic()
            time.sleep(min(STEP_SECS, delay - done))
            done += min(time.monotonic() - began, 2 * STEP_SECS)
        if not halfway:
            crashpoints.reached("processing")
        if self.fail(ctx.shard_id):
            ctx.log_path.write_text("ValueError: fake operator failure\n")
            raise AttemptFailed("fake operator failure", node_local=self.node_local)
        dataset = Path(config["dataset_path"])
        if ctx.stats_only:
            lines = parquet_lines(dataset) if dataset.name.endswith(".parquet") else dataset.read_bytes().splitlines()
            rows = [orjson.loads(line) for line in lines]
            kept = [orjson.dumps({**row, **self.stats(row)}) for row in rows]
        elif dataset.name.endswith(".parquet"):
            # Exported as Data-Juicer exports it, and kept line for line as the export wrote it.
            kept = [line for line in parquet_lines(dataset) if self.keep(orjson.loads(line))]
        else:
            rows = [orjson.loads(line) for line in dataset.read_bytes().splitlines()]
            kept = [orjson.dumps(row) for row in rows if self.keep(row)]
        ctx.ray_output.mkdir()
        half = len(kept) // 2
        # Second half first, so part order disagrees with input order as Ray's often does.
        for name, chunk in (("a_000000.json", kept[half:]), ("b_000001.json", kept[:half])):
            if chunk:
                (ctx.ray_output / name).write_bytes(b"".join(line + b"\n" for line in chunk))
