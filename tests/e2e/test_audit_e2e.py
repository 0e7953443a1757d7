"""End to end, A1-A4: a real gateway, a real AMQP client, the audit files, then Spark.

One module-scoped workload (``audit_run``) starts the gateway in-process (port 0, a temporary
data dir and an audit dir that rotates every few KB), drives a known workload with pika, stops
the gateway (which closes the last audit file) and keeps what the client saw.  Then:

* ``test_A1_A2_A3_A4_audit_log_of_a_known_workload`` reads the log with the ``cmq-audit``
  connector in the shared local SparkSession and checks the exact count of every event, every
  discard reason, per queue and per topic, the A2 fields of each record, and the numbers of the
  ready analyses (funnel, redeliveries and stale acks, auth failures, publishers, latency);
* ``test_A4_report_command_on_the_workload_log`` runs ``cmq-audit report`` on the same log.

The expected values come from the workload below and from the specification, never from the
log itself: SPEC A1 (which events), A2 (which fields), docs/ARCHITECTURE.md and spark/SCHEMA.md
(``route``: one record per subscription; ``msg_id``: the CMQ message ID, the same one from
``publish`` through ``route``/``enqueue`` to ``deliver``/``ack``, which is how the analyses join
queue-side records to their topic and subscription).  Mismatches are collected and reported
together, so that one run lists every gap.

The workload (vhost ``/``, user ``guest`` from loopback):

==========  ============================================  =====================================
message     published                                     outcome
==========  ============================================  =====================================
P1          direct ``e2e_tags``, key ``red``              qRed (nack requeue, redelivered, ack)
                                                          and qAll (ack)
P2          direct, key ``blue``                          qBlue, qAll (acked)
P3          direct, key ``green``, mandatory              qAll only: ``""`` takes all (M2)
P4          direct, ``purple`` + ``x-cmq-tags [red,blue]``qRed (nack, no requeue: discarded
                                                          ``rejected``), qBlue, qAll (acked)
P5          topic ``e2e_topic``, ``orders.eu``            qOrders, qEu (acked)
P6          topic, ``orders.us``                          qOrders (acked)
P7          topic, ``payments.eu``                        qEu (acked)
P8          topic, ``payments.us``, mandatory             unroutable: basic.return 312,
                                                          discard ``no_match``
P9          topic, ``misc``, not mandatory                discard ``no_match``
P10         topic, ``orders.xl``, 70,000 bytes            406 (L6), discard ``too_large``
P11         default exchange → qVis (visibility 1 s)      delivered, visibility expires,
                                                          delivered again; the first delivery's
                                                          ack is a stale ack, the second acks
P12, P13    default exchange → qTtl (x-message-ttl)       discard ``expired``
==========  ============================================  =====================================

plus one failed login (``guest`` with a wrong password, W2) and two successful connections
(publisher and consumer).
"""

from __future__ import annotations

import html as html_mod
import json
import os
import re
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pika
import pika.exceptions
import pytest

from gateway.config import AuditSettings
from gateway.server import gateway_in_thread

pytestmark = pytest.mark.spark

VHOST = "/"
USER = "guest"
EX_TAGS = "e2e_tags"
EX_TOPIC = "e2e_topic"
Q_RED, Q_BLUE, Q_ALL = "qRed", "qBlue", "qAll"
Q_ORDERS, Q_EU = "qOrders", "qEu"
Q_VIS, Q_TTL = "qVis", "qTtl"
QUEUES = (Q_RED, Q_BLUE, Q_ALL, Q_ORDERS, Q_EU, Q_VIS, Q_TTL)
BINDINGS = {  # (exchange, queue) -> binding key
    (EX_TAGS, Q_RED): "red",
    (EX_TAGS, Q_BLUE): "blue",
    (EX_TAGS, Q_ALL): "",  # M2: the empty binding key receives every message (T1)
    (EX_TOPIC, Q_ORDERS): "orders.*",
    (EX_TOPIC, Q_EU): "#.eu",
}
TOO_LARGE = 70_000  # above the topic's default MaximumMessageSize of 64 KB (L6)
TTL_MS = 300
ROTATE_BYTES = 2048  # several closed files for a workload of about a hundred records
DEADLINE = 30.0  # hang guard for the polling loops only; nothing asserts on elapsed time


def _body(name: str, size: int) -> bytes:
    """A body of exactly ``size`` bytes: every message has its own size and routing key, so
    each record names its message by (topic or queue, key or size) without trusting msg_id."""
    return (name.encode() + b" " + b"." * size)[:size]


@dataclass(frozen=True)
class Pub:
    name: str
    exchange: str  # "" for the default exchange
    routing_key: str
    body: bytes
    tags: tuple[str, ...]  # M2: the key plus x-cmq-tags, direct exchanges only
    queues: tuple[str, ...]  # where it must be enqueued
    discard: str | None = None  # the discard reason before routing, if any

    @property
    def topic(self) -> str | None:
        return self.exchange or None


PUBS = [
    Pub("P1", EX_TAGS, "red", _body("P1", 10), ("red",), (Q_RED, Q_ALL)),
    Pub("P2", EX_TAGS, "blue", _body("P2", 13), ("blue",), (Q_BLUE, Q_ALL)),
    Pub("P3", EX_TAGS, "green", _body("P3", 16), ("green",), (Q_ALL,)),
    Pub("P4", EX_TAGS, "purple", _body("P4", 19), ("purple", "red", "blue"), (Q_RED, Q_BLUE, Q_ALL)),
    Pub("P5", EX_TOPIC, "orders.eu", _body("P5", 22), (), (Q_ORDERS, Q_EU)),
    Pub("P6", EX_TOPIC, "orders.us", _body("P6", 25), (), (Q_ORDERS,)),
    Pub("P7", EX_TOPIC, "payments.eu", _body("P7", 28), (), (Q_EU,)),
    Pub("P8", EX_TOPIC, "payments.us", _body("P8", 31), (), (), "no_match"),
    Pub("P9", EX_TOPIC, "misc", _body("P9", 34), (), (), "no_match"),
    Pub("P10", EX_TOPIC, "orders.xl", _body("P10", TOO_LARGE), (), (), "too_large"),
    Pub("P11", "", Q_VIS, _body("P11", 37), (), (Q_VIS,)),
    Pub("P12", "", Q_TTL, _body("P12", 40), (), (Q_TTL,)),
    Pub("P13", "", Q_TTL, _body("P13", 43), (), (Q_TTL,)),
]
BY_NAME = {p.name: p for p in PUBS}
BY_BODY = {p.body: p for p in PUBS}


@dataclass
class Run:
    """What the client side saw; the expectations are derived from it and the table above."""

    audit_dir: str
    publisher_peer: str = ""
    consumer_peer: str = ""
    # (queue, publication name) -> the CMQ message ID delivered in x-cmq-msg-id (M11)
    delivered_ids: dict[tuple[str, str], str] = field(default_factory=dict)
    # (queue, publication name) -> x-cmq-receive-count of each delivery, in order
    receive_counts: dict[tuple[str, str], list[int]] = field(default_factory=dict)
    returned_reply_code: int | None = None  # basic.return for P8 (M9)
    too_large_reply_code: int | None = None  # channel close for P10 (L6)
    auth_error: str = ""
    closed_files: list[str] = field(default_factory=list)
    open_files: list[str] = field(default_factory=list)
    parquet_files: list[str] = field(default_factory=list)


def _local_peer(conn: pika.BlockingConnection) -> str:
    """The client's own ``host:port``, as the gateway should write ``peer`` (A2)."""
    sock = conn._impl._transport._sock  # noqa: SLF001 (pika exposes no public accessor)
    host, port = sock.getsockname()[:2]
    return f"{host}:{port}"


def _params(port: int, password: str = "guest", name: str = "") -> pika.ConnectionParameters:
    return pika.ConnectionParameters(
        host="127.0.0.1", port=port, virtual_host=VHOST,
        credentials=pika.PlainCredentials(USER, password),
        client_properties={"connection_name": name} if name else None,
        connection_attempts=1, heartbeat=0, blocked_connection_timeout=None,
    )


def _get(ch: Any, queue: str, run: Run) -> tuple[int, Pub]:
    """One basic.get that must return a message; records its CMQ ID and receive count."""
    method, props, body = ch.basic_get(queue, auto_ack=False)
    assert method is not None, f"basic.get on {queue} returned nothing"
    pub = BY_BODY[body]
    headers = props.headers or {}
    run.delivered_ids.setdefault((queue, pub.name), headers["x-cmq-msg-id"])
    run.receive_counts.setdefault((queue, pub.name), []).append(int(headers["x-cmq-receive-count"]))
    return method.delivery_tag, pub


def _drive(port: int, run: Run) -> None:
    # W2: a wrong password is refused (403 ACCESS_REFUSED) and must leave an auth_failure record.
    with pytest.raises(pika.exceptions.AMQPConnectionError) as refused:
        pika.BlockingConnection(_params(port, password="not-the-password"))
    run.auth_error = type(refused.value).__name__

    pub_conn = pika.BlockingConnection(_params(port, name="e2e-publisher"))
    con_conn = pika.BlockingConnection(_params(port, name="e2e-consumer"))
    run.publisher_peer, run.consumer_peer = _local_peer(pub_conn), _local_peer(con_conn)
    ch = pub_conn.channel()
    ch.exchange_declare(EX_TAGS, "direct")
    ch.exchange_declare(EX_TOPIC, "topic")
    for q in (Q_RED, Q_BLUE, Q_ALL, Q_ORDERS, Q_EU):
        ch.queue_declare(q)
    ch.queue_declare(Q_VIS, arguments={"x-cmq-visibility-timeout": 1})
    ch.queue_declare(Q_TTL, arguments={"x-message-ttl": TTL_MS})
    for (ex, q), key in BINDINGS.items():
        ch.queue_bind(q, ex, routing_key=key)
    ch.confirm_delivery()  # each publish waits for its confirm: the log order is the workload's

    for p in PUBS:
        if p.name == "P10":
            continue  # on a channel of its own below: the 406 closes the channel
        headers = {"x-cmq-tags": list(p.tags[1:])} if len(p.tags) > 1 else None
        props = pika.BasicProperties(headers=headers)
        if p.name in ("P3", "P8"):
            try:
                ch.basic_publish(p.exchange, p.routing_key, p.body, props, mandatory=True)
            except pika.exceptions.UnroutableError as e:
                run.returned_reply_code = e.messages[0].method.reply_code
                assert p.name == "P8", "P3 is routed to qAll by its empty binding key (M2)"
        else:
            ch.basic_publish(p.exchange, p.routing_key, p.body, props)

    big = pub_conn.channel()
    big.confirm_delivery()
    p10 = BY_NAME["P10"]
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as too_large:
        big.basic_publish(p10.exchange, p10.routing_key, p10.body)
    run.too_large_reply_code = too_large.value.reply_code

    c = con_conn.channel()
    # qRed: P1 nacked with requeue and redelivered, P4 nacked without requeue (M13).
    tags = dict(reversed(_get(c, Q_RED, run)) for _ in range(2))
    assert set(tags) == {BY_NAME["P1"], BY_NAME["P4"]}
    c.basic_nack(tags[BY_NAME["P4"]], requeue=False)
    c.basic_nack(tags[BY_NAME["P1"]], requeue=True)
    tag, pub = _get(c, Q_RED, run)
    assert pub.name == "P1"
    c.basic_ack(tag)
    # Every other routed message is received once and acked.
    for q in (Q_BLUE, Q_ALL, Q_ORDERS, Q_EU):
        expected = [p for p in PUBS if q in p.queues]
        got = [_get(c, q, run) for _ in expected]
        assert sorted(p.name for _, p in got) == sorted(p.name for p in expected)
        for tag, _ in got:
            c.basic_ack(tag)
    # qVis: received, not acked within its 1 s visibility timeout, received again (Q1); the
    # first receipt's ack then deletes nothing (stale, M12/Q3), the second one deletes it.
    first_tag, _ = _get(c, Q_VIS, run)
    deadline = time.monotonic() + DEADLINE
    while True:
        method, props, body = c.basic_get(Q_VIS, auto_ack=False)
        if method is not None:
            break
        assert time.monotonic() < deadline, "qVis message never became visible again"
        pub_conn.sleep(0.1)
    headers = props.headers or {}
    run.receive_counts[(Q_VIS, BY_BODY[body].name)].append(int(headers["x-cmq-receive-count"]))
    c.basic_ack(first_tag)
    c.basic_ack(method.delivery_tag)
    # qTtl: both messages expire unread (x-message-ttl, M7).
    deadline = time.monotonic() + DEADLINE
    while c.queue_declare(Q_TTL, passive=True).method.message_count:
        assert time.monotonic() < deadline, "qTtl messages never expired"
        pub_conn.sleep(0.1)
    c.queue_declare(Q_VIS, passive=True)  # a round trip: both acks above are processed
    con_conn.close()
    pub_conn.close()


@pytest.fixture(scope="module")
def audit_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    root = tmp_path_factory.mktemp("e2e-audit")
    audit_dir = str(root / "audit")
    run = Run(audit_dir=audit_dir)
    settings = AuditSettings(dir=audit_dir, rotate_bytes=ROTATE_BYTES)
    # The cmq profile (PF2): P10 is refused (L6) and deliveries carry x-cmq-msg-id (M11).
    with gateway_in_thread(port=0, data_dir=str(root / "data"), hosts=("127.0.0.1",),
                           audit=settings, profile="cmq") as gw:
        _drive(gw.port, run)
    # The gateway is stopped: its audit log is closed (A3).
    for dirpath, _, files in os.walk(audit_dir):
        for f in files:
            if f.startswith(".") and dirpath == audit_dir:
                continue  # the directory's locks (.lock: one gateway, .compact.lock: one compactor)
            rel = os.path.relpath(os.path.join(dirpath, f), audit_dir)
            if f.endswith(".parquet"):
                run.parquet_files.append(rel)  # a closed segment compacted (A7), beside its JSON lines
                continue
            (run.open_files if f.endswith(".open") else run.closed_files).append(rel)
    yield run


# ---- expectations ------------------------------------------------------------------------------

def _expected_event_counts() -> Counter[str]:
    """Records per event for the workload, from the table in the module docstring (A1)."""
    routed = sum(len(p.queues) for p in PUBS if p.exchange)
    enqueued = sum(len(p.queues) for p in PUBS)
    acked_once = sum(len(p.queues) for p in PUBS if p.exchange) - 1  # P4 on qRed is rejected
    return Counter({
        "auth_failure": 1,
        "connection_open": 2,
        "connection_close": 2,
        "exchange_declare": 2,
        "queue_declare": len(QUEUES),
        "bind": len(BINDINGS),
        "publish": len(PUBS),  # every basic.publish, including the refused P10
        "route": routed,  # one record per subscription that took the message
        "enqueue": enqueued,
        # routed once each, + P1's redelivery on qRed, + qVis twice
        "deliver": routed + 1 + 2,
        "ack": acked_once + 1,  # + qVis's second receipt
        "stale_ack": 1,
        "requeue": 1,  # P1 on qRed
        "nack": 1,  # P4 on qRed, without requeue
        "visibility_expire": 1,
        "discard": 2 + 1 + 1 + 2,  # no_match P8 P9, too_large P10, rejected P4, expired P12 P13
    })


EXPECTED_DISCARDS = {
    # reason -> [(topic, queue, publication)]
    "no_match": [(EX_TOPIC, None, "P8"), (EX_TOPIC, None, "P9")],
    "too_large": [(EX_TOPIC, None, "P10")],
    "rejected": [(None, Q_RED, "P4")],
    "expired": [(None, Q_TTL, "P12"), (None, Q_TTL, "P13")],
}


class Gaps:
    """Collects every mismatch so that one run names all of them; fails at the end."""

    def __init__(self) -> None:
        self.items: list[str] = []

    def eq(self, what: str, got: Any, want: Any) -> None:
        if got != want:
            self.items.append(f"{what}: got {got!r}, want {want!r}")

    def true(self, what: str, ok: bool) -> None:
        if not ok:
            self.items.append(what)

    def each(self, what: str, cases: list[tuple[str, Any, Any]]) -> None:
        """One line for a check made on many records: how many are wrong, and the first one."""
        wrong = [(name, got, want) for name, got, want in cases if got != want]
        if wrong:
            name, got, want = wrong[0]
            self.items.append(f"{what}: {len(wrong)} of {len(cases)} records wrong, e.g. {name}: "
                              f"got {got!r}, want {want!r}")

    def fail_if_any(self) -> None:
        assert not self.items, f"{len(self.items)} audit gap(s):\n  " + "\n  ".join(self.items)


def _rows(spark: Any, audit_dir: str) -> list[dict[str, Any]]:
    df = spark.read.format("cmq-audit").load(audit_dir)
    return [r.asDict() for r in df.orderBy("ts").collect()]


# ---- the tests -------------------------------------------------------------------------------

def test_A1_A2_A3_A4_audit_log_of_a_known_workload(spark: Any, audit_run: Run) -> None:
    """A1-A4: the exact audit trail of the workload, read back with the connector, and the
    ready analyses' exact numbers for it."""
    run = audit_run
    # The client saw the workload happen as specified (M9 312, L6 406, W2 403).
    assert run.returned_reply_code == 312
    assert run.too_large_reply_code == 406
    assert run.auth_error in ("ProbableAuthenticationError", "AuthenticationError",
                              "ProbableAccessDeniedError")
    assert run.receive_counts[(Q_RED, "P1")] == [1, 2]
    assert run.receive_counts[(Q_VIS, "P11")] == [1, 2]
    # A3: rotation by size left several closed files, and stopping closed the last one.
    assert run.open_files == []
    assert len(run.closed_files) >= 3, run.closed_files
    # A7, keep mode: a compacted segment keeps its JSON lines beside its Parquet file.
    assert {p.removesuffix(".parquet") + ".jsonl" for p in run.parquet_files} <= set(run.closed_files)
    assert all(re.fullmatch(r"dt=\d{4}-\d\d-\d\d/hour=\d\d/audit-\d{8}T\d{6}\.\d{6}Z-\d{6,}\.jsonl", f)
               for f in run.closed_files), run.closed_files

    rows = _rows(spark, run.audit_dir)
    skipped = spark.read.format("cmq-audit").option("output", "skipped").load(run.audit_dir).count()
    assert skipped == 0
    assert {r["file"] for r in rows} == set(run.closed_files)
    gaps = Gaps()

    # ---- A1: every event, exactly as often as the workload caused it --------------------------
    got_events = Counter(r["event"] for r in rows)
    want_events = _expected_event_counts()
    for event in sorted(set(got_events) | set(want_events)):
        gaps.eq(f"A1 count of '{event}' records", got_events.get(event, 0), want_events.get(event, 0))
    discards = [r for r in rows if r["event"] == "discard"]
    gaps.eq("A1 discards per reason", dict(Counter(r["reason"] for r in discards)),
            {k: len(v) for k, v in EXPECTED_DISCARDS.items()})

    # ---- A2: common fields -------------------------------------------------------------------
    for r in rows:
        gaps.true(f"A2 v/ts/vhost of {r['event']}: {r['v']!r} {r['ts']!r} {r['vhost']!r}",
                  r["v"] == 2 and r["ts"] is not None and r["vhost"] == VHOST)
    ts_re = re.compile(r'"ts":"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z"')
    raw_lines = [line for f in run.closed_files
                 for line in Path(run.audit_dir, f).read_text(encoding="utf-8").splitlines()]
    gaps.eq("A2 raw lines with a UTC microsecond ts", sum(bool(ts_re.search(x)) for x in raw_lines),
            len(rows))

    peers = {run.publisher_peer, run.consumer_peer}
    by_event: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        by_event.setdefault(r["event"], []).append(r)

    # connections (A1, W2)
    opens = by_event.get("connection_open", [])
    gaps.eq("A2 connection_open (user, peer)", sorted((r["user"], r["peer"]) for r in opens),
            sorted((USER, p) for p in peers))
    gaps.eq("A2 connection_open conn (connection_name)", sorted(str(r["conn"]) for r in opens),
            ["e2e-consumer", "e2e-publisher"])
    closes = by_event.get("connection_close", [])
    gaps.eq("A2 connection_close (user, peer)", sorted((r["user"], r["peer"]) for r in closes),
            sorted((USER, p) for p in peers))
    fails = by_event.get("auth_failure", [])
    gaps.eq("A2 auth_failure user", [r["user"] for r in fails], [USER])
    gaps.true(f"A2 auth_failure peer is the client's 127.0.0.1:port: {[r['peer'] for r in fails]}",
              all(re.fullmatch(r"127\.0\.0\.1:\d+", r["peer"] or "") and r["peer"] not in peers
                  for r in fails))
    gaps.true(f"A2 auth_failure carries a reason: {[r['reason'] for r in fails]}",
              all(r["reason"] for r in fails))

    # declarations and bindings
    gaps.eq("A2 exchange_declare (topic, user)",
            sorted((r["topic"], r["user"]) for r in by_event.get("exchange_declare", [])),
            sorted([(EX_TAGS, USER), (EX_TOPIC, USER)]))
    gaps.eq("A2 queue_declare (queue, user)",
            sorted((r["queue"], r["user"]) for r in by_event.get("queue_declare", [])),
            sorted((q, USER) for q in QUEUES))
    binds = by_event.get("bind", [])
    gaps.eq("A2 bind (topic, queue, routing_key, user)",
            sorted((r["topic"], r["queue"], r["routing_key"], r["user"]) for r in binds),
            sorted((ex, q, key, USER) for (ex, q), key in BINDINGS.items()))
    sub_of = {(r["topic"], r["queue"]): r["subscription"] for r in binds}
    gaps.true(f"A2 bind names its subscription: {sub_of}",
              len(sub_of) == len(BINDINGS) and all(isinstance(s, str) and s for s in sub_of.values()))

    # Each record names its message by what the client chose (destination, routing key, size:
    # all distinct in this workload), so a missing or inconsistent msg_id is reported once, by
    # the msg_id check below, instead of hiding every other field.
    def dest(p: Pub) -> str:
        return p.exchange or p.routing_key

    # publish: one per basic.publish (refused ones too), with the CMQ msg_id, key, tags, size,
    # user and peer of the publishing connection
    publishes = by_event.get("publish", [])
    pub_rec: dict[str, dict[str, Any]] = {}
    for p in PUBS:
        mine = [r for r in publishes if r["size"] == len(p.body) and r["routing_key"] == p.routing_key
                and (r["topic"] if p.exchange else r["queue"]) == dest(p)]
        gaps.eq(f"A1 publish records of {p.name}", len(mine), 1)
        if mine:
            pub_rec[p.name] = mine[0]
    gaps.each("A2 publish has a CMQ msg_id (msg-<hex>)", [
        (n, bool(re.fullmatch(r"msg-[0-9a-f]+", r["msg_id"] or "")), True) for n, r in pub_rec.items()])
    gaps.each("A2 publish (topic, queue, tags)", [
        (n, (r["topic"], r["queue"], sorted(r["tags"] or [])),
         (BY_NAME[n].topic, None if BY_NAME[n].exchange else BY_NAME[n].routing_key, sorted(BY_NAME[n].tags)))
        for n, r in pub_rec.items()])
    gaps.each("A2 publish (user, peer) of the publishing connection", [
        (n, (r["user"], r["peer"]), (USER, run.publisher_peer)) for n, r in pub_rec.items()])

    # route: one record per subscription that took the message (SCHEMA.md), named as in bind
    routes = by_event.get("route", [])
    gaps.true(f"A1 route: one record per subscription, `subscription` a single name; got "
              f"{[r['subscription'] for r in routes][:2]} ...",
              all(isinstance(r["subscription"], str) and r["subscription"] in sub_of.values()
                  for r in routes))
    gaps.eq("A1/A2 route records (topic, routing_key, subscription, queue, tags, size)",
            sorted(((r["topic"], r["routing_key"], str(r["subscription"]), r["queue"],
                     tuple(sorted(r["tags"] or [])), r["size"]) for r in routes), key=str),
            sorted(((p.exchange, p.routing_key, sub_of.get((p.exchange, q)), q, tuple(sorted(p.tags)),
                     len(p.body)) for p in PUBS if p.exchange for q in p.queues), key=str))

    # enqueue: per queue, with the topic and subscription it came through (the analyses fill
    # queue-side records from it)
    enqueues = by_event.get("enqueue", [])
    by_size = {len(p.body): p for p in PUBS}
    gaps.eq("A1/A2 enqueue records (queue, message, topic, subscription)",
            sorted(((r["queue"], getattr(by_size.get(r["size"]), "name", f"?{r['size']}"), r["topic"],
                     r["subscription"]) for r in enqueues), key=str),
            sorted(((q, p.name, p.topic, sub_of.get((p.exchange, q)) if p.exchange else None)
                    for p in PUBS for q in p.queues), key=str))
    # (queue, msg_id) -> publication, from the queue's own enqueue record
    msg_of = {(r["queue"], r["msg_id"]): by_size[r["size"]].name for r in enqueues if r["size"] in by_size}

    # msg_id: the one CMQ message ID of a message, from publish through route and enqueue to what
    # the consumer received in x-cmq-msg-id (M11); the funnel and latency analyses join on it.
    for p in PUBS:
        ids = {"publish": (pub_rec.get(p.name) or {}).get("msg_id")}
        for r in routes:
            if (r["topic"], r["routing_key"]) == (p.exchange, p.routing_key):
                ids[f"route {r['subscription']}"] = r["msg_id"]
        for (q, mid), name in msg_of.items():
            if name == p.name:
                ids[f"enqueue {q}"] = mid
        for (q, name), mid in run.delivered_ids.items():
            if name == p.name:
                ids[f"delivered from {q}"] = mid
        for r in by_event.get("discard", []):
            if (r["topic"], r["routing_key"], r["size"]) == (p.exchange, p.routing_key, len(p.body)):
                ids[f"discard {r['reason']}"] = r["msg_id"]
        gaps.true(f"A2 one msg_id for {p.name} across its records: {ids}",
                  len(set(ids.values())) == 1 and None not in ids.values())

    # queue-side events: the queue, the message as enqueued, the attempt, the consumer's user/peer
    def queue_side(event: str) -> list[tuple[str, str, int | None]]:
        out, who, sizes, latency = [], [], [], []
        for r in by_event.get(event, []):
            name = msg_of.get((r["queue"], r["msg_id"]), f"?{r['msg_id']}")
            where = f"{name} on {r['queue']}"
            out.append((r["queue"], name, r["attempt"] if event in ("deliver", "visibility_expire") else None))
            who.append((where, (r["user"], r["peer"]), (USER, run.consumer_peer)))
            sizes.append((where, r["size"], len(BY_NAME[name].body) if name in BY_NAME else None))
            latency.append((where, r["latency_ms"] is not None and r["latency_ms"] >= 0, True))
        if event in ("deliver", "ack", "stale_ack", "requeue", "nack"):
            gaps.each(f"A2 {event} (user, peer) of the consuming connection", who)
        if event == "deliver":
            gaps.each("A2 deliver size", sizes)
        if event == "ack":
            gaps.each("A2 ack carries latency_ms (SCHEMA: end-to-end, publish → ack)", latency)
        return sorted(out)

    routed_pairs = [(q, p.name) for p in PUBS for q in p.queues if q not in (Q_TTL, Q_VIS)]
    gaps.eq("A1/A2 deliver (queue, message, attempt)", queue_side("deliver"), sorted(
        [(q, n, 1) for q, n in routed_pairs] + [(Q_RED, "P1", 2), (Q_VIS, "P11", 1), (Q_VIS, "P11", 2)]))
    gaps.eq("A1/A2 ack (queue, message)", queue_side("ack"),
            sorted([(q, n, None) for q, n in routed_pairs if (q, n) != (Q_RED, "P4")]
                   + [(Q_VIS, "P11", None)]))
    gaps.eq("A1/A2 stale_ack", queue_side("stale_ack"), [(Q_VIS, "P11", None)])
    gaps.eq("A1/A2 requeue", queue_side("requeue"), [(Q_RED, "P1", None)])
    gaps.eq("A1/A2 nack", queue_side("nack"), [(Q_RED, "P4", None)])
    gaps.eq("A1/A2 visibility_expire (attempt = receives so far)", queue_side("visibility_expire"),
            [(Q_VIS, "P11", 1)])

    # discards: the reason, where, which message, its size; user/peer when a client caused it
    for reason, wants in EXPECTED_DISCARDS.items():
        got_keys = []
        for r in (r for r in discards if r["reason"] == reason):
            if r["queue"] is not None and (r["queue"], r["msg_id"]) in msg_of:
                name = msg_of[(r["queue"], r["msg_id"])]
            else:
                name = next((p.name for p in PUBS if (p.topic, p.routing_key, len(p.body))
                             == (r["topic"], r["routing_key"], r["size"])), f"?{r['msg_id']}")
            got_keys.append((r["topic"], r["queue"], name))
            if name not in BY_NAME:
                continue
            p = BY_NAME[name]
            gaps.eq(f"A2 discard {reason} of {name} size", r["size"], len(p.body))
            if reason in ("no_match", "too_large"):
                gaps.eq(f"A2 discard {reason} of {name} (routing_key, user, peer)",
                        (r["routing_key"], r["user"], r["peer"]), (p.routing_key, USER, run.publisher_peer))
            if reason == "rejected":
                gaps.eq(f"A2 discard rejected of {name} (user, peer)", (r["user"], r["peer"]),
                        (USER, run.consumer_peer))
        gaps.eq(f"A1/A2 discard {reason} (topic, queue, message)", sorted(got_keys, key=str),
                sorted(wants, key=str))

    # ---- A4: the ready analyses give the workload's numbers ----------------------------------
    from spark import analyses

    df = spark.read.format("cmq-audit").load(run.audit_dir).cache()
    funnel = {(r.topic, r.subscription): r.asDict() for r in analyses.funnel(df).collect()}
    cols = ("published", "routed", "delivered", "acked", "discarded", "discarded_no_match",
            "discarded_too_large", "discarded_rejected", "discarded_expired")
    want_funnel: dict[tuple[str, str | None], tuple[int, ...]] = {}
    for (ex, q) in BINDINGS:
        n_pub = sum(1 for p in PUBS if p.exchange == ex)
        msgs = [p for p in PUBS if p.exchange == ex and q in p.queues]
        rejected = sum(1 for p in msgs if (q, p.name) == (Q_RED, "P4"))
        want_funnel[(ex, sub_of.get((ex, q)))] = (
            n_pub, len(msgs), len(msgs), len(msgs) - rejected, rejected, 0, 0, rejected, 0)
    want_funnel[(EX_TOPIC, None)] = (6, 0, 0, 0, 3, 2, 1, 0, 0)
    # Through the default exchange, one row per queue: P11 acked on qVis; P12, P13 expired on qTtl.
    want_funnel[(analyses.DEFAULT_EXCHANGE, Q_VIS)] = (1, 1, 1, 1, 0, 0, 0, 0, 0)
    want_funnel[(analyses.DEFAULT_EXCHANGE, Q_TTL)] = (2, 2, 0, 0, 2, 0, 0, 0, 2)
    gaps.eq("A4 funnel rows", sorted(funnel, key=str), sorted(want_funnel, key=str))
    for key, want in want_funnel.items():
        row = funnel.get(key)
        gaps.eq(f"A4 funnel {key} {cols}", tuple(row[c] for c in cols) if row else None, want)

    stale = {r.queue: (r.deliveries, r.redeliveries, r.requeues, r.visibility_expiries, r.stale_acks)
             for r in analyses.stale_and_redeliveries(df).collect()}
    want_stale = {q: (sum(1 for p in PUBS if q in p.queues), 0, 0, 0, 0)
                  for q in QUEUES if q not in (Q_TTL, Q_VIS)}
    want_stale[Q_RED] = (3, 1, 1, 0, 0)
    want_stale[Q_VIS] = (2, 1, 0, 1, 1)
    gaps.eq("A4 stale_and_redeliveries per queue (deliveries, redeliveries, requeues, "
            "visibility_expiries, stale_acks)", stale, want_stale)

    auth = [(r.user, r.host, r.failures) for r in analyses.auth_failures(df).collect()]
    gaps.eq("A4 auth_failures", auth, [(USER, "127.0.0.1", 1)])

    pubs = [(r.user, r.host, r.messages, r.bytes, r.topics) for r in analyses.busiest_publishers(df).collect()]
    gaps.eq("A4 busiest_publishers (user, host, messages, bytes, topics)", pubs,
            [(USER, "127.0.0.1", len(PUBS), sum(len(p.body) for p in PUBS), 2)])

    lat = sorted(((r.topic, r.acks) for r in analyses.latency_percentiles(df).collect()), key=str)
    acks_tags = sum(len(p.queues) for p in PUBS if p.exchange == EX_TAGS) - 1
    acks_topic = sum(len(p.queues) for p in PUBS if p.exchange == EX_TOPIC)
    # rollup: one row per topic (the default exchange's qVis ack under its name) and the total
    gaps.eq("A4 latency_percentiles acks per topic", lat, sorted(
        [(None, acks_tags + acks_topic + 1), (analyses.DEFAULT_EXCHANGE, 1), (EX_TAGS, acks_tags),
         (EX_TOPIC, acks_topic)],
        key=str))
    df.unpersist()
    gaps.fail_if_any()


def _tables(page: str) -> list[list[list[str]]]:
    """The page's HTML tables as rows of cell texts (pandas' to_html output)."""
    out = []
    for table in re.findall(r"<table.*?</table>", page, flags=re.S):
        rows = []
        for tr in re.findall(r"<tr.*?</tr>", table, flags=re.S):
            cells = re.findall(r"<t[dh][^>]*>(.*?)</t[dh]>", tr, flags=re.S)
            rows.append([html_mod.unescape(c).strip() for c in cells])
        out.append(rows)
    return out


def test_A4_report_command_on_the_workload_log(audit_run: Run, tmp_path: Path) -> None:
    """A4: ``cmq-audit report`` over the workload's log writes the page and its plots, and the
    page carries the workload's numbers."""
    out = tmp_path / "report"
    proc = subprocess.run(
        [sys.executable, "-m", "spark.cli", "report", "--audit-dir", audit_run.audit_dir,
         "--out", str(out), "--master", "local[1]"],
        capture_output=True, text=True, timeout=600,
        env={**os.environ, "PYSPARK_PYTHON": sys.executable},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    page = (out / "index.html").read_text(encoding="utf-8")
    gaps = Gaps()
    pngs = sorted(p.name for p in out.glob("*.png"))
    # Drawn: what has data on more than one row. No topic retried (03), one failed login (06)
    # and one publisher (08) are sentences instead; administrative changes (07) are never drawn.
    gaps.eq("A4 report plots", pngs, ["01-timeline.png", "02-funnel.png", "04-latency.png", "05-redeliveries.png"])
    for p in pngs:
        png = (out / p).read_bytes()
        gaps.true(f"A4 {p} is a PNG image", png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 1000)
        gaps.true(f"A4 the page shows {p}", f"src='{p}'" in page)
    total = sum(1 for f in audit_run.closed_files
                for _ in Path(audit_run.audit_dir, f).read_text(encoding="utf-8").splitlines())
    gaps.true(f"A4 the page counts the {total} records", f"<b>{total:,}</b> records" in page)
    gaps.true("A4 the page reports no skipped line", ">0 torn or unreadable line(s) skipped" in page)
    tables = {tuple(t[0]): t[1:] for t in _tables(page)}
    # A wrong password is a failed login; an operation a logged-in user was refused would be
    # an "operation" row beside it.
    auth = tables.get(("kind", "user", "host", "failures", "first", "last"), [])
    gaps.eq("A4 report: auth failures", [row[:4] for row in auth], [["login", USER, "127.0.0.1", "1"]])
    pubs = tables.get(("user", "host", "messages", "bytes", "topics", "peak_per_s"), [])
    gaps.eq("A4 report: busiest publishers", [row[:5] for row in pubs],
            [[USER, "127.0.0.1", str(len(PUBS)), str(sum(len(p.body) for p in PUBS)), "2"]])
    redeliv = tables.get(("queue", "deliveries", "redeliveries", "requeues", "visibility_expiries",
                          "stale_acks"), [])
    gaps.eq("A4 report: redeliveries and stale acks (first two rows)", sorted(redeliv[:2]),
            [[Q_RED, "3", "1", "1", "0", "0"], [Q_VIS, "2", "1", "0", "1", "1"]])
    funnel = tables.get(("topic", "subscription", "published", "routed", "delivered", "acked",
                         "dead_lettered", "discarded", "discarded_no_match", "discarded_retries_exhausted",
                         "discarded_expired", "discarded_rejected", "discarded_too_large",
                         "discarded_max_length"), [])
    # e2e_topic's row without a subscription: its discards before routing (2 no_match, 1 too_large)
    gaps.eq("A4 report: funnel, e2e_topic before routing",
            [r[2:] for r in funnel if r[0] == EX_TOPIC and r[1] == ""],
            [["6", "0", "0", "0", "0", "3", "2", "0", "0", "0", "1", "0"]])
    # e2e_tags: one row per binding, (published, routed, delivered, acked, discarded_rejected);
    # the subscription names are the gateway's, as its bind records give them
    binds = [json.loads(line) for f in audit_run.closed_files
             for line in Path(audit_run.audit_dir, f).read_text(encoding="utf-8").splitlines()
             if '"event":"bind"' in line]
    sub = {(b["topic"], b["queue"]): b["subscription"] for b in binds}
    gaps.eq("A4 report: funnel, e2e_tags per subscription",
            sorted((r[1], r[2:6] + [r[11]]) for r in funnel if r[0] == EX_TAGS),
            sorted([(sub[(EX_TAGS, Q_ALL)], ["4", "4", "4", "4", "0"]),
                    (sub[(EX_TAGS, Q_BLUE)], ["4", "2", "2", "2", "0"]),
                    (sub[(EX_TAGS, Q_RED)], ["4", "2", "2", "1", "1"])]))
    gaps.fail_if_any()
