"""Per-attempt logs inside the warm runtime, where several shards run at once in one process.

File descriptors 1 and 2 belong to the whole process, so they stay on the runtime log: output
written at that level (C libraries, Ray's forwarding of its workers' output) lands there. Python's
`sys.stdout`/`sys.stderr` and Data-Juicer's loguru logger are routed by thread instead: what the
thread running an attempt writes goes to that attempt's log. Data-Juicer's `setup_logger`, called
by `init_configs` for every shard, is replaced by one that adds such a sink; its own log files in
the attempt's work dir are not written (the attempt log holds the same lines).
"""

from __future__ import annotations

import io
import os
import sys
import threading
from typing import Any, TextIO

LOG_FORMAT = "{time:YYYY-MM-DD HH:mm:ss.SSS} | {level: <8} | {name}:{line} - {message}"


class ThreadStreams(io.TextIOBase):
    """A text stream that writes to the log of the attempt running in the calling thread."""

    def __init__(self, fallback: TextIO):
        self._fallback = fallback
        self._files: dict[int, TextIO] = {}

    def attach(self, path: str) -> None:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self._files[threading.get_ident()] = open(fd, "w", buffering=1, encoding="utf-8", errors="replace")

    def detach(self) -> None:
        handle = self._files.pop(threading.get_ident(), None)
        if handle is not None:
            handle.close()

    def _target(self) -> TextIO:
        return self._files.get(threading.get_ident(), self._fallback)

    def write(self, text: str) -> int:
        target = self._target()
        target.write(text)
        if target is not self._fallback:
            target.flush()
        return len(text)

    def flush(self) -> None:
        self._target().flush()

    def fileno(self) -> int:
        return self._fallback.fileno()

    def isatty(self) -> bool:
        return False

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return "utf-8"


class AttemptLogs:
    """Installs the routing once per process; `start`/`end` bracket one attempt in its thread."""

    def __init__(self) -> None:
        from loguru import logger

        self._logger = logger
        self._stdout = ThreadStreams(sys.stdout)
        self._stderr = ThreadStreams(sys.stderr)
        self._sinks: dict[int, int] = {}
        self._lock = threading.Lock()
        sys.stdout, sys.stderr = self._stdout, self._stderr
        logger.remove()
        logger.add(sys.__stderr__, format=LOG_FORMAT, level="INFO", filter=self._not_an_attempt)
        from data_juicer.config import config as dj_config
        from data_juicer.utils import logger_utils

        logger_utils.setup_logger = dj_config.setup_logger = self._setup_logger

    def _not_an_attempt(self, record: dict[str, Any]) -> bool:
        return record["thread"].id not in self._sinks

    def _setup_logger(
        self,
        save_dir: str,
        distributed_rank: int = 0,
        filename: str = "log.txt",
        mode: str = "o",
        level: str = "INFO",
        redirect: Any = "auto",
    ) -> None:
        ident = threading.get_ident()
        with self._lock:
            if ident in self._sinks:
                return
            self._sinks[ident] = self._logger.add(
                self._stderr, format=LOG_FORMAT, level=level, filter=lambda record: record["thread"].id == ident
            )

    def start(self, path: str) -> None:
        self._stdout.attach(path)
        self._stderr.attach(path)

    def end(self) -> None:
        with self._lock:
            sink = self._sinks.pop(threading.get_ident(), None)
        if sink is not None:
            self._logger.remove(sink)
        for stream in (self._stdout, self._stderr):
            stream.detach()
