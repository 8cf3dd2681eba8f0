"""The recipe each attempt runs, and its environment.

The job's recipe as prepared (checked against the manifest's sha256 on every read, so a recipe
edited in the job directory fails the attempt instead of running), cut to the worker's segment,
with the attempt's shard, output and work directory, and always Data-Juicer's Ray executor on the
worker's runtime. Caches go to the job directory's, shared by every attempt on every node.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

import yaml

from elastic_sharding import confined, fsops
from elastic_sharding.errors import JobStateError
from elastic_sharding.layout import JobLayout
from elastic_sharding.records import Manifest, SegmentSpec
from elastic_sharding.settings import Settings
from elastic_sharding.work.runners import AttemptContext


class AttemptRecipes:
    """The attempts' recipes, as a part of `Worker` (which sets every attribute below)."""

    layout: JobLayout
    manifest: Manifest
    job_manifest: Manifest
    segment: SegmentSpec
    settings: Settings

    def _attempt_env(self) -> dict[str, str]:
        env = {"PYTHONUNBUFFERED": "1"}
        cache = str(self.layout.cache_dir)
        for key in ("XDG_CACHE_HOME", "HF_HOME"):
            if not os.environ.get(key):
                env[key] = cache
        return env

    def _job_recipe(self) -> dict[str, Any]:
        try:
            raw = confined.read_bytes_nofollow(self.layout.recipe)
            config: dict[str, Any] = yaml.safe_load(raw)
        except (OSError, yaml.YAMLError) as exc:
            raise JobStateError(
                f"cannot read the job's recipe {self.layout.recipe}: {exc}; restore the recipe that was prepared"
            ) from None
        if hashlib.sha256(raw).hexdigest() != self.manifest.recipe_sha256:
            raise JobStateError(
                f"{self.layout.recipe} was modified after prepare (sha256 differs from the manifest); "
                "restore the recipe that was prepared, or prepare a new --job-dir with the changed one"
            )
        return config

    def _write_attempt_recipe(self, ctx: AttemptContext, shard_path: Path) -> None:
        config = self._job_recipe()
        config["process"] = config["process"][self.segment.first_op : self.segment.end_op]
        if self.segment.index > 0 or self.job_manifest.analysis is not None:
            # Within one Ray executor run, the statistics and meta columns operators add reach the
            # export (it drops only those the input already had, unless told to keep them); the
            # ones earlier segments added must travel on the same way.
            config["keep_stats_in_res_ds"] = True
        config["dataset_path"] = str(shard_path)
        config["export_path"] = str(ctx.ray_output)
        config["work_dir"] = str(ctx.attempt_dir)
        config["executor_type"] = "ray"
        config["ray_address"] = self.settings.ray_address
        config.setdefault("skip_op_error", False)
        config.pop("export_type", None)
        config["export_shard_size"] = 0
        # Read only by this attempt's engine, on this node, right after: nothing to make durable
        # (a crash ends the attempt, and the next one writes its own): two syncs a shard fewer.
        recipe = yaml.safe_dump(config, sort_keys=False, allow_unicode=True).encode()
        fsops.replace_atomic(ctx.recipe_path, recipe, durable=False)
