"""_wire.c's stored_run against publisher.stored_run, its reference (issue 28: CPU a PubAck).

A run of PubAcks read together is settled in one C call while each names a stored write of the
store's (or no write: an earlier attempt's answer); it stops at anything else (a duplicate's
seq 0, an error, a status text, an LSN that is not plain digits, a write of another settle),
which Publisher._replied_plains reads itself. On random runs C must stop where the reference
stops and take the same writes out of the same places, in order. And _replied_plains settles
the same with and without C.
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.jetstream import publisher as publisher_mod
from gateway.jetstream.publisher import Publisher, stored_run
from tests.unit.jetstream.compiled import compiled, needs_compiled

_c: Any = getattr(compiled, "stored_run", None)
needs_stored_run = needs_compiled("stored_run")


def one(lsn: int, refused: bool, done: Any) -> None:  # the store's settle (its identity is what counts)
    raise AssertionError("not called by stored_run")


def other(lsn: int, refused: bool, done: Any) -> None:
    raise AssertionError("not called by stored_run")


_DONES = [lambda: None, lambda: None]
_data = st.sampled_from([
    b'{"stream":"S", "seq":12}', b'{"stream":"S","seq":7,"duplicate": true}', b'{"stream":"S", "seq":0}',
    b'{"stream":"S", "seq":3, "error":{"code":1}}', b'{"error":{"code":503}}', b"", b"junk",
    b'{"stream":"S",  "seq":00012}',
])
_tail = st.one_of(st.integers(0, 12).map(lambda n: str(n).encode()),
                  st.sampled_from([b"", b"+1", b"1_0", b"x", b"1" * 19, b" 3"]))
_reply = st.tuples(st.sampled_from([b"_INBOX.abc.", b"_INBOX.", b"", b"a.b."]), _tail, _data).map(
    lambda t: (t[0] + t[1], t[2]))


@needs_stored_run
@settings(max_examples=1000, deadline=None)
@given(st.lists(st.one_of(_reply, _reply, _reply, st.just(("x", b"y"))), max_size=10), st.integers(0, 2),
       st.dictionaries(st.integers(0, 12), st.tuples(st.sampled_from([one, one, one, other]), st.integers(0, 1)),
                       max_size=13),
       st.sets(st.integers(0, 12)), st.sets(st.integers(0, 12)))
def test_stored_run_in_c_as_in_python(replies: list[Any], start: int, ws: dict[int, Any], sent_lsns: set[int],
                                      again_lsns: set[int]) -> None:
    def run(fn: Any) -> Any:
        writes = {lsn: ("S", b"p", {}, _DONES[d], None, settle) for lsn, (settle, d) in ws.items()}
        sent = {lsn: 1.0 for lsn in sent_lsns}
        again = set(again_lsns)
        out: list[Any] = []
        i = fn(replies, start, writes, sent, again, one, out)
        return i, sorted(writes), sent, again, [(lsn, id(done)) for lsn, done in out]

    assert run(_c) == run(stored_run)


@needs_stored_run
def test_replied_plains_settles_the_same_without_c(monkeypatch: pytest.MonkeyPatch) -> None:
    replies = [(b"_INBOX.p.%d" % n, b'{"stream":"S", "seq":%d}' % (n if n % 5 else 0)) for n in range(1, 30)]
    replies += [(b"_INBOX.p.3", b'{"stream":"S", "seq":3}'), (b"_INBOX.p.31", b'{"error":{"code":10077}}')]
    results = []
    for use_c in (True, False):
        if not use_c:
            monkeypatch.setattr(publisher_mod, "_stored_run", None)
        loop = asyncio.new_event_loop()
        try:
            p = Publisher.__new__(Publisher)
            p._loop = loop
            p._outbox, p._sent, p._again, p._told_unknown = deque(), {}, set(), False
            settled: list[Any] = []
            many: list[Any] = []

            def one_settle(lsn: int, refused: bool, done: Any, settled: list[Any] = settled) -> None:
                settled.append((lsn, refused))

            p.settles = (one_settle, lambda ws, many=many: many.append([lsn for lsn, _ in ws]))
            p._writes = {n: ("S", b"p", {}, _DONES[0], lambda: False, one_settle) for n in range(1, 32)}
            p._sent = {n: 1.0 for n in range(1, 32)}
            p._replied_plains(replies)
            results.append((settled, many, sorted(p._writes), sorted(p._sent), sorted(p._again)))
        finally:
            loop.close()
    assert results[0] == results[1]
    assert results[0][1][0] == [1, 2, 3, 4]  # the run up to the first seq 0
