"""The recipe of a `--analyze` job: what `dj-analyze` runs of a recipe, and nothing else.

`dj-analyze` (Data-Juicer's `Analyzer.run`) loads every operator of `process` and runs only two
kinds: Filters outside `NON_STATS_FILTERS`, with their `process` switched off (every row gets its
statistics, none is dropped), and the tagging operators (`TAGGING_OPS`), which write meta fields.
Mappers, deduplicators, selectors and the rest are skipped, and every statistic is of the input
as read. The job's recipe keeps exactly those operators in their order, so shards, claims,
retries and the per-shard engine run them like any recipe; the workers run the filters with
Data-Juicer's own stats-only switch (`RayDataset.process(..., stats_only=True)`).
"""

from __future__ import annotations

from pathlib import PurePath
from typing import Any

from elastic_sharding.errors import RecipeError, UsageError
from elastic_sharding.prepare.recipe import Recipe, operator_registry
from elastic_sharding.records import AnalysisSpec

DEFAULT_EXPORT_STEM = "analysis"  # a recipe without export_path; dj-analyze itself requires one


def check_percentiles(values: list[float] | None, where: str) -> list[float]:
    """`--percentiles` (or the recipe's `percentiles`) as `dj-analyze` takes them: fractions in [0, 1]."""
    if values is None:
        return []
    if not isinstance(values, list) or not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
        raise RecipeError(f"{where}: percentiles must be a list of numbers between 0 and 1, e.g. [0.1, 0.9]")
    for value in values:
        if not 0 <= value <= 1:
            raise UsageError(f"{where}: percentile {value} is outside [0, 1]; write 0.999 for the 99.9th percentile")
    return [float(v) for v in values]


def export_stem(config: dict[str, Any]) -> str:
    """dj-analyze writes its stats next to the export: `<export_path without its suffix>_stats.jsonl`."""
    export_path = config.get("export_path")
    if not isinstance(export_path, str) or not export_path:
        return DEFAULT_EXPORT_STEM
    name = PurePath(export_path).name
    suffix = config.get("export_type") or name.rsplit(".", 1)[-1]
    return name.removesuffix(f".{suffix}") or DEFAULT_EXPORT_STEM


def analysis_recipe(recipe: Recipe, percentiles: list[float] | None) -> AnalysisSpec:
    """Cut `recipe.config` down to the operators `dj-analyze` runs; refuse a recipe with none."""
    where = str(recipe.source)
    config = recipe.config
    registry, kinds = operator_registry(config.get("custom_operator_paths") or [], where)
    from data_juicer.ops import NON_STATS_FILTERS, TAGGING_OPS

    kept: list[Any] = []
    operators: list[str] = []
    skipped: list[str] = []
    for position, (item, (name, _params)) in enumerate(zip(config["process"], recipe.ops)):
        cls = registry.get(name)
        label = f"process[{position}] {name}"
        if cls is None:
            raise RecipeError(
                f"{where}: {label}: unknown operator (not in Data-Juicer's registry; check the name or custom_operator_paths)"
            )
        stats_filter = issubclass(cls, kinds["Filter"]) and name not in NON_STATS_FILTERS.modules
        if stats_filter or name in TAGGING_OPS.modules:
            kept.append(item)
            operators.append(label)
        else:
            skipped.append(label)
    if not kept:
        raise RecipeError(
            f"{where}: nothing to analyze: the recipe has no statistics-producing Filter and no tagging operator "
            f"(dj-analyze runs only those; it would skip {', '.join(skipped)}); add a Filter such as "
            "text_length_filter, or run the recipe without --analyze"
        )
    chosen = check_percentiles(percentiles, "--percentiles") if percentiles is not None else None
    if chosen is None:
        chosen = check_percentiles(config.get("percentiles"), f"{where}: percentiles")
    spec = AnalysisSpec(
        percentiles=chosen,
        save_stats_in_one_file=bool(config.get("save_stats_in_one_file", False)),
        export_stem=export_stem(config),
        operators=operators,
        skipped=skipped,
    )
    config["process"] = kept
    config["percentiles"] = chosen
    return spec
