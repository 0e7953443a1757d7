"""CL4/Q1: a lease is not naked once JetStream's own ack_wait (visibility timeout + 1 s) is
about to hand it out or has: a nak reaching the server after that makes it deliver the message
once more while another gateway holds it (docs/CLUSTER.md, "The NATS server"). A younger
lease is naked as before."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace
from typing import Any

from gateway.jetstream.pulls import NAK_LATE_MARGIN, Pulls, lease_age
from semantics.queue_attrs import QueueAttributes


def _reply(sent_ns: int, newer_form: bool = False) -> str:
    head = "$JS.ACK.dom.acchash.S.C" if newer_form else "$JS.ACK.S.C"
    tail = f".1.5.5.{sent_ns}.0"
    return head + tail + (".token" if newer_form else "")


def test_lease_age_reads_the_servers_time_in_both_forms() -> None:
    now = time.time_ns()
    assert lease_age(_reply(now - 2_500_000_000), now) == 2.5
    assert lease_age(_reply(now - 1_000_000_000, newer_form=True), now) == 1.0
    assert lease_age("$JS.ACK.S.C.1.5.5.notatime.0", now) is None
    assert lease_age("_INBOX.x", now) is None


def _naked(age: float, visibility_timeout: int = 2) -> list[str]:
    sent: list[str] = []

    async def request(subject: str, payload: bytes, timeout: float) -> None:
        assert payload == b"-NAK"
        sent.append(subject)

    p = Pulls.__new__(Pulls)
    p.link = SimpleNamespace(nc=SimpleNamespace(request=request))  # type: ignore[assignment]
    p.want = lambda s: None  # type: ignore[method-assign]
    q = SimpleNamespace(attrs=QueueAttributes(visibility_timeout=visibility_timeout))
    s: Any = SimpleNamespace(q=q, forgetting=None, naks_pending=1)
    m = SimpleNamespace(reply=_reply(time.time_ns() - int(age * 1e9)))
    asyncio.run(p._nak_confirmed(s, m))
    assert s.naks_pending == 0
    return sent


def test_CL4_a_lease_past_ack_wait_is_left_to_jetstream() -> None:
    ack_wait = 2 + 1.0
    assert _naked(ack_wait + 0.5) == []
    assert _naked(ack_wait - NAK_LATE_MARGIN / 2) == []


def test_Q1_a_younger_lease_is_naked() -> None:
    assert len(_naked(0.1)) == 1
    assert len(_naked(2.0)) == 1  # at the visibility timeout itself, as the timer sends it
