"""`elastic-shard` command line: argument parsing and exit codes, nothing else.

Logs and progress go to stderr; `--json` output goes to stdout. Every `ElasticShardError` is
caught here, once, and becomes a one-line message and its exit code.
"""

from __future__ import annotations

import argparse
import logging
import os
import socket
import sys
import traceback
from collections.abc import Sequence
from pathlib import Path

import orjson

from .errors import EXIT_ERROR, EXIT_OK, ElasticShardError
from .runners import RUNNERS

DEFAULT_LOCK_TIMEOUT = 126000.0
DEFAULT_MAX_RETRIES = 3
DEFAULT_POLL_INTERVAL = 20.0
DEFAULT_RAY_ADDRESS = "local"
MAX_HEARTBEAT_INTERVAL = 30.0


def default_heartbeat(lock_timeout: float) -> float:
    """Heartbeat often enough that a live claim renews several times per lease."""
    return min(MAX_HEARTBEAT_INTERVAL, lock_timeout / 4)


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError("must be at least 1")
    return value


def _add_job_dir(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--job-dir", required=True, type=Path, help="shared job directory")


# The job settings: `prepare` stores them in the manifest, `worker` may override each one.
_SETTINGS = (
    (
        "--lock-timeout-secs",
        float,
        DEFAULT_LOCK_TIMEOUT,
        "claim lease: a claim whose heartbeat does not change for this long is stale",
    ),
    ("--max-retries", int, DEFAULT_MAX_RETRIES, "retries after the first failure"),
    ("--poll-interval-secs", float, DEFAULT_POLL_INTERVAL, "worker wait when nothing is claimable"),
    ("--heartbeat-interval-secs", float, None, "claim renewal interval"),
    ("--ray-address", str, DEFAULT_RAY_ADDRESS, "node-local Ray address for workers"),
)


def _add_settings(parser: argparse.ArgumentParser, as_overrides: bool) -> None:
    for flag, kind, default, text in _SETTINGS:
        if as_overrides:
            parser.add_argument(flag, type=kind, help=f"override for this worker: {text} (default: the manifest's value)")
        else:
            shown = "min(30, lock timeout / 4)" if default is None else "%(default)s"
            parser.add_argument(flag, type=kind, default=default, help=f"{text} (default {shown})")


def build_parser(prog: str = "elastic-shard") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog,
        description="Run a Data-Juicer recipe over a large JSONL dataset on many nodes that share a POSIX directory.",
    )
    parser.add_argument("--log-level", default=os.environ.get("ELASTIC_SHARD_LOG_LEVEL", "INFO"), help="stderr log level")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("prepare", help="validate recipe and input, split into shards, publish the job")
    p.add_argument("--config", required=True, type=Path, help="Data-Juicer YAML recipe")
    p.add_argument("--dataset-path", type=Path, help="JSONL file or directory (overrides the recipe's dataset_path)")
    _add_job_dir(p)
    p.add_argument("--num-shards", required=True, type=_positive_int, help="exact number of non-empty shards")
    _add_settings(p, as_overrides=False)
    p.add_argument("--json", action="store_true", help="print the manifest summary as JSON on stdout")

    p = sub.add_parser("worker", help="claim and process shards until the job is complete")
    _add_job_dir(p)
    p.add_argument("--max-shards", type=_positive_int, help="maximum claims (failed attempts count); default unlimited")
    _add_settings(p, as_overrides=True)
    p.add_argument("--allow-version-mismatch", action="store_true", help="run even if Data-Juicer differs from the manifest")
    p.add_argument("--runner", default="process", choices=RUNNERS, help="how a shard is processed (default %(default)s)")

    p = sub.add_parser("status", help="show the state of every shard (read-only)")
    _add_job_dir(p)
    p.add_argument("--lock-timeout-secs", type=float, help="only affects whether claims display as stale")
    p.add_argument("--json", action="store_true", help="machine-readable JSON on stdout")
    p.add_argument("--all", action="store_true", help="list every shard and owner")

    p = sub.add_parser("retry", help="requeue terminally failed shards")
    _add_job_dir(p)
    p.add_argument("--all-failed", action="store_true", help="requeue every failed shard")
    p.add_argument("--shard-id", action="append", default=[], help="requeue this shard (repeatable)")

    p = sub.add_parser("merge", help="validate and merge all shard outputs in manifest order")
    _add_job_dir(p)
    p.add_argument("--output", required=True, type=Path, help="final JSONL path")
    p.add_argument("--lock-timeout-secs", type=float, help="used while computing pre-merge status")
    p.add_argument("--overwrite", action="store_true", help="replace an existing output")
    p.add_argument("--json", action="store_true", help="print the merge record as JSON on stdout")

    p = sub.add_parser("verify", help="check that the job is complete, valid, and ran on enough nodes")
    _add_job_dir(p)
    p.add_argument(
        "--output", type=Path, help="merged output to check against merge.json (default <job-dir>/merged.jsonl if present)"
    )
    p.add_argument(
        "--expect-nodes", type=_positive_int, default=1, help="minimum distinct completion hostnames (default %(default)s)"
    )
    p.add_argument("--json", action="store_true", help="print the result as JSON on stdout")
    return parser


def _emit_json(value: object) -> None:
    sys.stdout.write(orjson.dumps(value, option=orjson.OPT_INDENT_2).decode() + "\n")
    sys.stdout.flush()


def _cmd_prepare(args: argparse.Namespace) -> int:
    import dataclasses

    from .prepare import PrepareRequest, prepare
    from .records import Settings

    heartbeat = args.heartbeat_interval_secs or default_heartbeat(args.lock_timeout_secs)
    settings = Settings(args.lock_timeout_secs, args.max_retries, args.poll_interval_secs, heartbeat, args.ray_address)
    result = prepare(PrepareRequest(args.config, args.dataset_path, args.job_dir, args.num_shards, settings))
    if args.json:
        manifest = dataclasses.asdict(result.manifest)
        _emit_json({"created": result.created, "job_dir": str(Path(os.path.abspath(args.job_dir))), "manifest": manifest})
    return EXIT_OK


def _cmd_worker(args: argparse.Namespace) -> int:
    from .worker import WorkerOptions, run_worker

    heartbeat = args.heartbeat_interval_secs
    if heartbeat is None and args.lock_timeout_secs is not None:
        heartbeat = default_heartbeat(args.lock_timeout_secs)
    options = WorkerOptions(
        max_shards=args.max_shards,
        lock_timeout_secs=args.lock_timeout_secs,
        max_retries=args.max_retries,
        poll_interval_secs=args.poll_interval_secs,
        heartbeat_interval_secs=heartbeat,
        ray_address=args.ray_address,
        allow_version_mismatch=args.allow_version_mismatch,
        runner=args.runner,
    )
    return run_worker(args.job_dir, options)


def _cmd_status(args: argparse.Namespace) -> int:
    from .report import Status

    status = Status(args.job_dir, args.lock_timeout_secs)
    if args.json:
        _emit_json(status.as_json())
    else:
        sys.stdout.write(status.text(args.all) + "\n")
    return status.exit_code


def _cmd_retry(args: argparse.Namespace) -> int:
    from .retry import retry

    retry(args.job_dir, args.all_failed, args.shard_id)
    return EXIT_OK


def _cmd_merge(args: argparse.Namespace) -> int:
    import dataclasses

    from .merge import merge

    record = merge(args.job_dir, args.output, args.overwrite, args.lock_timeout_secs)
    if args.json:
        _emit_json(dataclasses.asdict(record))
    return EXIT_OK


def _cmd_verify(args: argparse.Namespace) -> int:
    from .verify import verify

    result = verify(args.job_dir, args.expect_nodes, args.output)
    message = f"PASS: {result.shards} shards were completed by {len(result.hosts)} node(s): {', '.join(result.hosts)}"
    if result.output_checked is not None:
        message += f"; {result.output_checked} matches merge.json"
    logging.getLogger("elastic_sharding").info("%s", message)
    if args.json:
        _emit_json(
            {
                "pass": True,
                "shards": result.shards,
                "hosts": result.hosts,
                "output": str(result.output_checked) if result.output_checked else None,
            }
        )
    return EXIT_OK


COMMANDS = {
    "prepare": _cmd_prepare,
    "worker": _cmd_worker,
    "status": _cmd_status,
    "retry": _cmd_retry,
    "merge": _cmd_merge,
    "verify": _cmd_verify,
}


def setup_logging(level: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        logging.Formatter(f"%(asctime)s {socket.gethostname()} elastic-shard %(levelname)s %(message)s", "%Y-%m-%d %H:%M:%S")
    )
    root = logging.getLogger("elastic_sharding")
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    root.propagate = False


def main(argv: Sequence[str] | None = None, prog: str = "elastic-shard") -> int:
    parser = build_parser(prog)
    args = parser.parse_args(argv)
    try:
        setup_logging(args.log_level)
    except ValueError:
        parser.error(f"unknown --log-level {args.log_level!r}")
    try:
        return COMMANDS[args.command](args)
    except ElasticShardError as exc:
        sys.stderr.write(f"{prog} {args.command}: error: {exc}\n")
        return exc.exit_code
    except KeyboardInterrupt:
        sys.stderr.write(f"{prog} {args.command}: interrupted\n")
        return EXIT_ERROR
    except OSError as exc:
        where = f" ({exc.filename})" if exc.filename else ""
        sys.stderr.write(f"{prog} {args.command}: error: {exc.strerror or exc}{where}\n")
        return EXIT_ERROR
    except Exception:  # noqa: BLE001 - an unexpected bug must still exit with the error code
        sys.stderr.write(f"{prog} {args.command}: internal error:\n{traceback.format_exc()}")
        return EXIT_ERROR


def entry() -> None:
    sys.exit(main())
