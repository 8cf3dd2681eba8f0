"""How far along a job is, how fast each node goes, when it will end, and who is straggling.

Everything comes from records the job already keeps (attempt records, completion records, the
heartbeat each running attempt rewrites), so watching a job adds no file and no write. Times are
the owners' wall clocks; they are good for rates and ages, never for deciding ownership.

The rules, also documented in the README ("Reading status"):

- A worker is a (host, pid), timed by its *effective* time on an attempt (`worker_time`): not
  its wait in the queue behind a shard it claimed ahead, nor its runtime's start-up (`setup_secs`).
  The shard that started a runtime is also slow to process (Ray starts its worker processes on
  first use), so it counts only while the worker has no other completed shard.
- A worker's throughput is the rows (bytes) of its last RECENT_SHARDS completed shards (those that
  did not start a runtime, if it has any) over the effective time they took. A node's rows/s is the sum over its workers running now; a node with
  none running shows the rate over everything it completed.
- A running attempt's done fraction is estimated as its processing time (the owner's heartbeat)
  over the time its owner expects (its previous throughput, published in the heartbeat), capped
  at RUNNING_CAP; an attempt still starting or queued counts as not started.
- ETA = remaining normalized bytes (shards neither done nor failed, less the estimated done part
  of running ones) / the sum of the running workers' byte rates; the job's rows/s now is the sum
  of their row rates. A running worker without a finished shard yet counts with the mean rate of
  its node's workers, else of all workers (in both, so the two always agree). In
  the tail the job cannot end before its slowest running shard, so the ETA is at least the
  longest expected remaining time of a running attempt.
- A node's warm operators: every attempt record (and a running attempt's heartbeat) carries its
  warm runtime's figures per actor-mode operator, counted since that runtime started. Per runtime
  the latest figures count; per node and operator they are summed over its runtimes: loads are
  the instances built (replacements included), and the all-busy fraction is the time every
  instance was inside a call at once over the time from the first call's start to the last
  call's end (the CPU analogue of "all GPUs busy").
- A running attempt is a straggler by the rule that starts its backup (`claims.backups.StragglerRule`,
  with the job's settings), as `observe/stragglers.py` applies it from outside: by the owner's
  own clock, so skew between nodes cannot make a straggler.
- A backup attempt (`claims.backups`) and the attempt it backs up are one running shard: the ETA
  counts the larger done part of the two and the shorter time left. An attempt stopped because
  another of its shard published first (`beaten`) is neither a completion nor a failure.
- Each backup attempt's race with its original is judged by `backup_races`.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from elastic_sharding.claims.backups import StragglerRule, Straggling
from elastic_sharding.observe.backup_races import Backup, BackupCounts, backup_races, count_backups
from elastic_sharding.observe.snapshot import AttemptView, ShardView
from elastic_sharding.observe.stragglers import judge, median_secs_per_byte
from elastic_sharding.observe.worker_time import busy_secs, effective_starts
from elastic_sharding.records import BackupRecord, OperatorStats
from elastic_sharding.vocabulary import STARTING_PHASES, WAITING_PHASES, AttemptOutcome, Phase, ShardState

RECENT_SHARDS = 5
RUNNING_CAP = 0.95


@dataclass
class Running:
    """One running attempt as status shows it."""

    shard_id: str
    attempt_id: str
    host: str
    pid: int
    phase: str | None
    age_secs: float
    expected_secs: float | None
    est_fraction: float
    straggling: Straggling | None = None  # a straggler: how far past the median shard's time
    backup_of: str | None = None  # a backup attempt: the attempt it backs up

    @property
    def straggler(self) -> bool:
        return self.straggling is not None

    @property
    def factor(self) -> float | None:
        return self.straggling.overrun if self.straggling is not None else None


@dataclass
class WarmOperator:
    """One actor-mode operator's warm instances on one node (see the module docstring)."""

    op: str
    instances: int
    loads: int
    deaths: int
    rows: int
    window_secs: float
    all_busy_secs: float
    busy_secs: float

    @property
    def all_busy_fraction(self) -> float | None:
        return self.all_busy_secs / self.window_secs if self.window_secs > 0 else None

    @property
    def busy_fraction(self) -> float | None:
        return self.busy_secs / (self.window_secs * self.instances) if self.window_secs > 0 and self.instances else None


def warm_operators(attempts: list[AttemptView]) -> dict[str, list[WarmOperator]]:
    """Per host, its warm operators: the latest figures of each (runtime, operator), summed."""
    latest: dict[tuple[str, int, str], OperatorStats] = {}
    for attempt in attempts:
        for figures in attempt.operators or ():
            key = (attempt.host, figures.runtime_pid, figures.op)
            seen = latest.get(key)
            if seen is None or (figures.window_secs, figures.calls) >= (seen.window_secs, seen.calls):
                latest[key] = figures
    nodes: dict[str, dict[str, WarmOperator]] = defaultdict(dict)
    for (host, _runtime, op), f in sorted(latest.items()):
        mine = nodes[host].get(op)
        if mine is None:
            nodes[host][op] = WarmOperator(
                op, f.instances, f.started, f.deaths, f.rows, f.window_secs, f.all_busy_secs, f.busy_secs
            )
            continue
        mine.instances = max(mine.instances, f.instances)
        mine.loads += f.started
        mine.deaths += f.deaths
        mine.rows += f.rows
        mine.window_secs += f.window_secs
        mine.all_busy_secs += f.all_busy_secs
        mine.busy_secs += f.busy_secs
    return {host: list(ops.values()) for host, ops in nodes.items()}


@dataclass
class Node:
    host: str
    active_workers: int = 0
    shards_done: int = 0
    rows_done: int = 0
    bytes_done: int = 0
    rows_per_sec: float | None = None
    bytes_per_sec: float | None = None
    failures: int = 0
    running: list[Running] = field(default_factory=list)
    warm_operators: list[WarmOperator] = field(default_factory=list)


@dataclass
class Eta:
    secs: float | None
    at: float | None
    basis: str


@dataclass
class JobMetrics:
    started_at: float | None
    elapsed_secs: float
    shards_done: int
    shards_total: int
    rows_done: int
    rows_total: int
    bytes_done: int
    bytes_total: int
    rows_per_sec: float | None
    bytes_per_sec: float | None
    overall_rows_per_sec: float | None
    active_workers: int
    eta: Eta
    nodes: list[Node]
    stragglers: list[Running]
    backups: list[Backup] = field(default_factory=list)
    backup_counts: BackupCounts = field(default_factory=BackupCounts)
    straggler_rule: StragglerRule = field(default_factory=StragglerRule)
    median_secs_per_byte: float | None = None  # of the done shards, once the rule has enough

    @property
    def percent(self) -> float:
        return 100.0 * self.rows_done / self.rows_total if self.rows_total else 100.0

    @property
    def percent_bytes(self) -> float:
        return 100.0 * self.bytes_done / self.bytes_total if self.bytes_total else 100.0


@dataclass
class _Rate:
    rows: int = 0
    bytes: int = 0
    secs: float = 0.0

    def add(self, attempt: AttemptView, secs: float) -> None:
        self.rows += attempt.input_rows
        self.bytes += attempt.input_bytes
        self.secs += secs

    @property
    def rows_per_sec(self) -> float | None:
        return self.rows / self.secs if self.secs > 0 else None

    @property
    def bytes_per_sec(self) -> float | None:
        return self.bytes / self.secs if self.secs > 0 else None


def _worker_rates(completed: list[AttemptView], starts: dict[tuple[str, str], float]) -> dict[tuple[str, int], _Rate]:
    by_worker: dict[tuple[str, int], list[AttemptView]] = defaultdict(list)
    for attempt in completed:
        by_worker[(attempt.host, attempt.pid)].append(attempt)
    rates = {}
    for worker, own in by_worker.items():
        rate = _Rate()
        warm = [a for a in own if not a.setup_secs]
        for attempt in sorted(warm or own, key=lambda a: a.ended_at or 0.0)[-RECENT_SHARDS:]:
            rate.add(attempt, busy_secs(attempt, starts))
        rates[worker] = rate
    return rates


def _mean(values: list[float | None]) -> float | None:
    known = [v for v in values if v]
    return sum(known) / len(known) if known else None


def job_metrics(
    views: list[ShardView],
    attempts: list[AttemptView],
    now: float,
    backup_records: dict[str, BackupRecord] | None = None,
    rule: StragglerRule | None = None,
) -> JobMetrics:
    """`backup_records` (`snapshot.backup_records`) add why each backup attempt started; `rule` is
    the job's (`StragglerRule.of` its settings; the defaults' when not given)."""
    rule = rule or StragglerRule()
    current = [a for a in attempts if a.archive is None]
    done_ids = {v.shard_id for v in views if v.state == ShardState.DONE}
    completed = [
        a for a in current if a.outcome == AttemptOutcome.SUCCEEDED and a.ended_at is not None and a.shard_id in done_ids
    ]
    running = [a for a in current if a.outcome == AttemptOutcome.RUNNING]
    starts = effective_starts(attempts)
    rates = _worker_rates(completed, starts)
    all_rates = list(rates.values())

    nodes: dict[str, Node] = {}
    node_totals: dict[str, _Rate] = defaultdict(_Rate)
    for attempt in completed:
        node = nodes.setdefault(attempt.host, Node(attempt.host))
        node.shards_done += 1
        node.rows_done += attempt.input_rows
        node.bytes_done += attempt.input_bytes
        node_totals[attempt.host].add(attempt, busy_secs(attempt, starts))
    for attempt in current:
        if attempt.counts_as_failure:
            nodes.setdefault(attempt.host, Node(attempt.host)).failures += 1

    median = median_secs_per_byte(views, rule)
    unfinished = {v.shard_id for v in views if v.state not in (ShardState.DONE, ShardState.FAILED)}
    remaining = sum(v.spec.bytes for v in views if v.shard_id in unfinished)
    active: dict[tuple[str, int], float | None] = {}  # running worker -> bytes/s
    active_rows: dict[tuple[str, int], float | None] = {}  # and rows/s
    stragglers = []
    done_part: dict[str, float] = {}  # unfinished shard -> the largest estimated done bytes of its attempts
    time_left: dict[str, float] = {}  # and the shortest expected time left of its attempts
    for attempt in running:
        node = nodes.setdefault(attempt.host, Node(attempt.host))
        waiting = attempt.phase in WAITING_PHASES
        working = not waiting and attempt.phase not in STARTING_PHASES
        age = 0.0 if waiting else max(0.0, now - starts[(attempt.shard_id, attempt.attempt_id)])
        busy = attempt.phase_secs if attempt.phase == Phase.PROCESSING and attempt.phase_secs is not None else age
        expected = attempt.expected_secs
        fraction = min(RUNNING_CAP, busy / expected) if expected and working else 0.0
        item = Running(
            attempt.shard_id,
            attempt.attempt_id,
            attempt.host,
            attempt.pid,
            attempt.phase,
            age,
            expected,
            fraction,
            backup_of=attempt.backup_of,
        )
        shard = attempt.shard_id
        node.running.append(item)
        if shard in unfinished:
            item.straggling = judge(attempt, rule, median)
            if item.straggling is not None:
                stragglers.append(item)
            done_part[shard] = max(done_part.get(shard, 0.0), fraction * attempt.input_bytes)
        worker = (attempt.host, attempt.pid)
        if worker in rates:
            active[worker], active_rows[worker] = rates[worker].bytes_per_sec, rates[worker].rows_per_sec
        elif worker not in active:
            host_rates = [rate for (host, _), rate in rates.items() if host == attempt.host]
            active[worker] = _mean([r.bytes_per_sec for r in host_rates]) or _mean([r.bytes_per_sec for r in all_rates])
            active_rows[worker] = _mean([r.rows_per_sec for r in host_rates]) or _mean([r.rows_per_sec for r in all_rates])
        rate = active[worker]
        expected = expected or (attempt.input_bytes / rate if rate else None)
        if expected is not None and shard in unfinished:
            left = expected - (busy if working else 0.0)
            time_left[shard] = min(time_left.get(shard, left), left)
    remaining -= sum(done_part.values())
    longest = max([0.0, *time_left.values()])

    for node in nodes.values():
        own = {w for w in active if w[0] == node.host}
        node.active_workers = len(own)
        mine = [rates[w] for w in own if w in rates]
        if mine:
            node.rows_per_sec = sum(r.rows_per_sec or 0.0 for r in mine)
            node.bytes_per_sec = sum(r.bytes_per_sec or 0.0 for r in mine)
        elif not own:
            node.rows_per_sec = node_totals[node.host].rows_per_sec
            node.bytes_per_sec = node_totals[node.host].bytes_per_sec

    for host, operators in warm_operators(attempts).items():
        nodes.setdefault(host, Node(host)).warm_operators = operators

    starts_all = [a.started_at for a in attempts]
    started_at = min(starts_all) if starts_all else None
    finished = bool(views) and all(v.state in (ShardState.DONE, ShardState.FAILED) for v in views)
    end = max((a.ended_at for a in attempts if a.ended_at is not None), default=now) if finished else now
    elapsed = max(0.0, end - started_at) if started_at is not None else 0.0
    rows_done = sum(v.spec.rows for v in views if v.state == ShardState.DONE)
    bytes_rate = sum(rate for rate in active.values() if rate) or None
    rows_rate = sum(rate for rate in active_rows.values() if rate) or None
    backups = backup_races(views, current, completed, backup_records or {}, starts, now)
    return JobMetrics(
        started_at=started_at,
        elapsed_secs=elapsed,
        shards_done=len(done_ids),
        shards_total=len(views),
        rows_done=rows_done,
        rows_total=sum(v.spec.rows for v in views),
        bytes_done=sum(v.spec.bytes for v in views if v.state == ShardState.DONE),
        bytes_total=sum(v.spec.bytes for v in views),
        rows_per_sec=rows_rate,
        bytes_per_sec=bytes_rate,
        overall_rows_per_sec=rows_done / elapsed if elapsed > 0 and rows_done else None,
        active_workers=len(active),
        eta=_eta(views, max(0.0, remaining), bytes_rate, longest, bool(completed), bool(active), now),
        nodes=sorted(nodes.values(), key=lambda n: n.host),
        stragglers=stragglers,
        backups=backups,
        backup_counts=count_backups(backups),
        straggler_rule=rule,
        median_secs_per_byte=median,
    )


def _eta(
    views: list[ShardView],
    remaining: float,
    bytes_rate: float | None,
    longest: float,
    any_done: bool,
    any_active: bool,
    now: float,
) -> Eta:
    if all(v.state == ShardState.DONE for v in views):
        return Eta(0.0, now, "complete")
    if remaining <= 0:
        return Eta(None, None, "only failed shards remain; see `retry`")
    if not any_active:
        stale = sum(v.state == ShardState.STALE for v in views)
        why = f"{stale} stale claim(s), no live worker" if stale else "no worker is running"
        return Eta(None, None, why)
    if not any_done or not bytes_rate:
        return Eta(None, None, "no shard has finished yet")
    secs = remaining / bytes_rate
    if longest > secs:
        return Eta(longest, now + longest, "the slowest running shard's expected end (the job is in its tail)")
    return Eta(secs, now + secs, "remaining normalized bytes / recent throughput of the running workers")
