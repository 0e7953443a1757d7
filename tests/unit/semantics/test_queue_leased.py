"""A leased queue model (``CmqQueue(..., leased=True)``): the local model of a queue whose
messages live in a store several gateways share (gateway.jetstream). x-max-length and Q6's
deleted copies are the store's; a rewind is checked here as on one gateway, then handed to the
store through ``on_rewind``."""

from __future__ import annotations

from typing import Any

import pytest

from semantics.errors import CMQError
from semantics.queue import CmqQueue
from semantics.queue_attrs import QueueAttributes

T0 = 1_700_000_000.0


def _leased(**attrs: Any) -> CmqQueue:
    return CmqQueue("shared", QueueAttributes(msg_retention_seconds=86_400, **attrs), leased=True)


def test_Q6_a_leased_model_keeps_no_deleted_copies() -> None:
    """Q6 on a shared store: the stream keeps deleted messages, the leased model does not."""
    q = _leased(rewind_seconds=3_600)
    m = q.send(b"a", 1, T0)
    r = q.receive(T0)
    assert r is not None and q.delete(r, T0)
    assert (q.rewindable, q.get(m.msg_id)) == (0, None)
    plain = CmqQueue("alone", QueueAttributes(msg_retention_seconds=86_400, rewind_seconds=3_600))
    p = plain.send(b"a", 1, T0)
    r = plain.receive(T0)
    assert r is not None and plain.delete(r, T0)
    assert (plain.rewindable, plain.get(p.msg_id)) == (1, p)  # the same steps alone keep it


def test_Q6_a_leased_rewind_is_checked_here_and_handed_to_the_store() -> None:
    """Q6's checks (range, forward only) are one gateway's; a rewind that passes them goes to
    ``on_rewind`` (the shared consumer moves), one that fails does not."""
    q = _leased(rewind_seconds=3_600)
    moved: list[float] = []
    q.on_rewind = moved.append
    now = T0 + 100
    assert q.rewind(T0 + 50, now) == 0  # nothing here to make Active: the store redelivers
    with pytest.raises(CMQError) as e:
        q.rewind(now - 3_601, now)  # older than the range
    assert e.value.rule == "Q6"
    with pytest.raises(CMQError):
        q.rewind(T0 + 40, now)  # backwards
    assert moved == [T0 + 50]


def test_Q6_a_leased_rewind_with_rewind_off_is_refused() -> None:
    q = _leased()
    q.on_rewind = lambda to: pytest.fail("handed to the store")
    with pytest.raises(CMQError):
        q.rewind(T0, T0 + 1)


def test_M7_a_leased_model_leaves_x_max_length_to_the_store() -> None:
    """x-max-length counts the stream's ready messages (gateway.jetstream.maxlength), not the
    leases: the leased model takes more than the limit; alone, the same sends drop the head."""
    leased = _leased(max_length=2)
    plain = CmqQueue("alone", QueueAttributes(msg_retention_seconds=86_400, max_length=2))
    for i in range(4):
        leased.send(bytes([i]), 1, T0 + i)
        plain.send(bytes([i]), 1, T0 + i)
    assert (leased.active, plain.active) == (4, 2)
