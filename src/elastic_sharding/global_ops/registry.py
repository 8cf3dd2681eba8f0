"""Which whole-dataset operators are stages here, and which are refused and why."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from elastic_sharding.errors import RecipeError
from elastic_sharding.global_ops.groupers import KeyValueGrouper, PerGroupAggregator, ReverseGrouper
from elastic_sharding.global_ops.line_dedup import LineDedup
from elastic_sharding.global_ops.operators import GlobalOp
from elastic_sharding.global_ops.selectors import FrequencySelector, RandomSelector, RankSelector, TagsSelector

STAGES: dict[str, type[GlobalOp]] = {
    "document_line_deduplicator": LineDedup,
    "topk_specified_field_selector": RankSelector,
    "range_specified_field_selector": RankSelector,
    "frequency_specified_field_selector": FrequencySelector,
    "tags_specified_field_selector": TagsSelector,
    "random_selector": RandomSelector,
    "key_value_grouper": KeyValueGrouper,
    "naive_reverse_grouper": ReverseGrouper,
}

# Refused by name: what makes each impossible to run across shards with one machine's result.
REFUSED = {
    "naive_grouper": (
        "puts the whole dataset into one row, which no shard (and no node's memory, at the sizes this tool is for) can "
        "hold; group by a key with key_value_grouper, or run it on the merged output"
    ),
    "image_ohem_selector": (
        "scores every row with a model loaded from a user's score_file inside its own process, outside any "
        "executor; compute the loss per row with a Mapper or Filter that writes it into __dj__stats__, then keep the "
        "highest with topk_specified_field_selector (the same rows in the same order: heapq.nlargest over the loss)"
    ),
    "document_minhash_deduplicator_with_uid": (
        "keeps rows by a __dj__uid column that the Data-Juicer run assigns over the whole dataset; use "
        "document_minhash_deduplicator, which keeps the same rows and runs across all shards"
    ),
    "ray_bts_minhash_deduplicator_with_uid": (
        "is a Ray-only deduplicator that keeps whichever duplicate reaches its shared state first and needs a "
        "__dj__uid column; use document_minhash_deduplicator in its place: the same rule, deterministic, run here "
        "across all shards"
    ),
}


def is_aggregator(cls: type) -> bool:
    from data_juicer.ops.base_op import Aggregator

    return issubclass(cls, Aggregator)


def is_stage(name: str, cls: type | None = None) -> bool:
    """Whether the operator `name` (class `cls` in Data-Juicer's registry) runs as a stage here."""
    if name in STAGES:
        return True
    if cls is None:
        from data_juicer.ops import OPERATORS

        cls = OPERATORS.modules.get(name)
    return cls is not None and is_aggregator(cls)


def check_params(name: str, params: dict[str, Any]) -> None:
    """What prepare refuses in an operator's arguments before the job exists."""
    if name == "naive_reverse_grouper" and params.get("batch_meta_export_path"):
        raise RecipeError(
            "naive_reverse_grouper: batch_meta_export_path writes one file from one process; across shards it is "
            "not supported: remove it (the batch meta is dropped, as Data-Juicer does without the path)"
        )


_LOADED_CUSTOM: set[tuple[str, ...]] = set()


def load_custom_operators(paths: Sequence[str]) -> None:
    """The recipe's `custom_operator_paths` in this process's registry, once (Data-Juicer refuses
    to register a name twice): a stage may be a custom Aggregator."""
    if paths and tuple(paths) not in _LOADED_CUSTOM:
        from data_juicer.config.config import load_custom_operators as load

        load(list(paths))
        _LOADED_CUSTOM.add(tuple(paths))


def build(name: str, params: dict[str, Any], custom_paths: Sequence[str] = ()) -> GlobalOp:
    """The stage of one recipe entry, with the operator Data-Juicer builds from it."""
    from data_juicer.ops import load_ops

    load_custom_operators(custom_paths)
    check_params(name, params)
    (op,) = load_ops([{name: dict(params)}])
    cls = STAGES.get(name) or (PerGroupAggregator if is_aggregator(type(op)) else None)
    if cls is None:
        raise RecipeError(f"{name}: not a whole-dataset operator run across shards; report this as a bug")
    return cls(name, params, op)
