"""Directories a worker holds open (`confined.anchored`): names in them are reached relative to the
open directory, errors still name the whole path, and nothing outlives the block."""

from __future__ import annotations

import errno
import os
import threading
from pathlib import Path

import pytest
from support.fakes import FakeRunner

from elastic_sharding import confined, fsops
from elastic_sharding.work.worker import Worker, WorkerOptions


def _open_fds() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


def _open_dirs(before: set[str]) -> set[str]:
    """The directories open now that were not among `before`'s fds."""
    found = set()
    for fd in _open_fds() - before:
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except FileNotFoundError:  # the listing's own fd, closed meanwhile
            continue
        if os.path.isdir(target):
            found.add(target)
    return found


def test_names_in_an_anchored_directory_are_reached_through_it_not_by_path(tmp_path):
    state = tmp_path / "state"
    state.mkdir()
    with confined.anchored([state]):
        # The path no longer leads to the directory: only a call relative to the open one finds it.
        os.rename(state, tmp_path / "moved")
        assert fsops.publish_once(state / "claim.json", b"one")
        fsops.replace_atomic(state / "record.json", b"two")
        assert fsops.read_record(state / "claim.json", bytes) == b"one"
        assert confined.lexists(state / "record.json")
        assert confined.kind(state / "record.json") == "file"
        assert not fsops.publish_once(state / "claim.json", b"three")
        assert fsops.rename_away(state / "record.json", state / "away.json")
        assert sorted(confined.list_dir(tmp_path / "moved")) == ["away.json", "claim.json"]
    assert not confined.lexists(state / "claim.json"), "after the block, calls go by path again"


def test_a_name_a_few_levels_below_an_anchor_is_reached_from_it(tmp_path):
    attempts = tmp_path / "attempts"
    (attempts / "part-1" / "attempt-a").mkdir(parents=True)
    with confined.anchored([attempts]):
        os.rename(attempts, tmp_path / "moved")
        fsops.replace_atomic(attempts / "part-1" / "attempt-a" / "heartbeat.json", b"beat")
        assert fsops.make_dir_exclusive(attempts / "part-1" / "attempt-b")
    assert (tmp_path / "moved" / "part-1" / "attempt-a" / "heartbeat.json").read_bytes() == b"beat"
    assert (tmp_path / "moved" / "part-1" / "attempt-b").is_dir()


def test_an_error_names_the_whole_path_as_a_call_by_path_would(tmp_path):
    with confined.anchored([tmp_path]):
        with pytest.raises(FileNotFoundError) as caught:
            confined.unlink(tmp_path / "missing.json")
        assert caught.value.filename == str(tmp_path / "missing.json")
        with pytest.raises(FileNotFoundError) as caught:
            confined.link(tmp_path / "absent", tmp_path / "target")
        assert caught.value.filename == str(tmp_path / "absent")
        (tmp_path / "link").symlink_to(tmp_path)
        with pytest.raises(confined.LinkRefused):
            confined.read_bytes_nofollow(tmp_path / "link")


def test_blocks_share_one_handle_and_close_it_when_the_last_ends(tmp_path):
    before = _open_fds()
    with confined.anchored([tmp_path]):
        held = _open_fds() - before
        assert len(held) == 1
        with confined.anchored([tmp_path]):
            assert _open_fds() - before == held, "a second block reuses the open directory"
        fsops.replace_atomic(tmp_path / "x", b"1")
    assert _open_fds() == before


def test_a_directory_replaced_since_it_was_anchored_is_anchored_anew(tmp_path):
    state = tmp_path / "state"
    state.mkdir()
    before = _open_fds()
    with confined.anchored([state]):
        os.rename(state, tmp_path / "old")
        state.mkdir()
        with confined.anchored([state]):
            fsops.replace_atomic(state / "record.json", b"new")
        assert (state / "record.json").read_bytes() == b"new"
    assert _open_fds() == before


def test_a_handle_that_fails_as_a_lost_server_would_is_dropped_for_calls_by_path(tmp_path, monkeypatch):
    before = _open_fds()
    real = os.stat
    failures = []

    def stat(path, *args, dir_fd=None, **kwargs):
        if dir_fd is not None:
            failures.append(path)
            raise OSError(errno.ESTALE, os.strerror(errno.ESTALE), path)
        return real(path, *args, **kwargs)

    (tmp_path / "record.json").write_bytes(b"r")
    with confined.anchored([tmp_path]):
        monkeypatch.setattr(os, "stat", stat)
        with pytest.raises(OSError) as caught:
            confined.lstat(tmp_path / "record.json")
        assert caught.value.errno == errno.ESTALE and caught.value.filename == str(tmp_path / "record.json")
        assert confined.lexists(tmp_path / "record.json"), "the next call goes by path"
        assert failures == ["record.json"]
        assert _open_fds() == before, "the dropped handle is closed at once"
    assert _open_fds() == before


def test_threads_using_an_anchor_while_its_block_ends_never_see_a_closed_handle(tmp_path):
    stop = threading.Event()
    errors: list[BaseException] = []

    def writer(index: int) -> None:
        while not stop.is_set():
            try:
                fsops.replace_atomic(tmp_path / f"beat-{index}.json", b"x", durable=False)
            except BaseException as exc:  # noqa: BLE001 - reported below
                errors.append(exc)
                return

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(3)]
    for thread in threads:
        thread.start()
    for _ in range(200):
        with confined.anchored([tmp_path]):
            pass
    stop.set()
    for thread in threads:
        thread.join()
    assert errors == []


def test_a_worker_holds_its_job_directories_while_it_runs_and_none_after(make_job):
    job: Path = make_job(rows=8, shards=2)
    before = _open_fds()
    seen: list[set[str]] = []

    class Watching(FakeRunner):
        def run(self, ctx):
            seen.append(_open_dirs(before))
            super().run(ctx)

    assert Worker(job, WorkerOptions(), runner=Watching()).run() == 0
    assert {str(job / "state" / "locks"), str(job / "attempts")} <= seen[0]
    assert _open_dirs(before) == set()
