"""CI runs a bounded subset of the exhaustive suites; ELASTIC_SHARD_EXHAUSTIVE=1 runs all of them
(CONTRIBUTING.md: `ELASTIC_SHARD_EXHAUSTIVE=1 scripts/test`)."""

from __future__ import annotations

import os

import pytest

EXHAUSTIVE = os.environ.get("ELASTIC_SHARD_EXHAUSTIVE") == "1"
exhaustive_only = pytest.mark.skipif(not EXHAUSTIVE, reason="a case of the exhaustive suite: ELASTIC_SHARD_EXHAUSTIVE=1 runs it")
