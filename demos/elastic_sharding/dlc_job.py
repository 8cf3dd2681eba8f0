#!/usr/bin/env python3
"""The original demo's launcher for Worker-broadcast DLC jobs, run from the repository root:

    python demos/elastic_sharding/dlc_job.py dlc --job-dir /mnt/shared/jobs/job-001 [--nodes N ...]

Sub-commands: dlc, prepare, worker, status, verify (and mpi, local). Without --config they use
the bundled demo recipe; `status` lists every shard. A thin wrapper over `elastic-shard`.
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
    sys.exit(main(prog="dlc_job.py", profile="dlc"))
