#!/usr/bin/env python3
"""The original demo's entry point, run from the repository root:

    python demos/elastic_sharding/shard_job.py {prepare,worker,status,retry,merge,verify} ...

A thin wrapper over the `elastic-shard` command of the `elastic_sharding` package.
"""

import os
import sys
from pathlib import Path

# Without --config the bundled demo recipe of this checkout is the default, also where the package
# itself is installed elsewhere (an image): elastic_sharding.prepare.recipe.CHECKOUT_ENV.
os.environ.setdefault("ELASTIC_SHARD_CHECKOUT", str(Path(__file__).resolve().parents[2]))

try:
    from elastic_sharding.cli import main
except ImportError:  # running from a checkout without `pip install -e .`
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))
    from elastic_sharding.cli import main

if __name__ == "__main__":
    sys.exit(main(prog="shard_job.py"))
