"""Data-Juicer's run-time installs, switched off in every process of ours that runs its code.

Data-Juicer's `LazyLoader` installs a missing operator dependency from PyPI (uv, else pip) the
first time the operator touches it; it has no switch for that. Every install path of it goes
through one classmethod, `LazyLoader._install_package`, so that one method is replaced with one
that raises an ImportError naming the module, the operator and the command to install it: the
loader's own import attempt, and everything else of Data-Juicer's code path, stay as they are.

This module imports nothing but the standard library: Ray imports it at the start of every
worker process (`RAY_SETUP_HOOK`), where Data-Juicer may never be needed, so the replacement is
made when Data-Juicer's loader module is imported, not by importing it here.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import shlex
import sys
import traceback
from types import ModuleType
from typing import Any

LOADER_MODULE = "data_juicer.utils.lazy_loader"
RAY_SETUP_HOOK = f"{__name__}.forbid_runtime_installs"
_MARK = "_elastic_sharding_refuses_installs"


def forbid_runtime_installs() -> None:
    """From now on no Data-Juicer operator in this process installs a package (idempotent)."""
    loaded = sys.modules.get(LOADER_MODULE)
    if loaded is not None:
        _refuse_in(loaded)
        return
    if not any(isinstance(finder, _PatchOnImport) for finder in sys.meta_path):
        sys.meta_path.insert(0, _PatchOnImport())


def _refuse_in(module: ModuleType) -> None:
    loader_class = getattr(module, "LazyLoader", None)
    if loader_class is None or getattr(loader_class, _MARK, False):
        return
    loader_class._install_package = classmethod(_refuse_install)
    setattr(loader_class, _MARK, True)


def _refuse_install(cls: Any, package_spec: str, pip_args: Any = None) -> bool:
    operator = _operator_on_stack()
    who = f"operator {operator}" if operator else "a Data-Juicer operator"
    try:
        from elastic_sharding.dependencies.resolve import pinned_spec

        wanted = pinned_spec(str(package_spec))
    except Exception:  # noqa: BLE001 - the message must be raised whatever the metadata holds
        wanted = str(package_spec)
    command = f"{shlex.quote(sys.executable)} -m pip install {shlex.quote(wanted)}"
    raise ImportError(
        f"{who} needs the Python package {package_spec!r}, which is not installed on this node "
        f"({os.uname().nodename}), and elastic-sharding never installs packages while a job runs; "
        f"install it on every node ({command}) and retry the job"
    )


def _operator_on_stack() -> str | None:
    """The operator whose code asked for the package: the innermost method of an operator object
    (custom operators included), else the innermost module under data_juicer/ops/<kind>/, whose
    file name is the operator's name."""
    base_op = sys.modules.get("data_juicer.ops.base_op")
    op_class = getattr(base_op, "OP", None)
    frame = sys._getframe(1)
    while op_class is not None and frame is not None:
        owner = frame.f_locals.get("self")
        if isinstance(owner, op_class) and isinstance(getattr(owner, "_name", None), str):
            return owner._name
        frame = frame.f_back
    for frame in reversed(traceback.extract_stack()):
        parts = frame.filename.replace(os.sep, "/").rsplit("/", 4)
        if len(parts) == 5 and parts[1:3] == ["data_juicer", "ops"] and parts[4].endswith(".py"):
            name = parts[4][: -len(".py")]
            if not name.startswith("_") and parts[3] != "common":
                return name
    return None


class _PatchOnImport(importlib.abc.MetaPathFinder):
    """Makes the replacement right after Data-Juicer's loader module is executed."""

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if fullname != LOADER_MODULE:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        original = spec.loader

        class _Then(importlib.abc.Loader):
            def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
                return original.create_module(spec)

            def exec_module(self, module: ModuleType) -> None:
                original.exec_module(module)
                _refuse_in(module)

        spec.loader = _Then()
        return spec
