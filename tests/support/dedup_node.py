"""One participant of a deduplication stage, in its own process (`dedup/cooperate.py`).

`dedup_node.py SPEC.json`: SPEC names the stage directory (`root`), the operator (`rule`, `args`),
one JSONL file per shard (`shards`), the partition counts and the lease. The process takes part
until the stage is complete and prints on stdout the stage's record and `kept`, the indices of the
kept rows over all shards in order (what the keep step reads, read on this node); a failure
prints its message on stderr and exits with its exit code. `ELASTIC_SHARD_CRASH_AT` kills it at a crash point.
`node_command()` builds the command line; `stage_spec()` the spec.
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict
from pathlib import Path

NODE = Path(__file__).resolve()


def node_command(spec: Path) -> list[str]:
    return [sys.executable, str(NODE), str(spec)]


def stage_spec(
    path: Path, root: Path, rule: str, args: dict, shards: list[Path], bucket_parts: int, node_parts: int, lease_secs: float = 2.0
) -> Path:
    spec = {
        "root": str(root),
        "rule": rule,
        "args": args,
        "shards": [str(s) for s in shards],
        "bucket_parts": bucket_parts,
        "node_parts": node_parts,
        "lease_secs": lease_secs,
        "heartbeat_secs": 0.3,
        "poll_secs": 0.05,
    }
    path.write_text(json.dumps(spec))
    return path


def main(spec_path: str) -> int:
    from elastic_sharding.dedup.cooperate import StageParticipant
    from elastic_sharding.dedup.rules import DedupRule
    from elastic_sharding.dedup.stage import DedupPlan, DedupStage
    from elastic_sharding.errors import ElasticShardError

    spec = json.loads(Path(spec_path).read_text())
    shards = [Path(s) for s in spec["shards"]]
    plan = DedupPlan(DedupRule(spec["rule"], spec["args"]), len(shards), spec["bucket_parts"], spec["node_parts"])

    def rows_of(shard_index: int) -> list[dict]:
        return [json.loads(line) for line in shards[shard_index].read_text().splitlines()]

    stage = DedupStage(Path(spec["root"]), plan)
    participant = StageParticipant(stage, rows_of, spec["lease_secs"], spec["heartbeat_secs"], spec["poll_secs"])
    try:
        done = participant.run()
    except ElasticShardError as exc:
        print(str(exc), file=sys.stderr)
        return exc.exit_code
    kept, base = [], 0
    for shard_index in range(len(shards)):
        rows = len(rows_of(shard_index))
        dropped = set(stage.drops(shard_index, done.final_round).tolist())
        kept += [base + i for i in range(rows) if i not in dropped]
        base += rows
    print(json.dumps({**asdict(done), "kept": kept}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
