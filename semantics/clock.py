"""Time for the CMQ model, always injected so that tests can move it.

Times are Unix seconds as floats. ``ManualClock`` lets a test run a day of retries in
milliseconds; the gateway's real-time engine uses ``SystemClock`` in production.
"""

from __future__ import annotations

import time
from typing import Protocol

__all__ = ["Clock", "ManualClock", "SystemClock"]


class Clock(Protocol):
    def now(self) -> float: ...


class SystemClock:
    __slots__ = ()

    # time.time itself, not a method that calls it: the broker reads the clock a few times a
    # message, and the Python frame in between cost more than the read.
    now = staticmethod(time.time)


class ManualClock:
    """A clock that only moves when told to."""

    __slots__ = ("_now",)

    def __init__(self, start: float = 1_700_000_000.0) -> None:
        self._now = float(start)

    def now(self) -> float:
        return self._now

    def advance(self, seconds: float) -> float:
        if seconds < 0:
            raise ValueError("time moves forward only")
        self._now += seconds
        return self._now

    def set(self, when: float) -> None:
        if when < self._now:
            raise ValueError("time moves forward only")
        self._now = float(when)
