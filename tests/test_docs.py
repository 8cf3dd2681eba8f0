"""The READMEs stay true: every documented flag exists, and the Chinese README keeps the English
one's commands and code exactly (so a change to one that is not carried to the other fails)."""

from __future__ import annotations

import argparse
import re

from conftest import REPO

from elastic_sharding.cli import build_parser

# Flags of other programs that the READMEs mention (mpirun, srun, unshare, ray start, rsync, and
# dj-process's --executor_type, which the pattern below reads up to the underscore).
FOREIGN_FLAGS = {
    "--allow-run-as-root",
    "--ntasks-per-node",
    "--mca",
    "--uts",
    "--head",
    "--executor",
    "--collector",
    "--inplace",
    "--times",
}
PLACEHOLDERS = {"--opt"}  # "`--opt value` and `--opt=value`"


def _flags() -> set[str]:
    flags: set[str] = set()
    for profile in ("shard", "dlc"):
        parser = build_parser(profile=profile)
        flags.update(parser._option_string_actions)
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for sub in action.choices.values():
                    flags.update(sub._option_string_actions)
    return flags


def _code(text: str) -> tuple[list[str], list[str]]:
    blocks = re.findall(r"^```[a-z]*\n(.*?)^```", text, flags=re.S | re.M)
    inline = re.findall(r"`([^`\n]+)`", re.sub(r"^```.*?^```", "", text, flags=re.S | re.M))
    return blocks, inline


SCRIPTS_WITH_FLAGS = ("bench/elastic_bench.py", "tests/fault_matrix.py", "tests/cluster.py")


def _script_flags() -> set[str]:
    """Flags of the bench, fault-matrix and test-cluster scripts the READMEs document."""
    pattern = r'add_argument\(\s*"(--[a-z-]+)"'
    return {flag for path in SCRIPTS_WITH_FLAGS for flag in re.findall(pattern, (REPO / path).read_text())}


def test_every_documented_flag_exists():
    known = _flags() | _script_flags() | FOREIGN_FLAGS | PLACEHOLDERS
    for name in ("README.md", "README_ZH.md"):
        text = (REPO / name).read_text()
        documented = set(re.findall(r"(?<![\w-])--[a-z][a-z-]*[a-z]", text))
        assert documented - known == set(), f"{name} documents flags the CLI does not have"


def test_the_chinese_readme_keeps_every_command_and_code_block():
    english_blocks, english_inline = _code((REPO / "README.md").read_text())
    chinese_blocks, chinese_inline = _code((REPO / "README_ZH.md").read_text())
    assert chinese_blocks == english_blocks
    assert sorted(chinese_inline) == sorted(english_inline)
