"""Topic delivery to queue endpoints (D7) with retries (D5, D6), the journal of retained
messages across a restart (D2, M14), and the audit trail of one message (A1, A2)."""

from __future__ import annotations

import pytest
from pamqp import commands as C

from gateway.broker import Broker
from semantics.clock import ManualClock
from tests.unit.broker.conftest import Recorder
from tests.unit.broker.helpers import Client, declare, deliveries

FULL = {"x-max-length": 1, "x-overflow": "reject-publish"}


def _topology(c: Client, *, durable: bool = False, strategy: str | None = None) -> None:
    c.open_channel()
    args = {"x-cmq-notify-strategy": strategy} if strategy else None
    declare(c, C.Exchange.Declare(exchange="t", exchange_type="direct", durable=durable),
            C.Queue.Declare(queue="full", durable=durable, arguments=FULL),
            C.Queue.Bind(queue="full", exchange="t", routing_key="", arguments=args))


def _queue_full_of_m1(broker: Broker, **kw: object) -> tuple[Client, float]:
    """m1 fills the queue, so m2 is refused by it and retained by the topic."""
    c = Client(broker)
    _topology(c, **kw)  # type: ignore[arg-type]
    t0 = broker.now()
    c.publish(1, "t", "k", b"m1")
    c.publish(1, "t", "k", b"m2")
    return c, t0


def _drain_one(c: Client, queue: str) -> bytes:
    c.send(1, C.Basic.Get(queue=queue))
    [(ok, _, body)] = deliveries(c.read())
    c.send(1, C.Basic.Ack(delivery_tag=ok.delivery_tag))
    return body


async def test_D7_D6_a_queue_that_refuses_is_retried_after_1s(audited, audit: Recorder):
    c, t0 = _queue_full_of_m1(audited)
    ex = audited.vhosts["/"].exchanges["t"]
    q = audited.vhosts["/"].queues["full"]
    assert (q.message_count, ex.topic.retained_count) == (1, 1)
    [retry] = audit.of("retry")
    assert (retry["subscription"], retry["attempt"], retry["next_at"], retry["policy"]) == (
        "t->q:full", 2, t0 + 1, "EXPONENTIAL_DECAY_RETRY")
    assert _drain_one(c, "full") == b"m1"
    audited.advance_time(0.999)
    assert q.message_count == 0
    audited.advance_time(0.001)
    assert (q.message_count, ex.topic.retained_count) == (1, 0)
    assert _drain_one(c, "full") == b"m2"
    enq = audit.of("enqueue")
    assert [(e["queue"], e["topic"], e["subscription"]) for e in enq] == [("full", "t", "t->q:full")] * 2


async def test_D6_second_failure_waits_2s_and_blocks(audited, audit: Recorder):
    c, t0 = _queue_full_of_m1(audited)
    audited.advance_time(1)  # retry 1 fails: the queue is still full
    assert [(r["attempt"], r["next_at"]) for r in audit.of("retry")] == [(2, t0 + 1), (3, t0 + 3)]
    c.publish(1, "t", "k", b"m3")  # blocked behind m2 (D6)
    ex = audited.vhosts["/"].exchanges["t"]
    assert ex.topic.retained_count == 2
    assert _drain_one(c, "full") == b"m1"
    audited.advance_time(2)
    # m2 went in at t0+3, which unblocked m3 at once; the queue was full again: m3 retries at +1 s.
    assert [(r["attempt"], r["next_at"]) for r in audit.of("retry")][2:] == [(2, t0 + 4)]
    assert _drain_one(c, "full") == b"m2"
    audited.advance_time(1)
    assert _drain_one(c, "full") == b"m3"
    assert ex.topic.retained_count == 0


async def test_D5_backoff_retry_from_the_binding_argument(audited, audit: Recorder):
    c, t0 = _queue_full_of_m1(audited, strategy="BACKOFF_RETRY")
    [retry] = audit.of("retry")
    assert retry["policy"] == "BACKOFF_RETRY" and 10 <= retry["next_at"] - t0 <= 20
    assert _drain_one(c, "full") == b"m1"
    audited.advance_time(20)
    assert _drain_one(c, "full") == b"m2"


async def test_M8_unknown_notify_strategy_is_406(broker):
    c = Client(broker)
    c.open_channel()
    declare(c, C.Exchange.Declare(exchange="t", exchange_type="direct"), C.Queue.Declare(queue="q"))
    c.send(1, C.Queue.Bind(queue="q", exchange="t", routing_key="a",
                           arguments={"x-cmq-notify-strategy": "SOMETIMES"}))
    [close] = c.methods()
    assert (close.reply_code, close.reply_text) == (
        406, "PRECONDITION_FAILED - x-cmq-notify-strategy 'SOMETIMES' is not BACKOFF_RETRY or "
             "EXPONENTIAL_DECAY_RETRY")


async def test_M14_D2_retained_persistent_message_is_confirmed_after_fsync_and_survives_restart(tmp_path):
    clock = ManualClock()
    b = await Broker.open(str(tmp_path), clock=clock)
    c = Client(b)
    _topology(c, durable=True)
    declare(c, C.Confirm.Select())
    c.publish(1, "t", "k", b"m1", delivery_mode=2)
    c.publish(1, "t", "k", b"kept", delivery_mode=2)
    c.publish(1, "t", "k", b"transient", delivery_mode=1)
    acks = [m for m in c.methods() if isinstance(m, C.Basic.Ack)]
    assert acks == []  # m1 and the retained message wait for the fsync; the transient one behind them
    b.sync_now()
    acks = [(m.delivery_tag, m.multiple) for m in c.methods() if isinstance(m, C.Basic.Ack)]
    assert acks == [(3, True)]
    assert len(list(b.store.items("t/"))) == 1
    await b.close()

    b2 = await Broker.open(str(tmp_path), clock=clock)
    ex = b2.vhosts["/"].exchanges["t"]
    q = b2.vhosts["/"].queues["full"]
    assert (q.message_count, ex.topic.retained_count) == (1, 1)
    c2 = Client(b2)
    c2.open_channel()
    assert _drain_one(c2, "full") == b"m1"
    b2.advance_time(1)
    assert _drain_one(c2, "full") == b"kept"
    assert (ex.topic.retained_count, list(b2.store.items("t/"))) == (0, [])
    await b2.close()


@pytest.mark.profile("cmq")  # PF2 limits / M11 receive metadata
async def test_A2_one_msg_id_from_publish_to_ack_across_two_queues(audited, audit: Recorder):
    c = Client(audited)
    c.open_channel()
    declare(c, C.Exchange.Declare(exchange="tags", exchange_type="direct"),
            C.Queue.Declare(queue="red"), C.Queue.Declare(queue="all"),
            C.Queue.Bind(queue="red", exchange="tags", routing_key="red"),
            C.Queue.Bind(queue="all", exchange="tags", routing_key=""))
    c.publish(1, "tags", "red", b"body", headers={"x-cmq-tags": ["blue"]})
    [pub] = audit.of("publish")
    msg_id = pub["msg_id"]
    assert (pub["topic"], pub["routing_key"], pub["tags"], pub["size"], pub["user"], pub["peer"]) == (
        "tags", "red", ["red", "blue"], 4, "guest", "127.0.0.1:1")
    routes = sorted((r["subscription"], r["queue"], r["msg_id"], tuple(r["tags"])) for r in audit.of("route"))
    assert routes == [("tags->q:all", "all", msg_id, ("red", "blue")),
                      ("tags->q:red", "red", msg_id, ("red", "blue"))]
    assert sorted(b["subscription"] for b in audit.of("bind")) == ["tags->q:all", "tags->q:red"]
    audited.advance_time(2.5)
    c.send(1, C.Basic.Get(queue="red"))
    [(ok, props, _)] = deliveries(c.read())
    assert props.headers["x-cmq-msg-id"] == props.message_id == msg_id
    c.send(1, C.Basic.Ack(delivery_tag=ok.delivery_tag))
    [ack] = audit.of("ack")
    assert (ack["queue"], ack["msg_id"], ack["latency_ms"], ack["user"]) == ("red", msg_id, 2500.0, "guest")
    assert {e["msg_id"] for e in audit.of("enqueue")} == {msg_id}


async def test_A1_discards_name_their_reason_and_message(audited, audit: Recorder):
    c = Client(audited)
    c.open_channel()
    declare(c, C.Exchange.Declare(exchange="tt", exchange_type="topic"), C.Queue.Declare(queue="q"),
            C.Basic.Qos(prefetch_count=0))
    c.publish(1, "tt", "no.match", b"1234")
    c.publish(1, "", "q", b"rejected!")
    c.send(1, C.Basic.Get(queue="q"))
    [(ok, _, _)] = deliveries(c.read())
    c.send(1, C.Basic.Reject(delivery_tag=ok.delivery_tag, requeue=False))
    pubs = {p["size"]: p["msg_id"] for p in audit.of("publish")}
    discards = [(d["reason"], d.get("topic"), d.get("queue"), d["msg_id"], d["size"]) for d in audit.of("discard")]
    assert discards == [("no_match", "tt", None, pubs[4], 4), ("rejected", None, "q", pubs[9], 9)]
    [nack] = audit.of("nack")
    assert (nack["queue"], nack["msg_id"]) == ("q", pubs[9])


async def test_D7_endpoint_hooks_deliver_to_other_endpoint_kinds(audited, audit: Recorder):
    """D7: a subscription whose endpoint is ("http", url) goes to the registered hook; its
    False is a failed delivery (retried, D6), its None a pending one reported later."""
    c = Client(audited)
    c.open_channel()
    declare(c, C.Exchange.Declare(exchange="web", exchange_type="topic"))
    topic = audited.vhosts["/"].exchanges["web"].topic
    topic.subscribe("hook1", ("http", "http://example.invalid/a"), ["a.#"])
    answers: list[bool | None] = [False, None]
    seen: list[tuple[str, bytes]] = []

    def hook(t, sub, tmsg):
        seen.append((sub.name, tmsg.payload.body))
        return answers.pop(0)

    c.publish(1, "web", "a.b", b"x", mandatory=True)
    assert c.read() == []  # no hook yet: a failed delivery, retained (routed), no basic.return
    assert topic.retained_count == 1
    audited.endpoint_hooks["http"] = hook
    audited.advance_time(1)
    assert seen == [("hook1", b"x")] and topic.retained_count == 1  # failed again: retried
    audited.advance_time(2)
    assert seen == [("hook1", b"x")] * 2
    msg_id = audit.of("publish")[0]["msg_id"]
    assert topic.state(msg_id)["hook1"].in_flight is True
    audited.topic_events(audited.vhosts["/"], audited.vhosts["/"].exchanges["web"],
                         topic.report(msg_id, "hook1", True, audited.now()))
    assert topic.retained_count == 0


async def test_M14_a_nack_behind_pending_acks_keeps_publish_order(tmp_path):
    """M14: a refused publish (x-overflow reject-publish) behind messages waiting for the fsync
    is nacked on its own, never covered by a later multiple ack."""
    b = await Broker.open(str(tmp_path), clock=ManualClock())
    c = Client(b)
    c.open_channel()
    declare(c, C.Queue.Declare(queue="one", durable=True, arguments=FULL), C.Queue.Declare(queue="other"),
            C.Confirm.Select())
    c.publish(1, "", "one", b"kept", delivery_mode=2)      # 1: waits for the fsync
    c.publish(1, "", "one", b"refused", delivery_mode=2)   # 2: full: nack
    c.publish(1, "", "other", b"transient")                # 3: nothing to wait for
    assert c.methods() == []
    b.sync_now()
    confirms = [(m.name, m.delivery_tag, m.multiple) for m in c.methods()]
    assert confirms == [("Basic.Ack", 1, False), ("Basic.Nack", 2, False), ("Basic.Ack", 3, False)]
    await b.close()
