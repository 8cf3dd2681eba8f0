"""The original demo's strict two-node wrapper: the `dlc_job.py` commands with two-node defaults added.

Only options the user did not give are added, whether they wrote `--opt value` or `--opt=value`
(or an unambiguous abbreviation, which argparse accepts too).
"""

from __future__ import annotations

import os

GLOBAL_OPTIONS_WITH_VALUE = ("--log-level",)
OUTPUT_NAME = "two-node-merged.jsonl"


def _split(argv: list[str]) -> tuple[list[str], str | None, list[str]]:
    """(global options, command, command options)."""
    i = 0
    while i < len(argv):
        token = argv[i]
        if token in GLOBAL_OPTIONS_WITH_VALUE:
            i += 2
            continue
        if token.startswith("-"):
            i += 1
            continue
        return argv[:i], token, argv[i + 1 :]
    return argv, None, []


def _matches(token: str, flag: str) -> bool:
    name = token.split("=", 1)[0]
    return name.startswith("--") and len(name) > 2 and flag.startswith(name)


def _present(args: list[str], flag: str) -> bool:
    return any(_matches(token, flag) for token in args)


def _value(args: list[str], flag: str) -> str | None:
    for i, token in enumerate(args):
        if _matches(token, flag):
            if "=" in token:
                return token.split("=", 1)[1]
            return args[i + 1] if i + 1 < len(args) else None
    return None


def with_two_node_defaults(argv: list[str]) -> list[str]:
    head, command, args = _split(list(argv))
    if command is None:
        return list(argv)
    added: list[str] = []
    job_dir = _value(args, "--job-dir")
    if command == "dlc":
        if not _present(args, "--nodes"):
            added += ["--nodes", "2"]
        if not _present(args, "--require-all-nodes"):
            added.append("--require-all-nodes")
        if not _present(args, "--output") and job_dir:
            added += ["--output", os.path.join(job_dir, OUTPUT_NAME)]
    elif command == "worker":
        if not _present(args, "--max-shards"):
            added += ["--max-shards", "2"]
    elif command == "verify":
        if not _present(args, "--expect-nodes"):
            added += ["--expect-nodes", "2"]
        if not _present(args, "--output") and job_dir and os.path.exists(os.path.join(job_dir, OUTPUT_NAME)):
            added += ["--output", os.path.join(job_dir, OUTPUT_NAME)]
    return head + [command] + args + added
