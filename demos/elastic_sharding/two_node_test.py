#!/usr/bin/env python3
"""The original demo's strict two-node wrapper around `dlc_job.py`, run from the repository root:

    python demos/elastic_sharding/two_node_test.py dlc --job-dir /mnt/shared/jobs/two-node-001

Adds, when absent: `--nodes 2 --require-all-nodes --output <job-dir>/two-node-merged.jsonl` to
`dlc`, `--max-shards 2` to `worker`, `--expect-nodes 2` to `verify`.
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
from elastic_sharding.launch.two_node import with_two_node_defaults

if __name__ == "__main__":
    sys.exit(main(with_two_node_defaults(sys.argv[1:]), prog="two_node_test.py", profile="dlc"))
