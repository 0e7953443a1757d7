"""A5: a confirmed message's publish and enqueue records are on disk no later than its confirm,
and a stored message whose records a crash kept from the log gets them back at the restart
(origin "rebuilt"), against the real `cmq-gateway serve` process and pika."""

from __future__ import annotations

import signal
import uuid
from pathlib import Path
from typing import Any

import pika
import pytest
import yaml

from gateway.mqtt import codec as P
from tests.integration.cmq_client import CmqClient
from tests.integration.mqtt_client import RawClient
from tests.integration.test_process import serve
from tests.support.audit_files import records

QUEUE = "a5-orders"
KEY_ID, SECRET = "AKIDauditcrash000000000000000000000000", "audit-crash-secret-0123456789abcd"
# PF5: deliveries carry their CMQ ID (x-cmq-msg-id), the msg_id of their audit records.
METADATA = {"x-cmq-receive-metadata": True}


def channel(port: int) -> tuple[pika.BlockingConnection, Any]:
    conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port, connection_attempts=3))
    return conn, conn.channel()


def publish_confirmed(port: int, n: int) -> None:
    conn, ch = channel(port)
    ch.queue_declare(QUEUE, durable=True, arguments=METADATA)
    ch.confirm_delivery()
    for i in range(n):  # BlockingChannel.basic_publish returns once the basic.ack came back
        ch.basic_publish("", QUEUE, f"m{i:03d}".encode(), pika.BasicProperties(delivery_mode=2))
    conn.close()


def drain(port: int) -> list[str]:
    """The CMQ IDs of every message of the queue, taken with no ack."""
    conn, ch = channel(port)
    ids = []
    while True:
        method, props, _body = ch.basic_get(QUEUE, auto_ack=True)
        if method is None:
            break
        ids.append(props.headers["x-cmq-msg-id"])
    conn.close()
    return ids


def stop(proc: Any) -> None:
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 0


def test_A5_confirmed_messages_have_their_records_after_kill_9(tmp_path: Path) -> None:
    data = tmp_path / "data"
    with serve(data) as (proc, port):
        publish_confirmed(port, 300)
        proc.kill()  # at once after the last confirm: nothing had time to be written later
        proc.wait(timeout=30)
    with serve(data) as (proc, port):
        ids = drain(port)
        stop(proc)
    assert len(ids) == 300
    recs = records(data / "audit")
    published = {r["msg_id"] for r in recs if r["event"] == "publish"}
    enqueued = {r["msg_id"] for r in recs if r["event"] == "enqueue" and r["queue"] == QUEUE}
    assert set(ids) <= published and set(ids) <= enqueued
    # Written as they happened, none of them again at the restart.
    assert not [r for r in recs if r.get("origin") == "rebuilt"]


def test_A5_stored_messages_whose_records_a_crash_lost_get_them_back(tmp_path: Path) -> None:
    data = tmp_path / "data"
    with serve(data) as (proc, port):
        publish_confirmed(port, 50)
        stop(proc)
    # The log as a crash leaves it when the records of the last publishes never reached it:
    # cut before the first publish record (the queue's declaration stays).
    audit = data / "audit"
    cut = False
    for path in sorted(audit.glob("dt=*/hour=*/*.jsonl")):
        if cut:
            path.unlink()
            continue
        lines = path.read_bytes().splitlines(keepends=True)
        at = next((i for i, line in enumerate(lines) if b'"event":"publish"' in line), None)
        if at is not None:
            path.write_bytes(b"".join(lines[:at]))
            cut = True
    assert cut
    assert not [r for r in records(audit) if r["event"] == "publish"]
    with serve(data) as (proc, port):
        ids = drain(port)
        stop(proc)
    assert len(ids) == 50
    recs = records(audit)
    rebuilt = [r for r in recs if r.get("origin") == "rebuilt"]
    # One publish and one enqueue record a stored message, each once, ahead of its delivery.
    assert sorted(r["msg_id"] for r in rebuilt if r["event"] == "publish") == sorted(ids)
    assert sorted(r["msg_id"] for r in rebuilt if r["event"] == "enqueue") == sorted(ids)
    assert {(r["queue"], r["routing_key"], r["size"]) for r in rebuilt if r["event"] == "publish"} == {
        (QUEUE, QUEUE, len(b"m000"))}
    first_deliver = next(i for i, r in enumerate(recs) if r["event"] == "deliver")
    assert max(i for i, r in enumerate(recs) if r.get("origin") == "rebuilt") < first_deliver


def consume(ch: Any, n: int) -> list[str]:
    """The CMQ IDs of the next ``n`` deliveries of the queue, each acked as it comes."""
    got = []
    for method, props, _body in ch.consume(QUEUE, inactivity_timeout=30):
        assert method is not None, f"only {len(got)} of {n} delivered"
        got.append(props.headers["x-cmq-msg-id"])
        ch.basic_ack(method.delivery_tag)
        if len(got) == n:
            return got
    raise AssertionError("unreachable")


def test_A5_messages_consumed_before_any_confirm_keep_their_records_after_kill_9(tmp_path: Path) -> None:
    """A5 (issue 27): a message a client consumed before its publisher had a confirm (here no
    confirms at all) keeps its publish and enqueue records through a kill -9 that comes at
    once after the delivery: persistent ones acked (gone from the store, so nothing rebuilds
    them), then transient ones (never stored). Before deliveries handed their records to the
    audit writer process, the records of the last tenth of a second were in the gateway's
    memory still, and the kill took them."""
    data = tmp_path / "data"
    consumed = []
    with serve(data) as (proc, port):
        conn, ch = channel(port)
        ch.queue_declare(QUEUE, durable=True, arguments=METADATA)
        _pub_conn, pub = channel(port)
        for mode in (2, 1):
            for i in range(200):
                pub.basic_publish("", QUEUE, f"m{mode}-{i:03d}".encode(), pika.BasicProperties(delivery_mode=mode))
            consumed += consume(ch, 200)
        proc.kill()  # at once after the last delivery came in
        proc.wait(timeout=30)
    with serve(data) as (proc, port):
        left = drain(port)
        stop(proc)
    recs = records(data / "audit", include_open=True)
    published = {r["msg_id"] for r in recs if r["event"] == "publish"}
    enqueued = {r["msg_id"] for r in recs if r["event"] == "enqueue" and r["queue"] == QUEUE}
    missing = [m for m in consumed + left if m not in published or m not in enqueued]
    assert not missing, f"{len(missing)} of {len(consumed) + len(left)} messages have no records"


@pytest.mark.parametrize("store", ["embedded", "jetstream"])
def test_A5_a_cmq_api_send_answered_has_its_records_on_disk_already(tmp_path: Path, request: Any,
                                                                   store: str) -> None:
    """CA2 + A5: each SendMessage answered code 0 keeps its publish and enqueue records
    through a kill -9 that comes at once after the answer. On the embedded store they are in
    the audit files before the answer (its confirm waits for their fsync); on JetStream a
    PubAck does not wait for the audit, so the answer waits for their hand-off to the writer
    process, which writes them after the gateway died (before that hand-off, the records of
    the last sends were in the gateway's memory still: 5-9 answered sends without records in
    each 5 s crash trial, scripts/crash_trials_cmqapi.py --nats)."""
    config = tmp_path / "gateway.yaml"
    config.write_text(yaml.safe_dump({
        "users": [{"name": "guest", "password": "guest", "tags": ["administrator"],
                   "cmq_keys": [{"secret_id": KEY_ID, "secret_key": SECRET}]}],
        "permissions": [{"user": "guest", "vhost": "/", "configure": ".*", "write": ".*", "read": ".*"}]}))
    extra = ["--config", str(config)]
    if store == "jetstream":
        extra += ["--store", request.getfixturevalue("nats_single").store_url]
    data = tmp_path / "data"
    queue = f"a5-api-{uuid.uuid4().hex[:8]}"  # the session's nats-server keeps other tests' queues
    sent = []
    for _round in range(3):
        with serve(data, *extra) as (proc, _port):
            cmq = CmqClient(f"http://127.0.0.1:{proc.operator['CMQ API']}", KEY_ID, SECRET)  # type: ignore[attr-defined]
            if not sent:
                cmq.ok("CreateQueue", queueName=queue)
            for i in range(20):
                mid = cmq.ok("SendMessage", queueName=queue, msgBody=f"body-{i}")["msgId"]
                sent.append(mid)
                if store == "embedded":
                    recs = records(data / "audit", include_open=True)
                    assert mid in {r["msg_id"] for r in recs if r["event"] == "publish"}
                    assert (queue, mid) in {(r["queue"], r["msg_id"]) for r in recs if r["event"] == "enqueue"}
            proc.kill()  # at once after the last answer
            proc.wait(timeout=30)
    with serve(data, *extra) as (proc, _port):  # waits for the writer process the kill left
        stop(proc)
    recs = records(data / "audit", include_open=True)
    published = {r["msg_id"] for r in recs if r["event"] == "publish" and r.get("protocol") == "cmq-api"}
    enqueued = {r["msg_id"] for r in recs if r["event"] == "enqueue" and r["queue"] == queue}
    missing = [m for m in sent if m not in published or m not in enqueued]
    assert not missing, f"{len(missing)} of {len(sent)} answered sends have no records"


def test_A5_an_mqtt_puback_comes_after_the_records_of_its_message(tmp_path: Path) -> None:
    """MQ + A5: a QoS 1 PUBLISH to a persistent session's subscription is stored, and its
    PUBACK finds the publish and enqueue records in the audit files already."""
    data = tmp_path / "data"
    with serve(data) as (proc, _port):
        port = proc.mqtt_port  # type: ignore[attr-defined]
        sub = RawClient(port, 4)
        sub.connect("a5-sub", clean=False)
        sub.send(P.Subscribe(1, [("a5/#", 1)]))
        assert sub.recv().reason_codes == [1]
        sub.close()  # its session and queue stay: every message is stored for it
        pub = RawClient(port, 4)
        pub.connect("a5-pub")
        for i in range(1, 11):
            pub.send(P.Publish("a5/x", f"m{i}".encode(), 1, packet_id=i))
            ack = pub.recv()
            assert isinstance(ack, P.Ack) and ack.kind == P.PUBACK and ack.reason_code == 0, ack
            recs = records(data / "audit", include_open=True)
            mqtt = {r["msg_id"] for r in recs if r["event"] == "publish" and r.get("protocol") == "mqtt"}
            assert len(mqtt) == i
            assert mqtt <= {r["msg_id"] for r in recs if r["event"] == "enqueue"}
        proc.kill()
        proc.wait(timeout=30)


@pytest.mark.parametrize("store", ["embedded", "jetstream"])
def test_A5_a_management_publish_answered_has_its_records_after_kill_9(tmp_path: Path, request: Any,
                                                                      store: str) -> None:
    """M14 + A5: RabbitMQ's HTTP publish answers at the confirm; each answered publish keeps
    its publish and enqueue records through a kill -9 at once after the answer, on both
    stores (on JetStream the answer waits for their hand-off to the writer process, as the
    CMQ API's SendMessage does)."""
    import requests

    extra = [] if store == "embedded" else ["--store", request.getfixturevalue("nats_single").store_url]
    data = tmp_path / "data"
    queue = f"a5-mgmt-{uuid.uuid4().hex[:8]}"
    answered = 0
    for _round in range(3):
        with serve(data, *extra) as (proc, _port):
            api = f"http://127.0.0.1:{proc.operator['management API']}/api"  # type: ignore[attr-defined]
            auth = ("guest", "guest")
            if not answered:
                assert requests.put(f"{api}/queues/%2F/{queue}", json={"durable": True}, auth=auth,
                                    timeout=30).status_code in (201, 204)
            for i in range(20):
                r = requests.post(f"{api}/exchanges/%2F/amq.default/publish", auth=auth, timeout=30,
                                  json={"routing_key": queue, "payload": f"m{i}", "payload_encoding": "string",
                                        "properties": {"delivery_mode": 2}})
                assert r.status_code == 200 and r.json() == {"routed": True}, r.text
                answered += 1
            proc.kill()  # at once after the last answer
            proc.wait(timeout=30)
    with serve(data, *extra) as (proc, _port):  # waits for the writer process the kill left
        stop(proc)
    recs = [r for r in records(data / "audit", include_open=True) if r.get("origin") != "rebuilt"]
    published = {r["msg_id"] for r in recs if r["event"] == "publish" and r.get("routing_key") == queue}
    enqueued = {r["msg_id"] for r in recs if r["event"] == "enqueue" and r["queue"] == queue}
    assert len(published) == answered, f"{answered - len(published)} of {answered} answered publishes have no record"
    assert enqueued == published
