"""Queue attributes and their ranges: L6, L7, L8, Q8 (and the RabbitMQ extensions of M7)."""

from __future__ import annotations

import pytest

from semantics.errors import CMQError, LimitError
from semantics.queue_attrs import QueueAttributes, check_delay


def test_defaults_are_cmqs() -> None:
    """L6/L7/L8: the defaults are CMQ's."""
    a = QueueAttributes()
    assert (a.visibility_timeout, a.msg_retention_seconds, a.max_msg_size) == (30, 345_600, 65_536)
    assert (a.rewind_seconds, a.polling_wait_seconds, a.delay_seconds) == (0, 0, 0)
    assert a.dead_letter_queue is None and a.max_length is None and a.message_ttl is None


@pytest.mark.parametrize(
    ("field", "rule", "low", "high"),
    [
        ("max_msg_size", "L6", 1_024, 65_536),
        ("msg_retention_seconds", "L7", 60, 1_296_000),
        ("visibility_timeout", "L8", 1, 43_200),
        ("polling_wait_seconds", "L8", 0, 30),
        ("delay_seconds", "L8", 0, 3_600),
    ],
)
def test_L6_L7_L8_ranges_are_inclusive_and_refused_outside(field: str, rule: str, low: int, high: int) -> None:
    """L6, L7, L8: both ends are accepted; one past either end is refused naming the rule,
    the attribute, the value and the range."""
    assert getattr(QueueAttributes(**{field: low}), field) == low
    assert getattr(QueueAttributes(**{field: high}), field) == high
    for bad in (low - 1, high + 1):
        with pytest.raises(LimitError) as info:
            QueueAttributes(**{field: bad})
        assert info.value.rule == rule
        assert info.value.value == bad
        assert info.value.limit == (low, high)
        assert f"{field}={bad}" in str(info.value)
        assert f"{low:,}-{high:,}" in str(info.value)
        assert f"(CMQ limit {rule})" in str(info.value)
        assert info.value.reply_code == 406


def test_L8_rewind_seconds_range_and_never_above_retention() -> None:
    """L8 / Q6: rewindSeconds is 0-1,296,000 and never above msgRetentionSeconds."""
    assert QueueAttributes(msg_retention_seconds=1_296_000, rewind_seconds=1_296_000).rewind_seconds == 1_296_000
    assert QueueAttributes(msg_retention_seconds=3_600, rewind_seconds=3_600).rewind_seconds == 3_600
    with pytest.raises(LimitError) as info:
        QueueAttributes(msg_retention_seconds=3_600, rewind_seconds=3_601)
    assert info.value.rule == "L8"
    assert "above msg_retention_seconds=3600" in str(info.value)
    with pytest.raises(LimitError) as info:
        QueueAttributes(rewind_seconds=-1)
    assert info.value.rule == "L8"


def test_L8_max_msg_heap_num_is_positive() -> None:
    """L8: maxMsgHeapNum is configurable, at least 1."""
    assert QueueAttributes(max_msg_heap_num=1).max_msg_heap_num == 1
    with pytest.raises(LimitError) as info:
        QueueAttributes(max_msg_heap_num=0)
    assert info.value.rule == "L8"


def test_booleans_and_strings_are_not_numbers() -> None:
    """L8: True is not a visibility timeout of 1 s; '30' is not 30."""
    with pytest.raises(LimitError):
        QueueAttributes(visibility_timeout=True)
    with pytest.raises(LimitError):
        QueueAttributes(visibility_timeout="30")  # type: ignore[arg-type]


@pytest.mark.parametrize(("field", "low", "high"), [("max_receive_count", 1, 1_000),
                                                     ("max_time_to_live", 300, 43_200)])
def test_Q8_dead_letter_policy_ranges(field: str, low: int, high: int) -> None:
    """Q8: maxReceiveCount 1-1,000; maxTimeToLive 300-43,200 s."""
    for ok in (low, high):
        assert getattr(QueueAttributes(dead_letter_queue="dlq", **{field: ok}), field) == ok
    for bad in (low - 1, high + 1):
        with pytest.raises(LimitError) as info:
            QueueAttributes(dead_letter_queue="dlq", **{field: bad})
        assert info.value.rule == "Q8"
        assert info.value.value == bad


def test_Q8_policy_needs_both_a_queue_and_a_bound() -> None:
    """Q8: a dead-letter queue without a bound, or a bound without a queue, is refused."""
    with pytest.raises(CMQError) as info:
        QueueAttributes(dead_letter_queue="dlq")
    assert info.value.rule == "Q8"
    with pytest.raises(CMQError) as info:
        QueueAttributes(max_receive_count=3)
    assert info.value.rule == "Q8"


def test_rabbitmq_extensions_validated() -> None:
    """M7: x-message-ttl (ms) >= 0, x-max-length >= 0, x-overflow one of RabbitMQ's."""
    a = QueueAttributes(message_ttl_ms=1_500, max_length=0, overflow="reject-publish")
    assert a.message_ttl == 1.5
    for bad in ({"message_ttl_ms": -1}, {"max_length": -1}, {"overflow": "drop-tail"}):
        with pytest.raises(CMQError) as info:
            QueueAttributes(**bad)  # type: ignore[arg-type]
        assert info.value.rule == "M7"


def test_replace_validates_again() -> None:
    """L8: SetQueueAttributes goes through the same checks."""
    a = QueueAttributes()
    assert a.replace(visibility_timeout=60).visibility_timeout == 60
    with pytest.raises(LimitError):
        a.replace(visibility_timeout=43_201)


def test_L8_message_delay_range() -> None:
    """Q4 / L8: a message delay is 0-3,600 s."""
    check_delay(0)
    check_delay(3_600)
    with pytest.raises(LimitError) as info:
        check_delay(3_601)
    assert info.value.rule == "L8"
    assert info.value.value == 3_601
