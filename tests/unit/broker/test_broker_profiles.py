"""The two profiles through the broker (SPEC PF1-PF5): what cmq refuses, compatible lets
through and reports; what cmq adds to deliveries (M11), compatible adds only on request.

The cmq-side refusals of the same inputs are the limit tests of test_topology.py (marked
``profile("cmq")``)."""

from __future__ import annotations

import struct
from typing import Any

import pytest
from pamqp import commands as C
from pamqp import frame as F
from pamqp import header

from gateway.broker import Broker, BrokerConfig
from semantics.clock import ManualClock
from tests.unit.broker.conftest import Recorder
from tests.unit.broker.helpers import Client, declare, deliveries, small_and_big_behind_fanout


def _names(methods: list[Any]) -> list[str]:
    return [type(m).__name__ for m in methods]


def _reported(broker: Broker, rule: str) -> list[dict[str, Any]]:
    return broker.limit_report.by_rule("/").get(rule, {}).get("entries", [])


def _wire_properties(data: bytes) -> list[bytes]:
    """The raw property bytes (flags + list) of every content header in ``data``."""
    out = []
    while data:
        kind, _, size = struct.unpack_from(">BHI", data)
        if kind == 2:
            out.append(data[7 + 12:7 + size])  # class, weight, body size, then the properties
        data = data[7 + size + 1:]
    return out


def _published_properties(**props: Any) -> bytes:
    frame = header.ContentHeader(0, 1, C.Basic.Properties(**props))
    return _wire_properties(F.marshal(frame, 1))[0]


async def test_PF4_L4_sixth_binding_key_and_long_keys_pass_and_are_reported(audited: Broker,
                                                                            audit: Recorder) -> None:
    """PF3/PF4: the inputs the cmq profile refuses (test_topology) bind and route in
    compatible; each breach is an audit record and a migration report entry."""
    c = Client(audited)
    c.open_channel()
    declare(c, C.Exchange.Declare(exchange="t", exchange_type="topic"), C.Queue.Declare(queue="tq"))
    keys = [f"k{i}.#" for i in range(6)] + [".".join("w" * 20), "long." + "x" * 200]
    assert _names(declare(c, *(C.Queue.Bind(queue="tq", exchange="t", routing_key=k) for k in keys))) == \
        ["BindOk"] * len(keys)
    c.publish(1, "t", ".".join("w" * 20), b"twenty words")   # L4: 19 dots
    c.publish(1, "t", "long." + "x" * 200, b"long key")       # L4: 205 bytes
    c.send(1, C.Basic.Get(queue="tq", no_ack=True), C.Basic.Get(queue="tq", no_ack=True))
    assert [body for _, _, body in deliveries(c.read())] == [b"twenty words", b"long key"]
    # The short names t and tq are L1/L2 breaches too: reported, and not what this test is about.
    records = [r for r in audit.of("limit_exceeded") if r["rule"] != "L2"]
    # Bindings: the count from the 6th key on, and each new key past 15 dots or 64 bytes
    # (once, not again on every later bind); then the two publishes.
    b = "binding:t->q:tq"
    assert [(r["rule"], r["value"], r["limit"], r["object"]) for r in records] == [
        ("L4", 6, 5, b), ("L4", 7, 5, b), ("L4", 19, 15, b), ("L4", 8, 5, b), ("L4", 205, 64, b),
        ("L4", 19, 15, "exchange:t"), ("L4", 205, 64, "exchange:t")]
    assert all((r["user"], r["peer"], r["vhost"]) == ("guest", "127.0.0.1:1", "/") for r in records)
    assert records[-1]["reason"].startswith("PRECONDITION_FAILED - routing key 'long.xxx")
    assert records[-1]["reason"].endswith("is 205 bytes, more than 64 (CMQ limit L4)")
    entries = {(e["object"], e["count"], e["worst_value"]) for e in _reported(audited, "L4")}
    assert entries == {(b, 5, 205), ("exchange:t", 2, 205)}


async def test_PF4_L3_tags_pass_and_are_reported(audited: Broker, audit: Recorder) -> None:
    """PF3/PF4 L3: six tags, a tag of 41 characters (a routing key RabbitMQ clients use)."""
    c = Client(audited)
    c.open_channel()
    key = "TestConfirmDeliveryAfterUnroutableMessage"
    declare(c, C.Exchange.Declare(exchange="d", exchange_type="direct"), C.Queue.Declare(queue="dq"),
            C.Queue.Bind(queue="dq", exchange="d", routing_key=key))
    c.publish(1, "d", key, b"a")
    c.publish(1, "d", "a", b"b", headers={"x-cmq-tags": ["b", "c", "d", "e", key]})
    c.send(1, C.Basic.Get(queue="dq", no_ack=True), C.Basic.Get(queue="dq", no_ack=True))
    assert [body for _, _, body in deliveries(c.read())] == [b"a", b"b"]
    assert [(r["rule"], r["value"], r["limit"], r["object"]) for r in audit.of("limit_exceeded")
            if r["rule"] != "L2"] == [
        ("L3", 41, 16, "binding:d->q:dq"), ("L3", 41, 16, "exchange:d"), ("L3", 6, 5, "exchange:d")]


async def test_PF3_rabbitmq_limits_still_refuse_in_compatible(broker: Broker) -> None:
    """PF3: a tag past 255 bytes (an x-cmq-tags value; a routing key cannot be longer) is
    refused in compatible too, naming L3."""
    c = Client(broker)
    c.open_channel()
    declare(c, C.Exchange.Declare(exchange="d", exchange_type="direct"))
    c.publish(1, "d", "a", b"x", headers={"x-cmq-tags": ["t" * 256]})
    [close] = [m for m in c.methods() if isinstance(m, C.Channel.Close)]
    assert close.reply_code == 406 and close.reply_text.endswith("is 256 bytes, more than 255 (CMQ limit L3)")


async def test_PF4_L6_bodies_above_cmq_sizes_are_delivered_and_reported(audited: Broker, audit: Recorder) -> None:
    """PF3/PF4 L6: above the topic's MaximumMessageSize (64 KB) and a queue's MaxMsgSize, the
    cmq profile refuses (test_topology); compatible delivers and reports each."""
    c = small_and_big_behind_fanout(audited)
    c.publish(1, "fan", "", b"x" * 2049)
    c.publish(1, "fan", "", b"y" * 100_000)
    c.publish(1, "", "small", b"z" * 3000)  # M10: straight to the queue
    c.send(1, *(C.Basic.Get(queue=q, no_ack=True) for q in ("small", "small", "small", "big", "big")))
    assert [len(body) for _, _, body in deliveries(c.read())] == [2049, 100_000, 3000, 2049, 100_000]
    assert [(r["rule"], r["value"], r["limit"], r["object"]) for r in audit.of("limit_exceeded")] == [
        ("L6", 2049, 2048, "queue:small"), ("L6", 100_000, 65536, "exchange:fan"),
        ("L6", 100_000, 2048, "queue:small"), ("L6", 100_000, 65536, "queue:big"),  # big: the default
        ("L6", 3000, 2048, "queue:small")]
    assert audit.of("discard") == []  # nothing was refused: no too_large


async def test_PF4_L2_names_in_compatible_are_reported_not_refused() -> None:
    """PF4: the names the cmq profile refuses (L1/L2) are declared and reported in compatible;
    a redeclare is not reported again; strict_names refuses them in either profile (L2)."""
    audit = Recorder()
    broker = await Broker.open(None, clock=ManualClock(), audit=audit, config=BrokerConfig(profile="compatible"))
    try:
        c = Client(broker)
        c.open_channel()
        assert _names(declare(c, C.Queue.Declare(queue="orders.eu"), C.Queue.Declare(queue="orders.eu"),
                              C.Queue.Declare(queue="valid-name"),
                              C.Exchange.Declare(exchange="x:1", exchange_type="direct"))) == \
            ["DeclareOk"] * 4
        assert [(r["rule"], r["object"]) for r in audit.of("limit_exceeded")] == [
            ("L2", "queue:orders.eu"), ("L2", "exchange:x:1")]
    finally:
        await broker.close()
    strict = await Broker.open(None, clock=ManualClock(), config=BrokerConfig(strict_names=True,
                                                                                profile="compatible"))
    try:
        c = Client(strict)
        c.open_channel()
        c.send(1, C.Queue.Declare(queue="orders.eu"))
        [close] = [m for m in c.methods() if isinstance(m, C.Channel.Close)]
        assert close.reply_code == 406 and close.reply_text.endswith("(CMQ limit L2)")
    finally:
        await strict.close()


async def test_PF1_per_vhost_profile_from_the_config_and_changed_at_run_time() -> None:
    """PF1: a vhost's own profile overrides the gateway's, and can change while running."""
    broker = await Broker.open(None, clock=ManualClock(), config=BrokerConfig(
        vhosts=["/", "strict"], profile="compatible", vhost_profiles={"strict": "cmq"}))
    try:
        assert (broker.profile_of("/").name, broker.profile_of("strict").name) == ("compatible", "cmq")
        c = Client(broker, "strict")
        c.open_channel()
        declare(c, C.Exchange.Declare(exchange="tpx", exchange_type="topic"), C.Queue.Declare(queue="tqq"))
        c.send(1, C.Queue.Bind(queue="tqq", exchange="tpx", routing_key="k" * 65))
        [close] = [m for m in c.methods() if isinstance(m, C.Channel.Close)]
        assert close.reply_text.endswith("(CMQ limit L4)")
        broker.set_vhost_profile("strict", "compatible")
        c.open_channel(2)
        assert _names(declare(c, C.Queue.Bind(queue="tqq", exchange="tpx", routing_key="k" * 65), channel=2)) == \
            ["BindOk"]
        broker.set_vhost_profile("strict", None)  # back to the gateway's: compatible
        assert broker.vhosts["strict"].profile.name == "compatible"
    finally:
        await broker.close()


# -- PF5: receive metadata -------------------------------------------------------------------


def _consume_and_get(c: Client, queue: str, consume_args: dict[str, Any] | None = None) -> list[bytes]:
    """Publish two messages (message_id unset, headers set); one goes to a basic.get, one
    to a consumer. The raw property bytes of both deliveries, get first."""
    for body in (b"1", b"2"):
        c.publish(1, "", queue, body, headers={"app": "x", "n": 7}, delivery_mode=2)
    c.send(1, C.Basic.Get(queue=queue, no_ack=True))
    got = _wire_properties(c.conn.data_to_send())
    c.send(1, C.Basic.Consume(queue=queue, no_ack=True, arguments=consume_args or {}))
    return got + _wire_properties(c.conn.data_to_send())


async def test_PF5_compatible_delivers_properties_byte_for_byte(broker: Broker) -> None:
    c = Client(broker)
    c.open_channel()
    declare(c, C.Queue.Declare(queue="q"))
    published = _published_properties(headers={"app": "x", "n": 7}, delivery_mode=2)
    assert _consume_and_get(c, "q") == [published, published]


@pytest.mark.parametrize("where", ["queue", "consumer"])
async def test_PF5_M11_receive_metadata_on_request_in_compatible(broker: Broker, where: str) -> None:
    """PF5: x-cmq-receive-metadata on the queue (get and consume) or on the consumer (its
    deliveries only) adds the M11 properties."""
    c = Client(broker)
    c.open_channel()
    queue_args = {"x-cmq-receive-metadata": True} if where == "queue" else {}
    declare(c, C.Queue.Declare(queue="q", arguments=queue_args))
    consume_args = {"x-cmq-receive-metadata": True} if where == "consumer" else None
    published = _published_properties(headers={"app": "x", "n": 7}, delivery_mode=2)
    get, consumed = _consume_and_get(c, "q", consume_args)
    assert (get == published) is (where == "consumer")
    assert consumed != published
    decoded = C.Basic.Properties()
    decoded.unmarshal(struct.unpack_from(">H", consumed)[0], consumed[2:])
    assert decoded.message_id.startswith("msg-")
    assert (decoded.headers["app"], decoded.headers["x-cmq-msg-id"], decoded.headers["x-cmq-receive-count"]) == \
        ("x", decoded.message_id, 1)


@pytest.mark.profile("cmq")
async def test_PF5_cmq_profile_always_adds_receive_metadata(broker: Broker) -> None:
    c = Client(broker)
    c.open_channel()
    declare(c, C.Queue.Declare(queue="q"))
    published = _published_properties(headers={"app": "x", "n": 7}, delivery_mode=2)
    assert all(p != published for p in _consume_and_get(c, "q"))


@pytest.mark.profile("cmq")
async def test_M16_cmq_refusals_quoting_255_byte_names_and_keys_fit_a_reply_text(strict: Broker) -> None:
    """M16/PF2: a refusal that quotes a 255-byte name (L2) is cut to the 255 bytes of a short
    string and still names the rule; a 200-byte tag (L3) is quoted by its start (before: an
    exception while encoding channel.close)."""
    c = Client(strict)
    c.open_channel()
    closes = [m for m in declare(c, C.Queue.Declare(queue="q." + "n" * 253)) if isinstance(m, C.Channel.Close)]
    c.open_channel(2)
    declare(c, C.Exchange.Declare(exchange="direct-x", exchange_type="direct"), channel=2)
    c.publish(2, "direct-x", "t" * 200, b"x")
    closes += [m for m in c.methods() if isinstance(m, C.Channel.Close)]
    assert [(m.reply_code, m.reply_text[-18:]) for m in closes] == [(406, "... (CMQ limit L2)"),
                                                                    (406, " 16 (CMQ limit L3)")]
    assert "filter tag '" + "t" * 64 + "'... is 200 characters" in closes[1].reply_text
    assert all(len(m.reply_text.encode()) <= 255 for m in closes)


async def test_PF1_state_accepted_in_compatible_survives_a_restart_in_cmq(tmp_path: Any) -> None:
    """PF1: a limit applies to what is declared or published, never to what the store gives
    back: six binding keys and a 100 KB retained-free message accepted in compatible are all
    there after a restart in cmq (their breach stays in the limits report, not reported again:
    A6), and only a new breach is refused."""
    audit = Recorder()
    first = await Broker.open(str(tmp_path), clock=ManualClock(), config=BrokerConfig(profile="compatible"))
    c = Client(first)
    c.open_channel()
    declare(c, C.Exchange.Declare(exchange="t", exchange_type="topic", durable=True),
            C.Queue.Declare(queue="tq", durable=True),
            *(C.Queue.Bind(queue="tq", exchange="t", routing_key=f"k{i}") for i in range(6)))
    c.publish(1, "t", "k5", b"b" * 100_000, delivery_mode=2)
    first.sync_now()
    await first.close()
    second = await Broker.open(str(tmp_path), clock=ManualClock(), audit=audit, config=BrokerConfig(profile="cmq"))
    try:
        assert second.vhosts["/"].exchanges["t"].bindings[("q", "tq")].keys == [f"k{i}" for i in range(6)]
        assert second.vhosts["/"].profile.name == "cmq"
        # A6: the standing breach stays in the report (kept in the store), reported once.
        assert ("L4", "binding:t->q:tq", 6) in [(e.rule, e.object, e.worst_value)
                                                for e in second.limit_report.entries()]
        assert audit.of("limit_exceeded") == []
        c = Client(second)
        c.open_channel()
        c.send(1, C.Basic.Get(queue="tq", no_ack=True))
        assert [len(body) for _, _, body in deliveries(c.read())] == [100_000]
        c.send(1, C.Queue.Bind(queue="tq", exchange="t", routing_key="k6"))
        [close] = [m for m in c.methods() if isinstance(m, C.Channel.Close)]
        assert close.reply_text.endswith("has 7 binding keys, more than 5 (CMQ limit L4)")
    finally:
        await second.close()
