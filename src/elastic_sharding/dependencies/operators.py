"""What each operator of a recipe imports, read from Data-Juicer's own declarations (imports it).

Data-Juicer declares an operator's third-party imports in three places, and this module reads
all three rather than keeping a list of its own:
- the operator's module: its `LazyLoader(module, package, url)` calls (which say both what is
  imported and what would be installed), and everything Data-Juicer's own requirement analysis
  (`analyze_lazy_loaded_requirements_for_code_file`, the source of an op's `get_env_spec`) finds
  in that file, `LazyLoader.check_packages([...])` included;
- the class attribute `_requirements` (a list, or a requirements file);
- the media helpers it imports from `data_juicer.utils.mm_utils` (`load_video`: PyAV), read
  like model_utils below;
- the models it prepares: `prepare_model(model_type="kenlm")` calls in the operator's class, and
  the `LazyLoader` calls of `data_juicer.utils.model_utils` whose names the model type's prepare
  function (and the functions of that module it calls) use.

A model prepared only under a condition (`if tokenization:`) is needed when the condition holds
for the recipe's arguments (or the operator's defaults); a condition that cannot be evaluated
that way, or a loader its prepare function uses only on some branch, makes the need uncertain:
reported when missing, never refused.
"""

from __future__ import annotations

import ast
import inspect
import logging
import sys
import textwrap
import types
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from typing import Any

log = logging.getLogger(__name__)

# Branches that may not run: a name used only inside one is not certainly used.
_BRANCHES = (ast.If, ast.IfExp, ast.For, ast.AsyncFor, ast.While, ast.ExceptHandler, ast.Lambda, ast.comprehension)
_NESTED = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)


@dataclass(frozen=True)
class Need:
    """One import an operator makes, as Data-Juicer declares it."""

    operator: str
    position: int  # process[position] in the recipe
    package: str  # what Data-Juicer would install: a distribution name, a requirement, or a URL
    module: str | None  # what the operator imports, where Data-Juicer's declaration says
    via: str  # where the declaration is: "its module", "_requirements", "model 'kenlm'"
    certain: bool = True


def recipe_needs(ops: list[tuple[str, dict[str, Any]]], registry: dict[str, type]) -> list[Need]:
    """Every import of every operator in `ops` (name, arguments), in recipe order."""
    needs: list[Need] = []
    for position, (name, params) in enumerate(ops):
        cls = registry.get(name)
        if cls is not None:
            needs.extend(operator_needs(position, name, cls, params))
    return needs


def operator_needs(position: int, name: str, cls: type, params: dict[str, Any]) -> list[Need]:
    seen: dict[str, Need] = {}

    def add(package: str, module: str | None, via: str, certain: bool = True) -> None:
        key = _canonical(module or package)
        old = seen.get(key)
        if old is None or (certain and not old.certain):
            seen[key] = Need(name, position, package, module, via, certain)

    for module, package in _module_loaders(cls):
        add(package, module, "its module")
    declared = {_canonical(n.package) for n in seen.values()}
    listed = [(r, "its module") for r in _analyzed_requirements(cls)] + [(r, "_requirements") for r in _class_requirements(cls)]
    for requirement, via in listed:
        package = _requirement_name(requirement)
        if package and _canonical(package) not in declared and _canonical(package) not in seen:
            add(requirement, None, via)
    for module, package, used_always in _helper_loaders(cls):
        add(package, module, "data_juicer.utils.mm_utils", used_always)
    for model_type, certain in _model_types(cls, params):
        for module, package, used_always in _model_loaders(model_type):
            add(package, module, f"model {model_type!r}", certain and used_always)
    return list(seen.values())


# -- the operator's module and class ------------------------------------------------------------


def _declared_loaders(source: str) -> dict[str, tuple[str, str]]:
    """Every `LazyLoader(module, package, url)` call with a literal module in `source`: the name
    it is assigned to (or the module, unassigned) -> (module, package to install). Read from the
    source, never from the objects: a loader that has loaded replaced itself with the module in
    its module's globals, and any attribute access through one that has not imports (and,
    without our guard, installs) it."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return {}
    targets: dict[int, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            targets[id(node.value)] = node.targets[0].id
    found: dict[str, tuple[str, str]] = {}
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and _callee(node) == "LazyLoader"):
            continue
        values = {k.arg: k.value for k in node.keywords if k.arg}
        for position, name in enumerate(("module_name", "package_name", "package_url")):
            if position < len(node.args):
                values.setdefault(name, node.args[position])
        module = _string(values.get("module_name"))
        if module is None:
            continue
        package = _string(values.get("package_url")) or _string(values.get("package_name")) or _package_for(module)
        found[targets.get(id(node), module)] = (module, package)
    return found


def _string(node: ast.expr | None) -> str | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value:
        return node.value
    return None


def _package_for(module: str) -> str:
    from data_juicer.utils.lazy_loader import LazyLoader

    return LazyLoader.get_package_name(module.split(".")[0])


def _module_loaders(cls: type) -> list[tuple[str, str]]:
    module = sys.modules.get(cls.__module__)
    try:
        source = inspect.getsource(module) if module else ""
    except (OSError, TypeError):
        return []
    return list(dict.fromkeys(_declared_loaders(source).values()))


def _analyzed_requirements(cls: type) -> list[str]:
    from data_juicer.ops.op_env import analyze_lazy_loaded_requirements_for_code_file

    try:
        return list(analyze_lazy_loaded_requirements_for_code_file(inspect.getfile(cls)))
    except Exception as exc:  # noqa: BLE001 - Data-Juicer's analysis fails on non-literal arguments
        log.debug("Data-Juicer's requirement analysis of %s failed (%s); using its loaders only", cls.__name__, exc)
        return []


def _class_requirements(cls: type) -> list[str]:
    declared = getattr(cls, "_requirements", None)
    if not declared:
        return []
    from data_juicer.ops.op_env import OPEnvSpec

    return [str(item) for item in OPEnvSpec(pip_pkgs=declared).pip_pkgs or []]


def _requirement_name(requirement: str) -> str | None:
    from packaging.requirements import InvalidRequirement, Requirement

    text = requirement.strip()
    if text.startswith(("git+", "http://", "https://")):
        return text
    try:
        return Requirement(text).name
    except InvalidRequirement:
        return None


def _canonical(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


def _model_types(cls: type, params: dict[str, Any]) -> list[tuple[str, bool]]:
    """The literal model types the class prepares, each with whether it certainly does for
    these arguments."""
    try:
        source = textwrap.dedent(inspect.getsource(cls))
        tree = ast.parse(source)
    except (OSError, TypeError, SyntaxError):
        return []
    arguments = _arguments(cls, params)
    found: dict[str, bool] = {}
    for call, branches in _calls(tree):
        if _callee(call) != "prepare_model":
            continue
        model_type = _literal_model_type(call)
        if model_type is None:
            continue
        verdicts = [_holds(branch, arguments) for branch in branches]
        if False in verdicts:
            continue
        found[model_type] = found.get(model_type, False) or None not in verdicts
    return list(found.items())


def _arguments(cls: type, params: dict[str, Any]) -> dict[str, Any]:
    values: dict[str, Any] = {}
    try:
        for pname, parameter in inspect.signature(cls.__init__).parameters.items():
            if parameter.default is not inspect.Parameter.empty:
                values[pname] = parameter.default
    except (TypeError, ValueError):
        pass
    values.update(params)
    return values


def _literal_model_type(call: ast.Call) -> str | None:
    for keyword in call.keywords:
        if keyword.arg == "model_type" and isinstance(keyword.value, ast.Constant):
            return keyword.value.value if isinstance(keyword.value.value, str) else None
    if call.args and isinstance(call.args[0], ast.Constant) and isinstance(call.args[0].value, str):
        return call.args[0].value
    return None


def _holds(branch: tuple[ast.AST, bool], arguments: dict[str, Any]) -> bool | None:
    """Whether the branch (`if` test, True for its body, False for its else) is taken with these
    arguments; None when that cannot be told from them."""
    node, in_body = branch
    if not isinstance(node, ast.If):
        return None
    value = _evaluate(node.test, arguments)
    if value is None:
        return None
    return bool(value) == in_body


def _evaluate(test: ast.expr, arguments: dict[str, Any]) -> bool | None:
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        inner = _evaluate(test.operand, arguments)
        return None if inner is None else not inner
    name = None
    if isinstance(test, ast.Name):
        name = test.id
    elif isinstance(test, ast.Attribute) and isinstance(test.value, ast.Name) and test.value.id == "self":
        name = test.attr
    if name is None or name not in arguments:
        return None
    return bool(arguments[name])


def _callee(call: ast.Call) -> str:
    func = call.func
    if isinstance(func, ast.Attribute):
        return func.attr
    return func.id if isinstance(func, ast.Name) else ""


def _calls(tree: ast.AST) -> Iterator[tuple[ast.Call, list[tuple[ast.AST, bool]]]]:
    """Every call with the branches (node, in its body) it sits in, outermost first."""
    yield from _walk_branches(tree, [], ast.Call)  # type: ignore[misc]


def _walk_branches(node: ast.AST, branches: list[tuple[ast.AST, bool]], kind: type) -> Iterator[Any]:
    if isinstance(node, kind):
        yield node, branches
    if isinstance(node, ast.If):
        yield from _walk_branches(node.test, branches, kind)
        for child in node.body:
            yield from _walk_branches(child, [*branches, (node, True)], kind)
        for child in node.orelse:
            yield from _walk_branches(child, [*branches, (node, False)], kind)
        return
    for child in ast.iter_child_nodes(node):
        conditional = isinstance(node, _BRANCHES) or (
            isinstance(node, ast.BoolOp) and child is not node.values[0]  # type: ignore[attr-defined]
        )
        inner = [*branches, (node, True)] if conditional else branches
        yield from _walk_branches(child, inner, kind)


# -- model_utils and mm_utils -------------------------------------------------------------------

MEDIA_HELPERS = "data_juicer.utils.mm_utils"


def _helper_loaders(cls: type) -> Iterator[tuple[str, str, bool]]:
    """The loaders of Data-Juicer's media helpers that the operator's module imports by name
    (video_deduplicator's `load_video` reads through PyAV): (module, package, used on every path)."""
    import importlib

    home = sys.modules.get(cls.__module__)
    if home is None:
        return
    helpers = importlib.import_module(MEDIA_HELPERS)
    loaders = _home_loaders(helpers)
    for value in list(vars(home).values()):
        if isinstance(value, types.FunctionType) and value.__module__ == helpers.__name__:
            yield from _function_loaders(helpers, loaders, value, True, set())


@cache
def _model_loaders(model_type: str) -> tuple[tuple[str, str, bool], ...]:
    """(module, package, used on every path) of each loader the model type's prepare function uses."""
    from data_juicer.utils import model_utils

    prepare = getattr(model_utils, "MODEL_FUNCTION_MAPPING", {}).get(model_type)
    if prepare is None:
        return ()
    found: dict[str, tuple[str, str, bool]] = {}
    for module, package, always in _function_loaders(model_utils, _home_loaders(model_utils), prepare, True, set()):
        old = found.get(module)
        found[module] = (module, package, always or bool(old and old[2]))
    return tuple(found.values())


@cache
def _home_loaders(home: types.ModuleType) -> dict[str, tuple[str, str]]:
    try:
        return _declared_loaders(inspect.getsource(home))
    except (OSError, TypeError):
        return {}


def _function_loaders(
    home: types.ModuleType, loaders: dict[str, tuple[str, str]], function: Any, always: bool, visited: set[Any]
) -> Iterator[tuple[str, str, bool]]:
    if (function, always) in visited:
        return
    visited.add((function, always))
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(function)))
    except (OSError, TypeError, SyntaxError):
        return
    (definition,) = tree.body or [None]
    if not isinstance(definition, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return
    for statement in definition.body:
        for name, branches in _walk_branches(statement, [], ast.Name):
            if not isinstance(name.ctx, ast.Load):
                continue
            certain = always and not any(isinstance(node, _NESTED) for node, _ in branches) and not branches
            if name.id in loaders:
                yield (*loaders[name.id], certain)
                continue
            value = vars(home).get(name.id)
            if isinstance(value, types.FunctionType) and value.__module__ == home.__name__:
                yield from _function_loaders(home, loaders, value, certain, visited)
