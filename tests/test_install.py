"""The install page (docs/guides/install.md) and its image recipe (deploy/Dockerfile) do what they say.

There is no Docker here, so the test builds the Python part of the image: it copies what the
Dockerfile's COPY lines copy into a fresh build context, builds this package's wheel there as pip
does for the Dockerfile's `.` (`pip wheel`, this package only), checks the wheel (every file of the
package, the package data, the console script, the pins), and resolves the Dockerfile's own pip
line against that wheel in this environment, where scripts/setup installed every pinned
dependency: `--dry-run --no-index`, so it needs no index, changes nothing, and succeeds only if
constraints.txt, the extra and the package's pins agree. A constraint that contradicts a pin must
make that same line fail.

The page must show the Dockerfile's pip line token for token, and name the Python, Ray and
Data-Juicer versions pyproject.toml pins (read from it: a version bump fails here until the page
says the new one). The DLC and MPIJob guides must run their launcher with the interpreter the
page installs into, never a bare `python`. Nothing is written into the repository.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path, PurePosixPath

import pytest

REPO = Path(__file__).resolve().parents[1]
DOCKERFILE = REPO / "deploy" / "Dockerfile"
PAGE = REPO / "docs" / "guides" / "install.md"
ZH_PAGE = REPO / "docs" / "zh" / "guides" / "install.md"
GUIDES = [REPO / "docs" / "guides" / name for name in ("dlc.md", "mpi.md")]
GUIDES += [REPO / "docs" / "zh" / "guides" / name for name in ("dlc.md", "mpi.md")]
PACKAGE = "elastic_sharding"
EXTRA = "text-ops"
BASH_BLOCK = re.compile(r"^```bash\n(.*?)^```", flags=re.S | re.M)


def _pyproject() -> dict:
    return tomllib.loads((REPO / "pyproject.toml").read_text())


def _pin(name: str) -> str:
    for requirement in _pyproject()["project"]["dependencies"]:
        found = re.fullmatch(rf"{re.escape(name)}==(\S+)", requirement.strip())
        if found:
            return found.group(1)
    raise AssertionError(f"pyproject.toml does not pin {name} with ==")


def _python() -> str:
    """The one minor version `requires-python` allows (">=3.11,<3.12" -> "3.11")."""
    spec = _pyproject()["project"]["requires-python"]
    found = re.fullmatch(r">=(\d+)\.(\d+),<(\d+)\.(\d+)", spec.replace(" ", ""))
    assert found, f"requires-python {spec!r} is not one minor version: update this test and the install page"
    major, minor, upper_major, upper_minor = map(int, found.groups())
    assert (upper_major, upper_minor) == (major, minor + 1), f"requires-python {spec!r} allows more than one minor version"
    return f"{major}.{minor}"


def _logical_lines(text: str) -> list[str]:
    """Shell or Dockerfile text with backslash continuations joined and comment lines dropped."""
    lines = [line for line in text.splitlines() if not line.lstrip().startswith("#")]
    return [line.strip() for line in "\n".join(lines).replace("\\\n", " ").splitlines() if line.strip()]


def _instructions() -> list[tuple[str, str]]:
    """The Dockerfile's instructions as (KEYWORD, arguments)."""
    found = []
    for line in _logical_lines(DOCKERFILE.read_text()):
        keyword, _, rest = line.partition(" ")
        found.append((keyword.upper(), rest.strip()))
    return found


def _pip_install_args(command: str) -> tuple[str, list[str]]:
    """`<python> -m pip install ARGS` -> (<python>, ARGS)."""
    tokens = shlex.split(command)
    at = next((i for i in range(len(tokens) - 2) if tokens[i : i + 3] == ["-m", "pip", "install"]), None)
    assert at == 1, f"not `<python> -m pip install ...`: {command}"
    return tokens[0], tokens[at + 3 :]


def _dockerfile_install() -> tuple[str, list[str]]:
    commands = [
        part.strip()
        for keyword, rest in _instructions()
        if keyword == "RUN"
        for part in rest.split("&&")
        if "pip install" in part
    ]
    assert len(commands) == 1, f"deploy/Dockerfile should install with one pip line, found {commands}"
    return _pip_install_args(commands[0])


def _page_commands(path: Path) -> list[str]:
    return [
        part.strip()
        for block in BASH_BLOCK.findall(path.read_text())
        for line in _logical_lines(block)
        for part in line.split("&&")
    ]


def _page_install() -> tuple[str, list[str]]:
    """The page's pip line that installs this package (its target is the checkout, `.`)."""
    found = [
        _pip_install_args(command)
        for command in _page_commands(PAGE)
        if "-m pip install" in command and any(arg.startswith(".") for arg in shlex.split(command))
    ]
    assert len(found) == 1, f"{PAGE.name} should show one pip line that installs the checkout, found {found}"
    return found[0]


def _venv() -> str:
    """The virtual environment the Dockerfile creates (and puts first on PATH)."""
    for keyword, rest in _instructions():
        found = re.fullmatch(r"python(\d+\.\d+) -m venv (\S+)", rest) if keyword == "RUN" else None
        if found:
            assert found.group(1) == _python(), f"the Dockerfile's venv is made with Python {found.group(1)}"
            return found.group(2)
    raise AssertionError("deploy/Dockerfile creates no virtual environment")


def test_the_dockerfile_and_the_page_install_the_same_way():
    docker_python, docker_args = _dockerfile_install()
    page_python, page_args = _page_install()
    assert page_args == docker_args, "docs/guides/install.md and deploy/Dockerfile must show the same pip line"
    venv = _venv()
    assert docker_python == "python", "the Dockerfile's pip line runs the venv's python, first on PATH"
    assert page_python == f"{venv}/bin/python", "the page installs into the Dockerfile's venv path"
    env = " ".join(rest for keyword, rest in _instructions() if keyword == "ENV")
    assert f"PATH={venv}/bin:$PATH" in env, "the Dockerfile puts the venv's bin first on PATH"
    assert f"python{_python()} -m venv {venv}" in _page_commands(PAGE), "the page creates the venv with Python 3.x"
    # The pins, and the extra of the published text recipes, come with the line.
    assert docker_args[docker_args.index("-c") + 1] == "constraints.txt"
    targets = [arg for arg in docker_args if arg.startswith(".")]
    assert targets == [f".[{EXTRA}]"]


def test_the_dockerfile_builds_on_the_pinned_python_with_a_compiler_for_kenlm():
    base = next(rest for keyword, rest in _instructions() if keyword == "ARG" and rest.startswith("BASE_IMAGE="))
    assert base.startswith(f"BASE_IMAGE=python:{_python()}-"), base
    assert ("FROM", "${BASE_IMAGE}") in _instructions()
    extra = _pyproject()["project"]["optional-dependencies"][EXTRA]
    assert any(requirement.startswith("kenlm==") for requirement in extra)
    apt = " ".join(rest for keyword, rest in _instructions() if keyword == "RUN" and "apt-get install" in rest)
    assert "build-essential" in apt.split(), "kenlm has only an sdist: the image needs a C++ compiler and make"


@pytest.mark.parametrize("page", [PAGE, ZH_PAGE], ids=lambda path: str(path.relative_to(REPO)))
def test_the_page_names_the_pinned_versions(page):
    text = page.read_text()
    python, ray, data_juicer = _python(), _pin("ray"), _pin("py-data-juicer")
    assert f"Python {python}" in text
    assert f"Ray {ray}" in text
    assert f"Data-Juicer {data_juicer}" in text
    assert set(re.findall(r"Python (\d+\.\d+)", text)) == {python}, "the page names another Python"
    assert set(re.findall(r"\bRay (\d+(?:\.\d+)+)", text)) == {ray}, "the page names another Ray"
    assert set(re.findall(r"Data-Juicer (\d+(?:\.\d+)+)", text)) == {data_juicer}, "the page names another Data-Juicer"
    assert set(re.findall(r"\bray==(\S+?)`", text)) <= {ray}
    assert set(re.findall(r"py-data-juicer==(\S+?)`", text)) <= {data_juicer}
    for requirement in _pyproject()["project"]["optional-dependencies"][EXTRA]:
        assert requirement.split("==")[0] in text, f"the page does not name {requirement} of the {EXTRA} extra"


@pytest.mark.parametrize("guide", GUIDES, ids=lambda path: str(path.relative_to(REPO)))
def test_the_guides_call_the_python_the_page_installs_into(guide):
    python = f"{_venv()}/bin/python"
    launches = [command for command in _page_commands(guide) if "dlc_job.py" in command]
    assert launches, f"{guide.name} shows no dlc_job.py command"
    for command in launches:
        tokens = [token for token in shlex.split(command) if not re.fullmatch(r"[A-Z_]+=\S*", token)]
        assert tokens[0] == python, f"{guide.name}: {command!r} does not run {python}"
    assert "install.md" in guide.read_text(), f"{guide.name} does not link the install page"


# ---- the Python part of the image, built and resolved -----------------------------------------


def _copy_context(context: Path) -> None:
    """What the Dockerfile's COPY lines put in the WORKDIR its pip line runs in, from a clean
    checkout's files (no caches, no egg-info)."""
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info")
    workdir, copied_in, installed_in = "/", set(), None
    for keyword, rest in _instructions():
        if keyword == "WORKDIR":
            workdir = rest
        if keyword == "RUN" and "pip install" in rest:
            installed_in = workdir
        if keyword != "COPY":
            continue
        copied_in.add(workdir)
        *sources, dest = shlex.split(rest)
        assert not any(source.startswith("--") for source in sources), "COPY options are not modelled here"
        target = context / PurePosixPath(dest)
        for source in sources:
            origin = REPO / source
            assert origin.exists(), f"deploy/Dockerfile copies {source}, which the repository does not have"
            if origin.is_dir():
                into = target if len(sources) == 1 else target / origin.name
                shutil.copytree(origin, into, ignore=ignore)
            else:
                into = target / origin.name if dest.endswith("/") or len(sources) > 1 else target
                into.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(origin, into)
    assert copied_in == {installed_in}, "the COPY lines and the pip line should share one WORKDIR"


def _pip(*args: str, cwd: Path, offline: bool) -> subprocess.CompletedProcess:
    env = dict(os.environ, PIP_DISABLE_PIP_VERSION_CHECK="1")
    if offline:  # only this environment: no index, no find-links, no pip configuration
        env = {key: value for key, value in env.items() if not key.startswith("PIP_")}
        env["PIP_CONFIG_FILE"] = os.devnull
    return subprocess.run([sys.executable, "-m", "pip", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> tuple[Path, Path]:
    """(the build context, the wheel pip builds there)."""
    context = tmp_path_factory.mktemp("context")
    _copy_context(context)
    dist = tmp_path_factory.mktemp("dist")
    result = _pip("wheel", "--no-deps", "-w", str(dist), ".", cwd=context, offline=False)
    unreachable = re.search(r"No matching distribution found for (setuptools|wheel)", result.stdout + result.stderr)
    if result.returncode != 0 and unreachable:
        pytest.skip("building the wheel needs setuptools and wheel from an index or pip's cache, and neither answered")
    assert result.returncode == 0, result.stdout + result.stderr
    wheels = list(dist.glob("*.whl"))
    assert len(wheels) == 1, wheels
    return context, wheels[0]


def test_the_wheel_holds_the_whole_package_its_data_and_the_command(built):
    _, wheel = built
    project = _pyproject()["project"]
    assert wheel.name == f"{PACKAGE}-{project['version']}-py3-none-any.whl"
    source = REPO / "src" / PACKAGE
    expected = {
        str(PurePosixPath(PACKAGE, *path.relative_to(source).parts))
        for path in source.rglob("*")
        if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc"
    }
    assets = {name for name in expected if "/observe/assets/" in name}
    assert assets, "src/elastic_sharding/observe/assets/ is empty"
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        info = f"{PACKAGE}-{project['version']}.dist-info"
        entry_points = archive.read(f"{info}/entry_points.txt").decode()
        metadata = archive.read(f"{info}/METADATA").decode()
    assert expected - names == set(), "the wheel lacks files of the package (a folder without __init__.py? package data?)"
    for name, target in project["scripts"].items():
        assert re.search(rf"^{re.escape(name)} = {re.escape(target)}$", entry_points, flags=re.M), entry_points
    requires = set(re.findall(r"^Requires-Dist: (.+)$", metadata, flags=re.M))
    assert f"ray=={_pin('ray')}" in requires
    assert f"py-data-juicer=={_pin('py-data-juicer')}" in requires
    assert any(line.startswith("kenlm==") and f'extra == "{EXTRA}"' in line for line in requires), requires
    requires_python = re.search(r"^Requires-Python: (.+)$", metadata, flags=re.M)
    assert requires_python, "the wheel does not say which Python it needs"

    def specifiers(spec: str) -> set[str]:
        return set(spec.replace(" ", "").split(","))

    assert specifiers(requires_python.group(1)) == specifiers(project["requires-python"])


def _dry_run(context: Path, wheel: Path, report: Path) -> subprocess.CompletedProcess:
    """The Dockerfile's pip line, with the wheel pip builds from `.` in place of `.`, resolved only."""
    _, args = _dockerfile_install()
    args = [str(wheel) + arg[1:] if arg.startswith(".") else arg for arg in args]
    return _pip("install", "--dry-run", "--no-index", "--quiet", "--report", str(report), *args, cwd=context, offline=True)


def test_the_dockerfiles_pip_line_resolves_with_the_constraints_and_the_extra(built, tmp_path):
    context, wheel = built
    report = tmp_path / "report.json"
    result = _dry_run(context, wheel, report)
    assert result.returncode == 0, result.stdout + result.stderr
    install = json.loads(report.read_text())["install"]
    # Every dependency, the extra's included, is already here at the pinned version: pip would
    # install this package and nothing else.
    assert [(item["metadata"]["name"], item.get("requested_extras")) for item in install] == [("elastic-sharding", [EXTRA])]
    assert install[0]["metadata"]["version"] == _pyproject()["project"]["version"]


def test_a_constraint_against_a_pin_fails_that_line(built, tmp_path):
    """The resolution above is a real check: the same line with Ray constrained elsewhere fails."""
    context, wheel = built
    contradicting = tmp_path / "context"
    shutil.copytree(context, contradicting)
    constraints = contradicting / "constraints.txt"
    text, count = re.subn(r"(?m)^ray==.*$", "ray==0.0.1", constraints.read_text())
    assert count == 1, "constraints.txt does not pin ray"
    constraints.write_text(text)
    result = _dry_run(contradicting, wheel, tmp_path / "report.json")
    assert result.returncode != 0
    assert "ResolutionImpossible" in result.stdout + result.stderr or "conflict" in result.stdout + result.stderr


def test_a_demo_script_run_from_a_checkout_finds_its_demo_recipe_when_the_package_is_installed_elsewhere(tmp_path, monkeypatch):
    """In an image the package lives in site-packages, away from any checkout: `dlc_job.py` run
    from a checkout still defaults to that checkout's demo recipe (it names its checkout), and
    with no checkout named the refusal says where it looked."""
    import elastic_sharding.prepare.recipe as recipe
    from elastic_sharding.errors import UsageError

    monkeypatch.setattr(recipe, "PROJECT_ROOT", tmp_path / "site-packages")
    monkeypatch.delenv(recipe.CHECKOUT_ENV, raising=False)
    with pytest.raises(UsageError, match=r"no --config given and the bundled demo recipe .* is in no checkout here"):
        recipe.recipe_and_base(None)
    monkeypatch.setenv(recipe.CHECKOUT_ENV, str(REPO))
    assert recipe.recipe_and_base(None) == (REPO / "demos" / "elastic_sharding" / "configs" / "demo.yaml", REPO)
    script = subprocess.run(
        [
            sys.executable,
            "-c",
            "import runpy, os, sys; sys.argv = ['dlc_job.py', '--help'];"
            f"runpy.run_path({str(REPO / 'demos/elastic_sharding/dlc_job.py')!r}, run_name='not_main');"
            "print(os.environ['ELASTIC_SHARD_CHECKOUT'])",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env={**{k: v for k, v in os.environ.items() if k != recipe.CHECKOUT_ENV}, "PYTHONPATH": str(REPO / "src")},
    )
    assert script.returncode == 0 and script.stdout.strip() == str(REPO), script.stderr
