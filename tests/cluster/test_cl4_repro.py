"""The NATS server under the gateways must not hand out one message twice (CMQ Q2/Q3, CL4).

nats-server before 2.10.14 (nats-io/nats-server PR 5305) had a pull consumer bug: when a
message taken from the redelivery queue (a nak, or ack_wait expiry) finds no usable waiting
pull request (all expired, withdrawn, or too small), the consumer's next stream sequence is
moved back instead of the message being put back. The same message is then delivered again
as new (num_delivered 1) next to its redelivery: one receive, acked, and another of the same
message, not flagged redelivered. Under load the gateways' 1 s pull requests are often expired
at the server when a visibility timeout's nak arrives: the fresh-clone CI run of ee6480b failed
test_CL4_a_visibility_timeout_fires_once_across_three_gateways with
{'gw2': [(b'once', True), (b'once', False)]} that way (nats-server 2.9.10).

Here the unusable request is made deterministic (max_bytes smaller than the message): a pull
request the server has to skip, then the nak.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import nats
import pytest
from nats.js.api import AckPolicy, ConsumerConfig, RetentionPolicy, StreamConfig

from tests.support.natsd import NatsCluster


@pytest.fixture(scope="module")
def one_node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NatsCluster]:
    with NatsCluster(Path(tmp_path_factory.mktemp("cl4-nats")), 1) as cluster:
        yield cluster


def _counts(reply: str) -> tuple[int, int]:
    """(num_delivered, stream sequence) from a delivery's ack subject."""
    t = reply.split(".")
    return int(t[4]), int(t[5])


async def _pull(nc, stream: str, wait: float):  # type: ignore[no-untyped-def]
    inbox = nc.new_inbox()
    sub = await nc.subscribe(inbox)
    try:
        await nc.publish(f"$JS.API.CONSUMER.MSG.NEXT.{stream}.c",
                         b'{"batch":1,"expires":%d}' % int(wait * 1e9), reply=inbox)
        try:
            m = await sub.next_msg(timeout=wait + 1.0)
        except nats.errors.TimeoutError:
            return None
        return None if m.headers and m.headers.get("Status") else m
    finally:
        await sub.unsubscribe()


async def _scenario(url: str) -> list[tuple[int, int]]:
    nc = await nats.connect(url)
    try:
        js = nc.jetstream(timeout=10)
        await js.add_stream(StreamConfig(name="CL4R", subjects=["cl4r.x"], num_replicas=1,
                                         retention=RetentionPolicy.WORK_QUEUE))
        await js.add_consumer("CL4R", ConsumerConfig(durable_name="c", ack_policy=AckPolicy.EXPLICIT,
                                                     ack_wait=2.0, max_deliver=-1))
        await js.publish("cl4r.x", b"once", headers={"Nats-Msg-Id": "m1"})
        first = await _pull(nc, "CL4R", 1.0)
        assert first is not None and _counts(first.reply) == (1, 1)
        # A waiting pull request the server must skip (as an expired or withdrawn one is).
        skipped = nc.new_inbox()
        await nc.subscribe(skipped)
        await nc.publish("$JS.API.CONSUMER.MSG.NEXT.CL4R.c", b'{"batch":1,"expires":5000000000,"max_bytes":1}',
                         reply=skipped)
        await nc.flush()
        await asyncio.sleep(0.3)
        await nc.request(first.reply, b"-NAK", timeout=5)  # the visibility timeout's nak
        # Every delivery from here on, none acked, for longer than ack_wait: the message once.
        seen = []
        loop = asyncio.get_running_loop()
        end = loop.time() + 3.0
        while loop.time() < end:
            m = await _pull(nc, "CL4R", 0.5)
            if m is not None:
                seen.append(_counts(m.reply))
        return seen
    finally:
        await nc.close()


def test_a_naked_message_meeting_a_skipped_pull_request_is_delivered_once_as_a_redelivery(
        one_node: NatsCluster) -> None:
    seen = asyncio.run(_scenario(one_node.urls[0]))
    # Once, with num_delivered 2, until ack_wait (2 s) ends; then its next redelivery (3), never 1.
    assert seen and seen[0] == (2, 1), seen
    assert all(dc > 1 for dc, _ in seen), f"delivered again as new (num_delivered 1): {seen}"
