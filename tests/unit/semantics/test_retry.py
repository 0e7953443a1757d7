"""D5, D6: the NotifyStrategy retry schedules."""

from __future__ import annotations

import random

import pytest

from semantics.errors import CMQError
from semantics.retry import (
    DEFAULT_STRATEGY,
    NotifyStrategy,
    exp_decay_schedule,
    exp_decay_wait,
    max_retries,
    parse_strategy,
    retry_wait,
)

BACKOFF = NotifyStrategy.BACKOFF_RETRY
EXP = NotifyStrategy.EXPONENTIAL_DECAY_RETRY


def test_D6_exponential_decay_is_the_default() -> None:
    assert DEFAULT_STRATEGY is EXP
    assert parse_strategy(None) is EXP
    assert parse_strategy("") is EXP


def test_D6_exponential_decay_waits_and_total() -> None:
    schedule = exp_decay_schedule()
    assert len(schedule) == 176
    assert schedule[:11] == (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 512)
    assert set(schedule[9:]) == {512}
    assert sum(schedule[:10]) == 1023
    assert sum(schedule) == 1023 + 166 * 512 == 86_015  # "about one day", under 86,400 s
    assert max_retries(EXP) == 176
    assert exp_decay_wait(10) == 512
    assert retry_wait(EXP, 176, random.Random(0)) == 512.0
    assert retry_wait(EXP, 177, random.Random(0)) is None
    with pytest.raises(ValueError):
        exp_decay_wait(0)


def test_D5_backoff_three_retries_of_10_to_20_seconds() -> None:
    rng = random.Random(7)
    waits = [retry_wait(BACKOFF, n, rng) for n in (1, 2, 3)]
    assert all(w is not None and 10.0 <= w <= 20.0 for w in waits)
    assert retry_wait(BACKOFF, 4, rng) is None
    assert max_retries(BACKOFF) == 3
    # The wait comes from the injected rng, uniformly.
    assert retry_wait(BACKOFF, 1, random.Random(3)) == random.Random(3).uniform(10, 20)
    many = [retry_wait(BACKOFF, 1, rng) for _ in range(2000)]
    assert min(w for w in many if w is not None) < 10.1
    assert max(w for w in many if w is not None) > 19.9


def test_D5_D6_parse_strategy_from_binding_arguments() -> None:
    assert parse_strategy("BACKOFF_RETRY") is BACKOFF
    assert parse_strategy(b"backoff_retry") is BACKOFF
    assert parse_strategy("EXPONENTIAL_DECAY_RETRY") is EXP
    with pytest.raises(CMQError) as info:
        parse_strategy("LINEAR")
    assert info.value.reply_code == 406
    assert "LINEAR" in str(info.value)
