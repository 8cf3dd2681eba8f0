"""The original demo's strict two-node wrapper: the `dlc_job.py` commands with two-node defaults added.

Only options the user did not give are added, whether they wrote `--opt value` or `--opt=value`
(or an unambiguous abbreviation, which argparse accepts too).
"""

from __future__ import annotations

import os

from elastic_sharding.output_formats import FORMATS, suffix

GLOBAL_OPTIONS_WITH_VALUE = ("--log-level",)
# Options that are the start of another one (`--output`, `--output-format`): argparse takes them
# whole, never as that one's abbreviation.
WHOLE_OPTIONS = ("--output",)
OUTPUT_NAME = "two-node-merged.jsonl"


def _output_name(output_format: str | None) -> str:
    """The default output, with the suffix of `--output-format` (an unknown one is left to the parser)."""
    if output_format not in FORMATS:
        return OUTPUT_NAME
    return OUTPUT_NAME.removesuffix(".jsonl") + suffix(output_format)


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
    if name in WHOLE_OPTIONS:
        return name == flag
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
            added += ["--output", os.path.join(job_dir, _output_name(_value(args, "--output-format")))]
    elif command == "worker":
        if not _present(args, "--max-shards"):
            added += ["--max-shards", "2"]
    elif command == "verify":
        if not _present(args, "--expect-nodes"):
            added += ["--expect-nodes", "2"]
        existing = [os.path.join(job_dir, _output_name(f)) for f in FORMATS] if job_dir else []
        existing = [path for path in existing if os.path.exists(path)]
        if not _present(args, "--output") and existing:
            added += ["--output", existing[0]]
    return head + [command] + args + added
