"""A custom Data-Juicer operator for tests: while the file `flag` exists, each row announces
itself in `seen` and waits, so a test can break the runtime while a shard is mid-processing."""

import os
import time

from data_juicer.ops.base_op import OPERATORS, Mapper


@OPERATORS.register_module("stall_while_flag_mapper")
class StallWhileFlagMapper(Mapper):
    def __init__(self, flag: str = "", seen: str = "", *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.flag = flag
        self.seen = seen

    def process_single(self, sample):
        deadline = time.monotonic() + 300
        while self.flag and os.path.exists(self.flag) and time.monotonic() < deadline:
            with open(self.seen, "w") as handle:
                handle.write(str(os.getpid()))
            time.sleep(0.2)
        return sample
