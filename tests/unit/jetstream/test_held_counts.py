"""L8's count on JetStream (``messages.held``) reads the local model's count fields directly
(issue 28: CPU a publish): it must stay the sum of the properties it stands for, Active,
Inactive and Delayed (parked ones included), plus JetStream's undelivered count."""

from __future__ import annotations

from types import SimpleNamespace

from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.jetstream.messages import held
from semantics import queue as Q
from semantics.queue_attrs import QueueAttributes


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from(["send", "delayed", "receive", "delete"]), max_size=40),
       st.integers(min_value=0, max_value=50), st.integers(min_value=1, max_value=6))
def test_L8_held_is_the_sum_of_the_model_counts(steps: list[str], remote: int, inflight: int) -> None:
    cmq = Q.CmqQueue("q", QueueAttributes(), leased=True)
    cmq.max_inflight = inflight  # small, so that delayed messages park too
    now = 1000.0
    receipts = []
    for step in steps:
        now += 0.001
        if step == "send":
            cmq.send(b"x", 1, now)
        elif step == "delayed":
            cmq.send(b"x", 1, now, delay=60.0)
        elif step == "receive":
            r = cmq.receive(now)
            if r is not None:
                receipts.append(r)
        elif receipts:
            cmq.delete(receipts.pop(0), now)
    q = SimpleNamespace(cmq=cmq, remote_ready=remote)
    s = SimpleNamespace(delays={})
    assert held(q, s) == remote + cmq.active + cmq.inactive + cmq.delayed  # type: ignore[arg-type]
    s.delays = {"m1": (now + 5, True), "m2": (now + 5, False)}
    assert held(q, s) == remote + cmq.active + cmq.inactive + cmq.delayed + 1  # type: ignore[arg-type]
