"""The settings are declared once: the flags, the record and a worker's overrides cannot drift."""

from __future__ import annotations

import argparse
from dataclasses import fields

import pytest

from elastic_sharding.errors import UsageError
from elastic_sharding.settings import SETTINGS, Overrides, Settings, add_arguments, from_args, with_overrides
from elastic_sharding.work.worker import WorkerOptions


def test_every_setting_has_one_flag_and_one_override():
    names = [f.name for f in fields(Settings)]
    assert [s.key for s in SETTINGS] == names
    assert [f.name for f in fields(Overrides)] == names
    assert {f.name for f in fields(WorkerOptions)} >= set(names)


def test_a_worker_overrides_only_what_it_was_given_and_is_validated():
    parser = argparse.ArgumentParser()
    add_arguments(parser, as_overrides=False)
    settings = from_args(parser.parse_args(["--lock-timeout-secs", "60"]))
    assert settings.heartbeat_interval_secs == 15.0  # a quarter of the lease
    mine = with_overrides(settings, WorkerOptions(max_retries=7))
    assert (mine.max_retries, mine.lock_timeout_secs) == (7, 60.0)
    with pytest.raises(UsageError, match="--heartbeat-interval-secs"):
        with_overrides(settings, Overrides(heartbeat_interval_secs=40.0))
