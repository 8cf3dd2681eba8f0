"""One `dj-process` run with Data-Juicer's **default** executor that never installs anything:
`python bench/dj_default.py RECIPE` (the `dedup` baselines).

Data-Juicer's own entry point (`data_juicer.tools.process_data.main`) runs the recipe; its
executor and operators are Data-Juicer's, unchanged. Two things are arranged around it, and
nothing else:

- The default executor calls `free_models()` after every operator, which touches
  `torch.cuda.empty_cache()` through Data-Juicer's lazy loader, and the lazy loader pip-installs
  torch (6 GB with its CUDA libraries) into the environment when it is missing. Here the lazy
  `torch` of Data-Juicer's model and resource utilities is a CPU-only stand-in whose `cuda` has
  no device (nothing else sees it; none of the bench's recipes uses a model), and the lazy
  loader's installer raises instead of installing: a recipe whose operators need a missing
  package fails loudly.
- Nothing else: the recipe is run as written.

The test suite has the same technique in tests/support/dj_default_run.py; the bench does not
import tests/ (a bench must run from any checkout of bench/, and tests/ helpers may change
for the tests' own needs), so this is its own small copy.
"""

from __future__ import annotations

import sys
import types


def _stand_in() -> None:
    from elastic_sharding.dependencies.guard import forbid_runtime_installs

    forbid_runtime_installs()
    from data_juicer.utils import model_utils, resource_utils

    cuda = types.SimpleNamespace(is_available=lambda: False, device_count=lambda: 0, empty_cache=lambda: None)
    model_utils.torch = resource_utils.torch = types.SimpleNamespace(cuda=cuda)


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        sys.stderr.write("usage: dj_default.py RECIPE\n")
        return 2
    _stand_in()
    from data_juicer.tools.process_data import main as dj_main

    sys.argv = ["dj-process", "--config", argv[1]]
    result = dj_main()
    return result if isinstance(result, int) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
