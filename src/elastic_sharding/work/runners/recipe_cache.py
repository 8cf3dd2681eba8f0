"""Parse and validate a job's recipe once per warm runtime, not once per shard.

Data-Juicer's `init_configs` builds its argument parser, reads the recipe, validates every
operator's arguments and derives the run's directories: about 0.4 s per shard here, and it
is not thread-safe (two shards parsed at once got different operator arguments). The attempt
recipes of one job differ only in where the shard comes from and where its output and work
directory go (`worker._write_attempt_recipe`), so the first attempt's parsed configuration is
kept, and each later attempt gets a deep copy with those paths (and the run id Data-Juicer
derives its directories from) replaced in every string of it. The side effects of
`init_configs` an attempt relies on are repeated: the log directory, the recipe backup and the
attempt's log sink.
"""

from __future__ import annotations

import copy
import hashlib
import os
import threading
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import yaml

PER_ATTEMPT_KEYS = ("dataset_path", "export_path", "work_dir")


@dataclass
class _Parsed:
    cfg: Any
    replacements: dict[str, str]  # the first attempt's per-attempt strings, by role


def _roles(config: dict[str, Any], job_id: str) -> dict[str, str]:
    return {"dataset_path": config["dataset_path"], "attempt_dir": config["work_dir"], "job_id": job_id}


def _rewrite(value: Any, pairs: list[tuple[str, str]], seen: set[int]) -> Any:
    if isinstance(value, str):
        for old, new in pairs:
            if old in value:
                value = value.replace(old, new)
        return value
    if id(value) in seen:
        return value
    if isinstance(value, dict):
        seen.add(id(value))
        for key in list(value):
            value[key] = _rewrite(value[key], pairs, seen)
    elif isinstance(value, list):
        seen.add(id(value))
        for index, item in enumerate(value):
            value[index] = _rewrite(item, pairs, seen)
    elif isinstance(value, tuple):
        return tuple(_rewrite(item, pairs, seen) for item in value)
    elif hasattr(value, "__dict__") and not isinstance(value, type):
        seen.add(id(value))
        for key, item in list(vars(value).items()):
            setattr(value, key, _rewrite(item, pairs, seen))
    return value


class RecipeCache:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._parsed: dict[str, _Parsed] = {}

    def config(self, recipe_path: str) -> Any:
        """The Data-Juicer configuration of one attempt recipe (a fresh object per call)."""
        with open(recipe_path, "rb") as handle:
            raw = handle.read()
        config = yaml.safe_load(raw)
        template = {k: v for k, v in config.items() if k not in PER_ATTEMPT_KEYS}
        key = hashlib.sha256(yaml.safe_dump(template, sort_keys=True).encode()).hexdigest()
        with self._lock:
            parsed = self._parsed.get(key)
            if parsed is None:
                from data_juicer.config import init_configs

                cfg = init_configs(args=["--config", recipe_path])
                self._parsed[key] = _Parsed(copy.deepcopy(cfg), _roles(config, cfg.job_id))
                return cfg
            cfg = copy.deepcopy(parsed.cfg)
        job_id = f"{datetime.now(UTC).strftime('%Y%m%d_%H%M%S')}_{uuid.uuid4().hex[:6]}"
        mine = _roles(config, job_id)
        # Longest first: the attempt dir contains no other role, but a job id could occur in it.
        pairs = sorted(((parsed.replacements[r], mine[r]) for r in mine), key=lambda p: -len(p[0]))
        _rewrite(cfg, pairs, set())
        self._attempt_side_effects(cfg)
        return cfg

    @staticmethod
    def _attempt_side_effects(cfg: Any) -> None:
        from data_juicer.config import config as dj_config

        event_log_dir = cfg.get("event_log_dir")
        if event_log_dir:
            os.makedirs(event_log_dir, exist_ok=True)
        dj_config.setup_logger(save_dir=event_log_dir or cfg.work_dir, level="DEBUG" if cfg.get("debug") else "INFO")
        dj_config.config_backup(cfg)
