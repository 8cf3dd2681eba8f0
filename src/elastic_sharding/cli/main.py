"""`elastic-shard` command line: argument parsing and exit codes, nothing else.

Logs and progress go to stderr; `--json` output goes to stdout. Every `ElasticShardError` is
caught here, once, and becomes a one-line message and its exit code.
"""

from __future__ import annotations

import logging
import socket
import sys
import traceback
from collections.abc import Sequence

from elastic_sharding.cli.commands import COMMANDS
from elastic_sharding.cli.parser import build_parser
from elastic_sharding.dependencies.guard import forbid_runtime_installs
from elastic_sharding.errors import EXIT_ERROR, ElasticShardError


def setup_logging(level: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        logging.Formatter(
            f"%(asctime)s {socket.gethostname()} elastic-shard[%(process)d] %(levelname)s %(message)s", "%Y-%m-%d %H:%M:%S"
        )
    )
    root = logging.getLogger("elastic_sharding")
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    root.propagate = False


def main(argv: Sequence[str] | None = None, prog: str = "elastic-shard", profile: str = "shard") -> int:
    parser = build_parser(prog, profile)
    args = parser.parse_args(argv)
    try:
        setup_logging(args.log_level)
    except ValueError:
        parser.error(f"unknown --log-level {args.log_level!r}")
    forbid_runtime_installs()
    try:
        return COMMANDS[args.command](args)
    except ElasticShardError as exc:
        sys.stderr.write(f"{prog} {args.command}: error: {exc}\n")
        return exc.exit_code
    except KeyboardInterrupt:
        sys.stderr.write(f"{prog} {args.command}: interrupted\n")
        return EXIT_ERROR
    except OSError as exc:
        where = f" ({exc.filename} -> {exc.filename2})" if exc.filename2 else f" ({exc.filename})" if exc.filename else ""
        sys.stderr.write(f"{prog} {args.command}: error: {exc.strerror or exc}{where}\n")
        return EXIT_ERROR
    except Exception:  # noqa: BLE001 - an unexpected bug must still exit with the error code
        sys.stderr.write(f"{prog} {args.command}: internal error:\n{traceback.format_exc()}")
        return EXIT_ERROR


def entry() -> None:
    sys.exit(main())
