"""Loaded only into the fault matrix's clock-skewed workers (on PYTHONPATH next to libfaketime).

libfaketime 0.9.10 with FAKETIME_DONT_FAKE_MONOTONIC=1 breaks `clock_nanosleep(CLOCK_MONOTONIC,
TIMER_ABSTIME)`, so `time.sleep()` fails with EINVAL, while timed lock waits keep working; faking
the monotonic clock too makes timed lock waits hang instead. So the skewed workers keep a real
monotonic clock and sleep on an Event. Only the sleeping primitive changes, never a clock.
"""

import threading
import time


def _sleep(secs: float) -> None:
    if secs > 0:
        threading.Event().wait(secs)


time.sleep = _sleep
