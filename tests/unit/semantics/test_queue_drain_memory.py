"""A drained queue lets go of its messages at once (issue 15): the timer lanes held every
removed message until its retention deadline, days later."""

from __future__ import annotations

import gc
import weakref

from semantics.queue import CmqQueue


class Payload:
    pass


def test_Q1_a_drained_queue_holds_no_removed_message() -> None:
    q = CmqQueue("q")
    payloads = [Payload() for _ in range(3)]
    refs = [weakref.ref(p) for p in payloads]
    for p in payloads:
        q.send(p, 1, 0.0)
    del payloads, p
    while (r := q.receive(1.0)) is not None:
        assert q.delete(r, 1.0)
    del r
    gc.collect()
    assert [ref() for ref in refs] == [None, None, None]
    assert q.next_wakeup() is None
    q.send(Payload(), 1, 2.0)  # and the queue works on as before
    assert q.receive(2.0) is not None and q.inactive == 1


def test_Q1_a_queue_with_a_message_left_keeps_its_deadlines() -> None:
    q = CmqQueue("q")
    q.send(Payload(), 1, 0.0)
    q.send(Payload(), 1, 0.0)
    r = q.receive(1.0)
    assert r is not None and q.delete(r, 1.0)
    assert q.next_wakeup() is not None and len(q) == 1
