"""The ground truth for one whole-dataset operator in-process: its own `run` over one Data-Juicer
dataset of the rows (`data_juicer_rows`), with `no_model_cleanup` in effect."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def no_model_cleanup(monkeypatch):
    """The operators' `run` ends with `free_models()`, which imports torch through Data-Juicer's
    lazy loader, which pip-installs torch (GBs) where it is missing: here installs fail instead
    (as in every process of the tool), and there are no models to free."""
    from data_juicer.ops import base_op

    from elastic_sharding.dependencies.guard import forbid_runtime_installs

    forbid_runtime_installs()
    monkeypatch.setattr(base_op, "free_models", lambda *args, **kwargs: None)


def data_juicer_rows(name: str, params: dict, rows: list[dict]) -> list[dict]:
    from data_juicer.core.data import NestedDataset
    from data_juicer.ops import load_ops

    (op,) = load_ops([{name: dict(params)}])
    result = op.run(NestedDataset.from_list([dict(r) for r in rows]))
    return [dict(r) for r in result.to_list()] if not isinstance(result, list) else result
