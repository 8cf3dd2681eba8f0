"""One `dj-analyze` run that never installs anything: `python bench/dj_analyze.py RECIPE`
(Data-Juicer's default `Analyzer`), or `python bench/dj_analyze.py RECIPE NUM_CPUS RAY_TEMP_DIR`
for a recipe with `executor_type: ray` (its `RayAnalyzer`); the `analyze` baselines.

Data-Juicer's own entry point (`dj-analyze`: `data_juicer.tools.analyze_data.main`) runs the
recipe; its analyzer and operators are Data-Juicer's, unchanged. Around it, only what
`dj_default.py` arranges (run-time installs refused, a CPU-only stand-in for the lazy `torch` of
the model clean-up) and, for Ray, what `parquet.py dj-ray` arranges: Data-Juicer's `ray.init`
also gets `num_cpus`, a private `_temp_dir` (so the bench can find and stop the runtime) and no
dashboard (ours starts none either). The test suite's `tests/support/dj_analyze_run.py` does the
same for the default analyzer; the bench does not import tests/ (see `dj_default.py`).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from dj_default import _stand_in

BENCH = Path(__file__).resolve().parent


def _cap_ray(num_cpus: int, temp_dir: str) -> None:
    import ray

    plain_init = ray.init

    def capped_init(*args: Any, **kwargs: Any) -> Any:
        kwargs.setdefault("num_cpus", num_cpus)
        kwargs.setdefault("_temp_dir", temp_dir)
        kwargs.setdefault("include_dashboard", False)
        return plain_init(*args, **kwargs)

    ray.init = capped_init


def main(argv: list[str]) -> int:
    if len(argv) not in (2, 4):
        sys.stderr.write("usage: dj_analyze.py RECIPE [NUM_CPUS RAY_TEMP_DIR]\n")
        return 2
    _stand_in()
    # As plain `dj-analyze` runs: without bench/ (this script's directory) on the path that Ray
    # hands its workers.
    sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != BENCH]
    if len(argv) == 4:
        _cap_ray(int(argv[2]), argv[3])
    from data_juicer.tools.analyze_data import main as dj_main

    sys.argv = ["dj-analyze", "--config", argv[1]]
    result = dj_main()
    return result if isinstance(result, int) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
