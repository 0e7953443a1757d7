"""semantics.send_rules: the CMQ rules every message store applies on the way in (issue 28).

The message-storage contract (test_message_storage.py) runs them through both stores; these
pin the rules themselves, including the edges the JetStream store's own copies got wrong."""

from __future__ import annotations

import pytest

from semantics import limits
from semantics.errors import LimitError
from semantics.send_rules import (
    MaxLengthRejected,
    check_heap,
    check_room,
    check_size,
    message_expiry,
    send_delay,
    send_expiry,
)


def test_L6_refuses_only_above_the_size_and_only_when_enforced() -> None:
    check_size("q", 1024, 1024, True)
    check_size("q", 1025, 1024, False)  # compatible profile: taken (and reported elsewhere, PF4)
    with pytest.raises(LimitError) as e:
        check_size("q", 1025, 1024, True)
    assert (e.value.rule, e.value.value, e.value.limit) == ("L6", 1025, 1024)


def test_L8_heap_refuses_at_the_limit() -> None:
    check_heap("q", 999, 1000)
    with pytest.raises(LimitError) as e:
        check_heap("q", 1000, 1000)
    assert e.value.rule == "L8"


def test_Q4_default_delay_and_L8_range() -> None:
    assert send_delay(None, 5.0) == 5.0
    assert send_delay(0, 5.0) == 0  # an explicit 0 is no delay, not the default
    with pytest.raises(LimitError):
        send_delay(-1, 0.0)
    with pytest.raises(LimitError):
        send_delay(limits.DELAY_SECONDS_MAX + 1, 0.0)


def test_M7_message_ttl_counts_from_the_asked_delay_and_a_zero_ttl_is_one() -> None:
    assert message_expiry(100.0, None, None) is None
    assert message_expiry(100.0, 3.0, 2.0) == 105.0
    # ttl 0 expires at once; the JetStream store's own copy took 0 for "no TTL" (issue 28).
    assert message_expiry(100.0, None, 0) == 100.0


def test_M7_the_earlier_of_the_queue_ttl_and_the_message_expiry() -> None:
    assert send_expiry(100.0, 2.0, None, None) is None
    assert send_expiry(100.0, 2.0, 10.0, None) == 112.0  # x-message-ttl counts after the delay
    assert send_expiry(100.0, 2.0, 10.0, 105.0) == 105.0
    assert send_expiry(100.0, 2.0, 1.0, 105.0) == 103.0
    assert send_expiry(100.0, 0.0, 10.0, 100.0) == 100.0


def test_M7_reject_publish_refuses_a_full_queue_not_a_delayed_message_nor_drop_head() -> None:
    check_room("q", 0.0, 1, 2, "reject-publish")
    with pytest.raises(MaxLengthRejected):
        check_room("q", 0.0, 2, 2, "reject-publish")
    with pytest.raises(MaxLengthRejected):
        check_room("q", 0.0, 2, 2, "reject-publish-dlx")
    check_room("q", 5.0, 2, 2, "reject-publish")  # delayed: not ready, so it has room
    check_room("q", 0.0, 2, 2, "drop-head")
    check_room("q", 0.0, 10**6, None, "reject-publish")
