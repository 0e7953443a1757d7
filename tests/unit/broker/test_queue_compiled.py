"""The queue model's compiled common path (gateway/broker/_queue.c) against the Python model.

CmqQueue's send / receive / delete are the C twins once gateway.broker.queue is imported
(semantics.queue.use_compiled); ``PyQueue`` keeps the Python methods (py_send, py_receive,
py_delete). Random sequences of sends (plain, delayed, with a TTL, a duplicate or too large),
receives, deletes (stale receipts too), nacks with and without requeue, time passing
(visibility ends, delays, deadlines), purges and receive-and-deletes run through one queue of
each, over random attributes (x-max-length, TTL, a dead-letter policy, rewind, a default
delay), lanes and folds at small limits: every result, refusal, event and every slot of the
queue and of its messages must be the same. SPEC Q1, Q3, Q4, Q6, Q8, M7, M12, M13.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
from collections import deque
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.broker import queue as broker_queue
from semantics import queue as Q
from semantics.errors import CMQError
from semantics.queue_attrs import QueueAttributes
from semantics.queue_cold import ColdRun, LiveRun

pytestmark = pytest.mark.skipif(broker_queue.COMPILED is None, reason="pure Python: no compiled twin to compare")


class PyQueue(Q.CmqQueue):
    """The model with its Python methods (the reference)."""

    __slots__ = ()
    send = Q.py_send  # type: ignore[assignment]
    receive = Q.py_receive  # type: ignore[assignment]
    delete = Q.py_delete  # type: ignore[assignment]
    restore_plain = Q.py_restore_plain  # type: ignore[assignment]


class Freezer:
    def __init__(self) -> None:
        self.payloads: list[object] = []

    def freeze(self, msg_id: str, payload: object, enqueue_time: float) -> int:
        if len(self.payloads) % 5 == 4:
            self.payloads.append(None)
            return -1  # refused for now, as the gateway's may
        self.payloads.append(payload)
        return len(self.payloads) - 1

    def thaw(self, index: int, msg_id: str, enqueue_time: float, size: int, ref: int) -> object:
        return self.payloads[ref]


_QUEUE_SLOTS = [s for s in Q.CmqQueue.__slots__ if s not in ("__weakref__", "on_drained", "on_rewind")]


def _message(m: Q.QueueMessage) -> tuple[Any, ...]:
    return tuple(getattr(m, s, "<unset>") for s in Q._MESSAGE_SLOTS)


def _value(v: Any) -> Any:
    if isinstance(v, Q.QueueMessage):
        return ("msg", _message(v))
    if isinstance(v, Q.QueueEvent):
        return (type(v).__name__, *(_value(getattr(v, f)) for f in v.__slots__))
    if isinstance(v, (tuple, list, deque)):
        return (type(v).__name__, [_value(x) for x in v])
    if isinstance(v, dict):
        return ("dict", [(k, _value(x)) for k, x in v.items()])
    if isinstance(v, itertools.count):
        return repr(v)
    if v is _priority:
        return "priority"
    if isinstance(v, (LiveRun, ColdRun)):
        return (type(v).__name__, len(v), v.last() if len(v) else None)
    if isinstance(v, (Freezer, QueueAttributes)) or v is None or isinstance(v, (int, float, str, bool)):
        return v if not isinstance(v, Freezer) else "freezer"
    raise AssertionError(f"no snapshot for {type(v)}")


def _thaw(index: int, msg_id: str, enqueue_time: float, size: int, ref: int) -> object:
    return f"p{msg_id}"


def _priority(payload: object) -> int:
    return len(str(payload)) % 4


def snapshot(q: Q.CmqQueue) -> dict[str, Any]:
    """Every slot of the queue, its messages by value (their every slot)."""
    return {s: _value(getattr(q, s)) for s in _QUEUE_SLOTS}


def outcome(call: Any) -> Any:
    try:
        return ("ok", _value(call()))
    except CMQError as e:  # LimitError and MaxLengthRejected are CMQErrors
        return (type(e).__name__, str(e))


# Sends and receives weigh more, time mostly moves a little: the Active order and the lanes
# then grow to their limits, and most calls are the plain case the C path takes.
KINDS = (["send"] * 7 + ["restore"] * 4 + ["receive"] * 6 + ["delete"] * 3
         + ["release", "drop", "tick", "receive_and_delete", "purge"])
SENDS = ["plain"] * 6 + ["delay", "ttl", "dup", "big"]
RECEIVES: list[float | None] = [None] * 6 + [1.0, 5.0]
# restore_plain's (a pulled message's) enqueue time: just before now (in order or a little
# out of it), well before (the deadline lane out of order), past retention (due at once), an
# int; or an ID already in the queue.
RESTORES = ["recent"] * 5 + ["back", "old", "int", "dup"]
ops = st.lists(st.tuples(st.sampled_from(KINDS), st.integers(0, 1000),
                         st.floats(0, 1.5)), min_size=20, max_size=150)

attributes = st.fixed_dictionaries({}, optional={
    "visibility_timeout": st.sampled_from([1, 2, 10]),
    "msg_retention_seconds": st.sampled_from([60, 90]),
    "max_msg_size": st.just(1024),
    "rewind_seconds": st.sampled_from([0, 30]),
    "delay_seconds": st.sampled_from([0, 0, 2]),
    "message_ttl_ms": st.sampled_from([5000, 20000]),
    "max_length": st.sampled_from([3, 10]),
    "max_msg_heap_num": st.sampled_from([5, 1000]),
})


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(attrs=attributes, dead_letter=st.sampled_from([None, "receive", "ttl"]), ops=ops,
       small=st.booleans(), fold=st.booleans(), priorities=st.booleans(), cold=st.booleans())
def test_compiled_queue_is_the_python_model(attrs: dict[str, Any], dead_letter: str | None,
                                            ops: list[tuple[str, int, float]], small: bool, fold: bool,
                                            priorities: bool, cold: bool) -> None:
    if dead_letter == "receive":
        attrs = {**attrs, "dead_letter_queue": "dlq", "max_receive_count": 2}
    elif dead_letter == "ttl":
        attrs = {**attrs, "dead_letter_queue": "dlq", "max_time_to_live": 300}
    a = QueueAttributes(**attrs)
    queues = [Q.CmqQueue("q", a), PyQueue("q", a)]
    for q in queues:
        if small:  # lanes compacted and the Active order folded within a short sequence
            q._vis_limit = q._dl_limit = 4
        if fold:
            q.fold_with(Freezer(), keep=2, tail=1, batch=3)
        if priorities:
            q.set_priorities(3, _priority)
    assert type(queues[0]).send is not Q.py_send and type(queues[1]).send is Q.py_send
    assert type(queues[0]).restore_plain is not Q.py_restore_plain
    assert type(queues[1]).restore_plain is Q.py_restore_plain
    receipts: list[list[Q.Receipt]] = [[], []]
    ids = itertools.count(2**60)  # the process's own form, beyond new_msg_id's: folds take them
    last_id = None
    used: list[str] = []
    now = 1000.0
    if cold:  # a recovered backlog held as a run: its IDs are in no _messages (Q3 asks the run)
        cold_ids = [Q._OWN_IDS + f"{next(ids):016x}" for _ in range(3)]
        used += cold_ids
        for q in queues:
            run = ColdRun(_thaw)
            for i, msg_id in enumerate(cold_ids):
                run.append(msg_id, now - 5.0 + i, 16, i)
            q.restore_cold(run, now)
    for op, n, dt in ops:
        now += dt * 40 if op == "tick" else dt
        arg: Any = (SENDS[n % len(SENDS)] if op == "send" else RECEIVES[n % len(RECEIVES)] if op == "receive"
                    else RESTORES[n % len(RESTORES)] if op == "restore" else n)
        if op == "restore":
            # a repeated ID: any sent or restored before (a folded one too: Q3 on a cold run's)
            msg_id = Q._OWN_IDS + f"{next(ids):016x}" if arg != "dup" or not used else used[n % len(used)]
            last_id = msg_id
            used.append(msg_id)
            back = {"recent": dt, "back": 30.0 + dt, "old": 100.0 + dt}.get(arg, 0.0)
            enq: float = int(now) if arg == "int" else now - back
            results = [outcome(functools.partial(q.restore_plain, f"p{msg_id}", 16, now, msg_id, enq))
                       for q in queues]
        elif op == "send":
            msg_id = Q._OWN_IDS + f"{next(ids):016x}" if arg != "dup" or last_id is None else last_id
            last_id = msg_id
            used.append(msg_id)
            size = 2000 if arg == "big" else 16
            delay = 3.0 if arg == "delay" else None
            expires_at = now + 4.0 if arg == "ttl" else None
            results = [outcome(functools.partial(q.send, f"p{msg_id}", size, now, delay, msg_id, expires_at))
                       for q in queues]
        elif op == "receive":
            got = [q.receive(now, arg) if arg is not None else q.receive(now) for q in queues]
            results = [_value(r) for r in got]
            for i, r in enumerate(got):
                if r is not None:
                    receipts[i].append(r)
        elif op in ("delete", "release", "drop"):
            if not receipts[0]:
                continue
            k = arg % len(receipts[0])
            results = [_value(getattr(q, op)(receipts[i][k], now)) for i, q in enumerate(queues)]
        elif op == "tick":
            results = [_value(q.tick(now)) for q in queues]
        elif op == "purge":
            results = [_value(q.purge(now)) for q in queues]
        else:
            results = [_value(q.receive_and_delete(now)) for q in queues]
        assert results[0] == results[1], (op, arg)
        assert snapshot(queues[0]) == snapshot(queues[1]), (op, arg)
        assert _value(queues[0].next_wakeup()) == _value(queues[1].next_wakeup())
    assert _value(queues[0].drain_events()) == _value(queues[1].drain_events())


def _configured(send: Any, receive: Any, delete: Any, restore_plain: Any = Q.py_restore_plain) -> dict[str, Any]:
    from gateway.broker import _queue  # type: ignore[attr-defined]
    made: dict[str, Any] = _queue.configure(
        Q.CmqQueue, Q.QueueMessage, Q.Receipt, send, receive, delete,
        (Q.ACTIVE, Q.INACTIVE, Q.DELETED, Q.REMOVED), (Q._VISIBLE, Q._DEADLINE), restore_plain, Q._MIN_COMPACT)
    return made


def test_the_plain_case_is_taken_compiled() -> None:
    """The broker's calls (by position, a float now, an ID given) never reach the Python
    methods; a delayed send, a receive with its own visibility and a delete with a timer due do."""
    called: list[str] = []

    def spy(name: str, func: Any) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            called.append(name)
            return func(*args, **kwargs)
        return call

    made = _configured(spy("send", Q.py_send), spy("receive", Q.py_receive), spy("delete", Q.py_delete))
    try:
        q = Q.CmqQueue("q")
        send, receive, delete = made["send"], made["receive"], made["delete"]
        msg = send(q, "body", 4, 10.0, None, "m1", None)
        receipt = receive(q, 11.0)
        assert receipt is not None and type(receipt) is Q.Receipt and receipt.message is msg
        assert delete(q, receipt, 12.0) is True
        assert delete(q, receipt, 12.0) is False  # Q3: stale now
        assert len(q) == 0 and q.active == 0 and q.inactive == 0
        assert called == []
        send(q, "body", 4, 13.0, 5.0, "m2", None)
        send(q, "body", 4, 13.0, None, "m3", None)
        receipt = receive(q, 14.0, 60.0)
        delete(q, receipt, 10_000.0)
        assert called == ["send", "receive", "delete"]
    finally:
        made = _configured(Q.py_send, Q.py_receive, Q.py_delete)
        Q.use_compiled(made["send"], made["receive"], made["delete"], made["restore_plain"])
    assert type(Q.CmqQueue.__dict__["send"]).__name__ == "method_descriptor"


@contextlib.contextmanager
def _spied_restore() -> Iterator[tuple[Any, list[str]]]:
    """The compiled restore_plain, its Python fallback recording each call it is handed; the
    module's twins are configured again afterwards."""
    called: list[str] = []

    def spy(*args: Any) -> Any:
        called.append("restore_plain")
        return Q.py_restore_plain(*args)

    made = _configured(Q.py_send, Q.py_receive, Q.py_delete, spy)
    try:
        yield made["restore_plain"], called
    finally:
        made = _configured(Q.py_send, Q.py_receive, Q.py_delete)
        Q.use_compiled(made["send"], made["receive"], made["delete"], made["restore_plain"])


def test_a_pulled_message_is_restored_compiled() -> None:
    """JetStream's call (by position, float times, a new ID, enqueue times in order) never
    reaches the Python method; an ID in the queue (Q3), a deadline out of order or past, and a
    dead-letter queue do."""
    with _spied_restore() as (restore, called):
        q = Q.CmqQueue("q")
        m1 = restore(q, "body", 4, 10.0, "m1", 5.0)
        m2 = restore(q, "body", 4, 10.0, "m2", 6.0)
        assert (m1.pos, m2.pos, m2.seq, m2.next_visible_time, m2.deadline) == (0, 1, 1, 10.0, 6.0 + q._retention)
        assert q.active == 2 and called == []
        with pytest.raises(CMQError):
            restore(q, "body", 4, 10.0, "m1", 7.0)
        restore(q, "body", 4, 10.0, "m3", 1.0)  # before m2's deadline: the timer heap's
        restore(q, "body", 4, 10.0 + q._retention, "m4", 20.0)  # m1-m3's retention ends: _advance
        dlq = Q.CmqQueue("d", QueueAttributes(dead_letter_queue="dlq", max_receive_count=2))
        restore(dlq, "body", 4, 10.0, "m1", 5.0)
        empty = Q.CmqQueue("e")
        restore(empty, "body", 4, 2.0 + empty._retention, "m1", 1.0)  # its retention over: Q1 removes it at once
        assert called == ["restore_plain"] * 5 and len(empty) == 0
        assert list(q._messages) == ["m4"] and q.active == 1



@pytest.mark.parametrize("stale", [Q._MIN_COMPACT - 10, Q._MIN_COMPACT + 100])
def test_a_restore_that_compacts_the_active_order_is_the_python_models(stale: int) -> None:
    """More than _MIN_COMPACT stale entries in the Active order, and more than half of it:
    deletes of messages whose visibility ended (ACTIVE again, each entry left stale) do not
    compact, the next restore does (Python's _compact_active), so the C twin hands that call to
    the Python method; the compiled queue and the Python one end alike, compacted. With fewer
    stale entries the same call stays compiled: the compaction test is what decides."""
    compacts = stale > Q._MIN_COMPACT
    with _spied_restore() as (restore, called):
        queues = [Q.CmqQueue("q", QueueAttributes(visibility_timeout=1)),
                  PyQueue("q", QueueAttributes(visibility_timeout=1))]
        n = stale
        for q in queues:
            receipts = []
            for i in range(n):
                q.send("body", 4, 1000.0, None, f"m{i}", None)
            for _ in range(n):
                receipts.append(q.receive(1000.0))
            for r in receipts:  # at 1002 their visibility has ended: ACTIVE again, then deleted
                assert q.delete(r, 1002.0) is True
            assert q._active_stale == n and len(q) == 0
        assert called == []
        restored = [restore(queues[0], "body", 4, 1002.0, "late", 1001.0),
                    queues[1].restore_plain("body", 4, 1002.0, "late", 1001.0)]
        # The compiled twin's compaction check sent it to the Python method, or not.
        assert called == (["restore_plain"] if compacts else [])
        assert _value(restored[0]) == _value(restored[1])
        assert snapshot(queues[0]) == snapshot(queues[1])
        for q in queues:
            if compacts:
                assert q._active_stale == 0 and list(q._active) == [q._messages["late"]] and not q._returned
            else:
                assert q._active_stale == n and q._active[-1] is q._messages["late"]


def test_other_arguments_go_to_the_python_model() -> None:
    """Keywords, an int time, no ID: the Python method's results, refusals included."""
    q = Q.CmqQueue("q", QueueAttributes(max_msg_size=1024))
    m = q.send("body", 4, 10, msg_id="m1")
    assert m.enqueue_time == 10 and type(m.enqueue_time) is int
    fresh = q.send("body", 4, 10.5)
    assert fresh.msg_id.startswith(Q.MSG_ID_PREFIX)
    with pytest.raises(CMQError):
        q.send("body", 4, 11.0, None, "m1", None)  # Q3: the ID is in the queue
    with pytest.raises(CMQError):
        q.send("x", 2000, 11.0, None, "m2", None)  # L6
    with pytest.raises(TypeError):
        q.send()  # type: ignore[call-arg]
    r = q.receive(now=12.0)
    assert r is not None and r.message is m
    assert q.delete(receipt=r, now=12.5) is True
