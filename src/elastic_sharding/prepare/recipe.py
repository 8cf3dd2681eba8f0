"""Load a Data-Juicer recipe and decide whether it can run shard by shard.

Validation goes through Data-Juicer's own operator registry (after loading the recipe's custom
operators), so a recipe is judged by what the engine would really run, not by name patterns.
Relative paths in the recipe are made absolute against the directory `prepare` runs in, so
workers started anywhere run the same recipe.
"""

from __future__ import annotations

import hashlib
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from elastic_sharding.dedup.rules import RAY_TWINS, SUPPORTED, DedupKind, DedupRule
from elastic_sharding.dependencies.operators import recipe_needs
from elastic_sharding.dependencies.resolve import Found, check_needs, missing_line, refuse_missing
from elastic_sharding.errors import RecipeError, UsageError
from elastic_sharding.global_ops.registry import REFUSED, check_params, is_stage, load_custom_operators
from elastic_sharding.records import PackageRecord, SegmentSpec

log = logging.getLogger(__name__)

PROJECT_ROOT = Path(__file__).resolve().parents[3]  # the checkout, when the package runs from one
DEMO_RECIPE_IN_CHECKOUT = Path("demos", "elastic_sharding", "configs", "demo.yaml")
CHECKOUT_ENV = "ELASTIC_SHARD_CHECKOUT"  # the demo scripts' own checkout, set by them

MEDIA_KEY_DEFAULTS = {"image_key": "images", "audio_key": "audios", "video_key": "videos"}
PATH_SUFFIXES = ("_path", "_dir", "_file", "_paths", "_dirs")
GLOBAL_KINDS = ("Deduplicator", "Selector", "Grouper", "Aggregator", "Pipeline")
# Workers read each shard through Data-Juicer's read_json_stream: pyarrow's JSON reader with the
# recipe's read_options, else pyarrow's default ReadOptions().block_size of 1 MiB. A line longer
# than the block size may straddle two blocks and fail the read (measured: lines up to the block
# size always read, longer ones fail depending on where they fall), so it is the longest line
# prepare accepts. Data-Juicer does not retry with larger blocks as Ray's own read_json does.
DEFAULT_READ_BLOCK_SIZE = 1 << 20
MAX_READ_BLOCK_SIZE = (1 << 31) - 1  # pyarrow keeps block_size in an int32


@dataclass
class Recipe:
    source: Path
    sha256: str
    config: dict[str, Any]
    media_keys: list[str]
    index_key: str | None
    warnings: list[str] = field(default_factory=list)
    max_line_bytes: int = DEFAULT_READ_BLOCK_SIZE  # the longest input/shard line the engine reads
    packages: list[PackageRecord] = field(default_factory=list)  # set by check_with_engine
    package_warnings: list[str] = field(default_factory=list)  # likewise

    @property
    def ops(self) -> list[tuple[str, dict[str, Any]]]:
        return operator_entries(self.config, self.source)

    @property
    def segments(self) -> list[SegmentSpec]:
        """The recipe cut at each whole-dataset operator that runs as a stage across all shards."""
        segments: list[SegmentSpec] = []
        start, dedup = 0, None
        registry, _kinds = operator_registry(self.config.get("custom_operator_paths") or [], str(self.source))
        for position, (name, _params) in enumerate(self.ops):
            if name in SUPPORTED or is_stage(name, registry.get(name)):
                segments.append(SegmentSpec(len(segments), start, position, dedup))
                start, dedup = position + 1, position
        segments.append(SegmentSpec(len(segments), start, len(self.config["process"]), dedup))
        return segments


def dump_config(config: dict[str, Any]) -> bytes:
    return yaml.safe_dump(config, sort_keys=False, allow_unicode=True).encode()


def operator_entries(config: dict[str, Any], source: Path) -> list[tuple[str, dict[str, Any]]]:
    """The recipe's `process` as (operator name, arguments) pairs."""
    return [_op_entry(item, i, source) for i, item in enumerate(config["process"])]


def _op_entry(item: Any, position: int, source: Path) -> tuple[str, dict[str, Any]]:
    if isinstance(item, str):
        return item, {}
    if isinstance(item, dict) and len(item) == 1:
        ((name, params),) = item.items()
        if params is None:
            params = {}
        if isinstance(name, str) and isinstance(params, dict):
            return name, params
    raise RecipeError(f"{source}: process[{position}] must be an operator name or a one-key mapping of name to parameters")


def recipe_and_base(config: Path | None) -> tuple[Path, Path | None]:
    """The recipe to use, and where its relative paths resolve from.

    Without `--config` the bundled demo recipe is used; its relative data path resolves from the
    checkout it is in, so the demo works from any working directory. That is this package's own
    checkout, else (the package installed into an image, a demo script run from a checkout) the
    demo script's.
    """
    if config is not None:
        return config, None
    roots = [PROJECT_ROOT] + ([Path(os.environ[CHECKOUT_ENV])] if os.environ.get(CHECKOUT_ENV) else [])
    for root in roots:
        if (root / DEMO_RECIPE_IN_CHECKOUT).is_file():
            return root / DEMO_RECIPE_IN_CHECKOUT, root
    raise UsageError(
        f"no --config given and the bundled demo recipe {DEMO_RECIPE_IN_CHECKOUT} is in no checkout here "
        f"({', '.join(map(str, roots))}); pass --config"
    )


def read_recipe(path: Path) -> tuple[dict[str, Any], str]:
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise RecipeError(f"{path}: cannot read recipe: {exc.strerror or exc}; check the --config path") from None
    try:
        config = yaml.safe_load(raw)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark is not None else str(path)
        raise RecipeError(f"{where}: invalid YAML: {getattr(exc, 'problem', exc)}; fix the YAML") from None
    if not isinstance(config, dict):
        raise RecipeError(f"{path}: a recipe must be a YAML mapping")
    return config, hashlib.sha256(raw).hexdigest()


def _absolute(value: str, base: Path) -> str:
    if not value or "://" in value or os.path.isabs(value):
        return value
    return str((base / value).resolve())


def _resolve_paths(config: dict[str, Any], base: Path) -> None:
    for key in ("dataset_path", "export_path", "work_dir"):
        if isinstance(config.get(key), str):
            config[key] = _absolute(config[key], base)
    paths = config.get("custom_operator_paths")
    if isinstance(paths, str):
        paths = [paths]
    if paths:
        config["custom_operator_paths"] = [_absolute(str(p), base) for p in paths]
    for item in config.get("process") or []:
        if not isinstance(item, dict) or len(item) != 1:
            continue
        params = next(iter(item.values()))
        if not isinstance(params, dict):
            continue
        for key, value in params.items():
            if not isinstance(value, str) or not value:
                continue
            looks_like_path = key.endswith(PATH_SUFFIXES)
            existing_local = (key.startswith("hf_") or "model" in key) and (base / value).exists()
            if looks_like_path or existing_local:
                params[key] = _absolute(value, base)


def _normalize_keys(config: dict[str, Any]) -> None:
    """Accept the original demo's top-level `text_key` (Data-Juicer 1.6.1 only knows `text_keys`)."""
    if "text_key" in config:
        value = config.pop("text_key")
        config.setdefault("text_keys", value)


def read_resolved(path: Path, base: Path) -> Recipe:
    """Read and resolve a recipe and make every check that needs no Data-Juicer: enough to plan
    a prepare while `check_with_engine` (seconds: the engine's import) runs beside the scan."""
    config, sha = read_recipe(path)
    _normalize_keys(config)
    _resolve_paths(config, base)
    recipe = Recipe(source=path, sha256=sha, config=config, media_keys=[], index_key=None)
    inspect(recipe)
    return recipe


def load_recipe(path: Path, base: Path) -> Recipe:
    """Read, resolve and validate a recipe (imports Data-Juicer)."""
    recipe = read_resolved(path, base)
    check_with_engine(recipe)
    return recipe


def inspect(recipe: Recipe) -> None:
    """The checks, warnings and derived fields (media keys, index key, longest line) that the
    recipe's text alone decides."""
    config = recipe.config
    where = str(recipe.source)
    executor = config.get("executor_type", "default")
    if executor not in ("default", "ray"):
        raise RecipeError(
            f"{where}: executor_type {executor!r} is not supported; use 'default' or 'ray' (workers always run Ray)"
        )
    if "process" not in config:
        raise RecipeError(f"{where}: the recipe has no 'process' list; list the Mapper/Filter operators explicitly")
    process = config["process"]
    if not isinstance(process, list) or not process:
        raise RecipeError(f"{where}: 'process' must be a non-empty list of operators")
    if config.get("stats_export_path"):
        raise RecipeError(
            f"{where}: stats_export_path is not allowed: every shard would write the same statistics file; remove it"
        )
    if "skip_op_error" in config:
        recipe.warnings.append(
            f"recipe sets skip_op_error: {config['skip_op_error']}; "
            + (
                "rows whose operator raises are DROPPED silently"
                if config["skip_op_error"]
                else "an operator error fails the attempt"
            )
        )
    recipe.max_line_bytes = _read_block_size(config, where)
    for key, default in MEDIA_KEY_DEFAULTS.items():
        value = config.get(key, default)
        if not isinstance(value, str) or not value:
            raise RecipeError(f"{where}: {key} must be a field name")
        recipe.media_keys.append(value)
    index_keys = set()
    for position, (name, params) in enumerate(recipe.ops):
        if params.get("stats_export_path"):
            raise RecipeError(
                f"{where}: process[{position}] {name}: stats_export_path is not allowed: every shard would write the same statistics file; remove it"
            )
        if "skip_op_error" in params:
            recipe.warnings.append(f"{name} sets skip_op_error: {params['skip_op_error']} explicitly")
        if params.get("save_dir"):
            recipe.warnings.append(
                f"{name} writes into a fixed save_dir {params['save_dir']}: make sure file names cannot collide across shards"
            )
        if params.get("index_key"):
            index_keys.add(params["index_key"])
    if len(index_keys) > 1:
        raise RecipeError(f"{where}: operators declare different index_key values {sorted(index_keys)}; use one")
    recipe.index_key = index_keys.pop() if index_keys else None


def check_with_engine(recipe: Recipe) -> None:
    """Judge the operators by Data-Juicer's own registry and the whole recipe by its config parser."""
    where = str(recipe.source)
    registry, kinds = operator_registry(recipe.config.get("custom_operator_paths") or [], where)
    from data_juicer.core.executor.dag_execution_strategies import is_global_operation

    for position, (name, params) in enumerate(recipe.ops):
        label = f"{where}: process[{position}] {name}"
        cls = registry.get(name)
        if cls is None:
            raise RecipeError(
                f"{label}: unknown operator (not in Data-Juicer's registry; check the name or custom_operator_paths)"
            )
        if name in RAY_TWINS:
            raise RecipeError(
                f"{label}: is Data-Juicer's Ray-only deduplicator, which keeps whichever duplicate reaches its shared "
                f"state first, so two runs can keep different rows; use {RAY_TWINS[name]} in its place: the same "
                "rule, deterministic, run here across all shards"
            )
        if name in SUPPORTED and issubclass(cls, kinds["Deduplicator"]):
            rule = DedupRule(name, params)
            if rule.kind == DedupKind.SIMHASH:
                try:
                    rule.simhash_blocks()
                except RecipeError as exc:
                    raise RecipeError(f"{label}: {exc}") from None
            continue  # a deduplication stage across all shards (dedup/)
        if name in REFUSED:
            raise RecipeError(f"{label}: {REFUSED[name]}")
        if is_stage(name, cls):
            try:
                check_params(name, params)
            except RecipeError as exc:
                raise RecipeError(f"{label}: {exc}") from None
            continue  # a whole-dataset stage across all shards (global_ops/)
        for kind_name in GLOBAL_KINDS:
            if issubclass(cls, kinds[kind_name]):
                raise RecipeError(
                    f"{label}: is a {kind_name} that is not run across shards (docs/guides/whole-dataset-operators.md "
                    "lists, operator by operator, what is); remove it from the recipe and run it on the merged output"
                )
        if is_global_operation(cls):
            raise RecipeError(
                f"{label}: is a global operation that needs the whole dataset; remove it from the recipe and run it on the merged output"
            )
        if not issubclass(cls, (kinds["Mapper"], kinds["Filter"])):
            raise RecipeError(
                f"{label}: only Mapper and Filter operators are shard-safe; remove it from the recipe and run it on the merged output"
            )
        if "ray" not in getattr(cls, "_supported_exec_modes", ("ray",)):
            raise RecipeError(
                f"{label}: does not support Data-Juicer's Ray executor; use an operator that does, or run this one on the merged output"
            )
    _check_with_data_juicer_parser(recipe.config, {name for name, _ in recipe.ops}, where)
    recipe.packages = check_packages(recipe, registry)


def recipe_packages(recipe: Recipe, registry: dict[str, type]) -> list[Found]:
    """The packages the recipe's operators import (Data-Juicer's declarations), looked up here."""
    needs = recipe_needs(recipe.ops, registry)
    return check_needs((n.package, n.module, f"process[{n.position}] {n.operator}", n.certain) for n in needs)


def missing_requirements(recipe: Recipe) -> list[str]:
    """What Data-Juicer asks for of each package the recipe's operators need and this node lacks."""
    registry, _ = operator_registry(recipe.config.get("custom_operator_paths") or [], str(recipe.source))
    return sorted({item.record.wanted for item in recipe_packages(recipe, registry) if item.missing})


def check_packages(recipe: Recipe, registry: dict[str, type]) -> list[PackageRecord]:
    """Refuse the recipe while a package one of its operators needs is missing here (nothing is
    installed to find out); the records of those that are here, for the manifest. A package
    needed only on a branch that prepare cannot decide is a warning when missing."""
    found = recipe_packages(recipe, registry)
    refuse_missing(found, str(recipe.source))
    for item in found:
        if item.missing:
            warning = missing_line(item.record, str(recipe.source)) + " (needed only on a branch prepare could not decide)"
            log.warning("%s", warning)
            recipe.package_warnings.append(warning)
    return [item.record for item in found if item.present]


def _read_block_size(config: dict[str, Any], where: str) -> int:
    """The block size the engine's JSON reader will use for this recipe's shards."""
    options = config.get("read_options")
    if options is not None and not isinstance(options, dict):
        raise RecipeError(f"{where}: read_options must be a mapping of pyarrow JSON read options, such as block_size")
    if not options or "block_size" not in options:
        return DEFAULT_READ_BLOCK_SIZE
    size = options["block_size"]
    if type(size) is not int or not 1 <= size <= MAX_READ_BLOCK_SIZE:
        raise RecipeError(f"{where}: read_options.block_size must be a number of bytes from 1 to {MAX_READ_BLOCK_SIZE}")
    return size


def _check_with_data_juicer_parser(config: dict[str, Any], used_ops: set[str], where: str) -> None:
    """Parse the recipe with Data-Juicer's own config parser, as `dj-process` will on every
    attempt, so an unknown or mistyped top-level option fails here instead of on every shard."""
    import contextlib
    import io
    import tempfile
    import warnings

    from data_juicer.config.config import (
        _collect_config_info_from_class_docs,
        build_base_parser,
        sort_op_by_types_and_names,
    )
    from data_juicer.ops import OPERATORS

    parser = build_base_parser()
    parser.exit_on_error = False
    ops = [(name, cls) for name, cls in sort_op_by_types_and_names(OPERATORS.modules.items()) if name in used_ops]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # jsonargparse deprecation notices about Data-Juicer's own code
        _collect_config_info_from_class_docs(ops, parser)
    with tempfile.TemporaryDirectory(prefix="elastic-shard-recipe-") as tmp:
        probe = Path(tmp) / "recipe.yaml"
        probe.write_bytes(dump_config(config))
        try:
            with contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()):
                parser.parse_args(args=["--config", str(probe)])
        except (Exception, SystemExit) as exc:  # noqa: BLE001 - jsonargparse raises several types
            message = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise RecipeError(
                f"{where}: Data-Juicer's config parser rejects the recipe: {message}; fix the recipe (try it with dj-process)"
            ) from None


# Custom operator paths already loaded into this process's registry: Data-Juicer refuses to load
# the same package twice (`prepare --install-missing` reads the registry before the recipe unit).


def operator_registry(custom_paths: list[str], where: str) -> tuple[dict[str, type], dict[str, type]]:
    from data_juicer.ops import OPERATORS, base_op

    if custom_paths:
        missing = [p for p in custom_paths if not os.path.exists(p)]
        if missing:
            raise RecipeError(
                f"{where}: custom_operator_paths entry does not exist: {missing[0]}; fix the path (relative paths start at the recipe)"
            )
        try:
            load_custom_operators(custom_paths)
        except Exception as exc:  # noqa: BLE001 - user code: any error is a recipe error
            raise RecipeError(
                f"{where}: cannot load custom operators: {exc}; fix the operator module, or check custom_operator_paths"
            ) from None
    kinds = {name: getattr(base_op, name) for name in ("Mapper", "Filter", *GLOBAL_KINDS)}
    return OPERATORS.modules, kinds
