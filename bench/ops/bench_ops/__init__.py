"""Custom Data-Juicer operator for the heterogeneous-nodes benchmark.

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
