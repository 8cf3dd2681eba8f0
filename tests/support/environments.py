"""Python environments for the dependency tests: what one holds, and a second "node environment".

`overlay_env(dir)` makes a virtual environment that sees every package of the project's own
(`.venv`, after its own) and installs into itself only: a node whose environment has one more
package than the project's, without ever touching the project's environment.
"""

from __future__ import annotations

import json
import subprocess
import sys
import sysconfig
from pathlib import Path

LIST_DISTRIBUTIONS = (
    "import importlib.metadata as m, json, sys; "
    "json.dump(sorted({(d.metadata['Name'] or '').lower() + '==' + d.version for d in m.distributions()}), sys.stdout)"
)


def distributions(python: str = sys.executable) -> list[str]:
    """Every distribution the interpreter `python` can import, as name==version."""
    out = subprocess.run([python, "-c", LIST_DISTRIBUTIONS], capture_output=True, text=True, check=True, timeout=120)
    return json.loads(out.stdout)


def site_packages(root: Path) -> Path:
    return root / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"


def overlay_env(root: Path) -> Path:
    """A venv at `root` layered over this interpreter's environment; returns its python."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True, timeout=120)
    project_site = sysconfig.get_paths()["purelib"]
    (site_packages(root) / "zz_project_environment.pth").write_text(f"import site; site.addsitedir({project_site!r})\n")
    return root / "bin" / "python"
