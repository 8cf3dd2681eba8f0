"""The ground truth for `--analyze`: one `dj-analyze` run of a recipe with Data-Juicer's default
Analyzer, in a child process, exactly as a user runs it (with the recipe's `process` untouched:
the Analyzer itself picks the operators it runs).

The child is `dj_default_run.py`'s: run-time installs forbidden (a recipe whose operators need a
missing package fails loudly), a CPU-only `torch` in place of the lazy one Data-Juicer's model
utilities touch. `dj-analyze` 1.6.1 writes into `<work_dir>/<timestamp>/analysis/`.
"""

from __future__ import annotations

import os
from pathlib import Path

import yaml

from support.dj_default_run import run_dj_child


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
    log = workdir / "dj-analyze.log"
    run_dj_child("analyze_data", "dj-analyze", run_recipe, log, timeout)
    found = sorted((workdir / "work").glob("*/analysis"))  # Data-Juicer 1.6.1 adds a <timestamp>/ level
    if len(found) != 1:
        raise RuntimeError(f"dj-analyze wrote {len(found)} analysis directories under {workdir / 'work'}; log {log}")
    return found[0]
