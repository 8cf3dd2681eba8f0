"""The ground truth for `--analyze`: one `dj-analyze` run of a recipe with Data-Juicer's default
Analyzer, in a child process, exactly as a user runs it (with the recipe's `process` untouched:
the Analyzer itself picks the operators it runs).

As in `dj_default_run.py`, the child forbids run-time installs (a recipe whose operators need a
missing package fails loudly) and stands a CPU-only `torch` in for the lazy one Data-Juicer's
model utilities touch. `dj-analyze` 1.6.1 writes into `<work_dir>/<timestamp>/analysis/`.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import yaml

CHILD = """
import sys
import types
from elastic_sharding.dependencies.guard import forbid_runtime_installs

forbid_runtime_installs()
from data_juicer.utils import model_utils, resource_utils

cuda = types.SimpleNamespace(is_available=lambda: False, device_count=lambda: 0, empty_cache=lambda: None)
model_utils.torch = resource_utils.torch = types.SimpleNamespace(cuda=cuda)
from data_juicer.tools.analyze_data import main
sys.argv = ["dj-analyze", "--config", sys.argv[1]]
sys.exit(main())
"""


def dj_analyze(
    recipe: Path,
    dataset: Path,
    workdir: Path,
    np: int | None = None,
    percentiles: list[float] | None = None,
    timeout: float = 900,
) -> Path:
    """Run `dj-analyze` on `recipe` over `dataset`; its analysis directory (with `overall.csv`)."""
    workdir.mkdir(parents=True, exist_ok=True)
    config = yaml.safe_load(recipe.read_text())
    config.update(
        dataset_path=str(dataset),
        export_path=str(workdir / "export" / "reference.jsonl"),
        work_dir=str(workdir / "work"),
        executor_type="default",
        np=np or os.cpu_count() or 1,
        open_tracer=False,
    )
    if percentiles is not None:
        config["percentiles"] = percentiles
    config.pop("ray_address", None)
    run_recipe = workdir / "reference-recipe.yaml"
    run_recipe.write_text(yaml.safe_dump(config, sort_keys=False, allow_unicode=True))
    env = {key: value for key, value in os.environ.items() if key != "RAY_JOB"}
    log = workdir / "dj-analyze.log"
    with open(log, "wb") as out:
        proc = subprocess.run(
            [sys.executable, "-c", CHILD, str(run_recipe)], env=env, stdout=out, stderr=subprocess.STDOUT, timeout=timeout
        )
    if proc.returncode != 0:
        raise RuntimeError(f"dj-analyze failed ({proc.returncode}); log {log}:\n{log.read_text(errors='replace')[-3000:]}")
    found = sorted((workdir / "work").glob("*/analysis"))  # Data-Juicer 1.6.1 adds a <timestamp>/ level
    if len(found) != 1:
        raise RuntimeError(f"dj-analyze wrote {len(found)} analysis directories under {workdir / 'work'}; log {log}")
    return found[0]
