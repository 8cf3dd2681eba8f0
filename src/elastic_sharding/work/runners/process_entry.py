"""`dj-process` in our node-local Ray runtime: start Ray (with the node caps, and Data-Juicer's
run-time installs switched off in every Ray worker), then hand over to Data-Juicer's own main."""

from __future__ import annotations

import argparse
import os
import sys

from elastic_sharding.work.runners import lifeline, ray_runtime, stats_only


def main() -> int:
    lifeline.hold_group()
    parser = argparse.ArgumentParser(prog="process_entry")
    ray_runtime.add_arguments(parser)
    parser.add_argument("dj_args", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    ray_runtime.init_ray(args)
    if os.environ.get(stats_only.ENV):
        stats_only.install(default=True)
    sys.argv = ["dj-process", *[a for a in args.dj_args if a != "--"]]
    from data_juicer.tools.process_data import main as dj_main

    return dj_main()


if __name__ == "__main__":
    sys.exit(main())
