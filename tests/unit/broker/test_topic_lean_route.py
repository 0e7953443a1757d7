"""VHost._route's lean path for queue endpoints against the general one it shortcuts.

The lean path enqueues each subscription's queue itself instead of going through
Topic.publish's attempt callback, _attempt and _enqueue. The reference below is the general
path alone (the code before the lean path, verbatim): the same random workloads run on two
brokers, one of them routing through the reference, and must leave the same audit records in
the same order (A1: route before enqueue, retry, discard), the same frames to the client
(deliveries, confirms, nacks, returns) and the same queue and topic state (D1, D2, D7, M9, M10)."""

from __future__ import annotations

import random
import types
from typing import Any

import pytest
from pamqp import commands as C

from gateway.broker import Broker, BrokerConfig
from gateway.broker import vhost as V
from gateway.protocol.properties import Properties
from semantics.clock import ManualClock
from semantics.errors import CMQError
from semantics.topic import Topic
from tests.unit.broker.conftest import Recorder
from tests.unit.broker.helpers import Client, declare


def _reference_route(self: Any, ex: Any, msg: Any, headers: Any, now: float, out: Any,
                     seen: set[str], fresh: bool = False) -> None:
    """VHost._route before the lean path (``fresh`` unused), all but the retained case's steps."""
    tags = list(msg.tags) or None
    size = len(msg.body)
    if ex.topic is None:
        dests = ex.headers_route(headers)
        for dest in dests:
            sub = V.sub_label(ex.name, V.sub_name(dest))
            self.broker.emit_row(V.ROUTE, self.name, (ex.name, msg.msg_id, msg.routing_key, sub,
                                                      dest[1] if dest[0] == "q" else None, tags, size))
            self._attempt(dest, msg, headers, now, out, seen, ex.name, sub)
        matched = len(dests)
    else:
        topic = ex.topic
        subs = topic.match(msg.tags, msg.routing_key)
        emit_row = self.broker.emit_row
        labels = ex.labels
        for s in subs:
            endpoint = s.endpoint
            emit_row(V.ROUTE, self.name, (ex.name, msg.msg_id, msg.routing_key,
                                          labels.get(s.name) or ex.label_of(s.name),
                                          endpoint[1] if isinstance(endpoint, tuple) and endpoint[0] == "q"
                                          else None, tags, size))

        def attempt(sub: Any, tmsg: Any) -> bool | None:
            endpoint = sub.endpoint
            if endpoint[0] not in V._LOCAL:
                return self.broker.attempt_endpoint(topic, sub, tmsg)
            return self._attempt(endpoint, msg, headers, now, out, seen, ex.name,
                                 labels.get(sub.name) or ex.label_of(sub.name))

        tmsg = V.TopicMessage(msg.msg_id, now, msg.tags, msg.routing_key, msg, size)
        result = topic.publish(tmsg, now, attempt)
        matched = len(result.matched)
        if result.retained:
            self._retained(ex, msg, out, result)  # D2's steps, shared by both paths
    if not matched and ex.alternate and ex.alternate not in seen:
        alt = self.exchanges.get(ex.alternate)
        if alt is not None:
            seen.add(alt.name)
            self._route(alt, msg, headers, now, out, seen)


QUEUE_ARGS = [None, {"x-max-length": 1, "x-overflow": "reject-publish"},
              {"x-max-length": 2, "x-overflow": "reject-publish-dlx", "x-dead-letter-exchange": "dlx"},
              {"x-max-length": 1}, {"x-dead-letter-exchange": "dlx", "x-message-ttl": 1500}]
KEYS = ["a.b", "a.c", "x.y", "a.b.c"]
PATTERNS = ["a.*", "#", "a.b", "x.#", "*.c", "a.#.c"]


def _topology(c: Client, rnd: random.Random) -> list[str]:
    c.open_channel()
    c.send(1, C.Confirm.Select())
    declare(c, C.Exchange.Declare(exchange="alt", exchange_type="fanout"),
            C.Exchange.Declare(exchange="dlx", exchange_type="fanout"),
            C.Exchange.Declare(exchange="t", exchange_type="topic", arguments={"alternate-exchange": "alt"}),
            C.Exchange.Declare(exchange="d", exchange_type="direct"),
            C.Exchange.Declare(exchange="f", exchange_type="fanout"),
            C.Queue.Declare(queue="altq"), C.Queue.Declare(queue="dlq"),
            C.Queue.Bind(queue="altq", exchange="alt"), C.Queue.Bind(queue="dlq", exchange="dlx"))
    queues = [f"q{i}" for i in range(rnd.randint(1, 4))]
    for name in queues:
        durable = rnd.random() < 0.5
        declare(c, C.Queue.Declare(queue=name, durable=durable, arguments=rnd.choice(QUEUE_ARGS)))
        for _ in range(rnd.randint(0, 3)):
            declare(c, C.Queue.Bind(queue=name, exchange="t", routing_key=rnd.choice(PATTERNS)))
        if rnd.random() < 0.5:
            declare(c, C.Queue.Bind(queue=name, exchange="d", routing_key=rnd.choice(KEYS)))
        if rnd.random() < 0.3:
            declare(c, C.Queue.Bind(queue=name, exchange="f"))
    if rnd.random() < 0.4:  # an exchange endpoint: that topic takes the general path
        declare(c, C.Exchange.Bind(destination="f", source="t", routing_key=rnd.choice(PATTERNS)))
    return queues


def _workload(broker: Broker, seed: int) -> list[Any]:
    """Run one seed's operations; what a client and the broker show of them."""
    rnd = random.Random(seed)
    c = Client(broker)
    queues = _topology(c, rnd)
    vh = broker.vhosts["/"]
    seen: list[Any] = []
    for step in range(60):
        op = rnd.random()
        if op < 0.6:
            ex = rnd.choice(["t", "t", "d", "f"])
            c.publish(1, ex, rnd.choice(KEYS), b"m%d" % step, mandatory=rnd.random() < 0.3,
                      delivery_mode=rnd.choice([1, 2]),
                      expiration=rnd.choice([None, None, "500"]))
        elif op < 0.7:
            # MQ8: a resend under an ID given by the caller, twice (stored once)
            props = Properties(b"\x10\x00\x02") if rnd.random() < 0.5 else Properties(b"\x00\x00")
            for _ in range(2):
                try:
                    out = vh.publish("t", rnd.choice(KEYS), props, b"r%d" % step, user="guest",
                                     protocol="mqtt", msg_id=f"resend-{step}")
                    seen.append(("resend", out.routed, out.rejected))
                except CMQError as e:
                    seen.append(("resend-error", e.rule))
        elif op < 0.85:
            c.send(1, C.Basic.Get(queue=rnd.choice(queues), no_ack=True))
        else:
            broker.advance_time(rnd.choice([0.5, 1.0, 3.0]))
        seen.append(_frames(c.read()))
    seen.append(sorted((q.name, q.message_count) for q in vh.queues.values()))
    seen.append({name: ex.topic.retained_count for name, ex in vh.exchanges.items() if ex.topic is not None})
    return seen


def _plain(obj: Any) -> Any:
    """A frame as comparable values (pamqp's objects compare by identity)."""
    if isinstance(obj, list | tuple):
        return [_plain(o) for o in obj]
    if isinstance(obj, dict):
        return {k: _plain(v) for k, v in obj.items()}
    if hasattr(obj, "__dict__") or hasattr(obj, "__slots__"):
        names = list(getattr(obj, "__dict__", {})) or list(getattr(obj, "__slots__", ()))
        return (type(obj).__name__, {n: _plain(getattr(obj, n, None)) for n in names})
    return obj


def _frames(frames: list[tuple[int, Any]]) -> list[Any]:
    return [(ch, _plain(fr)) for ch, fr in frames]


def _normalised(records: list[tuple[str, dict[str, Any]]]) -> list[tuple[str, dict[str, Any]]]:
    """Message IDs by order of first appearance (the two brokers draw from one ID counter)."""
    ids: dict[str, str] = {}
    out = []
    for event, fields in records:
        f = dict(fields)
        for k in ("msg_id", "message_id"):
            if isinstance(f.get(k), str) and not f[k].startswith("resend-"):
                f[k] = ids.setdefault(f[k], f"#{len(ids)}")
        out.append((event, f))
    return out


async def _run(seed: int, reference: bool, profile: str) -> tuple[list[Any], list[Any]]:
    audit = Recorder()
    broker = await Broker.open(None, clock=ManualClock(), audit=audit, config=BrokerConfig(profile=profile))
    try:
        if reference:
            vh = broker.vhosts["/"]
            vh._route = types.MethodType(_reference_route, vh)  # type: ignore[method-assign]
        seen = _workload(broker, seed)
    finally:
        await broker.close()
    return seen, _normalised(audit.records)


@pytest.mark.parametrize("profile", ["compatible", "cmq"])
@pytest.mark.parametrize("seed", range(30))
async def test_lean_route_is_the_general_route(seed: int, profile: str) -> None:
    lean_seen, lean_audit = await _run(seed, False, profile)
    ref_seen, ref_audit = await _run(seed, True, profile)
    assert [e for e, _ in lean_audit] == [e for e, _ in ref_audit]
    assert lean_audit == ref_audit
    assert lean_seen == ref_seen


async def test_the_workloads_reach_the_cases(monkeypatch: pytest.MonkeyPatch) -> None:
    """The seeds above take the lean path with refusals in it (retain_failed: D7, retained),
    the general path too (Topic.publish: exchange endpoints), and retries and dead-letters."""
    calls = {"retain_failed": 0, "publish": 0}
    for name in calls:
        original = getattr(Topic, name)

        def counted(*args: Any, _name: str = name, _original: Any = original) -> Any:
            calls[_name] += 1
            return _original(*args)
        monkeypatch.setattr(Topic, name, counted)
    events: set[str] = set()
    for seed in range(30):
        _, records = await _run(seed, False, "compatible")
        events.update(e for e, _ in records)
    assert calls["retain_failed"] > 0 and calls["publish"] > 0
    assert {"route", "enqueue", "retry", "discard", "dead_letter"} <= events
