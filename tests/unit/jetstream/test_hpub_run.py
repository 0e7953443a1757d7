"""_wire.c's hpub_run against publisher.hpub_run, its reference (issue 28: CPU a write).

Publisher._next_batch hands its outbox to hpub_run, which takes writes in order while the
window and the batch have room, passes over LSNs settled meanwhile or queued twice, and stops,
leaving it queued, at a write whose command wire.hpub must make (hpub_lsn declines it: two
headers, a subject that is not ASCII). On random outboxes C must leave the outbox, the window,
the batch and the commands as the reference does; _next_batch makes the same batch either way.
"""

from __future__ import annotations

from collections import deque
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.jetstream import publisher as publisher_mod
from gateway.jetstream.publisher import Publisher, hpub_run
from tests.unit.jetstream.compiled import compiled, needs_compiled

_c: Any = getattr(compiled, "hpub_run", None)
needs_hpub_run = needs_compiled("hpub_run", "hpub_lsn")

_write = st.tuples(st.sampled_from(["QS_q.q", "QS_q.q", "QS_é"]),
                   st.sampled_from([{"Nats-Msg-Id": "m1"}, {"Nats-Msg-Id": "m2"}, {"Nats-Msg-Id": "m", "Cmq-Visible-At": "1.5"}]),
                   st.binary(max_size=8))


@needs_hpub_run
@settings(max_examples=800, deadline=None)
@given(st.lists(st.integers(0, 15), max_size=14), st.dictionaries(st.integers(0, 15), _write, max_size=16),
       st.sets(st.integers(0, 15)), st.sets(st.integers(0, 15)), st.integers(0, 20), st.integers(0, 10))
def test_hpub_run_in_c_as_in_python(outbox: list[int], ws: dict[int, Any], sent_lsns: set[int], again: set[int],
                                    max_sent: int, max_batch: int) -> None:
    def run(fn: Any) -> Any:
        box = deque(outbox)
        writes = {lsn: (subject, payload, headers, None, None, None) for lsn, (subject, headers, payload) in ws.items()}
        sent = dict.fromkeys(sent_lsns, 0.5)
        batch: list[int] = []
        commands: list[Any] = []
        fn(box, writes, sent, set(again), "_INBOX.p", 2.5, max_sent, max_batch, batch, commands)
        return list(box), sent, batch, commands

    assert run(_c) == run(hpub_run)


@needs_hpub_run
def test_next_batch_the_same_without_c(monkeypatch: pytest.MonkeyPatch) -> None:
    batches = []
    for use_c in (True, False):
        if not use_c:
            monkeypatch.setattr(publisher_mod, "_hpub_run", None)
        p = Publisher.__new__(Publisher)
        p.prefix = "_INBOX.p"
        p._outbox = deque([1, 2, 3, 2, 4, 5, 6, 7, 9, 8])
        p._writes = {n: ("QS_q.q" if n != 4 else "QS_é", b"x%d" % n,
                         {"Nats-Msg-Id": f"m{n}"} if n != 6 else {"Nats-Msg-Id": "m6", "Cmq-Expires-At": "9"},
                         None, None, None) for n in range(1, 9)}
        p._sent, p._again = {7: 0.0}, {8}
        batch, commands = p._next_batch()
        batches.append((batch, [c[:4] for c in commands], sorted(p._sent), list(p._outbox)))
    assert batches[0] == batches[1]
    assert batches[0][0] == [1, 2, 3, 4, 5, 6]  # 2 queued twice, 7 sent, 8 to send again, 9 settled
