"""541 INTERNAL_ERROR is never the answer to what a client sent (SPEC M16): arbitrary method
arguments, field tables of every AMQP field type, names of any UTF-8 (or none) up to 255
bytes, routing keys and message properties go over a real socket to a real gateway. Each
refusal must carry its own reply code, and the gateway must keep serving a healthy client.
"""

from __future__ import annotations

import asyncio
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pika
import pytest
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st
from pamqp import commands as C

from gateway.server import gateway_in_thread
from tests.integration.raw_asyncio_amqp import Closed, Raw, RawClient, method, method_frame

TEXT = st.text(alphabet=st.characters(exclude_categories=("Cs",)))
# The arguments each method knows (x-cmq-polling-wait-seconds left out: a basic.get would
# wait for it), so that the examples reach the checks behind them.
QUEUE_KEYS = ("x-cmq-visibility-timeout", "x-cmq-msg-retention-seconds", "x-cmq-max-msg-size",
              "x-cmq-max-msg-heap-num", "x-cmq-rewind-seconds", "x-cmq-max-receive-count",
              "x-cmq-max-time-to-live", "x-cmq-delay-seconds", "x-cmq-dead-letter-queue", "x-message-ttl",
              "x-expires", "x-max-length", "x-max-length-bytes", "x-overflow", "x-dead-letter-exchange",
              "x-dead-letter-routing-key", "x-max-priority", "x-queue-type", "x-queue-mode",
              "x-single-active-consumer", "x-delivery-limit")
EXCHANGE_KEYS = ("alternate-exchange", "x-cmq-max-message-size")
BINDING_KEYS = ("x-match", "x-cmq-notify-strategy", "k", "x-k")
CONSUME_KEYS = ("x-cmq-rewind-to", "x-stream-offset", "x-priority", "x-cancel-on-ha-failover")
HEADER_KEYS = ("x-cmq-tags", "x-delay", "x-cmq-delay-seconds", "x-death", "k")
KNOWN_KEYS = QUEUE_KEYS + EXCHANGE_KEYS + BINDING_KEYS + CONSUME_KEYS + HEADER_KEYS
NAMES = ("", "q", "q2", "ex.direct", "ex.topic", "ex.fanout", "ex.headers", "x", "k", "a.b", "amq.direct",
         "amq.fanout", "amq.topic", "amq.headers", "amq.match", "amq.gen-x", "rel-ñ", "ü" * 127,
         "amq.rabbitmq.reply-to", "a.b.c", "#", "*")
# Rebuilt before each example, so that the fuzzed methods reach routing, bindings, deliveries
# and settlements, not only 404s: the pool's names are these queues and exchanges.
TOPOLOGY = [
    *(C.Exchange.Delete(exchange=x) for x in ("ex.direct", "ex.topic", "ex.fanout", "ex.headers")),
    *(C.Queue.Delete(queue=q) for q in ("q", "q2")),
    *(C.Exchange.Declare(exchange=f"ex.{t}", exchange_type=t) for t in ("direct", "topic", "fanout", "headers")),
    C.Queue.Declare(queue="q"), C.Queue.Declare(queue="q2", arguments={"x-max-priority": 5}),
    C.Queue.Bind(queue="q", exchange="ex.direct", routing_key="k"),
    C.Queue.Bind(queue="q2", exchange="ex.topic", routing_key="a.*"),
    C.Queue.Bind(queue="q", exchange="ex.fanout", routing_key=""),
    C.Queue.Bind(queue="q2", exchange="ex.headers", routing_key="", arguments={"x-match": "any", "k": "v"}),
    C.Exchange.Bind(destination="ex.fanout", source="ex.direct", routing_key="k"),
]


def fit(text: str, limit: int = 255) -> str:
    return text.encode()[:limit].decode("utf-8", "ignore")


def shortstr(data: bytes) -> bytes:
    return bytes((len(data),)) + data


def longstr(data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + data


pool = st.sampled_from(NAMES)
fresh = st.text("abcdefgh.-_", min_size=1, max_size=12).map(lambda t: f"f-{t}")  # new every time
names = st.one_of(pool, pool, pool, fresh, fresh, TEXT.map(lambda t: fit(t, 40)),
                  st.text(alphabet=st.characters(exclude_categories=("Cs",)), min_size=100, max_size=255).map(fit))
# Names as a client could send them that are not UTF-8: refused, never a 541 (rarer, as each
# such refusal closes the connection and ends the example's reach).
raw_names = st.binary(max_size=255).map(lambda b: Raw(shortstr(b)))
any_name = st.one_of(names, names, names, raw_names)
INT64 = st.integers(-(2**63), 2**63 - 1)


def _scalar() -> st.SearchStrategy[bytes]:
    def packed(tag: bytes, fmt: str, values: st.SearchStrategy[Any]) -> st.SearchStrategy[bytes]:
        return values.map(lambda v: tag + struct.pack(fmt, v))

    return st.one_of(
        st.booleans().map(lambda v: b"t" + bytes((v,))),
        packed(b"b", ">b", st.integers(-128, 127)), packed(b"B", ">B", st.integers(0, 255)),
        packed(b"s", ">h", st.integers(-(2**15), 2**15 - 1)), packed(b"u", ">H", st.integers(0, 2**16 - 1)),
        packed(b"I", ">i", st.integers(-(2**31), 2**31 - 1)), packed(b"i", ">I", st.integers(0, 2**32 - 1)),
        packed(b"l", ">q", INT64), packed(b"f", ">f", st.floats(width=32)), packed(b"d", ">d", st.floats()),
        st.tuples(st.integers(0, 255), st.integers(-(2**31), 2**31 - 1)).map(
            lambda v: b"D" + struct.pack(">Bi", *v)),
        packed(b"T", ">Q", st.one_of(st.integers(0, 2**33), st.integers(0, 2**64 - 1))),
        st.binary(max_size=64).map(lambda b: b"S" + longstr(b)),
        TEXT.map(lambda t: b"S" + longstr(t.encode())),
        st.binary(max_size=64).map(lambda b: b"x" + longstr(b)),
        st.just(b"V"),
    )


def _key() -> st.SearchStrategy[bytes]:
    known = st.sampled_from(KNOWN_KEYS).map(str.encode)
    return st.one_of(known, known, TEXT.map(lambda t: fit(t, 64).encode()), st.binary(max_size=16))


def _table_of(values: st.SearchStrategy[bytes]) -> st.SearchStrategy[bytes]:
    entries = st.lists(st.tuples(_key(), values), max_size=6)
    return entries.map(lambda es: longstr(b"".join(shortstr(k) + v for k, v in es)))


field_value = st.recursive(
    _scalar(),
    lambda inner: st.one_of(
        st.lists(inner, max_size=5).map(lambda vs: b"A" + longstr(b"".join(vs))),
        _table_of(inner).map(lambda t: b"F" + t)),
    max_leaves=12)
# Values that trip type and range checks: not finite, negative, huge, wrong type, not UTF-8.
TRICKY = [b"d" + struct.pack(">d", v) for v in (float("nan"), float("inf"), -1.5, 0.5, 1e300)] + [
    b"I" + struct.pack(">i", v) for v in (-1, 0, 1, 5, 60, 1000)] + [
    b"l" + struct.pack(">q", v) for v in (2**62, -(2**62))] + [
    b"S" + longstr(v) for v in (b"", b"abc", b"all", b"any", b"\xff\xfe", b"reject-publish", b"drop-head",
                                b"BACKOFF_RETRY", b"q", b"ex.direct")] + [
    b"x" + longstr(b"\xff"), b"t\x01", b"t\x00", b"V", b"A" + longstr(b"I\x00\x00\x00\x01"),
    b"F" + longstr(b""), b"T" + struct.pack(">Q", 2**64 - 1), b"D\x02\x00\x00\x00\x07"]
tricky = st.sampled_from(TRICKY)
empty_table = st.just(Raw(longstr(b"")))


def arguments(keys: tuple[str, ...]) -> st.SearchStrategy[Raw]:
    """A table of the arguments a method knows, their values mostly tricky ones; or any table."""
    known = st.lists(st.tuples(st.sampled_from(keys).map(str.encode), st.one_of(tricky, tricky, field_value)),
                     min_size=1, max_size=3).map(lambda es: Raw(longstr(b"".join(shortstr(k) + v for k, v in es))))
    return st.one_of(empty_table, known, known, known, _table_of(field_value).map(Raw))


headers = arguments(HEADER_KEYS)


@st.composite
def properties(draw: st.DrawFn) -> bytes:
    """A content header's property flags and fields, each present or not."""
    short = st.one_of(TEXT.map(lambda t: shortstr(fit(t).encode())), st.sampled_from(
        [shortstr(b"60000"), shortstr(b"-1"), shortstr(b"abc"), shortstr(b"amq.rabbitmq.reply-to"),
         shortstr(b"guest")]))
    fields = [short, short, headers, st.integers(0, 255).map(lambda v: bytes((v,))),
              st.integers(0, 255).map(lambda v: bytes((v,))), short, short, short, short,
              st.integers(0, 2**64 - 1).map(lambda v: struct.pack(">Q", v)), short, short, short, short]
    flags = 0
    out = b""
    for bit, strategy in zip(range(15, 1, -1), fields, strict=True):
        if draw(st.booleans()):
            flags |= 1 << bit
            out += draw(strategy)
    return struct.pack(">H", flags) + out


bits = st.booleans()
mostly_false = st.sampled_from([False, False, False, True])  # passive: mostly a real declare
# Delivery tags are unsigned 64-bit, which pamqp cannot encode past 2**63.
tags = st.one_of(st.sampled_from([0, 1, 2, 2**63]), st.integers(0, 2**64 - 1)).map(lambda v: Raw(struct.pack(">Q", v)))


# The methods that carry tables and names, where client input meets the most checks, weigh more.
KINDS = ["x.declare"] * 3 + ["q.declare"] * 3 + ["x.bind", "q.bind", "consume", "publish"] * 2 + [
    "x.delete", "x.unbind", "q.unbind", "q.purge", "q.delete", "qos", "cancel", "get", "ack", "nack", "reject",
    "recover", "confirm", "tx.select", "tx.commit", "tx.rollback", "flow"]


@st.composite
def step(draw: st.DrawFn) -> tuple[Any, tuple[bytes, bytes] | None]:
    """One method (with its content for basic.publish)."""
    kind = draw(st.sampled_from(KINDS))
    n, b = draw(any_name), bits
    if kind == "x.declare":
        xtype = draw(st.one_of(st.sampled_from(["direct", "topic", "fanout", "headers"]), st.sampled_from(
            ["direct", "topic", "fanout", "headers", "x-custom"]), names))
        m = method(C.Exchange.Declare, exchange=n, exchange_type=xtype, passive=draw(mostly_false), durable=draw(b),
                   auto_delete=draw(b), internal=draw(b), nowait=False, arguments=draw(arguments(EXCHANGE_KEYS)))
    elif kind == "x.delete":
        m = method(C.Exchange.Delete, exchange=n, if_unused=draw(b), nowait=False)
    elif kind in ("x.bind", "x.unbind"):
        cls = C.Exchange.Bind if kind == "x.bind" else C.Exchange.Unbind
        m = method(cls, destination=n, source=draw(any_name), routing_key=draw(any_name), nowait=False,
                   arguments=draw(arguments(BINDING_KEYS)))
    elif kind == "q.declare":
        m = method(C.Queue.Declare, queue=n, passive=draw(mostly_false), durable=draw(b), exclusive=draw(b),
                   auto_delete=draw(b), nowait=False, arguments=draw(arguments(QUEUE_KEYS)))
    elif kind in ("q.bind", "q.unbind"):
        if kind == "q.bind":
            m = method(C.Queue.Bind, queue=n, exchange=draw(any_name), routing_key=draw(any_name),
                       nowait=False, arguments=draw(arguments(BINDING_KEYS)))
        else:
            m = method(C.Queue.Unbind, queue=n, exchange=draw(any_name), routing_key=draw(any_name),
                       arguments=draw(arguments(BINDING_KEYS)))
    elif kind == "q.purge":
        m = method(C.Queue.Purge, queue=n, nowait=False)
    elif kind == "q.delete":
        m = method(C.Queue.Delete, queue=n, if_unused=draw(b), if_empty=draw(b), nowait=False)
    elif kind == "qos":
        m = method(C.Basic.Qos, prefetch_size=draw(st.sampled_from([0, 0, 1, 2**32 - 1])),
                   prefetch_count=draw(st.integers(0, 2**16 - 1)), global_=draw(b))
    elif kind == "consume":
        m = method(C.Basic.Consume, queue=n, consumer_tag=draw(any_name), no_local=draw(b), no_ack=draw(b),
                   exclusive=draw(b), nowait=False, arguments=draw(arguments(CONSUME_KEYS)))
    elif kind == "cancel":
        m = method(C.Basic.Cancel, consumer_tag=n, nowait=False)
    elif kind == "get":
        m = method(C.Basic.Get, queue=n, no_ack=draw(b))
    elif kind == "publish":
        m = method(C.Basic.Publish, exchange=n, routing_key=draw(any_name), mandatory=draw(b),
                   immediate=draw(st.sampled_from([False, False, False, True])))
        return m, (draw(properties()), draw(st.binary(max_size=300)))
    elif kind == "ack":
        m = method(C.Basic.Ack, delivery_tag=draw(tags), multiple=draw(b))
    elif kind == "nack":
        m = method(C.Basic.Nack, delivery_tag=draw(tags), multiple=draw(b), requeue=draw(b))
    elif kind == "reject":
        m = method(C.Basic.Reject, delivery_tag=draw(tags), requeue=draw(b))
    elif kind == "recover":
        m = method(C.Basic.Recover, requeue=draw(b))
    elif kind == "confirm":
        m = method(C.Confirm.Select, nowait=False)
    elif kind == "tx.select":
        m = C.Tx.Select()
    elif kind == "tx.commit":
        m = C.Tx.Commit()
    elif kind == "tx.rollback":
        m = C.Tx.Rollback()
    else:
        m = method(C.Channel.Flow, active=draw(b))
    return m, None


def marker(n: int) -> Any:
    """Sent after each method: its declare-ok, whose queue name no other reply carries, shows
    that every answer to the method has arrived (a broker answers a channel in order)."""
    return C.Queue.Declare(queue=f"fuzz-marker-{n}", exclusive=True, auto_delete=True)


def content_frames(channel: int, props: bytes, body: bytes) -> bytes:
    head = struct.pack(">HHQ", 60, 0, len(body)) + props
    out = struct.pack(">BHI", 2, channel, len(head)) + head + b"\xce"
    if body:
        out += struct.pack(">BHI", 3, channel, len(body)) + body + b"\xce"
    return out


class FuzzClient:
    """A raw client that survives the refusals the fuzzed methods cause (each outcome is a
    hypothesis event: ``--hypothesis-show-statistics`` shows what the examples reached)."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.client: RawClient | None = None
        self.channel = 0
        self.sent = 0

    async def connect(self) -> RawClient:
        self.client = await RawClient.open(self.url)
        self.channel = 1
        await self.client.channel(self.channel)
        return self.client

    async def run(self, m: Any, content: tuple[bytes, bytes] | None) -> None:
        c = self.client or await self.connect()
        data = method_frame(self.channel, m)
        if content is not None:
            data += content_frames(self.channel, *content)
        self.sent += 1
        done = f"fuzz-marker-{self.sent}"
        c.send_raw(data + method_frame(self.channel, marker(self.sent)))
        while True:
            try:
                async with asyncio.timeout(15):  # hang guard
                    channel, f = await c.frame_on()
            except Closed:
                raise AssertionError(f"the gateway hung up without connection.close after {m.name}") from None
            name = getattr(f, "name", "")
            if name == "Connection.Close":
                event(f"{m.name}: connection {f.reply_code}")
                assert f.reply_code != 541, (m.name, f.reply_text)
                c.send(0, C.Connection.CloseOk())
                await c.aclose()
                self.client = None
                return
            if channel != self.channel:
                continue
            if name == "Channel.Close":
                event(f"{m.name}: channel {f.reply_code}")
                assert f.reply_code != 541, (m.name, f.reply_text)
                c.send(self.channel, C.Channel.CloseOk())
                self.channel += 1
                await c.channel(self.channel)
                return
            if name == "Queue.DeclareOk" and f.queue == done:
                event(f"{m.name}: ok")
                return

    async def aclose(self) -> None:
        if self.client is not None:
            await self.client.aclose()


async def healthy(url: str) -> None:
    """Another client: declare, publish, get, all as usual."""
    c = await RawClient.open(url)
    try:
        await c.channel(1)
        ok = await c.call(1, C.Queue.Declare(queue="", exclusive=True), "Queue.DeclareOk")
        c.publish(1, "", ok.queue, b"still serving")
        get = await c.call(1, C.Basic.Get(queue=ok.queue, no_ack=True), "Basic.GetOk", "Basic.GetEmpty")
        assert get.name == "Basic.GetOk"
        await c.frame()
        assert (await c.frame()).value == b"still serving"
    finally:
        await c.aclose()


@pytest.fixture(scope="module")
def fuzz_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A gateway of its own (with a store: durable declarations are persisted too)."""
    data = tmp_path_factory.mktemp("fuzz-data")
    with gateway_in_thread(port=0, data_dir=str(Path(data))) as gw:
        yield f"amqp://guest:guest@127.0.0.1:{gw.port}/%2F"


def _args(*entries: tuple[str | bytes, bytes]) -> Raw:
    return Raw(longstr(b"".join(shortstr(k if isinstance(k, bytes) else k.encode()) + v for k, v in entries)))


NAN = b"d" + struct.pack(">d", float("nan"))
INF = b"d" + struct.pack(">d", float("inf"))
NOT_UTF8 = b"x" + longstr(b"\xff\xfe")
HUGE_TIME = b"T" + struct.pack(">Q", 2**64 - 1)


def _declare_q(name: str, args: Raw, durable: bool = False) -> tuple[Any, None]:
    return method(C.Queue.Declare, queue=name, passive=False, durable=durable, exclusive=False,
                  auto_delete=False, nowait=False, arguments=args), None


def _declare_x(name: str, args: Raw, durable: bool = False) -> tuple[Any, None]:
    return method(C.Exchange.Declare, exchange=name, exchange_type="direct", passive=False, durable=durable,
                  auto_delete=False, internal=False, nowait=False, arguments=args), None


def _publish(exchange: str, key: str, headers: Raw) -> tuple[Any, tuple[bytes, bytes]]:
    return (method(C.Basic.Publish, exchange=exchange, routing_key=key, mandatory=True, immediate=False),
            (struct.pack(">H", 1 << 13) + headers, b"body"))


# Each 541 found so far, kept as an example the fuzz always runs (random search finds some of
# them only now and then within a CI-sized budget).
REGRESSIONS = [
    [_declare_q("f-nan", _args(("x-cmq-visibility-timeout", NAN)))],
    [_declare_q("f-inf", _args(("x-delivery-limit", INF)))],
    [_declare_q("f-dlx", _args(("x-dead-letter-exchange", NOT_UTF8)))],
    [_declare_q("f-overflow", _args(("x-overflow", NOT_UTF8)))],
    [_declare_x("f-size", _args(("x-cmq-max-message-size", b"S" + longstr(b"abc"))))],
    [_declare_x("f-decimal", _args(("k", b"D\x02\x00\x00\x01\x00")), durable=True)],
    [_declare_x("f-alt", _args(("alternate-exchange", NOT_UTF8))), _publish("f-alt", "nowhere", _args())],
    [(method(C.Basic.Consume, queue="q", consumer_tag="", no_local=False, no_ack=False, exclusive=False,
             nowait=False, arguments=_args(("x-cmq-rewind-to", INF))), None)],
    [(method(C.Queue.Bind, queue="q", exchange="ex.direct", routing_key="k2", nowait=False,
             arguments=_args(("x-cmq-notify-strategy", NOT_UTF8))), None)],
    [(method(C.Queue.Bind, queue="q", exchange="ex.headers", routing_key="k2", nowait=False,
             arguments=_args(("x-match", NOT_UTF8))), None)],
    [_publish("ex.direct", "k", _args(("x-cmq-tags", b"I\x00\x00\x00\x05")))],
    [_publish("ex.headers", "", _args(("k", HUGE_TIME)))],
    [_declare_q("rel-ñ", _args()), _declare_q("rel-ñ", _args()), _publish("", "rel-ñ", _args())],
    [_declare_x("ñ-x", _args()), _publish("ñ-x", "unrouted", _args())],
    [(method(C.Queue.Declare, queue="é" * 120, passive=True, durable=False, exclusive=False,
             auto_delete=False, nowait=False, arguments=_args()), None)],
    *([_declare_q("f-dl", _args(("x-dead-letter-exchange", b"S" + longstr(b"ex.fanout")))),
       _publish("", "f-dl", _args(("x-death", death))),
       (method(C.Basic.Get, queue="f-dl", no_ack=False), None),
       (method(C.Basic.Reject, delivery_tag=Raw(struct.pack(">Q", 1)), requeue=False), None)]
      for death in (b"I\x00\x00\x00\x05",  # not an array
                    b"A" + longstr(b"F" + _args(("time", HUGE_TIME), (b"\xff", b"t\x01"))))),
]


def _with_regressions(test: Any) -> Any:
    for steps in REGRESSIONS:
        test = example(steps=steps)(test)
    return test


@_with_regressions
@settings(max_examples=200, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                 HealthCheck.function_scoped_fixture])
@given(steps=st.lists(step(), min_size=1, max_size=10))
def test_M16_fuzzed_methods_never_get_541(fuzz_url: str, steps: list[tuple[Any, Any]]) -> None:
    async def scenario() -> None:
        session = FuzzClient(fuzz_url)
        try:
            for m in TOPOLOGY:
                await session.run(m, None)
            await session.run(C.Basic.Publish(exchange="", routing_key="q"), (b"\x00\x00", b"ready"))
            for m, content in steps:
                await session.run(m, content)
        finally:
            await session.aclose()
        await healthy(fuzz_url)

    asyncio.run(scenario())


def test_M16_the_fuzzed_gateway_still_serves_pika(fuzz_url: str) -> None:
    conn = pika.BlockingConnection(pika.URLParameters(fuzz_url))
    try:
        ch = conn.channel()
        q = ch.queue_declare("", exclusive=True).method.queue
        ch.basic_publish("", q, b"after the fuzz")
        assert ch.basic_get(q, auto_ack=True)[2] == b"after the fuzz"
    finally:
        conn.close()
