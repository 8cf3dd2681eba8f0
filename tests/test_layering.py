"""The layering rule of CONTRIBUTING.md, checked on every import of the package.

The package is layered in pipeline order: primitives (the top-level modules and `records/`),
`claims/`, `dependencies/`, `dedup/` and `analysis/` (two whole-dataset stages, which never
import each other), `global_ops/` (the other whole-dataset operators, which read both),
`prepare/`, `work/`, `finish/`, `observe/`, `launch/`, `cli/`. A module imports only
primitives, its own layer and the layers before it; the one exception is `observe.snapshot`, the
read-only view of a job that `finish/` (merge, verify, retry) reads the shards' states through.
"""

from __future__ import annotations

import ast
from pathlib import Path

import elastic_sharding

SRC = Path(elastic_sharding.__file__).parent
ORDER = {
    "claims": 1,
    "dependencies": 2,
    "dedup": 3,
    "analysis": 3,
    "global_ops": 3.5,
    "prepare": 4,
    "work": 5,
    "finish": 6,
    "observe": 7,
    "launch": 8,
    "cli": 9,
}
READ_MODEL = "elastic_sharding.observe.snapshot"


def _package(module: str) -> str | None:
    """The stage a module belongs to (None for a primitive)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 2 and parts[1] in ORDER else None


def _imports() -> list[tuple[str, str]]:
    found = []
    for path in SRC.rglob("*.py"):
        module = ".".join(("elastic_sharding", *path.relative_to(SRC).with_suffix("").parts))
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("elastic_sharding"):
                targets = [node.module] + [f"{node.module}.{a.name}" for a in node.names if node.module == "elastic_sharding"]
                found += [(module, target) for target in targets]
    return found


def _allowed(source: str, target: str) -> bool:
    here, there = _package(source), _package(target)
    if there is None or here == there:
        return True  # a primitive, or the same layer
    if here is None:
        return False  # a primitive never imports a layer above it
    return ORDER[there] < ORDER[here] or target == READ_MODEL


def test_every_import_follows_the_layering_rule():
    wrong = [f"{source} imports {target}" for source, target in _imports() if not _allowed(source, target)]
    assert wrong == []


def test_the_rule_is_not_vacuous():
    assert not _allowed("elastic_sharding.claims.protocol", "elastic_sharding.work.worker")
    assert not _allowed("elastic_sharding.layout", "elastic_sharding.claims.protocol")
    assert not _allowed("elastic_sharding.observe.status", "elastic_sharding.launch.steps")
    assert not _allowed("elastic_sharding.prepare.job", "elastic_sharding.finish.merge")
    assert not _allowed("elastic_sharding.finish.merge", "elastic_sharding.observe.status")
    assert _allowed("elastic_sharding.finish.retry", "elastic_sharding.observe.snapshot")


def test_no_test_file_imports_another():
    """Helpers live in tests/support/ (CONTRIBUTING.md): a test module is never a library."""
    tests = Path(__file__).parent
    wrong = []
    for path in tests.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            wrong += [f"{path.relative_to(tests)} imports {name}" for name in names if name.split(".")[0].startswith("test_")]
    assert wrong == []
