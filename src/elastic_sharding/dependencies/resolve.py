"""Whether the packages a recipe needs are here, which versions, and what to do when one is not.

Nothing is imported to find out (a package's top-level module is located, its distribution's
metadata read), so a check costs milliseconds and cannot run a package's import-time code; and
nothing here imports Data-Juicer, so a worker checks its node before it starts anything.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import re
import shlex
import sys
import tomllib
from collections.abc import Iterable
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from elastic_sharding.errors import MissingPackagesError
from elastic_sharding.records import PackageRecord

DJ_DISTRIBUTION = "py-data-juicer"


@dataclass(frozen=True)
class Found:
    """A needed package as this environment has it (`record.version` None when it is missing)."""

    record: PackageRecord
    present: bool

    @property
    def missing(self) -> bool:
        return not self.present


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def look_up(package: str, module: str | None) -> tuple[bool, str | None, str | None]:
    """(present, distribution, version) of a package, found through its top-level module when
    the operator's declaration names one (an import is what the operator will do), else through
    its distribution name."""
    if module:
        top = module.split(".")[0]
        try:
            present = importlib.util.find_spec(top) is not None
        except (ImportError, ValueError):
            present = False
        if not present:
            return False, None, None
        candidates = _distributions_of(top)
        wanted = canonical(_name_of(package))
        distribution = next((d for d in candidates if canonical(d) == wanted), candidates[0] if candidates else None)
        return True, distribution, _version(distribution) if distribution else None
    name = _name_of(package)
    version = _version(name)
    if version is not None:
        return True, name, version
    try:
        present = importlib.util.find_spec(name.replace("-", "_")) is not None
    except (ImportError, ValueError):
        present = False
    return present, None, None


def check_needs(needs: Iterable[tuple[str, str | None, str, bool]]) -> list[Found]:
    """Each (package, module, operator label, certain), merged by top-level module (else by
    package name), looked up here."""
    groups: dict[str, list[tuple[str, str | None, str, bool]]] = {}
    for need in needs:
        package, module = need[0], need[1]
        groups.setdefault(canonical(module.split(".")[0] if module else _name_of(package)), []).append(need)
    found = []
    for group in groups.values():
        package = group[0][0]
        module = next((m for _, m, _, _ in group if m), None)
        present, distribution, version = look_up(package, module)
        record = PackageRecord(
            package=package,
            module=module,
            distribution=distribution,
            version=version,
            operators=list(dict.fromkeys(operator for _, _, operator, _ in group)),
            required=any(certain for *_, certain in group),
            wanted=pinned_spec(package),
        )
        found.append(Found(record, present))
    return found


def refuse_missing(found: Iterable[Found], where: str) -> None:
    """MissingPackagesError with one line per required package that is not here."""
    lines = [missing_line(item.record, where) for item in found if item.missing and item.record.required]
    if lines:
        lines.append(
            "nothing was prepared; install the packages above, or pass --install-missing to have prepare install them here"
        )
        raise MissingPackagesError("\n".join(lines))


def missing_line(record: PackageRecord, where: str) -> str:
    name = _name_of(record.package)
    imports = f" (import {record.module})" if record.module else ""
    asks = f"Data-Juicer asks for {record.wanted}" if record.wanted != name else "Data-Juicer pins no version of it"
    return (
        f"{where}: {' and '.join(record.operators)} needs the Python package {name}{imports}, which is not installed "
        f"here; {asks}; install it with: {install_command([record.wanted])}"
    )


def install_command(specs: Iterable[str]) -> str:
    return " ".join([shlex.quote(sys.executable), "-m", "pip", "install", *(shlex.quote(s) for s in specs)])


def pinned_spec(package: str) -> str:
    """What Data-Juicer asks for when it installs `package`: the pin of its source checkout's
    uv.lock where it runs from one (its LazyLoader's first choice), else the requirement its
    distribution declares (`Requires-Dist`, any extra), else the bare name; a URL as it is."""
    if "://" in package or package.startswith("git+"):
        return package
    name = _name_of(package)
    if name != package.strip():
        return package.strip()  # already a requirement with a version or marker
    key = canonical(name)
    locked = _checkout_lock().get(key)
    if locked:
        return f"{name}=={locked}"
    return _declared().get(key, name)


@lru_cache(maxsize=1)
def _declared() -> dict[str, str]:
    from packaging.requirements import InvalidRequirement, Requirement

    try:
        requires = importlib.metadata.requires(DJ_DISTRIBUTION) or []
    except importlib.metadata.PackageNotFoundError:
        return {}
    found: dict[str, str] = {}
    for line in requires:
        try:
            requirement = Requirement(line)
        except InvalidRequirement:
            continue
        spec = f"{requirement.name}{requirement.specifier}" if requirement.specifier else requirement.name
        key = canonical(requirement.name)
        if key not in found or (requirement.specifier and found[key] == requirement.name):
            found[key] = spec
    return found


@lru_cache(maxsize=1)
def _checkout_lock() -> dict[str, str]:
    spec = importlib.util.find_spec("data_juicer")
    if spec is None or not spec.origin:
        return {}
    lock = Path(spec.origin).parent.parent / "uv.lock"
    try:
        data = tomllib.loads(lock.read_text())
    except (OSError, tomllib.TOMLDecodeError, UnicodeDecodeError):
        return {}
    return {canonical(p["name"]): p["version"] for p in data.get("package", []) if "name" in p and "version" in p}


def forget_installed() -> None:
    """Look again after an install."""
    _module_owners.cache_clear()


@lru_cache(maxsize=1)
def _module_owners() -> dict[str, list[str]]:
    return importlib.metadata.packages_distributions()


def _distributions_of(top: str) -> list[str]:
    return sorted(set(_module_owners().get(top, [])))


def _version(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def _name_of(package: str) -> str:
    """The distribution name in a requirement or a git URL (`.../recognize-anything.git@sha`)."""
    text = package.strip()
    if "://" in text or text.startswith("git+"):
        if " @ " in text:
            return text.split(" @ ", 1)[0].strip()
        tail = text.rstrip("/").rsplit("/", 1)[-1]
        return tail.split("@", 1)[0].removesuffix(".git")
    match = re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", text)
    return match.group(0) if match else text
