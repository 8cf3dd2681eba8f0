"""SIGTERM and SIGINT mean "stop, handing back what you hold" for every long-running command."""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Callable, Iterator
from typing import Any

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


@contextlib.contextmanager
def on_stop_signals(handler: Callable[[str], None]) -> Iterator[None]:
    """Call `handler(signal name)` on SIGTERM/SIGINT while the block runs; restore afterwards."""

    def on_signal(signum: int, _frame: Any) -> None:
        handler(signal.Signals(signum).name)

    previous = {sig: signal.signal(sig, on_signal) for sig in STOP_SIGNALS}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
