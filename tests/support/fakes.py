"""A fast stand-in for Data-Juicer, for tests of the claim/lease state machine only.

It behaves like Ray's exporter where it matters to the worker: it writes a directory of part
files whose order is NOT the input order (rows inside a part stay in order), and it can be told
to drop rows, fail, or take a while; and it can tell a waiting test that it started processing.
"""

from __future__ import annotations

import time
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
    ):
        self.delay = delay
        self.shard_delays = shard_delays or {}  # a slower (or faster) shard: a straggler on this node
        self.node_local = node_local  # failures say the node failed (a runtime that did not start)
        self.fail = fail or (lambda shard_id: False)
        self.keep = keep or (lambda row: True)
        self.ready = ready  # touched when a shard starts processing: a test's barrier, not a sleep
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
        rows = [orjson.loads(line) for line in Path(config["dataset_path"]).read_bytes().splitlines()]
        kept = [row for row in rows if self.keep(row)]
        ctx.ray_output.mkdir()
        half = len(kept) // 2
        # Second half first, so part order disagrees with input order as Ray's often does.
        for name, chunk in (("a_000000.json", kept[half:]), ("b_000001.json", kept[:half])):
            if chunk:
                (ctx.ray_output / name).write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in chunk))
