"""The two CMQ NotifyStrategy retry policies of a subscription (SPEC D5, D6), as pure functions.

Retries are numbered from 1: retry ``n`` is delivery attempt ``n + 1`` and follows the
``n``-th failure of that message to that subscription.

* BACKOFF_RETRY (D5): at most 3 retries, each after a uniform random wait of 10-20 s.
* EXPONENTIAL_DECAY_RETRY (D6, the default): retry ``n`` waits ``min(2**(n-1), 512)`` s,
  176 retries in all: 2^0 + ... + 2^9 = 1,023 s, then 166 x 512 = 84,992 s, 86,015 s in
  total, just under the topic lifecycle of 86,400 s (D3), which is the seed's "about one day".
"""

from __future__ import annotations

import enum
import random

from semantics.errors import CMQError
from semantics.limits import (
    BACKOFF_MAX_RETRIES,
    BACKOFF_WAIT_MAX,
    BACKOFF_WAIT_MIN,
    EXP_DECAY_CAP_SECONDS,
    EXP_DECAY_RETRIES,
)

__all__ = [
    "DEFAULT_STRATEGY",
    "NotifyStrategy",
    "exp_decay_schedule",
    "exp_decay_wait",
    "max_retries",
    "parse_strategy",
    "retry_wait",
]


class NotifyStrategy(enum.StrEnum):
    BACKOFF_RETRY = "BACKOFF_RETRY"
    EXPONENTIAL_DECAY_RETRY = "EXPONENTIAL_DECAY_RETRY"


DEFAULT_STRATEGY = NotifyStrategy.EXPONENTIAL_DECAY_RETRY


def parse_strategy(value: object) -> NotifyStrategy:
    """``x-cmq-notify-strategy`` (M8): absent means the default, anything unknown is a 406."""
    if value is None or value == "":
        return DEFAULT_STRATEGY
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    try:
        return NotifyStrategy(str(value).upper())
    except ValueError:
        raise CMQError("M8", f"unknown x-cmq-notify-strategy {value!r}: use BACKOFF_RETRY or "
                       "EXPONENTIAL_DECAY_RETRY", value=value)


def max_retries(strategy: NotifyStrategy) -> int:
    """3 for BACKOFF_RETRY (D5), 176 for EXPONENTIAL_DECAY_RETRY (D6)."""
    return BACKOFF_MAX_RETRIES if strategy is NotifyStrategy.BACKOFF_RETRY else EXP_DECAY_RETRIES


def exp_decay_wait(retry: int) -> int:
    """D6: seconds before retry ``retry`` (1-based): 1, 2, 4, ..., 512, then 512 each."""
    if not 1 <= retry <= EXP_DECAY_RETRIES:
        raise ValueError(f"retry {retry} is outside 1-{EXP_DECAY_RETRIES}")
    return min(1 << (retry - 1), EXP_DECAY_CAP_SECONDS)


def exp_decay_schedule() -> tuple[int, ...]:
    """D6: the 176 waits, in order."""
    return tuple(exp_decay_wait(n) for n in range(1, EXP_DECAY_RETRIES + 1))


def retry_wait(strategy: NotifyStrategy, retry: int, rng: random.Random) -> float | None:
    """Seconds to wait before retry ``retry`` (1-based), or None when there is no such retry
    (the message is given up for that subscription). ``rng`` is used by BACKOFF_RETRY only."""
    if retry < 1:
        raise ValueError(f"retry {retry} is below 1")
    if retry > max_retries(strategy):
        return None
    if strategy is NotifyStrategy.BACKOFF_RETRY:
        return rng.uniform(BACKOFF_WAIT_MIN, BACKOFF_WAIT_MAX)
    return float(exp_decay_wait(retry))
