"""The documentation stays true.

- Every `--flag` it mentions exists (in the CLI, or in a project script the docs show).
- The generated CLI reference (docs/reference/cli.md) matches the parsers.
- Every Chinese page keeps its English twin's commands and code exactly: the same fenced code
  blocks in order and the same inline code spans, so a change to one that is not carried to the
  other fails. Every English guide, concept and getting-started page has a Chinese twin.
- No relative link is dead: its file exists and its `#anchor` is a heading (or an explicit
  `<a id>`) of the target, by GitHub's slug rule.
- The newcomer's path README → getting started → a guide → the CLI reference is linked.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path

import pytest

from elastic_sharding.cli import build_parser

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs"
ZH = DOCS / "zh"
GENERATED = DOCS / "reference" / "cli.md"

# Flags of other programs that the docs mention (mpirun, srun, sbatch, unshare, ray start, rsync,
# node-exporter's --collector.textfile.directory and dj-process's --executor_type, which the
# pattern below reads up to the dot or the underscore).
FOREIGN_FLAGS = {
    "--allow-run-as-root",
    "--ntasks-per-node",
    "--ntasks",  # srun and sbatch, in the Slurm guide's batch script
    "--cpu-bind",
    "--kill-on-bad-exit",
    "--exclusive",
    "--signal",
    "--open-mode",
    "--parsable",
    "--constraint",
    "--mca",
    "--uts",
    "--head",
    "--executor",
    "--collector",
    "--inplace",
    "--times",
}
PLACEHOLDERS = {"--opt"}  # "`--opt value` and `--opt=value`"
# Flags of the project's shell scripts, which have no argparse to read them from.
SHELL_SCRIPT_FLAGS = {"--required"}  # scripts/system-packages --required (what .ci/run calls)

# Project scripts whose flags the docs show: the bench, the fault matrix, the test cluster, the
# CLI reference generator.
SCRIPTS_WITH_FLAGS = (
    "bench/elastic_bench.py",
    "tests/support/fault_matrix.py",
    "tests/support/cluster.py",
    "scripts/cli-reference",
)


def _markdown(*patterns: str) -> list[Path]:
    return sorted({path for pattern in patterns for path in REPO.glob(pattern)})


# The pages whose flags and links are checked.
PROSE = _markdown("README.md", "README_ZH.md", "CONTRIBUTING.md", "docs/**/*.md")
LINKED = _markdown("README.md", "README_ZH.md", "CONTRIBUTING.md", "bench/README.md", "docs/**/*.md")
# English pages that must have a Chinese twin under docs/zh/ with the same relative path.
TRANSLATED = _markdown("docs/getting-started.md", "docs/guides/*.md", "docs/concepts/*.md")


def _name(path: Path) -> str:
    return str(path.relative_to(REPO))


def _twins() -> list[tuple[Path, Path]]:
    pairs = [(REPO / "README.md", REPO / "README_ZH.md")]
    pairs += [(DOCS / path.relative_to(ZH), path) for path in sorted(ZH.rglob("*.md"))]
    return pairs


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


def _script(path: str) -> Path:
    """A script of SCRIPTS_WITH_FLAGS, also when the tests or the bench were moved into folders."""
    where = REPO / path
    if where.exists():
        return where
    found = sorted((REPO / Path(path).parts[0]).rglob(Path(path).name))
    assert found, f"{path} is gone: update SCRIPTS_WITH_FLAGS"
    return found[0]


def _script_flags() -> set[str]:
    pattern = r'add_argument\(\s*"(--[a-z-]+)"'
    return {flag for path in SCRIPTS_WITH_FLAGS for flag in re.findall(pattern, _script(path).read_text())}


FENCE = re.compile(r"^```.*?^```", flags=re.S | re.M)


def _code(text: str) -> tuple[list[str], list[str]]:
    blocks = re.findall(r"^```[a-z]*\n(.*?)^```", text, flags=re.S | re.M)
    inline = re.findall(r"`([^`\n]+)`", FENCE.sub("", text))
    return blocks, inline


def test_every_documented_flag_exists():
    known = _flags() | _script_flags() | SHELL_SCRIPT_FLAGS | FOREIGN_FLAGS | PLACEHOLDERS
    for path in PROSE:
        if path == GENERATED:
            continue  # written from the parsers themselves
        documented = set(re.findall(r"(?<![\w-])--[a-z][a-z-]*[a-z]", path.read_text()))
        assert documented - known == set(), f"{_name(path)} documents flags the CLI does not have"


def test_the_cli_reference_is_not_stale():
    result = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "cli-reference"), "--check"], capture_output=True, text=True, cwd=REPO
    )
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize("english, chinese", _twins(), ids=lambda path: _name(path))
def test_the_chinese_readme_keeps_every_command_and_code_block(english, chinese):
    assert english.exists(), f"{_name(chinese)} has no English page {_name(english)}"
    english_blocks, english_inline = _code(english.read_text())
    chinese_blocks, chinese_inline = _code(chinese.read_text())
    assert chinese_blocks == english_blocks
    assert sorted(chinese_inline) == sorted(english_inline)


def test_every_english_page_has_a_chinese_twin():
    assert TRANSLATED, "no guide, concept or getting-started page found"
    missing = [_name(path) for path in TRANSLATED if not (ZH / path.relative_to(DOCS)).exists()]
    assert missing == []


# ---- links ------------------------------------------------------------------------------------

LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
HEADING = re.compile(r"^(#{1,6})\s+(.+?)\s*#*\s*$", flags=re.M)
EXPLICIT_ANCHOR = re.compile(r"""<a\s+(?:id|name)=["']([^"']+)["']""")


def _prose(text: str) -> str:
    """The text outside fenced code blocks and inline code, where links and headings live."""
    return re.sub(r"`[^`\n]+`", "code", FENCE.sub("", text))


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: its rendered text, lowercased, punctuation dropped except
    `-` and `_`, spaces to `-` (letters of any script, Chinese included, are kept)."""
    text = re.sub(r"`([^`]*)`", r"\1", heading)
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", text)
    text = re.sub(r"<[^>]+>", "", text)
    text = re.sub(r"[^\w\- ]", "", text.strip().lower())
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    text = FENCE.sub("", path.read_text())
    found: set[str] = set(EXPLICIT_ANCHOR.findall(text))
    seen: dict[str, int] = {}
    for _, heading in HEADING.findall(text):
        base = slug(heading)
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


def links(path: Path) -> list[str]:
    return [target for target in LINK.findall(_prose(path.read_text())) if not re.match(r"^[a-z][a-z0-9+.-]*:", target)]


def _resolve(source: Path, target: str) -> tuple[Path, str | None]:
    file, _, anchor = target.partition("#")
    return (source.parent / file).resolve() if file else source, anchor or None


def _dead(source: Path) -> list[str]:
    dead = []
    for target in links(source):
        path, anchor = _resolve(source, target)
        if not path.exists():
            dead.append(f"{target} (no such file)")
        elif anchor is not None and (path.is_dir() or anchor not in anchors(path)):
            dead.append(f"{target} (no such heading)")
    return dead


def test_slugs_follow_github():
    assert slug("P1 — at most one live claim per shard") == "p1--at-most-one-live-claim-per-shard"
    assert slug("PAI-DLC Worker broadcast (`dlc`)") == "pai-dlc-worker-broadcast-dlc"
    assert slug("Where `--output` goes") == "where---output-goes"
    assert slug("`dlc_job.py dlc`") == "dlc_jobpy-dlc"
    assert slug("弹性模式与严格参与模式") == "弹性模式与严格参与模式"
    assert slug("PAI-DLC Worker 广播（`dlc`）") == "pai-dlc-worker-广播dlc"


@pytest.mark.parametrize("source", LINKED, ids=_name)
def test_no_dead_links(source):
    assert _dead(source) == []


def _linked_pages(source: Path, under: Path) -> list[Path]:
    pages = []
    for target in links(source):
        path, _ = _resolve(source, target)
        if path.suffix == ".md" and path.is_relative_to(under) and path not in pages:
            pages.append(path)
    return pages


def test_a_newcomer_finds_the_way_from_the_readme_to_the_cli_reference():
    start = DOCS / "getting-started.md"
    assert start in _linked_pages(REPO / "README.md", DOCS), "README.md does not link docs/getting-started.md"
    guides = _linked_pages(start, DOCS / "guides")
    assert guides, "docs/getting-started.md links no guide"
    for guide in guides:
        assert guide.exists(), f"{_name(guide)} is linked from getting started but missing"
        assert GENERATED in _linked_pages(guide, DOCS / "reference"), f"{_name(guide)} does not link the CLI reference"
