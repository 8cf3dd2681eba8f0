"""The bounded CI subset of `scripts/faults`: every kind of fault once, on a GlusterFS volume in its
default caching mode (the harder one: it behaves like a NAS with attribute caching).

The full randomized run (`scripts/faults --trials 200`) is documented in the README with its
summary line; this subset keeps every kind exercised on every CI run.
"""

from __future__ import annotations

import os

import pytest
from support.fault_matrix import KINDS, run

pytestmark = pytest.mark.cluster


def test_every_kind_of_fault_loses_nothing_and_merges_identically(gluster, capsys):
    cluster = gluster(nodes=3, mode="cached")
    summary = run(trials=len(KINDS), seed=int(os.environ.get("FAULTS_SEED", "20261130")), cluster=cluster, kinds=list(KINDS))
    line = capsys.readouterr().out.strip().splitlines()[-1]
    assert summary.failed == [], "\n".join(summary.failed) + "\n" + line
    assert summary.trials == len(KINDS) and set(summary.kinds) == set(KINDS), line
    assert summary.rows_lost == 0 and summary.rows_duplicated == 0, line
    assert summary.identical == summary.merges > 0, line
    assert summary.clean_failures == summary.expected_failures > 0, line
