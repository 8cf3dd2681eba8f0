"""Custom Data-Juicer operators for the benchmarks and the tests that need a known cost per row.

A worker's "node speed" is simulated by sleeping per row: the sleep is `ms_per_row` times the
factor in the environment variable `ELASTIC_BENCH_SLOWDOWN` of the worker that runs the op.
Sleeping (not spinning) keeps a 3× slower node cheap on a 2-core box, so three simulated nodes
do not compete for the CPU and the measured imbalance is the one we asked for.

Loaded by Data-Juicer through the recipe's `custom_operator_paths` (this package directory), and
shipped to Ray workers as a `py_modules` entry by Data-Juicer itself.
"""

from __future__ import annotations

import os
import time

from data_juicer.ops.base_op import OPERATORS, Mapper

SLOWDOWN_ENV = "ELASTIC_BENCH_SLOWDOWN"


@OPERATORS.register_module("bench_sleep_mapper")
class BenchSleepMapper(Mapper):
    """Leaves every row unchanged after sleeping `ms_per_row × $ELASTIC_BENCH_SLOWDOWN` ms per row."""

    def __init__(self, ms_per_row: float = 10.0, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.ms_per_row = float(ms_per_row)

    def process_single(self, sample):
        # Read at call time: the op object is built in the driver but runs in Ray workers, which
        # inherit the environment of the worker process that started their node-local runtime.
        factor = float(os.environ.get(SLOWDOWN_ENV, "1"))
        time.sleep(self.ms_per_row * factor / 1000.0)
        return sample


@OPERATORS.register_module("bench_spin_mapper")
class BenchSpinMapper(Mapper):
    """Leaves every row unchanged after burning `ms_per_row` ms of CPU on it: work that a CPU
    throttle (a noisy neighbour, cgroup quotas) slows down, unlike sleeping."""

    def __init__(self, ms_per_row: float = 10.0, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.ms_per_row = float(ms_per_row)

    def process_single(self, sample):
        spent = 0.0
        while spent < self.ms_per_row / 1000.0:
            began = time.process_time()
            sum(i * i for i in range(2000))
            spent += time.process_time() - began
        return sample


_MODELS: dict[str, object] = {}  # per process, as Data-Juicer's MODEL_ZOO caches loaded models


@OPERATORS.register_module("bench_model_mapper")
class BenchModelMapper(Mapper):
    """A stand-in for a model operator: the first row a process handles "loads the model"
    (sleeps `load_secs` and appends the process id to `load_log`), every row then costs
    `ms_per_row` of "inference" and gets a deterministic `model_score`. Run it with
    `ray_execution_mode: actor` to measure what an actor-mode (GPU) operator pays per shard.

    While the file `stall_flag` exists, each row first writes its process id to `stall_seen`
    and waits, so a test can kill or freeze an instance that has rows in it."""

    def __init__(
        self,
        load_secs: float = 4.0,
        ms_per_row: float = 25.0,
        load_log: str = "",
        stall_flag: str = "",
        stall_seen: str = "",
        *args,
        **kwargs,
    ):
        super().__init__(*args, **kwargs)
        self.load_secs = float(load_secs)
        self.ms_per_row = float(ms_per_row)
        self.load_log = load_log
        self.stall_flag = stall_flag
        self.stall_seen = stall_seen

    def _model(self) -> object:
        model = _MODELS.get("model")
        if model is None:
            time.sleep(self.load_secs)
            if self.load_log:
                with open(self.load_log, "a") as handle:
                    handle.write(f"{os.getpid()}\n")
            model = _MODELS["model"] = object()
        return model

    def process_single(self, sample):
        self._model()
        deadline = time.monotonic() + 300
        while self.stall_flag and os.path.exists(self.stall_flag) and time.monotonic() < deadline:
            with open(self.stall_seen, "w") as handle:
                handle.write(str(os.getpid()))
            time.sleep(0.1)
        time.sleep(self.ms_per_row / 1000.0)
        sample["model_score"] = sum(map(ord, sample.get(self.text_key) or "")) % 97
        return sample
