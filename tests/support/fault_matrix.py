"""Randomized fault-injection trials on the GlusterFS test cluster: `scripts/faults`.

Every trial starts from a freshly prepared job on the shared volume, runs workers (the fast fake
processor from `support/fakes.py`, in real processes, one per simulated node) and injects one fault:

  kill        SIGKILL a worker at a named crash point (probing, claimed, staged, processing,
              collecting, publishing, published) or at a random moment; sometimes restart it on
              its node (which removes the probe directory a worker killed mid-probe left)
  parquet     as `kill`, on a job prepared from Parquet input (a directory of Parquet files of
              several row groups, nested, null and timestamp fields; its shards Parquet files, which
              the fake processor exports as Data-Juicer's Ray export does), one or two workers
              killed; the merge must be the clean run of the same Parquet job, byte for byte
  kill-merge  SIGKILL `merge` while it writes; the previous output must be untouched
  stall       SIGSTOP a worker mid-shard for two leases, then SIGCONT: it must not publish
  partition   cut a node off the volume mid-shard, heal it later: it must not publish
  client-kill kill a node's glusterfs client mid-shard: its worker must fail safe
  drain       SIGTERM or SIGINT to a worker mid-shard: it hands the shard back at once (nobody
              waits a lease) and exits with code 2
  skew        workers with clocks ±1 h off (libfaketime) and one worker killed: no live claim
              stolen, the dead one taken over
  coordinator `dlc` instances, one of which dies at a crash point of the prepare or finalize phase
              (or in its filesystem probe, before it joins);
              sometimes of a resubmission of a finished job (prepare hashes the input again),
              sometimes with every instance creating the same new --output directories
  corrupt     a shard input, an attempt output or a completion record damaged: detected, merge
              refuses, the previous output untouched
  enospc      the job dir on a tiny tmpfs: prepare, attempt output or merge runs out of space;
              clear error, nothing half-published, then the job recovers once space is back
  actor       real Data-Juicer + Ray warm runners on two nodes, with an actor-mode operator (the
              bench's stand-in model): one of its warm instances is killed (kill -9) or frozen
              (SIGSTOP, a hang) mid-shard; only the attempts with rows in it fail, the pool
              replaces it, and every instance loads its model once
  dedup-kill  a deduplication stage (real Data-Juicer operators, no Ray) shared by a participant on
              every node: one of them killed, or frozen for two leases, at a crash point of a
              phase (keys, buckets, components; before or after the unit's work), the others
              starting with it or once it met its fault; every other participant (and the
              resumed one) exits 0 and reads exactly the rows one Data-Juicer run keeps
  dedup-job   a job whose recipe has a deduplicator between two segments (fake processing of the
              segments' shards, the real Data-Juicer operator in the stage), a worker on every
              node: one of them killed, or frozen for two leases, at a crash point of the stage
              (keys, buckets, keep; before or after the unit's work) or of a shard of the
              segment after it; the job is finished as a user would and the merged output must be
              the clean run's, byte for byte
  global-job  the same with whole-dataset stages (global_ops/), one of two recipes: key_value_grouper
              (rows leave their shards), naive_reverse_grouper, a topk selector reordering every row;
              or document_line_deduplicator, the frequency, random and range selectors: a worker
              killed or frozen at a crash point of a stage (keys, buckets, place, keep) or of a
              shard of a segment after one; the merged output must be the clean run's
  analysis-job  a `--analyze` job (fake processing that writes every row's statistics, the real
              analysis), a worker on every node: one of them killed, or frozen for two leases, at a
              crash point of the analysis (columns, plan, stats, report; before or after the unit's
              work) or of a shard; the job is finished as a user would, `merge` publishes the
              analysis directory, and every file of it must be the one clean run's, byte for byte,
              whatever the trial's shard count (index.html less its note naming the count)
  slow        a worker slowed 5-20x mid-shard (SIGSTOP/SIGCONT duty cycles on its process tree:
              alive, heartbeating, its claim never stale), the others idle once the rest is done:
              they back its shard up, the first valid publish wins, the slow attempt stops and
              publishes nothing; sometimes the slow worker is killed after its backup started
  scale-kill  a job of hundreds of tiny shards, a worker on every node, all of them busy: a quarter
              of the nodes (at least one) have their workers SIGKILLed at once mid-job, then
              restarted on the same nodes, each of which must publish shards again
  scale-partition  the same job: a quarter of the nodes (never node 0, which watches the job) cut
              off the volume at once mid-job for two to four leases, then healed; no attempt
              whose claim was taken over publishes
  prepare-kill  a cooperative prepare by two or three participants (`prepare`, or the helper that
              joins one) on separate nodes: one of them killed at a crash point of a phase (scan,
              cut, write, final, staged), or SIGKILLed or frozen (SIGSTOP for two leases) at a
              random moment while it holds a unit of a chosen phase; sometimes it prepares alone
              and the same `prepare` is rerun. The survivors (or the rerun) exit 0 with the job a
              clean single-process prepare writes, byte for byte; `.<job>.preparing` is gone. One
              trial in three prepares Parquet input (a directory of Parquet files) instead of JSONL

After the fault the job is driven to its end the way a user would (surviving workers finish it,
or the same command is rerun) and the merged output is compared with a clean single-worker run:
rows lost, rows duplicated and byte-identity are counted. Trials that must end in a clean failure
(corruption, no space) check the error instead and count as clean failures.

Seeded and reproducible in what it chooses (kinds, victims, crash points, delays); the exact
moment a random kill lands still depends on timing.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import logging
import math
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import zlib
from collections import Counter
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

TESTS = Path(__file__).resolve().parents[1]
SRC = TESTS.parent / "src"
sys.path.insert(0, str(TESTS))  # `support` (this file's package), also when it runs as a script
sys.path.insert(0, str(SRC))

import orjson  # noqa: E402

from elastic_sharding.finish.analysis_output import publish_analysis  # noqa: E402
from elastic_sharding.finish.merge import merge  # noqa: E402
from elastic_sharding.fsprobe import PROBE_PREFIX  # noqa: E402
from elastic_sharding.layout import processed_file  # noqa: E402
from elastic_sharding.prepare.job import PrepareRequest, prepare  # noqa: E402
from elastic_sharding.prepare.plan import UNIT_BYTES_ENV, plan_units, write_units  # noqa: E402
from elastic_sharding.records import Settings  # noqa: E402
from elastic_sharding.work.worker import Worker, WorkerOptions  # noqa: E402
from support.cluster import Cluster, Node, cluster_available  # noqa: E402
from support.dedup_corpus import prose_rows  # noqa: E402
from support.dedup_node import node_command, stage_spec  # noqa: E402
from support.e2e_support import processes_with  # noqa: E402
from support.fake_worker import launch_command, worker_command  # noqa: E402
from support.fakes import META_FIELD, FakeRunner, fake_recipe_keep  # noqa: E402
from support.jobs import DEDUP_RECIPE, SIMPLE_RECIPE, sample_rows, write_jsonl  # noqa: E402
from support.throttle import DutyCycle  # noqa: E402

PY = sys.executable
LEASE, HEARTBEAT, POLL = 3.0, 0.3, 0.2
ROWS = 90
BENCH_OPS = TESTS.parent / "bench" / "ops" / "bench_ops"
# Real Data-Juicer workers start Ray on a loaded box: a longer lease than the fake ones need.
ACTOR_LEASE, ACTOR_HEARTBEAT, ACTOR_SHARDS = 20.0, 1.0, 6
ACTOR_RECIPE = """\
executor_type: ray
ray_address: local
dataset_path: {dataset}
custom_operator_paths: [{ops}]
process:
  - bench_model_mapper:
      load_secs: 0.5
      ms_per_row: 40
      load_log: {loads}
      ray_execution_mode: actor
      num_proc: 1
"""
KINDS = {
    "kill": 5,
    "parquet": 2,
    "kill-merge": 1,
    "stall": 2,
    "partition": 2,
    "client-kill": 1,
    "drain": 1,
    "skew": 2,
    "coordinator": 2,
    "corrupt": 2,
    "enospc": 1,
    "actor": 1,
    "prepare-kill": 2,
    "dedup-kill": 2,
    "dedup-job": 2,
    "global-job": 2,
    "analysis-job": 2,
    "slow": 2,
    "scale-kill": 1,
    "scale-partition": 1,
}
# The slow trials: enough shards that three have completed when the others turn idle.
SLOW_SHARDS, SLOW_BACKUP_AFTER, SLOW_BACKUP_MIN_SECS = 12, 1.5, 0.5
CRASH_POINTS = ("probing", "claimed", "staged", "processing", "collecting", "publishing", "published")
COORDINATOR_POINTS = (
    "probing",
    "phase-locked:prepare",
    "prepare-staged",
    "phase-done:prepare",
    "phase-locked:finalize",
    "merging",
    "phase-done:finalize",
)
# A resubmission of a finished job: prepare hashes the input again, finalize re-verifies the merge.
RESUBMIT_POINTS = (
    "phase-locked:prepare",
    "prepare-rehashing",
    "phase-done:prepare",
    "phase-locked:finalize",
    "phase-done:finalize",
)
# The cooperative prepare: a few hundred KB in scan units of a few KB, so every phase has work to
# share and a short lease keeps a takeover across nodes quick.
# 24 shards in units of 64 KB: a write unit writes several shards (`shards_per_write`).
PREPARE_ROWS, PREPARE_SHARDS, PREPARE_UNIT_BYTES = 2000, (4, 5, 6, 24), (4096, 8192, 16384, 65536)
PREPARE_LEASE, PREPARE_HEARTBEAT = 2.0, 0.2
PREPARE_POINTS = (
    "prepare-scan",
    "prepare-scan-done",
    "prepare-cut",
    "prepare-cut-done",
    "prepare-write",
    "prepare-write-done",
    "prepare-recipe",
    "prepare-recipe-done",
    "prepare-final",
    "prepare-final-done",
    "prepare-staged",
)
PREPARE_PHASES = ("scan", "cut", "write", "recipe", "final")
# One prepare-kill trial in three prepares Parquet input: PREPARE_ROWS rows in a directory of
# Parquet files whose row groups have these many rows (file i: PREPARE_PARQUET_GROUPS[i]). About
# the JSONL input's size in all (~240 KB), so the smaller unit sizes split every file into several
# scan units, and at 24 shards there are fewer row groups than shards (the cut splits groups).
PREPARE_PARQUET, PREPARE_PARQUET_GROUPS = 1 / 3, (60, 90, 150, 250)
# The parquet kind's job: PARQUET_ROWS rows in files of row groups of PARQUET_GROUPS rows; 12
# shards are more than its 8 row groups (shards of row ranges), the others runs of whole groups.
PARQUET_ROWS, PARQUET_GROUPS, PARQUET_SHARDS = 180, (20, 25, 40), (3, 4, 6, 12)
# A deduplication stage over a few shards of prose with planted duplicates: the simhash
# operator as published, and a small minhash one whose chains take several rounds.
DEDUP_ROWS, DEDUP_SHARDS, DEDUP_LEASE = 900, (3, 4, 6), 3.0
DEDUP_OPERATORS = (
    ("document_simhash_deduplicator", {}),
    ("document_minhash_deduplicator", {"num_bands": 8, "num_rows_per_band": 4, "num_permutations": 32}),
)
DEDUP_POINTS = tuple(f"dedup-{phase}{end}" for phase in ("keys", "buckets", "components") for end in ("", "-done"))
DEDUP_EXIT_SECS = 120
DEDUP_JOB_SHARDS = (3, 5)
DEDUP_JOB_POINTS = tuple(f"dedup-{phase}{end}" for phase in ("keys", "buckets", "keep") for end in ("", "-done"))
# Jobs with whole-dataset stages (global_ops/), one of two recipes per trial: a group-by whose rows
# leave their shards, its inverse in place and a ranking selector that reorders every row; or line
# deduplication, a frequency selector, the random selector and a range selector.
GLOBAL_JOB_POINTS = tuple(f"global-{phase}{end}" for phase in ("keys", "buckets", "place", "keep") for end in ("", "-done"))
GLOBAL_JOB_HEAD = """\
executor_type: ray
ray_address: local
dataset_path: {dataset}
process:
  - whitespace_normalization_mapper:
"""
GLOBAL_JOB_RECIPES = (
    GLOBAL_JOB_HEAD
    + """\
  - key_value_grouper:
      group_by_keys: [bucket]
  - naive_reverse_grouper:
  - topk_specified_field_selector:
      field_key: id
      top_ratio: 0.8
  - text_length_filter:
      min_len: 5
""",
    GLOBAL_JOB_HEAD
    + """\
  - document_line_deduplicator:
      frequency_threshold: 3
  - frequency_specified_field_selector:
      field_key: bucket
      top_ratio: 0.7
  - random_selector:
      select_ratio: 0.8
  - range_specified_field_selector:
      field_key: id
      lower_percentile: 0.1
      upper_percentile: 0.9
  - text_length_filter:
      min_len: 5
""",
)
GLOBAL_JOB_LINES = ("Home | About | Contact", "All rights reserved.", "Share this page", "Cookies help us")
# A `--analyze` job over the dedup kinds' prose: the recipe's filters are what prepare keeps (the
# fake computes its own statistics, `fakes.fake_analysis`), the rest is skipped as dj-analyze skips it.
# The trials' shard counts, and the one clean run's every trial is compared with: a count no trial
# uses, since the analysis is byte-identical whatever the cut.
ANALYSIS_SHARDS, ANALYSIS_CLEAN_SHARDS, ANALYSIS_PERCENTILES = (3, 5), 4, [0.1, 0.9]
ANALYSIS_POINTS = tuple(f"analysis-{phase}{end}" for phase in ("columns", "plan", "stats", "report") for end in ("", "-done"))
ANALYSIS_RECIPE = """\
executor_type: ray
ray_address: local
dataset_path: {dataset}
export_path: /tmp/ignored-by-workers/prose.jsonl
process:
  - whitespace_normalization_mapper:
  - text_length_filter:
  - alphanumeric_filter:
  - document_deduplicator:
"""
# The scale kinds: a job of hundreds of tiny shards (SCALE_ROWS rows of `sample_rows`, SCALE_SHARDS
# shards, a per-shard delay from SCALE_DELAY) keeps every node busy for most of the trial, at 3
# nodes as at 16 or 32; the fault hits a quarter of the nodes (`scale_victims`) at once when a
# fraction SCALE_AT of the shards is done, so that most of the job is still ahead of them.
SCALE_ROWS, SCALE_SHARDS, SCALE_DELAY, SCALE_AT = 800, (200, 320), (0.02, 0.08), (0.1, 0.3)
# A restarted worker must publish shards if, once it is ready to claim, at least this many
# unclaimed shards per node are left.
SCALE_PICKUP_MARGIN = 2
SCALE_LISTING_LAG = 1.5  # seconds a caching node may list a new completion late
SCALE_EXIT_SECS = 300  # how long the workers of a scale job may take to finish it once the fault is over
PREPARE_EXIT_SECS = 90  # how long a participant may take to exit once the fault has been injected
FAKETIME = next(Path("/usr/lib").glob("*/faketime/libfaketime.so.1"), Path("/usr/lib/faketime/libfaketime.so.1"))
INSPECT = r"""
import json, os, sys
job = sys.argv[1]
def load(path):
    try:
        with open(path, "rb") as f:
            return json.loads(f.read())
    except (OSError, ValueError):
        return None
def names(path):
    try:
        return sorted(os.listdir(path))
    except OSError:
        return []
out = {"done": {}, "claims": {}, "attempts": {}}
for kind, folder in (("done", "done"), ("claims", "locks")):
    for name in names(f"{job}/state/{folder}"):
        if name.endswith(".json"):
            out[kind][name[:-5]] = load(f"{job}/state/{folder}/{name}")
for shard in names(f"{job}/attempts"):
    for attempt in names(f"{job}/attempts/{shard}"):
        base = f"{job}/attempts/{shard}/{attempt}"
        record = load(f"{base}/attempt.json") or {}
        beat = load(f"{base}/heartbeat.json") or {}
        out["attempts"][attempt] = {"shard": shard, "status": record.get("status"), "pid": record.get("pid"),
            "host": record.get("host"), "superseded": os.path.exists(f"{base}/superseded.json"),
            "backup_of": record.get("backup_of"), "finished_at": record.get("finished_at"),
            "phase": beat.get("phase"), "started_at": record.get("started_at")}
print(json.dumps(out))
"""
# A published analysis directory as a node sees it: each file's sha256, index.html's without the
# note that names the job's shard count ("900 rows of ... in 3 shard(s)"), the one difference a
# different cut makes.
ANALYSIS_INSPECT = r"""
import hashlib, json, os, re, sys
root = sys.argv[1]
def digest(name):
    data = open(os.path.join(root, name), "rb").read()
    if name == "index.html":
        data = re.sub(rb" in [0-9]+ shard\(s\)</li>", b"</li>", data, count=1)
    return hashlib.sha256(data).hexdigest()
print(json.dumps({n: digest(n) for n in sorted(os.listdir(root))}))
"""

# Waits on a node until argv[2] shards of the job argv[1] are done (or argv[3] seconds passed), then
# up to argv[4] seconds more until one of the hosts named after it holds a running claim; prints the
# names done and the running claims of the shards not done: the light look at a job of hundreds
# of shards that a scale trial takes just before its fault (INSPECT reads every record).
SCALE_WAIT = r"""
import json, os, sys, time
job, target, hosts = sys.argv[1], int(sys.argv[2]), set(sys.argv[5:])
deadline = time.monotonic() + float(sys.argv[3])
def names(path):
    try:
        return {n[:-5] for n in os.listdir(path) if n.endswith(".json")}
    except OSError:
        return set()
def running(done):
    claims = {}
    for shard in sorted(names(f"{job}/state/locks") - done):
        try:
            with open(f"{job}/state/locks/{shard}.json", "rb") as f:
                claim = json.loads(f.read())
        except (OSError, ValueError):
            continue
        if claim.get("status") == "running":
            claims[shard] = claim
    return claims
while True:
    done = names(f"{job}/state/done")
    if len(done) >= target or time.monotonic() > deadline:
        break
    time.sleep(0.05)
deadline = time.monotonic() + float(sys.argv[4])
while True:
    claims = running(done)
    if not hosts or hosts & {c.get("host") for c in claims.values()} or time.monotonic() > deadline:
        break
    time.sleep(0.1)
    done = names(f"{job}/state/done")
print(json.dumps({"done": sorted(done), "claims": claims}))
"""
SCALE_HOLD_SECS = 5  # how long a scale trial waits past its moment for a victim to hold a claim

# Waits on a node until the claim record argv[1] no longer holds token argv[2] (taken over) or is no
# longer running, or argv[3] seconds passed; prints which. A takeover renames the record away for a
# moment: a missing or unreadable record is waited out.
TAKEOVER_WAIT = r"""
import json, sys, time
path, token = sys.argv[1], sys.argv[2]
deadline = time.monotonic() + float(sys.argv[3])
while time.monotonic() < deadline:
    try:
        with open(path, "rb") as f:
            claim = json.loads(f.read())
    except (OSError, ValueError):
        claim = None
    if claim is not None and claim.get("token") != token:
        print("taken")
        sys.exit(0)
    if claim is not None and claim.get("status") != "running":
        print(claim.get("status"))
        sys.exit(0)
    time.sleep(0.05)
print("timeout")
"""
TAKEOVER_SECS = 90  # at 32 nodes on 2 cores the other workers take tens of seconds to start

# Waits on a node until the job argv[1] has its manifest (or argv[2] seconds passed).
PREPARE_PUBLISHED = r"""
import os, sys, time
manifest = os.path.join(sys.argv[1], "manifest.json")
deadline = time.monotonic() + float(sys.argv[2])
while not os.path.exists(manifest) and time.monotonic() < deadline:
    time.sleep(0.005)
"""
# Waits on a node until pid argv[3] holds a unit of the prepare of job argv[1] whose name starts
# with argv[2] and that is not done yet; prints the unit (or "timeout").
PREPARE_WAIT = r"""
import json, os, sys, time
job, prefix, pid = sys.argv[1], sys.argv[2], int(sys.argv[3])
root = os.path.join(os.path.dirname(job), "." + os.path.basename(job) + ".preparing")
units = os.path.join(root, "units")
deadline = time.monotonic() + float(sys.argv[4])
while time.monotonic() < deadline:
    try:
        names = os.listdir(units)
    except OSError:
        names = []
    for name in sorted(names):
        if not (name.startswith(prefix) and name.endswith(".lock")):
            continue
        unit = name[:-5]
        if os.path.exists(os.path.join(units, unit + ".json")):
            continue
        try:
            with open(os.path.join(units, name), "rb") as f:
                claim = json.loads(f.read())
        except (OSError, ValueError):
            continue
        if claim.get("pid") == pid:
            print(unit)
            sys.exit(0)
    time.sleep(0.01)
print("timeout")
"""
# What a prepared job holds, as a node sees it: the `.<job>.preparing*` entries beside it, the
# manifest, the files in shards/, each shard's sha256 and the ids of its rows in order.
PREPARE_INSPECT = r"""
import hashlib, json, os, sys
job = sys.argv[1]
parent, name = os.path.dirname(job), os.path.basename(job)
left = sorted(n for n in os.listdir(parent) if n.startswith("." + name + ".preparing"))
# Each leftover with the files in it: what was written there says who wrote it.
out = {"leftovers": {n: sorted(os.path.relpath(os.path.join(r, f), os.path.join(parent, n)) for r, _, fs in os.walk(os.path.join(parent, n)) for f in fs) for n in left}, "manifest": None}
try:
    with open(os.path.join(job, "manifest.json"), "rb") as f:
        out["manifest"] = json.loads(f.read())
except (OSError, ValueError):
    pass
try:
    out["files"] = sorted(os.listdir(os.path.join(job, "shards")))
except OSError:
    out["files"] = []
out["shards"], out["ids"] = {}, []
for shard in out["files"]:
    if shard.startswith("part-") and shard.endswith((".jsonl", ".parquet")):
        with open(os.path.join(job, "shards", shard), "rb") as f:
            data = f.read()
        out["shards"][shard] = hashlib.sha256(data).hexdigest()
        if shard.endswith(".parquet"):
            import pyarrow.parquet as pq
            out["ids"] += pq.read_table(os.path.join(job, "shards", shard), columns=["id"]).column("id").to_pylist()
        else:
            out["ids"] += [json.loads(line)["id"] for line in data.splitlines()]
print(json.dumps(out))
"""


@dataclass
class PrepareReference:
    """The input of the prepare-kill trials (a JSONL file, or a directory of Parquet files), its
    clean single-process prepares (one per shard count, as PREPARE_INSPECT sees them) and the
    merge of a clean fake run over one of them."""

    data: Path
    recipe: Path
    files: list[Path]  # the input files, in the order prepare reads them
    sizes: list[int]
    jobs: dict[int, dict]
    merged: bytes
    expected_ids: list[int]

    @property
    def size(self) -> int:
        return sum(self.sizes)

    def scan_units(self, unit_bytes: int) -> int:
        return len(plan_units(self.files, self.sizes, unit_bytes))


@dataclass
class Template:
    """A job prepared once on local disk and copied onto the volume for each trial."""

    shards: int
    job: Path
    reference: bytes


@dataclass
class AnalysisTemplate:
    """A `--analyze` job prepared once per shard count on local disk, and the analysis directory
    the one clean run publishes (at `ANALYSIS_CLEAN_SHARDS`): each file's sha256 as
    `ANALYSIS_INSPECT` gives it, and the stats export's row ids in order."""

    shards: int
    job: Path
    files: dict[str, str]
    export: str
    row_ids: list[int]


@dataclass
class PrepareCase:
    """One prepare-kill trial: what fault hits which participant, who takes part and where."""

    shards: int
    unit_bytes: int
    fault: str  # "point" (a crash point), "kill" (SIGKILL) or "stop" (SIGSTOP for two leases)
    point: str  # with "point": the crash point and its count, "prepare-write@1"
    phase: str
    alone: bool  # the victim prepares alone; a rerun finishes
    victim: int
    helpers: list[bool]  # per participant: the helper that joins (True) or `prepare` (False)
    procs: list[int]  # per participant: --prepare-procs
    placement: list[int]  # per participant, then the rerun: the node it runs on
    same_host: bool
    # Start the victim alone and the others once it holds a unit of `phase` (or is dead), so that
    # it is the victim's unit that is taken over.
    hold: bool
    # With "stop": resume the victim after two leases, or the moment another node sees the job
    # published (while the others remove the prepare directory it still has a view of).
    resume_at_publish: bool = False
    parquet: bool = False  # the input is a directory of Parquet files, not a JSONL file


@dataclass
class Outcome:
    kind: str
    detail: str
    counts: Counter = field(default_factory=Counter)
    identical: bool | None = None
    clean_failure: bool | None = None
    rows_lost: int = 0
    rows_duplicated: int = 0
    problems: list[str] = field(default_factory=list)

    def check(self, condition: bool, problem: str) -> None:
        if not condition:
            self.problems.append(problem)


class VictimRun(NamedTuple):
    """A job run by a worker on every node, one of them the victim of a fault."""

    job: Path
    log: Path
    codes: dict[int, int | None]  # each node's worker's exit code
    stalled: bool  # the victim was frozen at its point and resumed after two leases


class Harness:
    def __init__(self, cluster: Cluster, workdir: Path):
        self.cluster = cluster
        self.workdir = workdir
        self.data = write_jsonl(workdir / "input.jsonl", sample_rows(ROWS))
        self.recipe = workdir / "recipe.yaml"
        self.recipe.write_text(SIMPLE_RECIPE.format(dataset=self.data))
        self.templates = {n: self._template(n) for n in (3, 4, 6)}
        self.slow_template = self._template(SLOW_SHARDS, SLOW_BACKUP_AFTER, SLOW_BACKUP_MIN_SECS)
        references = {t.reference for t in (*self.templates.values(), self.slow_template)}
        if len(references) != 1:
            raise AssertionError("clean runs with different shard counts disagree: determinism is broken")
        self.reference = references.pop()
        self.expected_ids = [orjson.loads(line)["id"] for line in self.reference.splitlines()]
        self._actor_template: Template | None = None
        self._parquet_templates: dict[int, Template] = {}
        self._prepare_references: dict[bool, PrepareReference] = {}
        self._dedup_expected: dict[int, list[int]] = {}
        self._stage_jobs: dict[tuple[str, int, int], Template] = {}
        self._analysis_jobs: dict[int, AnalysisTemplate] = {}
        self._analysis_clean: tuple[dict[str, str], str, list[int]] | None = None
        self._scale_templates: dict[int, Template] = {}
        self.compare_with: bytes | None = None

    # -- set-up ---------------------------------------------------------------------------------

    def _template(
        self, shards: int, backup_after: float = 2.0, backup_min_secs: float = 10.0, recipe: Path | None = None, tag: str = ""
    ) -> Template:
        job = self.workdir / f"{tag}template-{shards}"
        settings = Settings(
            lock_timeout_secs=LEASE,
            max_retries=6,
            poll_interval_secs=POLL,
            heartbeat_interval_secs=HEARTBEAT,
            ray_address="local",
            backup_after=backup_after,
            backup_min_secs=backup_min_secs,
        )
        prepare(PrepareRequest(recipe or self.recipe, None, job, shards, settings), quiet=True)
        clean = self.workdir / f"{tag}clean-{shards}"
        shutil.copytree(job, clean, symlinks=True)
        if Worker(clean, WorkerOptions(), runner=FakeRunner(keep=fake_recipe_keep)).run() != 0:
            raise AssertionError("the clean reference run failed")
        out = self.workdir / f"{tag}clean-{shards}.jsonl"
        merge(clean, out)
        return Template(shards, job, out.read_bytes())

    def node(self, index: int) -> Node:
        return self.cluster.nodes[index % len(self.cluster.nodes)]

    def parquet_templates(self) -> dict[int, Template]:
        """The parquet kind's jobs (built once): Parquet input of PARQUET_ROWS rows prepared per
        shard count, each with its clean fake run; every shard count must merge the same."""
        if not self._parquet_templates:
            data = write_parquet_input(self.workdir / "parquet-input", parquet_rows(PARQUET_ROWS), PARQUET_GROUPS)
            recipe = self.workdir / "parquet-recipe.yaml"
            recipe.write_text(SIMPLE_RECIPE.format(dataset=data))
            templates = {n: self._template(n, recipe=recipe, tag="parquet-") for n in PARQUET_SHARDS}
            if len({t.reference for t in templates.values()}) != 1:
                raise AssertionError("clean runs of the Parquet job with different shard counts disagree")
            self._parquet_templates = templates
        return self._parquet_templates

    def fresh_job(self, name: str, shards: int, templates: dict[int, Template] | None = None) -> Path:
        job = self.cluster.mount / name / "job"
        if templates is not None:
            template = templates[shards]
        else:
            template = self.slow_template if shards == SLOW_SHARDS else self.templates[shards]
        self.node(0).run(["mkdir", "-p", str(job.parent)], check=True)
        self.node(0).run(["cp", "-a", str(template.job), str(job)], check=True)
        return job

    def env(self, **extra: str) -> dict[str, str]:
        return {"PYTHONPATH": f"{SRC}{os.pathsep}{TESTS}", "PYTHONUNBUFFERED": "1", **extra}

    def worker(self, node: Node, job: Path, log: Path, delay: float, env: dict[str, str] | None = None) -> subprocess.Popen:
        """A fake worker; one in three stores its outputs plain (`--shard-output-codec none`, drawn
        from its log's name, so a seed repeats it), so jobs mix both codecs."""
        codec = "none" if zlib.crc32(str(log).encode()) % 3 == 0 else "zstd"
        handle = open(log, "ab")  # noqa: SIM115 - the child keeps it
        try:
            return node.popen(
                worker_command(job, "--delay", f"{delay:.2f}", "--keep-fake-recipe", "--shard-output-codec", codec),
                env=self.env(**(env or {})),
                stdout=subprocess.DEVNULL,
                stderr=handle,
            )
        finally:
            handle.close()

    def inspect(self, job: Path) -> dict:
        proc = self.node(0).run([PY, "-c", INSPECT, str(job)], check=True, timeout=60)
        return json.loads(proc.stdout)

    def cli(self, node: Node, *args: str, env: dict[str, str] | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
        return node.run([PY, "-m", "elastic_sharding", *args], env=self.env(**(env or {})), timeout=timeout)

    # -- checks ---------------------------------------------------------------------------------

    def compare(self, outcome: Outcome, merged: bytes, expected_ids: list[int] | None = None) -> None:
        got = [orjson.loads(line)["id"] for line in merged.splitlines()]
        outcome.rows_lost = len(set(expected_ids or self.expected_ids) - set(got))
        outcome.rows_duplicated = len(got) - len(set(got))
        outcome.identical = merged == (self.compare_with or self.reference)
        outcome.check(outcome.identical, "merged output differs from the clean run")

    def finish_and_compare(
        self, outcome: Outcome, job: Path, log: Path, workers: list[subprocess.Popen], expected_ids: list[int] | None = None
    ) -> dict:
        """Wait for the running workers, rerun one if the job is not done, merge, compare."""
        for proc in workers:
            wait(proc, 180)
        status = self.cli(self.node(1), "status", "--job-dir", str(job))
        if status.returncode != 0:
            outcome.counts["reruns"] += 1
            rerun = self.worker(self.node(1), job, log, 0.0)
            outcome.check(wait(rerun, 180) == 0, "a rerun worker did not complete the job")
        out = job.parent / "merged.jsonl"
        proc = self.cli(self.node(2), "merge", "--job-dir", str(job), "--output", str(out), "--overwrite")
        outcome.check(proc.returncode == 0, f"merge failed: {last_line(proc.stderr)}")
        if proc.returncode == 0:
            self.compare(outcome, self.node(2).read_bytes(out), expected_ids)
        state = self.inspect(job)
        backups = {k: a for k, a in state["attempts"].items() if a.get("backup_of")}
        outcome.counts["backups"] += len(backups)
        outcome.counts["backups_won"] += sum(
            (state["done"].get(a["shard"]) or {}).get("attempt_id") == k for k, a in backups.items()
        )
        for shard, done in state["done"].items():
            attempt = state["attempts"].get(done["attempt_id"]) if done else None
            # "running": its owner was killed or cut off between publishing and recording it (status
            # then reports it as succeeded: the completion record is the truth).
            outcome.check(
                attempt is not None and attempt["status"] in ("succeeded", "running"),
                f"{shard}: the published attempt is recorded as {attempt and attempt['status']}",
            )
        return state

    # -- the warm-operator trials (real Data-Juicer + Ray) -----------------------------------------

    def actor_template(self) -> Template:
        """Prepared once, with its clean reference from one real warm worker on local disk."""
        if self._actor_template is None:
            loads = self.workdir / "actor-template-loads.log"
            recipe = self.workdir / "actor-recipe.yaml"
            recipe.write_text(ACTOR_RECIPE.format(dataset=self.data, ops=BENCH_OPS, loads=loads))
            job = self.workdir / "actor-template"
            settings = Settings(
                lock_timeout_secs=ACTOR_LEASE,
                max_retries=6,
                poll_interval_secs=POLL,
                heartbeat_interval_secs=ACTOR_HEARTBEAT,
                ray_address="local",
                ray_num_cpus=1,
                ray_object_store_mb=256,
            )
            prepare(PrepareRequest(recipe, None, job, ACTOR_SHARDS, settings), quiet=True)
            clean = self.workdir / "actor-clean"
            shutil.copytree(job, clean, symlinks=True)
            argv = [PY, "-m", "elastic_sharding", "worker", "--job-dir", str(clean), "--runner", "warm"]
            argv += ["--ray-temp-dir", tempfile.mkdtemp(prefix="esfa", dir="/tmp")]
            with open(self.workdir / "actor-clean.log", "wb") as log:
                proc = subprocess.run(argv, env={**os.environ, **self.env()}, stdout=subprocess.DEVNULL, stderr=log, timeout=600)
            if proc.returncode != 0:
                raise AssertionError(f"the clean warm-operator run failed (see {self.workdir / 'actor-clean.log'})")
            out = self.workdir / "actor-clean.jsonl"
            merge(clean, out)
            self._actor_template = Template(ACTOR_SHARDS, job, out.read_bytes())
        return self._actor_template

    def trial_actor(self, name: str, log_dir: Path, rng: random.Random) -> Outcome:
        template = self.actor_template()
        freeze = rng.random() < 0.3
        after = rng.uniform(0.0, 2.5)
        outcome = Outcome("actor", f"{'froze' if freeze else 'killed'} a warm instance {after:.1f}s into processing")
        job = self.cluster.mount / name / "job"
        self.node(0).run(["mkdir", "-p", str(job.parent)], check=True)
        self.node(0).run(["cp", "-a", str(template.job), str(job)], check=True)
        loads = self.workdir / "actor-template-loads.log"
        loads_before = len(loads.read_text().split())
        workers = []
        for index in range(2):
            argv = [PY, "-m", "elastic_sharding", "worker", "--job-dir", str(job), "--runner", "warm"]
            argv += ["--ray-temp-dir", f"/tmp/esfm-{os.getpid()}-{name[-4:]}-{index}"]
            with open(log_dir / f"worker-{index}.log", "ab") as handle:
                workers.append(self.node(index).popen(argv, env=self.env(), stdout=subprocess.DEVNULL, stderr=handle))
        deadline = time.monotonic() + 240
        victims: list[int] = []
        while not victims and time.monotonic() < deadline and any(w.poll() is None for w in workers):
            victims = [pid for pid in _instances_of(job) if _busy(pid)]
            time.sleep(0.2)
        if victims:
            time.sleep(after)
            victim = rng.choice(victims)
            with contextlib.suppress(ProcessLookupError):
                os.kill(victim, signal.SIGSTOP if freeze else signal.SIGKILL)
                outcome.counts["actor_freezes" if freeze else "actor_kills"] += 1
        outcome.check(bool(victims), "no warm instance was ever seen running")
        self.compare_with = template.reference
        try:
            state = self.finish_and_compare(outcome, job, log_dir / "finish.log", workers)
        finally:
            self.compare_with = None
        # Every instance loads its model once (one killed during its load never logs it).
        built = _instances_built(self.node(0), job)
        logged = len(loads.read_text().split()) - loads_before
        outcome.check(built - 1 <= logged <= built, f"{logged} model loads logged for {built} instances built")
        failed = [a for a in state["attempts"].values() if a["status"] == "failed"]
        outcome.counts["actor_failed_attempts"] += len(failed)
        return outcome

    # -- trials ---------------------------------------------------------------------------------

    def run_trial(self, index: int, rng: random.Random, kind: str | None = None) -> Outcome:
        kind = kind or rng.choices(list(KINDS), weights=list(KINDS.values()))[0]
        name = f"trial-{index:04d}"
        log_dir = self.workdir / name
        log_dir.mkdir()
        outcome = getattr(self, "trial_" + kind.replace("-", "_"))(name, log_dir, rng)
        if not outcome.problems:
            self.node(0).run(["rm", "-rf", str(self.cluster.mount / name)])
            shutil.rmtree(log_dir, ignore_errors=True)
        return outcome

    def _start(
        self,
        name: str,
        log_dir: Path,
        rng: random.Random,
        delay: float,
        envs: dict[int, dict] | None = None,
        victim: int | None = None,
        shards: int | None = None,
        templates: dict[int, Template] | None = None,
    ) -> tuple[Path, list[subprocess.Popen], dict | None]:
        """A fresh job (of `templates`, or the JSONL ones) with a worker on every node. With
        `victim`, that worker starts first and the others only once it is mid-shard, which is
        returned (its claim record and shard)."""
        job = self.fresh_job(name, shards or rng.choice(list(self.templates)), templates)
        envs = envs or {}
        workers: list[subprocess.Popen | None] = [None] * len(self.cluster.nodes)
        held = None
        if victim is not None:
            workers[victim] = self.worker(self.node(victim), job, log_dir / f"worker-{victim}.log", delay, envs.get(victim))
            held = self._held(job, workers[victim].pid)
        for i, node in enumerate(self.cluster.nodes):
            if workers[i] is None:
                workers[i] = self.worker(node, job, log_dir / f"worker-{i}.log", delay, envs.get(i))
        return job, workers, held

    def trial_kill(self, name: str, log_dir: Path, rng: random.Random) -> Outcome:
        return self._kill_trial("kill", name, log_dir, rng)

    def trial_parquet(self, name: str, log_dir: Path, rng: random.Random) -> Outcome:
        """As `kill`, on a job prepared from Parquet input (its shards are Parquet files, exported
        by the fake as Data-Juicer's Ray export does), and sometimes with two workers killed."""
        templates = self.parquet_templates()
        shards = rng.choice(list(templates))
        victims = rng.choice((1, 1, 2))
        outcome = self._kill_trial("parquet", name, log_dir, rng, templates, shards, victims)
        outcome.counts["parquet_jobs"] += 1
        return outcome

    def _kill_trial(
        self,
        kind: str,
        name: str,
        log_dir: Path,
        rng: random.Random,
        templates: dict[int, Template] | None = None,
        shards: int | None = None,
        victims: int = 1,
    ) -> Outcome:
        """SIGKILL `victims` workers at crash points or at a random moment, sometimes restart them
        on their nodes; the job (of `templates`, or the JSONL ones) must merge as its clean run."""
        count = len(self.cluster.nodes)
        victim = rng.randrange(count)
        delay = rng.uniform(0.3, 1.2)
        prefix = "" if templates is None else f"x{shards}: "
        if rng.random() < 0.7:
            points = {}
            for v in [victim] + rng.sample([i for i in range(count) if i != victim], victims - 1):
                point = rng.choice(CRASH_POINTS)
                points[v] = point + ("@1" if point == "probing" else f"@{rng.choice((1, 1, 2))}")  # a worker probes once
            detail = ", ".join(f"worker {v} at {point}" for v, point in points.items())
            outcome = Outcome(kind, prefix + detail)
            envs = {v: {"ELASTIC_SHARD_CRASH_AT": point} for v, point in points.items()}
            job, workers, _ = self._start(name, log_dir, rng, delay, envs, shards=shards, templates=templates)
            for v in points:
                if wait(workers[v], 120) == -signal.SIGKILL:
                    outcome.counts["kills"] += 1
        else:
            after = rng.uniform(0.2, 4.0)
            points = {v: "" for v in [victim] + rng.sample([i for i in range(count) if i != victim], victims - 1)}
            outcome = Outcome(
                kind, prefix + f"worker{'s' if victims > 1 else ''} {', '.join(map(str, points))} after {after:.1f}s"
            )
            job, workers, _ = self._start(name, log_dir, rng, delay, shards=shards, templates=templates)
            time.sleep(after)
            for v in points:
                if workers[v].poll() is None:
                    workers[v].kill()
                    outcome.counts["kills"] += 1
                workers[v].wait()
        restarted = rng.random() < 0.5
        if restarted:
            for v in points:
                outcome.counts["restarts"] += 1
                workers[v] = self.worker(self.node(v), job, log_dir / f"restarted-{v}.log", delay)
        if templates is None:
            self.finish_and_compare(outcome, job, log_dir / "finish.log", workers)
        else:
            reference = templates[shards].reference
            self.compare_with = reference
            try:
                expected = [orjson.loads(line)["id"] for line in reference.splitlines()]
                self.finish_and_compare(outcome, job, log_dir / "finish.log", workers, expected)
            finally:
                self.compare_with = None
        left = [name for name in self.node(0).run(["ls", "-A", str(job)]).stdout.split() if name.startswith(PROBE_PREFIX)]
        outcome.counts["probe_leftovers"] += len(left)  # a SIGKILL mid-probe cannot clean up
        for v in points if restarted else ():
            mine = f"{PROBE_PREFIX}{self.node(v).name}."
            outcome.check(not any(name.startswith(mine) for name in left), f"the restarted worker {v} kept {left}")
        return outcome

    def trial_kill_merge(self, name: str, log_dir: Path, rng: random.Random) -> Outcome:
        outcome = Outcome("kill-merge", "merge killed while writing")
        job, workers, _ = self._start(name, log_dir, rng, 0.2)
        for proc in workers:
            wait(proc, 120)
        out = job.parent / "merged.jsonl"
        previous = b'{"previous": "output"}\n'
        self.node(0).run(["sh", "-c", f"printf '%s\\n' '{previous.decode().strip()}' > {out}"], check=True)
        nth = rng.choice((1, 2))
        proc = self.cli(self.node(1), "merge", "--job-dir", str(job), "--output", str(out), "--overwrite",
                        env={"ELASTIC_SHARD_CRASH_AT": f"merging@{nth}"})  # fmt: skip
        if proc.returncode == -signal.SIGKILL:
            outcome.counts["kills"] += 1
        outcome.check(self.node(1).read_bytes(out) == previous, "a killed merge changed the previous output")
        leftovers = [p for p in self.node(1).run(["ls", "-a", str(out.parent)]).stdout.split() if ".tmp-" in p]
        outcome.counts["merge_temp_leftovers"] += len(leftovers)  # a SIGKILL cannot clean up; the next merge must not mind
        self.finish_and_compare(outcome, job, log_dir / "finish.log", [])
        return outcome

    def _held(self, job: Path, pid: int, timeout: float = 30) -> dict | None:
        """The running claim `pid` holds once its attempt is processing (None if it never gets there)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            state = self.inspect(job)
            for shard, claim in state["claims"].items():
                if claim and claim.get("pid") == pid and claim.get("status") == "running":
                    attempt = state["attempts"].get(claim["attempt_id"], {})
                    if attempt.get("phase") == "processing":
                        return {"shard": shard, **claim}
            time.sleep(0.1)
        return None

    def _lost_claim_trial(
        self, kind: str, name: str, log_dir: Path, rng: random.Random, victim: int, fault, recover, takeover: bool = True
    ) -> Outcome:
        """Start workers on slow shards, hit `victim` mid-shard with `fault`, `recover`, and check
        that the victim never published the shard it held (unless it did so before the fault).

        With `takeover`, `recover` (given the monotonic time of the fault) comes only once another
        worker took the held claim over (or TAKEOVER_SECS passed): a victim resumed before anyone
        took over still holds a valid claim and rightly publishes. Each recover waits its own time
        from the fault as well; at 3 nodes the takeover comes first, but at 16 the others are still
        starting (importing, then watching the claim for a lease) when the fault hits."""
        outcome = Outcome(kind, f"{self.node(victim).name}")
        job, workers, held = self._start(name, log_dir, rng, rng.uniform(1.5, 3.0), victim=victim)
        time.sleep(rng.uniform(0, 0.3))
        since = time.monotonic()
        fault(workers[victim], outcome)
        try:
            before = self.inspect(job)["done"]
            if takeover and held is not None and (before.get(held["shard"]) or {}).get("token") != held["token"]:
                self._await_takeover(job, held)
        finally:
            recover(workers[victim], outcome, since)
        state = self.finish_and_compare(outcome, job, log_dir / "finish.log", workers)
        if held is None:
            outcome.problems.append(f"the {kind} victim never held a shard mid-processing")
        elif (before.get(held["shard"]) or {}).get("token") != held["token"]:
            done = state["done"].get(held["shard"]) or {}
            outcome.check(
                done.get("token") != held["token"], f"{held['shard']}: the {kind} worker published after losing its claim"
            )
        return outcome

    def _await_takeover(self, job: Path, held: dict) -> str:
        """Until the claim `held` is taken over, or no longer running (published, handed back), or
        TAKEOVER_SECS passed: "taken", its status, or "timeout"."""
        path = job / "state" / "locks" / f"{held['shard']}.json"
        argv = [PY, "-c", TAKEOVER_WAIT, str(path), held["token"], str(TAKEOVER_SECS)]
        return self.node(0).run(argv, check=True, timeout=TAKEOVER_SECS + 60).stdout.strip()

    def trial_stall(self, name: str, log_dir: Path, rng: random.Random) -> Outcome:
        def fault(proc: subprocess.Popen, outcome: Outcome) -> None:
            proc.send_signal(signal.SIGSTOP)
            outcome.counts["stalls"] += 1

        def recover(proc: subprocess.Popen, outcome: Outcome, since: float) -> None:
            time.sleep(max(0.0, since + 2 * LEASE + 1 - time.monotonic()))
            proc.send_signal(signal.SIGCONT)

        return self._lost_claim_trial("stall", name, log_dir, rng, rng.randrange(len(self.cluster.nodes)), fault, recover)

    def trial_partition(self, name: str, log_dir: Path, rng: random.Random) -> Outcome:
        node = self.node(rng.randrange(1, len(self.cluster.nodes)))

        def fault(proc: subprocess.Popen, outcome: Outcome) -> None:
            node.partition()
            outcome.counts["partitions"] += 1

        def recover(proc: subprocess.Popen, outcome: Outcome, since: float) -> None:
            try:
                time.sleep(max(0.0, since + rng.uniform(2 * LEASE, 4 * LEASE) - time.monotonic()))
            finally:
                node.heal()

        return self._lost_claim_trial("partition", name, log_dir, rng, self.cluster.nodes.index(node), fault, recover)

    def trial_client_kill(self, name: str, log_dir: Path, rng: random.Random) -> Outcome:
        node = self.node(rng.randrange(1, len(self.cluster.nodes)))

        def fault(proc: subprocess.Popen, outcome: Outcome) -> None:
            node.kill_client()
            outcome.counts["client_kills"] += 1

        def recover(proc: subprocess.Popen, outcome: Outcome, since: float) -> None:
            try:
                code = wait(proc, 60)
                outcome.check(code not in (0, None), f"the cut-off worker exited {code} instead of failing")
            finally:
                node.remount()

        return self._lost_claim_trial(
            "client-kill", name, log_dir, rng, self.cluster.nodes.index(node), fault, recover, takeover=False
        )

    def trial_drain(self, name: str, log_dir: Path, rng: random.Random) -> Outcome:
        victim = rng.randrange(len(self.cluster.nodes))
        sig = rng.choice((signal.SIGTERM, signal.SIGINT))
        outcome = Outcome("drain", f"{sig.name} to worker {victim} mid-shard")
        job, workers, held = self._start(name, log_dir, rng, rng.uniform(2.0, 4.0), victim=victim)
        sent, sent_wall = time.monotonic(), time.time()
        workers[victim].send_signal(sig)
        code = wait(workers[victim], 60)
        exited = time.monotonic() - sent
        outcome.counts["drains"] += 1
        outcome.check(code == 2, f"a drained worker exited {code}, not 2")
        state = self.finish_and_compare(outcome, job, log_dir / "finish.log", workers)
        if held is None:
            outcome.check(exited < LEASE, "draining took longer than a lease")
        else:
            attempt = state["attempts"].get(held["attempt_id"], {})
            outcome.check(attempt.get("status") == "interrupted", f"the drained attempt is {attempt.get('status')}")
            # The hand-back (the attempt's end, recorded just before its claim is released; one
            # kernel clock for all nodes here), not the exit: a Python process with 15 others on
            # 2 cores may take longer than a lease to exit after it has handed its shard back.
            handed = (attempt.get("finished_at") or float("inf")) - sent_wall
            outcome.check(handed < LEASE, f"handing the shard back took {handed:.1f} s, more than a lease (exit: {exited:.1f} s)")
            outcome.check(not attempt.get("superseded"), "the drained shard was taken over after a lease instead of handed back")
        return outcome

    def trial_slow(self, name: str, log_dir: Path, rng: random.Random) -> Outcome:
        victim = rng.randrange(len(self.cluster.nodes))
        slowdown = rng.uniform(5.0, 20.0)
        kill = rng.random() < 0.2
        outcome = Outcome("slow", f"worker {victim} slowed {slowdown:.0f}x mid-shard{', then killed' if kill else ''}")
        job, workers, held = self._start(name, log_dir, rng, rng.uniform(0.8, 1.5), victim=victim, shards=SLOW_SHARDS)
        cycle = DutyCycle(workers[victim].pid, slowdown)
        cycle.start()
        outcome.counts["slowed"] += 1
        try:
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                state = self.inspect(job)
                backups = [a for a in state["attempts"].values() if a.get("backup_of")]
                if kill and backups and workers[victim].poll() is None:
                    workers[victim].kill()  # mid-race: its claim goes stale, the backup still wins
                    outcome.counts["kills"] += 1
                if len(state["done"]) == SLOW_SHARDS:
                    break
                time.sleep(0.2)
        finally:
            cycle.stop()
        state = self.finish_and_compare(outcome, job, log_dir / "finish.log", workers)
        if held is None:
            outcome.problems.append("the slowed worker never held a shard mid-processing")
            return outcome
        attempt = state["attempts"].get(held["attempt_id"], {})
        done = state["done"].get(held["shard"]) or {}
        if done.get("attempt_id") != held["attempt_id"] and not kill:
            # Its shard was published by another attempt: it noticed and stopped, recording it.
            outcome.check(attempt.get("status") == "beaten", f"the slowed attempt is {attempt.get('status')}, not beaten")
        outcome.check(not [a for a in state["attempts"].values() if a["status"] == "failed"], "an attempt failed in a slow trial")
        return outcome

    def trial_skew(self, name: str, log_dir: Path, rng: random.Random) -> Outcome:
        count = len(self.cluster.nodes)
        skews = [rng.choice((-3600, 0, 3600)) for _ in range(count)]
        skews[rng.randrange(count)] = rng.choice((-3600, 3600))
        envs = {i: faketime_env(s) for i, s in enumerate(skews) if s}
        victim = rng.randrange(count)
        outcome = Outcome("skew", f"clocks {skews}, worker {victim} killed mid-shard")
        outcome.counts["skewed_workers"] += len(envs)
        job, workers, held = self._start(name, log_dir, rng, rng.uniform(2.0, 3.0), envs, victim=victim)
        time.sleep(rng.uniform(0, LEASE))  # the others run beside the victim's live claim first
        workers[victim].kill()
        workers[victim].wait()
        outcome.counts["kills"] += 1
        state = self.finish_and_compare(outcome, job, log_dir / "finish.log", workers)
        victim_pid = workers[victim].pid
        stolen = [a for a, v in state["attempts"].items() if v["superseded"] and v["pid"] != victim_pid]
        now = time.time()
        for i, skew in enumerate(skews):
            starts = [v["started_at"] for v in state["attempts"].values() if v["pid"] == workers[i].pid and v["started_at"]]
            outcome.check(
                not starts or all(abs(start - now - skew) < 900 for start in starts), f"worker {i}'s clock is not {skew:+d}s off"
            )
        outcome.check(not stolen, f"live claims taken over: {stolen}")
        if held is None:
            outcome.problems.append("the skew victim never held a shard mid-processing")
        elif (state["attempts"].get(held["attempt_id"]) or {}).get("status") == "running":
            # Still "running" and not the published attempt: its claim must have been taken over.
            # (Killed after publishing and marking its claim done, before its own record said so,
            # it is the shard's completion: seed 61021, trial 29.)
            published = (state["done"].get(held["shard"]) or {}).get("attempt_id") == held["attempt_id"]
            outcome.check(published or state["attempts"][held["attempt_id"]]["superseded"], "the dead claim was not taken over")
        return outcome

    def trial_coordinator(self, name: str, log_dir: Path, rng: random.Random) -> Outcome:
        """A dlc instance killed at a point of prepare/finalize. Sometimes the submission is a
        resubmission of a finished job (its prepare coordinator hashes the input again), and
        sometimes every instance creates the same new --output directories at once."""
        resubmit = rng.random() < 0.3
        point = rng.choice(RESUBMIT_POINTS if resubmit else COORDINATOR_POINTS)
        base = self.cluster.mount / name
        output = base / "out" / "new" / "merged.jsonl" if rng.random() < 0.5 else None
        outcome = Outcome(
            "coordinator",
            f"dlc instance 0 at {point}" + (" of a resubmission" if resubmit else "") + (", new --output dir" if output else ""),
        )
        self.node(0).run(["mkdir", "-p", str(base)], check=True)
        data = base / "input.jsonl"
        self.node(0).run(["cp", str(self.data), str(data)], check=True)
        job = base / "job"
        args = [
            "--config", str(self.recipe), "--dataset-path", str(data), "--job-dir", str(job),
            "--num-shards", str(rng.choice(list(self.templates))), "--coordinator-lease-secs", "4",
            "--lock-timeout-secs", str(LEASE), "--heartbeat-interval-secs", str(HEARTBEAT), "--poll-interval-secs", "0.3",
            "--max-retries", "6", "--quiet", *(["--output", str(output)] if output else []),
        ]  # fmt: skip
        if resubmit:
            first = self._dlc(args + ["--run-id", f"{name}-first"], log_dir, "first", crash_at=None)
            outcome.check(first == [0] * len(first), f"the first submission exited {first}")
        codes = self._dlc(args + ["--run-id", name], log_dir, "dlc", crash_at=point)
        if codes[0] == -signal.SIGKILL:
            outcome.counts["coordinator_kills"] += 1
        outcome.check(all(code == 0 for code in codes[1:]), f"surviving dlc instances exited {codes[1:]}")
        if all(code == 0 for code in codes[1:]):
            self.compare(outcome, self.node(1).read_bytes(output or job / "merged.jsonl"))
        return outcome

    def _dlc(self, args: list[str], log_dir: Path, tag: str, crash_at: str | None) -> list[int]:
        """One dlc instance per node (the fake runner), instance 0 first; their exit codes."""
        instances = []
        for i, node in enumerate(self.cluster.nodes):
            crash = {"ELASTIC_SHARD_CRASH_AT": crash_at} if i == 0 and crash_at else {}
            env = self.env(FAKE_DELAY="0.3", FAKE_KEEP_MOD7="1", **crash)
            with open(log_dir / f"{tag}-{i}.log", "ab") as handle:
                instances.append(node.popen(launch_command("dlc", *args), env=env, stdout=handle, stderr=handle))
            if i == 0:
                time.sleep(1.5)
        return [wait(proc, 240) for proc in instances]

    def trial_corrupt(self, name: str, log_dir: Path, rng: random.Random) -> Outcome:
        target = rng.choice(("shard input", "attempt output", "completion record"))
        outcome = Outcome("corrupt", target, clean_failure=False)
        outcome.counts["corruptions"] += 1
        shards = rng.choice(list(self.templates))
        job = self.fresh_job(name, shards)
        shard = f"part-{rng.randrange(shards):05d}-of-{shards:05d}"
        out = job.parent / "merged.jsonl"
        if target == "shard input":
            damage(self.node(0), job / "shards" / f"{shard}.jsonl", rng)
            worker = self.worker(self.node(0), job, log_dir / "worker.log", 0.0)
            outcome.check(wait(worker, 120) == 2, "a worker over a corrupt shard input did not end with exit 2")
            proc = self.cli(self.node(1), "merge", "--job-dir", str(job), "--output", str(out))
            failed = orjson.loads(self.cli(self.node(1), "status", "--job-dir", str(job), "--json").stdout)
            errors = [s["last_error"] or "" for s in failed["shards"] if s["state"] == "failed"]
            outcome.clean_failure = proc.returncode == 2 and any("is corrupt" in e for e in errors)
        else:
            worker = self.worker(self.node(0), job, log_dir / "worker.log", 0.0)
            outcome.check(wait(worker, 120) == 0, "the clean run before the corruption failed")
            outcome.check(self.cli(self.node(1), "merge", "--job-dir", str(job), "--output", str(out)).returncode == 0, "merge")
            before = self.node(1).read_bytes(out)
            done = orjson.loads(self.node(0).read_bytes(job / "state" / "done" / f"{shard}.json"))
            path = (
                processed_file(job / "attempts" / shard / done["attempt_id"], done.get("output_codec", "none"))
                if target == "attempt output"
                else job / "state" / "done" / f"{shard}.json"
            )
            # Damaged and checked from one node: another may serve the old content from its cache
            # for a moment, which is the NAS being a NAS, not the damage going unnoticed.
            damage(self.node(1), path, rng, record=target == "completion record")
            proc = self.cli(self.node(1), "merge", "--job-dir", str(job), "--output", str(out), "--overwrite")
            verify = self.cli(self.node(1), "verify", "--job-dir", str(job))
            outcome.clean_failure = (
                proc.returncode == 2
                and shard in last_line(proc.stderr)
                and verify.returncode == 2
                and self.node(1).read_bytes(out) == before
            )
            outcome.check(self.node(1).read_bytes(out) == before, "a refused merge changed the previous output")
        outcome.check(outcome.clean_failure, f"corrupt {target} not refused cleanly: {last_line(proc.stderr)}")
        return outcome

    def trial_enospc(self, name: str, log_dir: Path, rng: random.Random) -> Outcome:
        """On a tiny tmpfs (local: the point is ENOSPC, not the network)."""
        stage = rng.choice(("prepare", "attempt output", "merge"))
        outcome = Outcome("enospc", stage, clean_failure=False)
        outcome.counts["enospc"] += 1
        mount = self.workdir / name / "tmpfs"
        mount.mkdir(parents=True)
        template = self.templates[rng.choice(list(self.templates))]
        # prepare: a job is at least five files of one 4 KiB page each; otherwise room for the
        # job, then (below) shrunk to what the copied job uses plus a margin.
        size = rng.randint(4, 12) if stage == "prepare" else 4096
        subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}k", "tmpfs", str(mount)], check=True)
        try:
            job = mount / "job"
            env = self.env()
            if stage == "prepare":
                proc = subprocess.run(
                    [PY, "-m", "elastic_sharding", "prepare", "--config", str(self.recipe), "--job-dir", str(job),
                     "--num-shards", str(template.shards)],
                    capture_output=True, text=True, env={**os.environ, **env}, timeout=120,
                )  # fmt: skip
                leftovers = os.listdir(mount)
                outcome.clean_failure = proc.returncode == 2 and "No space left" in last_line(proc.stderr) and not leftovers
                outcome.check(
                    outcome.clean_failure, f"prepare on a full disk: rc={proc.returncode} {last_line(proc.stderr)} {leftovers}"
                )
                return outcome
            shutil.copytree(template.job, job, symlinks=True)
            if stage == "attempt output":
                size = shutil.disk_usage(mount).used // 1024 + rng.randint(4, 24)
                subprocess.run(["mount", "-o", f"remount,size={size}k", str(mount)], check=True)
            worker = subprocess.run(
                worker_command(job, "--keep-fake-recipe"),
                capture_output=True, text=True, env={**os.environ, **env}, timeout=180,
            )  # fmt: skip
            out = mount / "merged.jsonl"
            if stage == "attempt output":
                outcome.check(worker.returncode == 2, f"a worker out of space exited {worker.returncode}")
                outcome.check("No space left" in worker.stderr, "the worker did not say the disk is full")
                subprocess.run(["mount", "-o", "remount,size=4096k", str(mount)], check=True)
                retry = subprocess.run([PY, "-m", "elastic_sharding", "retry", "--job-dir", str(job), "--all-failed"],
                                       capture_output=True, text=True, env={**os.environ, **env})  # fmt: skip
                again = subprocess.run(worker_command(job, "--keep-fake-recipe"),
                                       capture_output=True, text=True, env={**os.environ, **env}, timeout=180)  # fmt: skip
                if retry.returncode != 0 or again.returncode != 0:
                    outcome.problems.append(
                        f"no recovery once space was back: retry {retry.returncode} {last_line(retry.stderr)}; "
                        f"worker {again.returncode} {last_line(again.stderr)}"
                    )
                    return outcome
                merge(job, out, overwrite=True)
                self.compare(outcome, out.read_bytes())
                outcome.clean_failure = not outcome.problems
                return outcome
            outcome.check(worker.returncode == 0, "the run before the merge failed")
            previous = b'{"previous": "output"}\n' * (len(self.reference) // 24 + 1)
            out.write_bytes(previous)
            filler = mount / "filler"
            free = shutil.disk_usage(mount).free
            filler.write_bytes(b"\0" * max(0, free - len(self.reference) // 2))
            proc = subprocess.run([PY, "-m", "elastic_sharding", "merge", "--job-dir", str(job), "--output", str(out), "--overwrite"],
                                  capture_output=True, text=True, env={**os.environ, **env})  # fmt: skip
            temps = [p for p in os.listdir(mount) if ".tmp-" in p]
            outcome.clean_failure = (
                proc.returncode == 2 and "No space left" in last_line(proc.stderr) and out.read_bytes() == previous and not temps
            )
            outcome.check(outcome.clean_failure, f"merge on a full disk: rc={proc.returncode} {last_line(proc.stderr)} {temps}")
            filler.unlink()
            merge(job, out, overwrite=True)
            self.compare(outcome, out.read_bytes())
            return outcome
        finally:
            subprocess.run(["umount", "-l", str(mount)], check=False)

    # -- the scale trials ----------------------------------------------------------------------

    def scale_templates(self) -> dict[int, Template]:
        """The scale kinds' jobs (built once): SCALE_ROWS rows prepared per shard count of
        SCALE_SHARDS, each with its clean single-worker run; every shard count must merge the same."""
        if not self._scale_templates:
            data = write_jsonl(self.workdir / "scale-input.jsonl", sample_rows(SCALE_ROWS))
            recipe = self.workdir / "scale-recipe.yaml"
            recipe.write_text(SIMPLE_RECIPE.format(dataset=data))
            templates = {n: self._template(n, recipe=recipe, tag="scale-") for n in SCALE_SHARDS}
            if len({t.reference for t in templates.values()}) != 1:
                raise AssertionError("clean runs of the scale job with different shard counts disagree")
            self._scale_templates = templates
        return self._scale_templates

    def _scale_run(
        self, outcome: Outcome, name: str, log_dir: Path, shards: int, delay: float, at: float, victims: Sequence[int]
    ) -> tuple[Path, dict[int, subprocess.Popen], dict]:
        """A fresh scale job with a worker on every node, returned once `at` of its shards are
        done and a victim holds a claim (or SCALE_HOLD_SECS more passed: with shards this short a
        worker is often between two), with what SCALE_WAIT saw then (the shards done, the
        running claims). Waiting for every victim to hold one at once lets the job run out."""
        job = self.fresh_job(name, shards, self.scale_templates())
        workers = {i: self.worker(node, job, log_dir / f"worker-{i}.log", delay) for i, node in enumerate(self.cluster.nodes)}
        target = max(1, round(at * shards))
        hosts = [self.node(v).name for v in victims]
        probe = [PY, "-c", SCALE_WAIT, str(job), str(target), str(SCALE_EXIT_SECS), str(SCALE_HOLD_SECS), *hosts]
        seen = json.loads(self.node(0).run(probe, check=True, timeout=SCALE_EXIT_SECS + SCALE_HOLD_SECS + 60).stdout)
        outcome.check(target <= len(seen["done"]) < shards, f"{len(seen['done'])} of {shards} shards done at the fault")
        holding = {claim.get("host") for claim in seen["claims"].values()} & set(hosts)
        outcome.detail += f", {len(holding)}/{len(hosts)} victims mid-shard"
        return job, workers, seen

    def _scale_finish(self, outcome: Outcome, job: Path, log_dir: Path, shards: int, workers: Sequence[subprocess.Popen]) -> dict:
        """`finish_and_compare` against the scale job's clean run."""
        reference = self.scale_templates()[shards].reference
        self.compare_with = reference
        try:
            expected = [orjson.loads(line)["id"] for line in reference.splitlines()]
            state = self.finish_and_compare(outcome, job, log_dir / "finish.log", workers, expected)
        finally:
            self.compare_with = None
        hosts = {done["host"] for done in state["done"].values() if done}
        outcome.detail += f", {len(hosts)}/{len(self.cluster.nodes)} nodes published"
        return state

    def trial_scale_kill(self, name: str, log_dir: Path, rng: random.Random) -> Outcome:
        """A quarter of the nodes lose their workers at once (SIGKILL) mid-job and get new ones:
        every shard the dead held is taken over, and every restarted worker publishes shards."""
        count = len(self.cluster.nodes)
        victims = sorted(rng.sample(range(count), scale_victims(count)))
        shards, delay, at = rng.choice(SCALE_SHARDS), rng.uniform(*SCALE_DELAY), rng.uniform(*SCALE_AT)
        pause = rng.uniform(0, LEASE)  # the nodes stay without a worker for up to a lease
        outcome = Outcome(
            "scale-kill", f"x{shards}: {len(victims)}/{count} workers killed at {at:.0%}, restarted after {pause:.1f}s"
        )
        job, workers, seen = self._scale_run(outcome, name, log_dir, shards, delay, at, victims)
        dead = {workers[v].pid for v in victims}
        for v in victims:
            if workers[v].poll() is None:
                workers[v].kill()
                outcome.counts["scale_kills"] += 1
        for v in victims:
            workers[v].wait()
        held = {shard: claim for shard, claim in seen["claims"].items() if claim.get("pid") in dead}
        time.sleep(pause)
        logs = {v: log_dir / f"restarted-{v}.log" for v in victims}
        restarted = {v: self.worker(self.node(v), job, logs[v], delay) for v in victims}
        # A worker takes seconds to start on a loaded machine (16 nodes on 2 cores: ~8 s); once
        # every restarted one is ready to claim, enough unclaimed shards must be left for the
        # check that each of them picks up work to be fair (a trial line without it says why).
        deadline = time.monotonic() + SCALE_EXIT_SECS
        while time.monotonic() < deadline and any(
            proc.poll() is None and b"worker on host=" not in logs[v].read_bytes() for v, proc in restarted.items()
        ):
            time.sleep(0.1)
        look = json.loads(self.node(0).run([PY, "-c", SCALE_WAIT, str(job), "0", "0", "0"], check=True, timeout=120).stdout)
        unclaimed = shards - len(look["done"]) - len(look["claims"])
        fair = unclaimed >= SCALE_PICKUP_MARGIN * count
        state = self._scale_finish(outcome, job, log_dir, shards, [*workers.values(), *restarted.values()])
        for v, proc in restarted.items():
            published = sum((done or {}).get("pid") == proc.pid for done in state["done"].values())
            outcome.check(published > 0 or not fair, f"the worker restarted on {self.node(v).name} published no shard")
        if not fair:
            outcome.detail += f", {unclaimed} unclaimed at restart: pick-up not checked"
        taken = sum((state["done"].get(shard) or {}).get("attempt_id") != claim["attempt_id"] for shard, claim in held.items())
        outcome.counts["scale_takeovers"] += taken
        outcome.detail += f", {taken}/{len(held)} dead claims taken over"
        return outcome

    def trial_scale_partition(self, name: str, log_dir: Path, rng: random.Random) -> Outcome:
        """A quarter of the nodes (never node 0, which watches the job) cut off the volume at
        once mid-job for two to four leases, then healed: an attempt of theirs whose claim was
        taken over meanwhile never publishes."""
        count = len(self.cluster.nodes)
        victims = sorted(rng.sample(range(1, count), min(count - 1, scale_victims(count))))
        shards, delay, at = rng.choice(SCALE_SHARDS), rng.uniform(*SCALE_DELAY), rng.uniform(*SCALE_AT)
        cut = rng.uniform(2 * LEASE, 4 * LEASE)
        outcome = Outcome("scale-partition", f"x{shards}: {len(victims)}/{count} nodes cut at {at:.0%} for {cut:.1f}s")
        if not victims:
            outcome.problems.append("a partition needs a second node")
            return outcome
        job, workers, seen = self._scale_run(outcome, name, log_dir, shards, delay, at, victims)
        cut_off = {self.node(v).name for v in victims}
        held = {shard: claim for shard, claim in seen["claims"].items() if claim.get("host") in cut_off}
        cut_at = time.monotonic()
        try:
            for v in victims:
                self.node(v).partition()
            outcome.counts["scale_partitions"] += len(victims)
            # What was published before the cut: a caching node may list it up to a second late,
            # and nothing of the cut-off nodes can reach the volume meanwhile.
            time.sleep(SCALE_LISTING_LAG)
            look = [PY, "-c", SCALE_WAIT, str(job), "0", "0", "0"]
            before = set(json.loads(self.node(0).run(look, check=True, timeout=120).stdout)["done"])
            time.sleep(max(0.0, cut - (time.monotonic() - cut_at)))
        finally:
            with ThreadPoolExecutor(len(victims)) as pool:  # each heal waits ~3 s for its mount
                list(pool.map(lambda v: self.node(v).heal(), victims))
        state = self._scale_finish(outcome, job, log_dir, shards, list(workers.values()))
        taken = 0
        for shard, claim in held.items():
            if shard in before:
                continue
            done = state["done"].get(shard) or {}
            if done.get("attempt_id") != claim["attempt_id"]:
                taken += 1
                continue
            # Published by the attempt that held it at the cut: only if nobody took it over (its
            # heartbeat write hung through a short cut and then went through).
            attempt = state["attempts"].get(claim["attempt_id"]) or {}
            outcome.check(not attempt.get("superseded"), f"{shard}: a cut-off worker published after its claim was taken over")
        outcome.counts["scale_takeovers"] += taken
        rejoined = sum(workers[v].returncode == 0 for v in victims)
        outcome.detail += f", {taken}/{len(held)} cut-off claims taken over, {rejoined} cut-off workers finished"
        return outcome

    # -- the cooperative prepare trials --------------------------------------------------------

    def prepare_reference(self, parquet: bool = False) -> PrepareReference:
        """Built once per input format: the input (a JSONL file, or a directory of Parquet files),
        a clean single-process prepare per shard count (on local disk, in one scan unit) and the
        merge of a clean fake run over the first."""
        if parquet not in self._prepare_references:
            tag = "prepare-parquet" if parquet else "prepare"
            if parquet:
                data = write_parquet_input(
                    self.workdir / "prepare-input-parquet", parquet_rows(PREPARE_ROWS), PREPARE_PARQUET_GROUPS
                )
                files = sorted(data.iterdir())
            else:
                data = write_jsonl(self.workdir / "prepare-input.jsonl", prepare_rows(PREPARE_ROWS))
                files = [data]
            recipe = self.workdir / f"{tag}-recipe.yaml"
            recipe.write_text(SIMPLE_RECIPE.format(dataset=data))
            settings = Settings(
                lock_timeout_secs=PREPARE_LEASE,
                max_retries=6,
                poll_interval_secs=POLL,
                heartbeat_interval_secs=PREPARE_HEARTBEAT,
                ray_address="local",
            )
            saved = os.environ.pop(UNIT_BYTES_ENV, None)
            jobs = {}
            try:
                for shards in PREPARE_SHARDS:
                    job = self.workdir / f"{tag}-reference-{shards}"
                    prepare(PrepareRequest(recipe, None, job, shards, settings, procs=1), quiet=True)
                    proc = subprocess.run([PY, "-c", PREPARE_INSPECT, str(job)], capture_output=True, check=True, timeout=60)
                    jobs[shards] = json.loads(proc.stdout)
            finally:
                if saved is not None:
                    os.environ[UNIT_BYTES_ENV] = saved
            clean = self.workdir / f"{tag}-clean"
            shutil.copytree(self.workdir / f"{tag}-reference-{PREPARE_SHARDS[0]}", clean, symlinks=True)
            if Worker(clean, WorkerOptions(), runner=FakeRunner(keep=fake_recipe_keep)).run() != 0:
                raise AssertionError("the clean run over the prepare-kill reference failed")
            out = self.workdir / f"{tag}-clean.jsonl"
            merge(clean, out)
            merged = out.read_bytes()
            self._prepare_references[parquet] = PrepareReference(
                data,
                recipe,
                files,
                [f.stat().st_size for f in files],
                jobs,
                merged,
                [orjson.loads(line)["id"] for line in merged.splitlines()],
            )
        return self._prepare_references[parquet]

    def _participant(
        self, node: Node, job: Path, shards: int, log: Path, helper: bool, procs: int, env: dict, parquet: bool = False
    ) -> subprocess.Popen:
        """`prepare` of the trial's request, or the helper that joins the prepare under way."""
        ref = self.prepare_reference(parquet)
        if helper:
            argv = [PY, "-m", "elastic_sharding.prepare.cooperate", str(job)]
        else:
            argv = [
                PY, "-m", "elastic_sharding", "prepare", "--config", str(ref.recipe), "--job-dir", str(job),
                "--num-shards", str(shards), "--prepare-procs", str(procs), "--lock-timeout-secs", str(PREPARE_LEASE),
                "--heartbeat-interval-secs", str(PREPARE_HEARTBEAT), "--poll-interval-secs", str(POLL),
                "--max-retries", "6", "--quiet",
            ]  # fmt: skip
        with open(log, "ab") as handle:
            proc = node.popen(argv, env=self.env(**env), stdout=subprocess.DEVNULL, stderr=handle)
        # Reaped at once: a dead participant left a zombie would look alive to the others on its
        # node (they take over a dead pid's unit at once, a live one's only after a lease).
        threading.Thread(target=proc.wait, daemon=True).start()
        return proc

    def _await_prepare(self, node: Node, job: Path, prefix: str, proc: subprocess.Popen, timeout: float = 90) -> str:
        """Until `proc` holds a unit of the prepare of `job` starting with `prefix` (returned);
        "exited" if `proc` ends first, "timeout" after `timeout`."""
        waiter = node.popen(
            [PY, "-c", PREPARE_WAIT, str(job), prefix, str(proc.pid), str(timeout)], stdout=subprocess.PIPE, text=True
        )
        while waiter.poll() is None:
            if proc.returncode is not None:
                waiter.kill()
                waiter.wait()
                return "exited"
            time.sleep(0.005)
        return waiter.stdout.read().strip() or "timeout"

    def dedup_expected(self, operator: int) -> list[int]:
        """The rows one Data-Juicer run of `DEDUP_OPERATORS[operator]` keeps (computed once)."""
        if operator not in self._dedup_expected:
            from support.dj_dedup_reference import dj_kept

            self._dedup_expected[operator] = dj_kept(*DEDUP_OPERATORS[operator], prose_rows(DEDUP_ROWS, seed=5))
        return self._dedup_expected[operator]

    def trial_dedup_kill(self, name: str, log_dir: Path, rng: random.Random) -> Outcome:
        """A deduplication stage on every node, one participant killed or frozen at a crash point."""
        operator = rng.randrange(len(DEDUP_OPERATORS))
        shards = rng.choice(DEDUP_SHARDS)
        victim = rng.randrange(len(self.cluster.nodes))
        stop = rng.random() < 0.3
        point = rng.choice(DEDUP_POINTS) + f"@{rng.choice((1, 1, 2))}" + (":stop" if stop else "")
        together = rng.random() < 0.4  # the others start with the victim, not once it met its fault
        outcome = Outcome(
            "dedup-kill",
            f"{DEDUP_OPERATORS[operator][0].split('_')[1]} x{shards}: node {victim} {'SIGSTOP' if stop else 'SIGKILL'} "
            f"at {point.removesuffix(':stop')}" + (", together" if together else ""),
        )
        rows = prose_rows(DEDUP_ROWS, seed=5)
        cut = [len(rows) * i // shards for i in range(shards + 1)]
        files = [write_jsonl(log_dir / "shards" / f"{i}.jsonl", rows[cut[i] : cut[i + 1]]) for i in range(shards)]
        root = self.cluster.mount / name / "stage"
        spec = stage_spec(log_dir / "spec.json", root, *DEDUP_OPERATORS[operator], files, rng.choice((1, 2, 3)),
                          rng.randint(1, shards), lease_secs=DEDUP_LEASE)  # fmt: skip
        logs = [log_dir / f"participant-{i}.log" for i in range(len(self.cluster.nodes))]

        def start(i: int, env: dict[str, str]) -> subprocess.Popen:
            with open(logs[i], "wb") as log:
                return self.node(i).popen(node_command(spec), env=self.env(**env), stdout=subprocess.PIPE, stderr=log, text=True)

        procs = {victim: start(victim, {"ELASTIC_SHARD_CRASH_AT": point})}
        met = together or _await_fault(procs[victim], stop, DEDUP_EXIT_SECS)
        procs.update({i: start(i, {}) for i in range(len(self.cluster.nodes)) if i != victim})
        if stop and (together and _await_fault(procs[victim], stop, DEDUP_EXIT_SECS) or met):
            time.sleep(2 * DEDUP_LEASE + 1)
            procs[victim].send_signal(signal.SIGCONT)
            outcome.counts["dedup_stalls"] += 1
        outputs = {}
        for i, proc in sorted(procs.items()):
            try:
                outputs[i] = proc.communicate(timeout=DEDUP_EXIT_SECS)[0]
            except subprocess.TimeoutExpired:
                proc.send_signal(signal.SIGCONT)
                proc.kill()
                outputs[i] = proc.communicate()[0]
        codes = {i: proc.returncode for i, proc in procs.items()}
        killed = codes[victim] == -signal.SIGKILL
        outcome.counts["dedup_kills"] += killed
        outcome.counts["dedup_takeovers"] += sum(log.read_text(errors="replace").count("dedup: took over") for log in logs)
        outcome.check(
            all(code == 0 for i, code in codes.items() if not (i == victim and killed and not stop)),
            f"participants exited {codes} (-9 after a freeze: still running after {DEDUP_EXIT_SECS} s): "
            + " | ".join(f"{i}: {last_line(logs[i].read_text(errors='replace'))}" for i, c in codes.items() if c != 0),
        )  # fmt: skip
        expected = self.dedup_expected(operator)
        for i, out in outputs.items():
            if codes[i] != 0:
                continue
            kept = json.loads(out)["kept"]
            outcome.rows_lost += len(set(expected) - set(kept))
            outcome.rows_duplicated += len(kept) - len(set(kept)) + len(set(kept) - set(expected))
            outcome.identical = kept == expected if outcome.identical is None else outcome.identical and kept == expected
        outcome.check(outcome.identical is True, "a participant read other rows than one Data-Juicer run keeps")
        return outcome

    def job_template(self, kind: str, shards: int, variant: int = 0) -> Template:
        """A job of the `dedup-job` kind or a `global-job` recipe, prepared once per shard count,
        with its clean result from one fake worker on local disk."""
        if (kind, shards, variant) not in self._stage_jobs:
            rows = prose_rows(DEDUP_ROWS, seed=7)
            if kind == "global-job":
                rows = [
                    dict(row, bucket=row["id"] * 7 % 11, text=row["text"] + "\n" + GLOBAL_JOB_LINES[row["id"] % 4])
                    for row in rows
                ]
            data = write_jsonl(self.workdir / f"{kind}-input.jsonl", rows)
            recipe = self.workdir / f"{kind}-recipe-{variant}.yaml"
            recipe.write_text((GLOBAL_JOB_RECIPES[variant] if kind == "global-job" else DEDUP_RECIPE).format(dataset=data))
            job = self.workdir / f"{kind}-template-{shards}-{variant}"
            settings = Settings(
                lock_timeout_secs=DEDUP_LEASE,
                max_retries=6,
                poll_interval_secs=POLL,
                heartbeat_interval_secs=HEARTBEAT,
                ray_address="local",
            )
            prepare(PrepareRequest(recipe, None, job, shards, settings), quiet=True)
            clean = self.workdir / f"{kind}-clean-{shards}-{variant}"
            shutil.copytree(job, clean, symlinks=True)
            if Worker(clean, WorkerOptions(), runner=FakeRunner(keep=fake_recipe_keep)).run() != 0:
                raise AssertionError(f"the clean run of the {kind} job failed")
            out = self.workdir / f"{kind}-clean-{shards}-{variant}.jsonl"
            merge(clean, out)
            self._stage_jobs[kind, shards, variant] = Template(shards, job, out.read_bytes())
        return self._stage_jobs[kind, shards, variant]

    def trial_dedup_job(self, name: str, log_dir: Path, rng: random.Random) -> Outcome:
        """A job with a deduplication stage between two segments, one worker killed or frozen in
        the stage or in a shard of the segment after it."""
        return self.stage_job_trial("dedup-job", DEDUP_JOB_POINTS, name, log_dir, rng)

    def trial_global_job(self, name: str, log_dir: Path, rng: random.Random) -> Outcome:
        """A job with three whole-dataset stages, one worker killed or frozen in a stage's unit
        or in a shard of a segment after one."""
        return self.stage_job_trial("global-job", GLOBAL_JOB_POINTS, name, log_dir, rng)

    def stage_job_trial(self, kind: str, points: tuple[str, ...], name: str, log_dir: Path, rng: random.Random) -> Outcome:
        shards = rng.choice(DEDUP_JOB_SHARDS)
        variant = rng.randrange(len(GLOBAL_JOB_RECIPES)) if kind == "global-job" else 0
        template = self.job_template(kind, shards, variant)
        victim = rng.randrange(len(self.cluster.nodes))
        stop = rng.random() < 0.3
        if rng.random() < 0.75:
            point = rng.choice(points) + f"@{rng.choice((1, 1, 2))}"
        else:  # a shard of the segment after the stage: the victim's (shards + n)-th time there
            point = f"{rng.choice(('claimed', 'processing', 'publishing', 'published'))}@{shards + rng.randint(1, 2)}"
        point += ":stop" if stop else ""
        together = rng.random() < 0.5
        outcome, (job, _, _, _) = self.victim_trial(
            kind, name, template.job, log_dir, shards, victim, point, stop, together, "took over"
        )
        self.compare_with = template.reference
        try:
            expected = [orjson.loads(line)["id"] for line in template.reference.splitlines()]
            self.finish_and_compare(outcome, job, log_dir / "finish.log", [], expected)
        finally:
            self.compare_with = None
        return outcome

    def victim_trial(
        self,
        kind: str,
        name: str,
        template: Path,
        log_dir: Path,
        shards: int,
        victim: int,
        point: str,
        stop: bool,
        together: bool,
        takeover: str,
    ) -> tuple[Outcome, VictimRun]:
        """`workers_with_victim`, with the trial's outcome named and its `<kind>_stalls`, `_kills`
        and `_takeovers` (log lines containing `takeover`) counted."""
        outcome = Outcome(
            kind,
            f"x{shards}: node {victim} {'SIGSTOP' if stop else 'SIGKILL'} at {point.removesuffix(':stop')}"
            + (", together" if together else ""),
        )
        run = self.workers_with_victim(name, template, log_dir, victim, point, stop, together)
        counter = kind.replace("-", "_")
        outcome.counts[f"{counter}_stalls"] += run.stalled
        outcome.counts[f"{counter}_kills"] += run.codes[victim] == -signal.SIGKILL
        outcome.counts[f"{counter}_takeovers"] += run.log.read_text(errors="replace").count(takeover)
        return outcome, run

    def workers_with_victim(
        self, name: str, template: Path, log_dir: Path, victim: int, point: str, stop: bool, together: bool
    ) -> VictimRun:
        """A copy of the `template` job on the volume and a worker on every node, node `victim`'s
        with the crash point `point` (started first, the others with it if `together`, else once it
        met its fault); a victim frozen there is resumed after two leases."""
        job = self.cluster.mount / name / "job"
        self.node(0).run(["mkdir", "-p", str(job.parent)], check=True)
        self.node(0).run(["cp", "-a", str(template), str(job)], check=True)
        log = log_dir / "workers.log"
        procs = {victim: self.worker(self.node(victim), job, log, 0.05, {"ELASTIC_SHARD_CRASH_AT": point})}
        met = together or _await_fault(procs[victim], stop, DEDUP_EXIT_SECS)
        procs.update({i: self.worker(self.node(i), job, log, 0.05) for i in range(len(self.cluster.nodes)) if i != victim})
        stalled = bool(stop and (together and _await_fault(procs[victim], stop, DEDUP_EXIT_SECS) or met))
        if stalled:
            time.sleep(2 * DEDUP_LEASE + 1)
            procs[victim].send_signal(signal.SIGCONT)
        return VictimRun(job, log, {i: wait(proc, 180) for i, proc in procs.items()}, stalled)

    def analysis_template(self, shards: int) -> AnalysisTemplate:
        """A `--analyze` job prepared once per shard count, with what the one clean run publishes."""
        if shards not in self._analysis_jobs:
            self._analysis_jobs[shards] = AnalysisTemplate(shards, self.analysis_job(shards), *self.analysis_clean())
        return self._analysis_jobs[shards]

    def analysis_job(self, shards: int) -> Path:
        data = self.workdir / "analysis-job-input.jsonl"
        if not data.exists():  # prepared jobs remember its modification time
            write_jsonl(data, prose_rows(DEDUP_ROWS, seed=7))
        recipe = self.workdir / "analysis-job-recipe.yaml"
        recipe.write_text(ANALYSIS_RECIPE.format(dataset=data))
        job = self.workdir / f"analysis-job-template-{shards}"
        settings = Settings(
            lock_timeout_secs=DEDUP_LEASE,
            max_retries=6,
            poll_interval_secs=POLL,
            heartbeat_interval_secs=HEARTBEAT,
            ray_address="local",
        )
        prepare(PrepareRequest(recipe, None, job, shards, settings, analyze=True, percentiles=ANALYSIS_PERCENTILES), quiet=True)
        return job

    def analysis_clean(self) -> tuple[dict[str, str], str, list[int]]:
        """The analysis directory one fake worker and `merge` publish on local disk, once, at
        `ANALYSIS_CLEAN_SHARDS` (the worker runs as the trials' do: `fake_recipe_keep` is ignored,
        an analysis drops no row): each file's digest, the stats export's name and its row ids.
        Every trial, whatever its shard count, must publish these very files."""
        if self._analysis_clean is None:
            clean = self.workdir / "analysis-job-clean"
            shutil.copytree(self.analysis_job(ANALYSIS_CLEAN_SHARDS), clean, symlinks=True)
            if Worker(clean, WorkerOptions(), runner=FakeRunner(keep=fake_recipe_keep)).run() != 0:
                raise AssertionError("the clean run of the analysis job failed")
            out = self.workdir / "analysis-job-clean-analysis"
            published, _, _ = publish_analysis(clean, out, quiet=True)
            inspect = subprocess.run([PY, "-c", ANALYSIS_INSPECT, str(out)], check=True, capture_output=True, text=True)
            ids = [orjson.loads(line)[META_FIELD]["row_id"] for line in published.stats_export.read_bytes().splitlines()]
            if ids != list(range(DEDUP_ROWS)):
                raise AssertionError("the clean analysis's stats export is not every input row in order")
            self._analysis_clean = json.loads(inspect.stdout), published.stats_export.name, ids
        return self._analysis_clean

    def trial_analysis_job(self, name: str, log_dir: Path, rng: random.Random) -> Outcome:
        """A `--analyze` job, one worker killed or frozen in the analysis or in a shard; `merge`
        publishes the analysis, and every file of it must be the clean run's."""
        shards = rng.choice(ANALYSIS_SHARDS)
        template = self.analysis_template(shards)
        victim = rng.randrange(len(self.cluster.nodes))
        stop = rng.random() < 0.3
        if rng.random() < 0.75:
            point = rng.choice(ANALYSIS_POINTS)
            # columns and stats have several units, which a worker may reach more than once; plan and report one
            point += f"@{rng.choice((1, 1, 2)) if point.startswith(('analysis-columns', 'analysis-stats')) else 1}"
        else:
            point = f"{rng.choice(('claimed', 'processing', 'publishing', 'published'))}@{rng.randint(1, 2)}"
        point += ":stop" if stop else ""
        together = rng.random() < 0.5
        outcome, (job, log, codes, _) = self.victim_trial(
            "analysis-job", name, template.job, log_dir, shards, victim, point, stop, together, "analysis: took over"
        )
        # Frozen holding a shard's claim, the victim may find its attempt superseded once resumed and
        # exit 2 ("run the worker again"); frozen in the analysis, it must finish it with the others.
        allowed = {-signal.SIGKILL, 0, 2} if stop and not point.startswith("analysis-") else {-signal.SIGKILL, 0}
        outcome.check(
            codes[victim] in allowed and all(code == 0 for i, code in codes.items() if i != victim),
            f"workers exited {codes} (None: still running after 180 s): {last_line(log.read_text(errors='replace'))}",
        )
        self.finish_analysis(outcome, job, log_dir / "finish.log", template)
        return outcome

    def finish_analysis(self, outcome: Outcome, job: Path, log: Path, template: AnalysisTemplate) -> None:
        """Rerun a worker if `status` says the job is not complete, publish the analysis with
        `merge` as a user would, and compare every file with the clean run's."""
        if self.cli(self.node(1), "status", "--job-dir", str(job)).returncode != 0:
            outcome.counts["reruns"] += 1
            rerun = self.worker(self.node(1), job, log, 0.0)
            outcome.check(wait(rerun, 180) == 0, "a rerun worker did not complete the job")
        out = job.parent / "analysis"
        proc = self.cli(self.node(2), "merge", "--job-dir", str(job), "--output", str(out))
        outcome.check(proc.returncode == 0, f"merge failed: {last_line(proc.stderr)}")
        failed = job / "analysis-stage" / "failed.json"
        outcome.check(self.node(0).run(["test", "-e", str(failed)]).returncode != 0, "the analysis recorded a failure")
        if proc.returncode != 0:
            return
        got = json.loads(self.node(2).run([PY, "-c", ANALYSIS_INSPECT, str(out)], check=True, timeout=60).stdout)
        exported = self.node(2).read_bytes(out / template.export)
        ids = [orjson.loads(line)[META_FIELD]["row_id"] for line in exported.splitlines()]
        outcome.rows_lost = len(set(template.row_ids) - set(ids))
        outcome.rows_duplicated = len(ids) - len(set(ids))
        differ = sorted(n for n in {*got, *template.files} if got.get(n) != template.files.get(n))
        outcome.identical = not differ
        outcome.check(
            outcome.identical, f"analysis files differ from the clean run's at {ANALYSIS_CLEAN_SHARDS} shards: {differ}"
        )

    def trial_prepare_kill(self, name: str, log_dir: Path, rng: random.Random) -> Outcome:
        """A cooperative prepare on separate nodes, one participant killed (or frozen) in a phase."""
        return self.prepare_case(name, log_dir, self.draw_prepare_case(rng), rng)

    def draw_prepare_case(self, rng: random.Random) -> PrepareCase:
        parquet = rng.random() < PREPARE_PARQUET
        ref = self.prepare_reference(parquet)
        shards = rng.choice(PREPARE_SHARDS)
        unit_bytes = rng.choice(PREPARE_UNIT_BYTES)
        units = ref.scan_units(unit_bytes)
        fault = rng.choices(("point", "kill", "stop"), weights=(6, 3, 1))[0]
        alone = fault != "stop" and rng.random() < 0.25  # the victim prepares alone; a rerun finishes
        count = 1 if alone else rng.choice((2, 3))
        point = ""
        if fault == "point":
            point = rng.choice(PREPARE_POINTS)
            phase = point.split("-")[1]
            share = {"scan": units, "write": write_units(ref.size, shards, unit_bytes)}.get(phase, count) // count
            point += f"@{rng.randint(1, max(1, min(3, share)))}"
        else:
            phase = rng.choice(PREPARE_PHASES)
        # Everyone starts at once, except where the phase has one unit.
        hold = phase in ("cut", "recipe", "final") and not alone
        victim = 0 if hold or alone else rng.randrange(count)
        helpers = [False] + [rng.random() < 0.4 for _ in range(count - 1)]  # participant 0 makes the plan
        procs = [1] + [rng.choice((1, 1, 2)) for _ in range(count - 1)]
        procs[victim] = 1  # its own helpers would share its crash point
        order = list(range(len(self.cluster.nodes)))
        rng.shuffle(order)
        placement = [order[i % len(order)] for i in range(count + 1)]  # the last: where a rerun runs
        same_host = rng.random() < 0.3  # a survivor (or the rerun) on the victim's node: no lease wait
        if same_host:
            placement[(victim + 1) % count if count > 1 else count] = placement[victim]
        return PrepareCase(
            shards, unit_bytes, fault, point, phase, alone, victim, helpers, procs, placement, same_host, hold, parquet=parquet
        )

    def prepare_case(self, name: str, log_dir: Path, case: PrepareCase, rng: random.Random) -> Outcome:
        """Run `case`; `rng` draws only the moment of a signal and the checks after it."""
        shards, fault, point, phase, alone = case.shards, case.fault, case.point, case.phase, case.alone
        victim, helpers, procs, placement = case.victim, case.helpers, case.procs, case.placement
        count, hold = len(helpers), case.hold
        what = {"point": f"at {point}", "kill": f"SIGKILL in {phase}", "stop": f"SIGSTOP in {phase}"}[fault]
        roles = "".join("h" if h else "p" for h in helpers)
        outcome = Outcome(
            "prepare-kill",
            ("parquet " if case.parquet else "")
            + f"{roles}[{victim}] {what}"
            + (", rerun" if alone else "")
            + (", same host" if case.same_host else ""),
        )
        if case.parquet:
            outcome.counts["parquet_prepares"] += 1
        job = self.cluster.mount / name / "job"
        self.node(0).run(["mkdir", "-p", str(job.parent)], check=True)
        env = {UNIT_BYTES_ENV: str(case.unit_bytes)}
        logs = [log_dir / f"participant-{i}.log" for i in range(count + 1)]
        started: list[subprocess.Popen] = []

        def start(i: int) -> subprocess.Popen:
            extra = {**env, "ELASTIC_SHARD_CRASH_AT": point} if fault == "point" and i == victim else env
            return self._participant(self.node(placement[i]), job, shards, logs[i], helpers[i], procs[i], extra, case.parquet)

        started = [start(i) for i in range(1 if hold else count)]
        target = started[victim]
        stopped = False
        if fault != "point" or hold:
            seen = self._await_prepare(self.node(placement[victim]), job, phase, target)
            if fault != "point" and seen not in ("exited", "timeout"):
                time.sleep(rng.uniform(0, 0.05))
                with contextlib.suppress(ProcessLookupError):
                    target.send_signal(signal.SIGKILL if fault == "kill" else signal.SIGSTOP)
                    stopped = fault == "stop"
        # A helper that comes after the job is published exits 0 (seed 27, trial 135: the victim had
        # published it before dying at prepare-final-done); one that finds no prepare at all exits 1.
        finished = target.returncode == 0
        started += [start(i) for i in range(len(started), count)]
        if stopped and case.resume_at_publish:
            survivor = self.node(placement[(victim + 1) % count])
            survivor.run([PY, "-c", PREPARE_PUBLISHED, str(job), str(PREPARE_EXIT_SECS)], timeout=PREPARE_EXIT_SECS + 30)
        elif stopped:
            time.sleep(2 * PREPARE_LEASE + 1)
        if stopped:
            with contextlib.suppress(ProcessLookupError):
                target.send_signal(signal.SIGCONT)
            outcome.counts["prepare_stalls"] += 1
        codes = [wait(proc, PREPARE_EXIT_SECS) for proc in started]
        killed = codes[victim] == -signal.SIGKILL
        if killed:
            outcome.counts["prepare_kills"] += 1
        elif not stopped:
            outcome.counts["prepare_misses"] += 1  # it never held a unit of the phase: the others did them all
        survivors = [
            0 if finished and helpers[i] and code == 1 else code for i, code in enumerate(codes) if i != victim or not killed
        ]
        outcome.check(
            all(code == 0 for code in survivors),
            f"participants exited {codes} (None: still running after {PREPARE_EXIT_SECS} s): "
            + " | ".join(f"{i}: {last_line(logs[i].read_text(errors='replace'))}" for i, c in enumerate(codes) if c not in (0, -9)),
        )  # fmt: skip
        if alone or not any(code == 0 for code in survivors):
            outcome.counts["prepare_reruns"] += 1
            rerun = self._participant(self.node(placement[count]), job, shards, logs[count], False, 1, env, case.parquet)
            code = wait(rerun, PREPARE_EXIT_SECS)
            outcome.check(code == 0, f"the rerun prepare exited {code}: {last_line(logs[count].read_text(errors='replace'))}")
        outcome.counts["prepare_takeovers"] += sum(
            log.read_text(errors="replace").count("prepare: took over") for log in logs if log.exists()
        )
        self._check_prepared(outcome, job, shards, log_dir, rng, case.parquet)
        return outcome

    def _check_prepared(
        self, outcome: Outcome, job: Path, shards: int, log_dir: Path, rng: random.Random, parquet: bool = False
    ) -> None:
        """The job is the clean one byte for byte and nothing of the prepare is left beside it;
        then a fake run over it merges to the clean merge (and a repeated prepare is a no-op)."""
        ref = self.prepare_reference(parquet)
        expected = ref.jobs[shards]
        deadline = time.monotonic() + 5  # another node's removal may show here a moment late
        while True:
            got = json.loads(self.node(0).run([PY, "-c", PREPARE_INSPECT, str(job)], check=True, timeout=60).stdout)
            if (got["manifest"] is not None and not got["leftovers"]) or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        outcome.check(not got["leftovers"], f"left beside the job: {got['leftovers']}")
        ids = got["ids"]
        outcome.rows_lost = len(set(range(PREPARE_ROWS)) - set(ids))
        outcome.rows_duplicated = len(ids) - len(set(ids))
        manifest = got["manifest"]
        if manifest is None:
            outcome.problems.append("no prepared job")
            return
        for key in ("shards", "normalized_sha256", "total_rows", "total_bytes"):
            outcome.check(manifest.get(key) == expected["manifest"][key], f"the manifest's {key} differs from a clean prepare")
        outcome.check(got["shards"] == expected["shards"], "shard files differ from a clean prepare")
        extra = sorted(set(got["files"]) - set(expected["files"]))
        outcome.check(not extra, f"extra files in shards/: {extra}")
        if rng.random() < 0.3:  # a repeated prepare of the same request finds the job and does nothing
            outcome.counts["prepare_repeats"] += 1
            proc = self.cli(
                self.node(rng.randrange(len(self.cluster.nodes))),
                "prepare", "--config", str(ref.recipe), "--job-dir", str(job), "--num-shards", str(shards),
                "--lock-timeout-secs", str(PREPARE_LEASE), "--heartbeat-interval-secs", str(PREPARE_HEARTBEAT),
                "--poll-interval-secs", str(POLL), "--max-retries", "6", "--json",
            )  # fmt: skip
            created = proc.returncode == 0 and orjson.loads(proc.stdout)["created"]
            outcome.check(proc.returncode == 0 and not created, f"a repeated prepare: rc={proc.returncode} created={created}")
        lost, duplicated = outcome.rows_lost, outcome.rows_duplicated
        worker = self.worker(self.node(1), job, log_dir / "worker.log", 0.0)
        outcome.check(wait(worker, 120) == 0, "the fake run over the prepared job failed")
        out = job.parent / "merged.jsonl"
        proc = self.cli(self.node(2), "merge", "--job-dir", str(job), "--output", str(out))
        outcome.check(proc.returncode == 0, f"merge failed: {last_line(proc.stderr)}")
        if proc.returncode == 0:
            self.compare_with = ref.merged
            try:
                self.compare(outcome, self.node(2).read_bytes(out), ref.expected_ids)
            finally:
                self.compare_with = None
        outcome.rows_lost = max(lost, outcome.rows_lost)
        outcome.rows_duplicated = max(duplicated, outcome.rows_duplicated)


# -- helpers ------------------------------------------------------------------------------------


def _instances_of(job: Path) -> list[int]:
    """Processes of warm operator instances started for `job` (Ray names them after the actor class)."""
    found = []
    for pid in processes_with(str(job)):
        with contextlib.suppress(OSError):
            if b"OperatorInstance" in Path(f"/proc/{pid}/cmdline").read_bytes():
                found.append(pid)
    return found


def _busy(pid: int) -> bool:
    """An instance inside a call: Ray retitles the worker process after the method it runs."""
    try:
        return b".call" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def _instances_built(node: Node, job: Path) -> int:
    probe = (
        "import json, glob, sys\n"
        "seen = {}\n"
        "for p in glob.glob(sys.argv[1] + '/attempts/*/*/attempt.json'):\n"
        "    for o in json.load(open(p)).get('operators') or []:\n"
        "        k = (o['runtime_pid'], o['op'])\n"
        "        seen[k] = max(seen.get(k, 0), o['started'])\n"
        "print(sum(seen.values()))\n"
    )
    return int(node.run([PY, "-c", probe, str(job)], check=True, timeout=60).stdout.strip() or 0)


def prepare_rows(n: int) -> list[dict]:
    """Rows of varied shape (nested, numbers of both kinds, a field only late rows have), so the
    scan units' schemas must be merged at the cut."""
    rng = random.Random(7)
    rows = []
    for i in range(n):
        row: dict = {"id": i, "text": f"row {i} " + "word " * rng.randint(1, 40)}
        if i % 3 == 0:
            row["meta"] = {"score": rng.random() if i % 2 else rng.randint(0, 9), "tags": ["a"] * rng.randint(0, 3)}
        if i > n // 2 and i % 11 == 0:
            row["late"] = {"x": i}
        rows.append(row)
    return rows


def parquet_rows(n: int) -> list[dict]:
    """Rows for Parquet input: an `id` (the fake recipe's and the checks'), text of random words (so
    the files are about as large as the JSONL input), a struct holding a list (each sometimes
    null), a timestamp with microseconds, and a string that is null in two rows of three."""
    rng = random.Random(13)
    start = datetime.datetime(2024, 1, 1, tzinfo=datetime.UTC)
    rows = []
    for i in range(n):
        words = " ".join(
            "".join(rng.choices("abcdefghijklmnopqrstuvwxyz", k=rng.randint(2, 9))) for _ in range(rng.randint(1, 20))
        )
        meta = None
        if i % 5:
            tags = None if i % 4 == 1 else [f"t{rng.randint(0, 9)}"] * rng.randint(0, 3)
            meta = {"source": f"s{i % 3}", "score": rng.random(), "tags": tags}
        when = start + datetime.timedelta(seconds=37 * i, microseconds=rng.randint(0, 999_999))
        rows.append({"id": i, "text": f"row {i} {words}", "meta": meta, "when": when, "note": None if i % 3 else f"n{i}"})
    return rows


def parquet_schema():
    import pyarrow as pa

    return pa.schema([
        ("id", pa.int64()),
        ("text", pa.string()),
        ("meta", pa.struct([("source", pa.string()), ("score", pa.float64()), ("tags", pa.list_(pa.string()))])),
        ("when", pa.timestamp("us", tz="UTC")),
        ("note", pa.string()),
    ])  # fmt: skip


def write_parquet_input(root: Path, rows: list[dict], group_rows: Sequence[int]) -> Path:
    """A directory of Parquet files of `rows` in order, one file per entry of `group_rows`, file i
    with its equal share of the rows in row groups of `group_rows[i]` rows (the last one shorter)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    root.mkdir(parents=True, exist_ok=True)
    files = len(group_rows)
    cut = [len(rows) * i // files for i in range(files + 1)]
    for i, size in enumerate(group_rows):
        table = pa.Table.from_pylist(rows[cut[i] : cut[i + 1]], schema=parquet_schema())
        pq.write_table(table, root / f"part-{i:02d}.parquet", row_group_size=size)
    return root


def scale_victims(nodes: int) -> int:
    """How many nodes a scale trial hits at once: a quarter, rounded up (one of up to four)."""
    return max(1, math.ceil(nodes / 4))


def _await_fault(proc: subprocess.Popen, stop: bool, timeout: float) -> bool:
    """Until `proc` stopped itself (`stop`) or died by SIGKILL at its crash point: True if it did,
    False if it ended otherwise (it never reached the point) or the timeout passed."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return proc.returncode == -signal.SIGKILL
        if stop:
            with contextlib.suppress(OSError):
                if Path(f"/proc/{proc.pid}/stat").read_text().rpartition(")")[2].split()[0] == "T":
                    return True
        time.sleep(0.05)
    return False


def wait(proc: subprocess.Popen, timeout: float) -> int | None:
    """The exit code, after a SIGCONT in case the process was left stopped; kills it on timeout."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(proc.pid, signal.SIGCONT)
    try:
        return proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        return None


def last_line(text: str) -> str:
    lines = [line for line in (text or "").splitlines() if line.strip()]
    return lines[-1] if lines else ""


def damage(node: Node, path: Path, rng: random.Random, record: bool = False) -> None:
    """Truncate a file or change it, from a node (so the volume sees the change). A record is
    changed where it matters (a count or a digest): a record whose host name is misspelt is not
    corrupt in any way a checker could or should notice."""
    how = rng.choice(("truncate", "change"))
    if how == "truncate":
        change = "d = d[: len(d) // 2]"
    elif record:
        change = rng.choice((
            "import json; r = json.loads(d); r['output_rows'] += 1; d = json.dumps(r).encode()",
            "import json; r = json.loads(d); r['output_sha256'] = r['output_sha256'][::-1]; d = json.dumps(r).encode()",
        ))  # fmt: skip
    else:
        change = "i = len(d) // 3; d = d[:i] + bytes([d[i] ^ 0x20]) + d[i + 1:]"
    script = f"import sys; p = sys.argv[1]; d = open(p, 'rb').read(); {change}; open(p, 'wb').write(d)"
    node.run([PY, "-c", script, str(path)], check=True)


def faketime_env(offset: int) -> dict[str, str]:
    """A worker whose wall clock is `offset` seconds off (libfaketime); its monotonic clock stays
    real (see faketime_shim/sitecustomize.py for why, and for the one thing the shim changes)."""
    return {
        "LD_PRELOAD": str(FAKETIME),
        "FAKETIME": f"{offset:+d}s",
        "FAKETIME_DONT_FAKE_MONOTONIC": "1",
        "FAKE_UTIME": "1",
        "PYTHONPATH": f"{TESTS / 'faketime_shim'}{os.pathsep}{SRC}{os.pathsep}{TESTS}",
    }


@dataclass
class Summary:
    trials: int = 0
    counts: Counter = field(default_factory=Counter)
    kinds: Counter = field(default_factory=Counter)
    rows_lost: int = 0
    rows_duplicated: int = 0
    identical: int = 0
    merges: int = 0
    clean_failures: int = 0
    expected_failures: int = 0
    failed: list[str] = field(default_factory=list)

    def add(self, index: int, outcome: Outcome) -> None:
        self.trials += 1
        self.kinds[outcome.kind] += 1
        self.counts.update(outcome.counts)
        self.rows_lost += outcome.rows_lost
        self.rows_duplicated += outcome.rows_duplicated
        if outcome.identical is not None:
            self.merges += 1
            self.identical += outcome.identical
        if outcome.clean_failure is not None:
            self.expected_failures += 1
            self.clean_failures += outcome.clean_failure
        if outcome.problems:
            self.failed.append(f"trial {index} ({outcome.kind}: {outcome.detail}): {'; '.join(outcome.problems)}")

    def line(self, mode: str, seed: int, secs: float) -> str:
        c = self.counts
        return (
            f"faults: mode={mode} seed={seed} trials={self.trials} kills={c['kills']} stalls={c['stalls']} "
            f"partitions={c['partitions']} client_kills={c['client_kills']} skewed_workers={c['skewed_workers']} "
            f"drains={c['drains']} coordinator_kills={c['coordinator_kills']} corruptions={c['corruptions']} enospc={c['enospc']} "
            f"actor_kills={c['actor_kills']} actor_freezes={c['actor_freezes']} "
            f"prepare_kills={c['prepare_kills']} prepare_stalls={c['prepare_stalls']} "
            f"dedup_kills={c['dedup_kills']} dedup_stalls={c['dedup_stalls']} "
            f"dedup_job_kills={c['dedup_job_kills']} dedup_job_stalls={c['dedup_job_stalls']} "
            f"analysis_job_kills={c['analysis_job_kills']} analysis_job_stalls={c['analysis_job_stalls']} "
            f"global_job_kills={c['global_job_kills']} global_job_stalls={c['global_job_stalls']} "
            f"slowed={c['slowed']} backups={c['backups']} backups_won={c['backups_won']} "
            f"parquet_jobs={c['parquet_jobs']} parquet_prepares={c['parquet_prepares']} "
            f"scale_kills={c['scale_kills']} scale_partitions={c['scale_partitions']} scale_takeovers={c['scale_takeovers']} "
            f"rows_lost={self.rows_lost} rows_duplicated={self.rows_duplicated} "
            f"identical_merges={self.identical}/{self.merges} clean_failures={self.clean_failures}/{self.expected_failures} "
            f"failed_trials={len(self.failed)} secs={secs:.0f}"
        )


def run(trials: int, seed: int, cluster: Cluster, kinds: list[str] | None = None, keep: bool = False) -> Summary:
    """Run `trials` trials on a started cluster (kinds drawn by weight, or `kinds` in turn) and
    print the summary line on stdout."""
    logging.getLogger("elastic_sharding").setLevel(logging.WARNING)  # the in-process reference runs
    workdir = Path(tempfile.mkdtemp(prefix=f"es-faults-{seed}-"))
    summary = Summary()
    started = time.monotonic()
    harness = Harness(cluster, workdir)
    for index in range(trials):
        rng = random.Random(f"{seed}:{index}")
        trial_started = time.monotonic()
        try:
            outcome = harness.run_trial(index, rng, kinds[index % len(kinds)] if kinds else None)
        except Exception as exc:  # noqa: BLE001 - one broken trial is reported, the others still run
            outcome = Outcome("error", f"{type(exc).__name__}: {exc}", problems=[traceback.format_exc(limit=3)])
        summary.add(index, outcome)
        state = "ok" if not outcome.problems else "FAILED: " + "; ".join(outcome.problems)
        print(
            f"trial {index:4d} {outcome.kind:<11} {outcome.detail:<48} {time.monotonic() - trial_started:5.1f}s {state}",
            file=sys.stderr,
            flush=True,
        )
    print(summary.line(cluster.mode, seed, time.monotonic() - started), flush=True)
    for failure in summary.failed:
        print(f"  {failure}", file=sys.stderr)
    if summary.failed or keep:
        print(f"trial logs kept in {workdir}", file=sys.stderr)
    else:
        shutil.rmtree(workdir, ignore_errors=True)
    return summary


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=200)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--mode", choices=("strict", "cached"), default="cached")
    parser.add_argument("--nodes", type=int, default=3)
    parser.add_argument("--kinds", help=f"comma-separated kinds to run in turn instead of drawing them ({','.join(KINDS)})")
    parser.add_argument("--keep", action="store_true", help="keep the trial logs even when every trial passes")
    args = parser.parse_args()
    kinds = args.kinds.split(",") if args.kinds else None
    if kinds and set(kinds) - set(KINDS):
        parser.error(f"unknown kinds: {', '.join(sorted(set(kinds) - set(KINDS)))}")
    reason = cluster_available()
    if reason is not None:
        parser.error(f"cannot build the GlusterFS test cluster here: {reason}")
    with Cluster(nodes=args.nodes, mode=args.mode) as cluster:
        summary = run(args.trials, args.seed, cluster, kinds, args.keep)
    return 0 if not summary.failed and summary.rows_lost == 0 and summary.rows_duplicated == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
