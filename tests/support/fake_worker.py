"""`elastic-shard` with the fake runner (`support/fakes.py`) in place of Data-Juicer, in its own
process, for fast multi-process tests. Two modes:

`fake_worker.py worker JOB [--delay S] [--shard-delay ID=S ...] [--fail-shard ID ...] [--keep-fake-recipe] [--ready-file PATH] [worker flags...]`
    The real `worker` command with the fake runner. The fake runner's options come first; every
    other flag goes to `worker`, so errors, signals and exit codes take the same path as in
    production. `--ready-file` is touched each time a shard starts processing (a test's barrier).

`fake_worker.py launch [--two-node] COMMAND ...`
    `elastic-shard COMMAND ...` (dlc, local, mpi, prepare, ...) with the fake runner, for the
    launchers' coordination. The worker processes `local` and `mpi` start are `fake_worker.py
    worker` (the mode above). FAKE_FAIL_SHARDS=part-00001-of-00003,... makes those shards fail;
    FAKE_DELAY=secs slows each one; FAKE_KEEP_MOD7=1 drops rows as `fakes.fake_recipe_keep` says.
    `--two-node` runs the commands as `two_node_test.py` does (its defaults added, `dlc_job.py`'s
    profile).

`worker_command()` and `launch_command()` build these command lines.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

FAKE_WORKER = Path(__file__).resolve()
if str(FAKE_WORKER.parents[1]) not in sys.path:
    sys.path.insert(0, str(FAKE_WORKER.parents[1]))  # `support`, when this file runs as a script


def worker_command(job_dir: Path, *options: str) -> list[str]:
    """`fake_worker.py worker JOB OPTIONS...`: also what `local` and `mpi` start in launch mode."""
    return [sys.executable, str(FAKE_WORKER), "worker", str(job_dir), *options]


def launch_command(*args: str) -> list[str]:
    """`fake_worker.py launch ARGS...`: `elastic-shard ARGS...` with fake workers."""
    return [sys.executable, str(FAKE_WORKER), "launch", *args]


def run_worker(argv: list[str]) -> int:
    import elastic_sharding.work.worker
    from elastic_sharding.cli import main
    from support.fakes import FakeRunner, fake_recipe_keep

    parser = argparse.ArgumentParser(prog="fake_worker.py worker")
    parser.add_argument("job_dir", type=Path)
    parser.add_argument("--delay", type=float, default=0.0)
    parser.add_argument("--shard-delay", action="append", default=[], help="ID=SECS: this shard takes SECS here")
    parser.add_argument("--fail-shard", action="append", default=[])
    parser.add_argument("--keep-fake-recipe", action="store_true", help="drop rows as fakes.fake_recipe_keep says")
    parser.add_argument("--ready-file", type=Path, help="touched each time a shard starts processing")
    args, worker_flags = parser.parse_known_args(argv)
    keep = fake_recipe_keep if args.keep_fake_recipe else None
    shard_delays = {shard: float(secs) for shard, secs in (item.split("=") for item in args.shard_delay)}
    elastic_sharding.work.worker.get_runner = lambda name, runtime=None: FakeRunner(
        delay=args.delay,
        fail=lambda shard: shard in args.fail_shard,
        keep=keep,
        ready=args.ready_file,
        shard_delays=shard_delays,
    )
    return main(["worker", "--job-dir", str(args.job_dir), *worker_flags])


def run_launch(argv: list[str]) -> int:
    import elastic_sharding.launch.local
    import elastic_sharding.launch.mpi
    import elastic_sharding.work.worker
    from elastic_sharding.cli import main
    from elastic_sharding.launch.two_node import with_two_node_defaults
    from support.fakes import FakeRunner, fake_recipe_keep

    failing = set(filter(None, os.environ.get("FAKE_FAIL_SHARDS", "").split(",")))
    delay = float(os.environ.get("FAKE_DELAY", "0"))
    keep = fake_recipe_keep if os.environ.get("FAKE_KEEP_MOD7") else None
    elastic_sharding.work.worker.get_runner = lambda name, runtime=None: FakeRunner(
        delay=delay, fail=lambda shard: shard in failing, keep=keep
    )
    elastic_sharding.launch.local.worker_command = worker_command
    elastic_sharding.launch.mpi.worker_command = worker_command
    if argv[:1] == ["--two-node"]:
        return main(with_two_node_defaults(argv[1:]), prog="two_node_test.py", profile="dlc")
    return main(argv)


MODES = {"worker": run_worker, "launch": run_launch}

if __name__ == "__main__":
    if sys.argv[1:2] == [] or sys.argv[1] not in MODES:
        sys.exit(f"usage: fake_worker.py {{{','.join(MODES)}}} ...\n\n{__doc__}")
    sys.exit(MODES[sys.argv[1]](sys.argv[2:]))
