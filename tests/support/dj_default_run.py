"""The ground truth for a whole recipe: one `dj-process` run with Data-Juicer's **default** executor.

`dj_default_rows(recipe, dataset, workdir)` runs Data-Juicer's own `dj-process` entry point in a
child process on the recipe as given (its `process` untouched; deduplicators included) with only
the paths replaced, and returns the exported rows, parsed.

Two things are arranged around it, and nothing else:

- The default executor calls `free_models()` after every operator, which touches
  `torch.cuda.empty_cache()` through Data-Juicer's lazy loader, and the lazy loader pip-installs
  torch (6 GB with its CUDA libraries) when it is missing. In the child, the lazy `torch` of
  Data-Juicer's model and resource utilities is a CPU-only stand-in whose `cuda` has no device
  (nothing else sees it), and the lazy loader's installer raises instead of installing
  (`dependencies.guard`, as in every process of the tool): a recipe whose operators need a
  missing package fails loudly.
- `keep_stats_in_res_ds: true`: the default executor drops `__dj__stats__` from its result
  unless told otherwise, while the Ray executor that runs each shard keeps it; with it kept, the
  rows of both executors are comparable field for field.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import orjson
import yaml

CHILD = """
import sys
import types
from elastic_sharding.dependencies.guard import forbid_runtime_installs

forbid_runtime_installs()
from data_juicer.utils import model_utils, resource_utils

cuda = types.SimpleNamespace(is_available=lambda: False, device_count=lambda: 0, empty_cache=lambda: None)
model_utils.torch = resource_utils.torch = types.SimpleNamespace(cuda=cuda)
from data_juicer.tools.{tool} import main
sys.argv = ["{prog}", "--config", sys.argv[1]]
sys.exit(main())
"""


def run_dj_child(tool: str, prog: str, recipe: Path, log: Path, timeout: float) -> None:
    """Run Data-Juicer's `tool` entry point (`process_data`, `analyze_data`) on `recipe` in a child
    arranged as this module's docstring says; its output goes to `log`, a failure raises."""
    env = {key: value for key, value in os.environ.items() if key != "RAY_JOB"}
    script = CHILD.format(tool=tool, prog=prog)
    with open(log, "wb") as out:
        proc = subprocess.run(
            [sys.executable, "-c", script, str(recipe)], env=env, stdout=out, stderr=subprocess.STDOUT, timeout=timeout
        )
    if proc.returncode != 0:
        raise RuntimeError(
            f"the reference {prog} run failed ({proc.returncode}); log {log}:\n{log.read_text(errors='replace')[-3000:]}"
        )


def dj_default_rows(recipe: Path, dataset: Path, workdir: Path, np: int | None = None, timeout: float = 900) -> list[dict]:
    """The rows one default-executor `dj-process` run of `recipe` over `dataset` exports, in order."""
    workdir.mkdir(parents=True, exist_ok=True)
    config = yaml.safe_load(recipe.read_text())
    export = workdir / "reference.jsonl"
    config.update(
        dataset_path=str(dataset),
        export_path=str(export),
        work_dir=str(workdir / "work"),
        executor_type="default",
        keep_stats_in_res_ds=True,
        np=np or os.cpu_count() or 1,
        open_tracer=False,
    )
    config.pop("ray_address", None)
    run_recipe = workdir / "reference-recipe.yaml"
    run_recipe.write_text(yaml.safe_dump(config, sort_keys=False, allow_unicode=True))
    run_dj_child("process_data", "dj-process", run_recipe, workdir / "reference.log", timeout)
    return [orjson.loads(line) for line in export.read_bytes().splitlines() if line.strip()]
