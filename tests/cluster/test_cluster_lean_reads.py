"""Issue 28's CPU a message on JetStream: the lean read paths give what the general ones give.

* A wire handler's ``plain`` takes a subscription's messages without headers as bytes (a
  PubAck), the handler every other one: together in the order sent, over a real nats-server.
* The publisher's PubAck reading from those bytes settles a write exactly as its reading of a
  Delivery does (CL3, the PubAck rule: stored only for a sequence, refused on an error,
  sent again otherwise).
* A queue stream's record read from its head (``head.stored_message``) is the message the
  whole-record decode made.
"""

from __future__ import annotations

import asyncio
import random
from pathlib import Path
from typing import Any

import nats
import pytest

from gateway.broker import persistence as P
from gateway.jetstream import wire
from gateway.jetstream.head import stored_message
from gateway.jetstream.publisher import Publisher
from tests.support.natsd import NatsCluster
from tests.support.natsd_interest import subscribed


def test_plain_handler_takes_the_messages_without_headers_and_the_order_holds(tmp_path: Path) -> None:
    with NatsCluster(tmp_path / "nats", 1) as cluster:

        async def main() -> None:
            reader = await nats.connect(cluster.store_url)
            writer = await nats.connect(cluster.store_url)
            rnd = random.Random(2828)
            sent: list[tuple[str, str, bytes, dict[str, str] | None]] = []
            got: list[tuple[str, str, bytes, dict[str, str] | None]] = []
            plain = 0
            done = asyncio.Event()
            handlers = wire.Handlers.of(reader)

            def handler(d: wire.Delivery) -> None:
                got.append((d.subject, d.reply, d.data, d.headers))
                if len(got) == len(sent):
                    done.set()

            def on_plain(subject: bytes, data: bytes) -> None:
                nonlocal plain
                plain += 1
                got.append((subject.decode(), "", data, None))
                if len(got) == len(sent):
                    done.set()

            sub = await reader.subscribe("h1.lean.*", pending_msgs_limit=-1, pending_bytes_limit=-1)
            handlers.add(sub, handler, on_plain)
            await subscribed(reader)  # flush() alone: its PING may pass the SUB
            for i in range(400):
                data = rnd.randbytes(rnd.choice((0, 16, 300, 70_000)))
                headers = rnd.choice((None, {"Nats-Msg-Id": f"msg-{i}"}))
                reply = rnd.choice(("", "", f"_INBOX.r.{i}"))  # with a reply subject: the handler's
                sent.append((f"h1.lean.{i}", reply, data, headers))
                await writer.publish(f"h1.lean.{i}", data, reply=reply, headers=headers)
            await writer.flush()
            await asyncio.wait_for(done.wait(), 30)
            assert got == sent
            assert 0 < plain < sum(1 for _, r, _, h in sent if not r and h is None) + 1  # the plain path was taken (most reads come straight from the socket)
            handlers.discard(sub)
            assert sub._id not in handlers.plain
            await writer.close()
            await reader.close()

        asyncio.run(asyncio.wait_for(main(), 60))


class _Nc:
    def new_inbox(self) -> str:
        return "_INBOX.t"


@pytest.mark.parametrize(("headers", "data"), [
    (None, b'{"stream":"S", "seq":7}'),
    (None, b'{"stream":"S","seq":7,"duplicate": true}'),
    (None, b'{"stream":"S", "seq":0,"duplicate": true}'),  # staged, not stored (CL3)
    (None, b'{"error":{"code":400,"err_code":10077,"description":"maximum messages exceeded"},"stream":"S","seq":0}'),
    (None, b'{"stream":"S", "seq":5, "error":{"code":500}}'),
    (None, b"not json"),
    (None, b"[1]"),
    ({"Status": "503"}, b""),
])
def test_CL3_a_pubacks_bytes_settle_a_write_as_its_delivery_does(headers: dict[str, str] | None, data: bytes) -> None:
    async def outcome(plain: bool) -> tuple[list[tuple[int, bool]], bool, bool]:
        p = Publisher(_Nc(), asyncio.get_running_loop())
        settled: list[tuple[int, bool]] = []

        def on_settled(lsn: int, refused: bool, done: Any) -> None:
            settled.append((lsn, refused))

        p.publish(3, "S.q", b"x", {"Nats-Msg-Id": "m"}, lambda: None, None, on_settled)
        subject = f"{p.prefix}.3"
        if plain and headers is None:
            p._replied_plain(subject.encode(), data)
        else:
            p._replied(wire.Delivery(subject, "", data, headers))
        p._replied_plain(f"{p.prefix}.99".encode(), data)  # no such write: nothing
        p._replied_plain(b"_INBOX.t.x", data)  # not an LSN: nothing
        return settled, 3 in p._writes, 3 in p._again

    async def both() -> None:
        general, lean = await outcome(False), await outcome(True)
        assert lean == general
        stored = data.startswith(b'{"stream":"S", "seq":7') or data.startswith(b'{"stream":"S","seq":7')
        refused = b'"error"' in data
        assert general[0] == ([(3, refused)] if stored or refused else [])

    asyncio.run(both())


@pytest.mark.parametrize(("exchange", "routing_key", "properties", "body"), [
    ("", "q1", b"\x00\x00", b"x" * 16),
    ("amq.topic", "a.b.\u00e9", b"\x10\x00\x02", b""),
    ("ex", "", b"\x80\x00\x0atext/plain", bytes(range(256))),
])
def test_a_records_head_gives_the_message_the_whole_decode_gave(exchange: str, routing_key: str,
                                                                 properties: bytes, body: bytes) -> None:
    for queue in ("q1", "q2"):  # a second queue's names, and each again (read from the cache)
        raw = P.encode_message("/", queue, "msg-1", 1234.5, exchange, routing_key, properties, body)
        for _ in range(2):
            r = P.decode_message(raw)
            m = stored_message(raw, "msg-1")
            assert (m.body, m.properties.raw, m.exchange, m.routing_key, m.published_at, m.msg_id) == \
                (r["body"], r["properties"], r["exchange"], r["routing_key"], r["enqueue_time"], "msg-1")
            big = stored_message(raw, "msg-1", b"read back")
            assert big.body == b"read back" and big.exchange == r["exchange"]
