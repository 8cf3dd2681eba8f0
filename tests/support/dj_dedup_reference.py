"""The ground truth for the distributed deduplicators: which rows one Data-Juicer default-executor
run of a deduplicator keeps, computed by Data-Juicer's own operator code.

`dj_kept(op_name, op_args, rows)` builds the operator through Data-Juicer's registry (`load_ops`, as
the default executor does), makes a `NestedDataset` of the rows and does what
`Deduplicator.run` (`data_juicer/ops/base_op.py`) does, without calling it:

- `OP.run` (its `super().run`): wrap the dataset in a `NestedDataset`; add `Fields.meta` for a
  tagging operator and `index_key` when the operator has one (a deduplicator is never a Filter, so
  no `Fields.stats`);
- `dataset.map(op.compute_hash, ...)`: `NestedDataset.map` turns it into a batched map of batch
  size 1 through the operator's fault-tolerance wrapper, as in the executor;
- `op.process(dataset, show_num=0)` (no tracer), whose filter walks the rows in order in this
  process, with the closure's "seen" sets.

The maps run in this process (`num_proc=None`) where the executor passes `runtime_np()`: that
starts Ray when the environment has `RAY_JOB=1` (a Ray test in the same process may set it), and
`datasets` starts a worker pool for any `num_proc >= 1`, even 1 (about 2 ms a row here). The
hashes are per row, so the process count changes nothing.

Not `Deduplicator.run` itself nor `free_models()`: `free_models` touches torch through Data-Juicer's
lazy loader, which pip-installs a missing module at run time. Nothing may be installed: simhash and
scipy (the lazy imports of the simhash and minhash operators) must import when this module is
imported, and every call runs with the lazy loader's installer replaced by one that raises.

The row positions come back through an extra integer column, `REF_INDEX`, that no operator reads.
The dataset is built in memory (it has no cache files, so `filter(..., load_from_cache_file=True)`
has nothing to reuse) and Hugging Face caching is off during the call, so one call can never see
another's results.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

try:
    import scipy.integrate  # noqa: F401  document_minhash_deduplicator: LazyLoader("scipy.integrate")
    import simhash  # document_simhash_deduplicator: LazyLoader("simhash", "simhash-pybind")
except ImportError as exc:  # pragma: no cover - the environment is broken
    raise ImportError(
        f"the Data-Juicer dedup reference needs simhash-pybind and scipy installed in this environment ({exc}); "
        "Data-Juicer would pip-install them at run time, which the tests never allow"
    ) from exc
if not all(hasattr(simhash, name) for name in ("compute", "find_all", "unsigned_hash")):  # pragma: no cover
    raise ImportError(f"`simhash` at {getattr(simhash, '__file__', '?')} is not simhash-pybind")

import datasets
from data_juicer.core.data import NestedDataset, add_same_content_to_new_column
from data_juicer.ops import load_ops
from data_juicer.ops.base_op import TAGGING_OPS, Deduplicator, Filter
from data_juicer.utils.constant import Fields
from data_juicer.utils.lazy_loader import LazyLoader

REF_INDEX = "__ref_index"
TEXT_DEDUPLICATORS = ("document_deduplicator", "document_simhash_deduplicator", "document_minhash_deduplicator")


class InstallAttempted(RuntimeError):
    """Data-Juicer tried to install a package while the reference ran."""


def _refuse_install(*args, **kwargs):
    raise InstallAttempted(f"Data-Juicer tried to install a package during a reference run: {args} {kwargs}")


@contextmanager
def _sealed() -> Iterator[None]:
    """No package installs, no Hugging Face caching and no progress bars, for the call only."""
    saved_install = LazyLoader.__dict__["_install_package"]
    saved_check = LazyLoader.__dict__["check_packages"]
    caching = datasets.is_caching_enabled()
    bars = datasets.is_progress_bar_enabled()
    LazyLoader._install_package = staticmethod(_refuse_install)
    LazyLoader.check_packages = staticmethod(_refuse_install)
    datasets.disable_caching()
    datasets.disable_progress_bars()
    try:
        yield
    finally:
        LazyLoader._install_package = saved_install
        LazyLoader.check_packages = saved_check
        if caching:
            datasets.enable_caching()
        if bars:
            datasets.enable_progress_bars()


def build_op(op_name: str, op_args: dict) -> Deduplicator:
    """The operator as the default executor builds it: `load_ops([{op_name: op_args}])`."""
    with _sealed():
        (op,) = load_ops([{op_name: dict(op_args)}])
    if not isinstance(op, Deduplicator):
        raise ValueError(f"{op_name} is not a Data-Juicer Deduplicator")
    if isinstance(op, Filter) or op.use_cuda():
        raise ValueError(f"{op_name}: the reference drives CPU deduplicators only")
    return op


def _op_run_prelude(op: Deduplicator, dataset: NestedDataset) -> NestedDataset:
    """What `OP.run` does to the dataset before a deduplicator hashes it (in this process)."""
    if op._name in TAGGING_OPS.modules and Fields.meta not in dataset.features:
        dataset = dataset.map(
            add_same_content_to_new_column,
            fn_kwargs={"new_column_name": Fields.meta, "initial_value": {}},
            batch_size=op.batch_size,
            desc="Adding new column for meta",
        )
    if op.index_key is not None and op.index_key not in dataset.features:

        def add_index(sample, idx):
            sample[op.index_key] = idx
            return sample

        dataset = dataset.map(add_index, with_indices=True)
    return dataset


def dj_kept(op_name: str, op_args: dict, rows: list[dict]) -> list[int]:
    """The 0-based positions in `rows`, ascending, of the rows that Data-Juicer's `op_name`, built with
    `op_args`, keeps in one default-executor run over exactly these rows in this order."""
    if not rows:
        return []
    if any(REF_INDEX in row for row in rows):
        raise ValueError(f"rows must not have the reference's own column {REF_INDEX}")
    with _sealed():
        op = build_op(op_name, op_args)
        if any(row.get(op.text_key) is None for row in rows):
            # Data-Juicer's loader (format/formatter.py unify_format) drops such rows before any operator
            raise ValueError(f"every row needs a string {op.text_key!r}: the executor drops rows whose text is null at load")
        dataset = NestedDataset.from_list([{**row, REF_INDEX: i} for i, row in enumerate(rows)])
        dataset = _op_run_prelude(op, dataset)
        hashed = dataset.map(op.compute_hash, num_proc=None, with_rank=False, desc=op._name + "_compute_hash")
        kept, _ = op.process(hashed, show_num=0)
        assert not kept.cache_files, "the reference dataset must stay in memory (no cache files to reuse)"
        indices = list(kept[REF_INDEX])
    assert indices == sorted(set(indices)), "a deduplicator keeps rows in their order, each once"
    return indices


def dj_hashes(op_name: str, op_args: dict, texts: list[str]) -> list:
    """The hash value Data-Juicer's `op_name` computes for each text, by calling the operator's own
    `compute_hash` on a plain sample (`HashKeys.hash`, `.simhash` or `.minhash`, whichever it sets)."""
    op = build_op(op_name, op_args)
    with _sealed():
        before = {op.text_key}
        values = []
        for text in texts:
            sample = op.compute_hash({op.text_key: text})
            (key,) = set(sample) - before
            values.append(sample[key])
    return values
