"""Every listener held to the AMQP core's bar (H4's listener audit), with real clients over
real sockets (requests, pika, paho, raw sockets):

* A1/W2: a refused login and a refused operation are audited on the management API, the CMQ
  API and MQTT as on AMQP (``auth_failure`` with user, peer, why and ``protocol``), and an
  HTTP login that succeeds is audited once per TCP connection (``connection_open``, then
  ``connection_close`` when the socket closes), not once per request;
* SE6: the management API's publish is refused while the memory or disk alarm holds AMQP
  publishers (RabbitMQ's own HTTP publish is exempt from alarms; SE6 is not), and the CMQ
  API's sends under the disk alarm too;
* SE5: the management API decides the login on the headers, before any body; the bodies a
  listener receives at once cannot raise the memory alarm; RabbitMQ's 20 MiB definitions
  limit; MQTT sockets have TCP keep-alive (MQTT keep alive 0);
* D7: an HTTP push endpoint's endless answer body neither holds the push nor memory.

Waits are bounded only by HANG (hang protection, never a threshold under test)."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pika
import pytest
import requests

from gateway.auth import Permission, User, UserDB, hash_password
from gateway.config import AuditSettings, CmqKey, Limits
from gateway.server import gateway_in_thread
from tests.integration.cmq_client import CmqClient
from tests.integration.cmq_gateway import ADMIN_ID, ADMIN_KEY, READER_ID, READER_KEY, STORES, store_of

HANG = 30.0
SECRET = "s3cret-never-logged"


def _users() -> UserDB:
    """admin; ``mgr`` (management tag, rights on ``/``); ``plain`` (no tag); ``reader``
    (read only, for the CMQ API key)."""
    return UserDB({"admin": User("admin", hash_password("admin"), ("administrator",)),
                   "mgr": User("mgr", hash_password("mgr"), ("management",)),
                   "plain": User("plain", hash_password("plain")),
                   "reader": User("reader", hash_password("reader"))},
                  {("admin", "/"): Permission(), ("mgr", "/"): Permission(), ("plain", "/"): Permission(),
                   ("reader", "/"): Permission("^$", "^$", ".*")},
                  ["/"], frozenset())


def _records(dir_: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for f in sorted(dir_.rglob("*.jsonl*")) for line in f.read_text().splitlines()]


def _until(gw: Any, dir_: Path, check: Callable[[list[dict[str, Any]]], Any]) -> list[dict[str, Any]]:
    deadline = time.monotonic() + HANG
    while True:
        gw.audit.flush(10)
        records = _records(dir_)
        if check(records) or time.monotonic() > deadline:
            return records
        time.sleep(0.05)


@contextlib.contextmanager
def _listeners(tmp_path: Path, store: str | None = None) -> Iterator[tuple[Any, str, str, Path]]:
    audit = tmp_path / "audit"
    keys = {ADMIN_ID: CmqKey("admin", ADMIN_KEY), READER_ID: CmqKey("reader", READER_KEY)}
    data = str(tmp_path / "data") if store else None
    with gateway_in_thread(hosts=("127.0.0.1",), data_dir=data, audit=AuditSettings(dir=str(audit)),
                           users=_users(), management_port=0, management_host="127.0.0.1",
                           cmq_api_port=0, cmq_api_host="127.0.0.1", cmq_keys=keys, store=store) as gw:
        addresses = dict(gw.operator_addresses())
        yield gw, f"http://{addresses['management API']}", f"http://{addresses['CMQ API']}", audit


@pytest.fixture
def gateway(tmp_path: Path) -> Iterator[tuple[Any, str, str, Path]]:
    """(gateway, management URL, CMQ API URL, audit dir)."""
    with _listeners(tmp_path) as listeners:
        yield listeners


@pytest.fixture(params=STORES)
def gateway_on(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[Any, str, str, Path]]:
    """``gateway`` on each store: the listeners' rules hold on JetStream as on the embedded store."""
    with _listeners(tmp_path, store_of(request)) as listeners:
        yield listeners


def test_A1_W2_SE1_management_logins_and_refusals_are_audited(gateway_on: tuple[Any, str, str, Path]) -> None:
    gw, url, _cmq, audit = gateway_on
    # Refused logins: the client hears RabbitMQ's same 401 for each; the audit tells them apart.
    assert requests.get(f"{url}/api/overview", auth=("mgr", SECRET), timeout=HANG).status_code == 401
    assert requests.get(f"{url}/api/overview", auth=("ghost", SECRET), timeout=HANG).status_code == 401
    assert requests.get(f"{url}/api/overview", timeout=HANG).status_code == 401
    assert requests.get(f"{url}/api/overview", auth=("plain", "plain"), timeout=HANG).status_code == 401
    # A logged-in management user refused an administrator's route (SE1), on a keep-alive
    # session whose two successful requests are one login.
    with requests.Session() as http:
        http.auth = ("mgr", "mgr")
        assert http.get(f"{url}/api/overview", timeout=HANG).status_code == 200
        assert http.get(f"{url}/api/queues/%2F", timeout=HANG).status_code == 200
        assert http.get(f"{url}/api/users", timeout=HANG).status_code == 401
        assert http.put(f"{url}/api/vhosts/other", timeout=HANG).status_code == 401

    def http_records(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [r for r in records if r.get("protocol") == "http"]

    records = http_records(_until(gw, audit, lambda rs: any(r["event"] == "connection_close"
                                                            for r in http_records(rs))))
    failures = [(r.get("user"), r["reason"]) for r in records if r["event"] == "auth_failure"]
    assert [(u, why.split(" (")[0]) for u, why in failures] == [
        ("mgr", "wrong password"), ("ghost", "unknown user"), (None, "no credentials"),
        ("plain", "not a management user"),
        ("mgr", "not_authorised: Not administrator user"), ("mgr", "not_authorised: Not administrator user")]
    assert failures[4][1].endswith("(GET /api/users)") and failures[5][1].endswith("(PUT /api/vhosts/other)")
    assert all(r["peer"].startswith("127.0.0.1:") for r in records)
    opens = [r for r in records if r["event"] == "connection_open"]
    closes = [r for r in records if r["event"] == "connection_close"]
    assert [r["user"] for r in opens] == ["mgr"] and [r["user"] for r in closes] == ["mgr"]
    assert opens[0]["peer"] == closes[0]["peer"] and opens[0]["conn"] == closes[0]["conn"]
    assert SECRET not in "".join(f.read_text() for f in audit.rglob("*.jsonl*"))


def test_A1_W2_SE1_cmq_api_logins_and_refusals_are_audited(gateway_on: tuple[Any, str, str, Path]) -> None:
    gw, _url, cmq, audit = gateway_on
    admin = CmqClient(cmq, ADMIN_ID, ADMIN_KEY)
    admin.ok("CreateQueue", queueName="barq")
    assert CmqClient(cmq, ADMIN_ID, "not-the-key").call("ListQueue")["code"] == 4100
    assert CmqClient(cmq, "AKIDunknown00000000000000000000000000", ADMIN_KEY).call("ListQueue")["code"] == 4100
    # The reader's key is valid; its user may not write: a refusal of a verified caller.
    assert CmqClient(cmq, READER_ID, READER_KEY).call("SendMessage", queueName="barq", msgBody="x")["code"] == 4101

    def cmq_records(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [r for r in records if r.get("protocol") == "cmq-api" and r["event"] in
                ("auth_failure", "connection_open")]

    records = cmq_records(_until(gw, audit, lambda rs: len([r for r in cmq_records(rs)
                                                            if r["event"] == "auth_failure"]) >= 3))
    failures = [(r.get("user"), r["reason"]) for r in records if r["event"] == "auth_failure"]
    assert [u for u, _ in failures] == ["admin", None, "reader"], failures
    assert "signature is not correct" in failures[0][1] and "is not existed" in failures[1][1]
    assert "write permission" in failures[2][1] and failures[2][1].endswith("(Action SendMessage)")
    assert {r["user"] for r in records if r["event"] == "connection_open"} >= {"admin", "reader"}
    assert all(r["peer"].startswith("127.0.0.1:") for r in records)


def test_SE6_management_publish_refused_while_the_memory_alarm_holds_publishers(tmp_path: Path) -> None:
    """The memory mark below what the gateway holds: AMQP publishers are blocked; a publish
    over the management API is refused with 503 and nothing is stored; reads still work."""
    with gateway_in_thread(hosts=("127.0.0.1",), data_dir=None, management_port=0, management_host="127.0.0.1",
                           limits=Limits(memory_high_watermark=1)) as gw:
        url = f"http://{dict(gw.operator_addresses())['management API']}"
        auth = ("guest", "guest")
        assert requests.put(f"{url}/api/queues/%2F/held", json={"durable": False}, auth=auth,
                            timeout=HANG).status_code in (201, 204)
        body = {"routing_key": "held", "properties": {}, "payload": "x", "payload_encoding": "string"}
        r = requests.post(f"{url}/api/exchanges/%2F/amq.default/publish", json=body, auth=auth, timeout=HANG)
        assert r.status_code == 503 and "SE6" in r.json()["reason"], r.text
        conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", gw.port))
        try:
            assert conn.channel().queue_declare("held", passive=True).method.message_count == 0
        finally:
            conn.close()
        assert requests.get(f"{url}/api/queues/%2F/held", auth=auth, timeout=HANG).json()["messages"] == 0


async def test_D7_SE5_a_200_with_an_endless_body_is_a_success_not_a_held_push() -> None:
    """An HTTP subscription endpoint that answers 200 and then streams its body forever: the
    push is a success at once (D7: the status decides), its connection is dropped, and the
    gateway does not read (and hold) the body until the push timeout."""
    import asyncio

    import aiohttp
    from aiohttp import web

    from gateway.management.testing import LOOPBACK_PUSH, operator_gateway

    stopped = asyncio.Event()

    async def endless(request: web.Request) -> web.StreamResponse:
        await request.read()
        resp = web.StreamResponse(status=200)
        await resp.prepare(request)
        try:
            while True:
                await resp.write(b"x" * 65536)
                await asyncio.sleep(0.01)
        except (ConnectionError, asyncio.CancelledError):
            stopped.set()
            raise

    app = web.Application()
    app.router.add_post("/notify", endless)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    url = f"http://127.0.0.1:{runner.addresses[0][1]}/notify"
    try:
        # A push timeout far beyond the test's own hang protection: the push must not need it
        # (before, the body was read until the timeout, and held: 6 MB a second here).
        async with operator_gateway(push=LOOPBACK_PUSH, push_timeout=3600) as og, \
                aiohttp.ClientSession(auth=aiohttp.BasicAuth("guest", "guest")) as http:
            async with http.put(f"{og.management_url}/api/exchanges/%2F/hooks", json={"type": "fanout"}) as r:
                assert r.status in (201, 204)
            body = {"subscriptionName": "endless", "protocol": "http", "endpoint": url}
            async with http.post(f"{og.management_url}/api/cmq/topics/%2F/hooks/subscriptions", json=body) as r:
                assert r.status == 201, await r.text()
            publish = {"routing_key": "", "properties": {}, "payload": "hi", "payload_encoding": "string"}
            async with http.post(f"{og.management_url}/api/exchanges/%2F/hooks/publish", json=publish) as r:
                assert r.status == 200
            sent = asyncio.get_running_loop().time()
            while og.pusher.succeeded + og.pusher.failed == 0:
                assert asyncio.get_running_loop().time() - sent < HANG, "the push is still reading the body"
                await asyncio.sleep(0.02)
            assert (og.pusher.succeeded, og.pusher.failed) == (1, 0), og.pusher.last_errors
            await asyncio.wait_for(stopped.wait(), HANG)  # the endpoint saw its connection dropped
    finally:
        await runner.cleanup()


def _raw_answer(port: int, request: bytes) -> bytes:
    """Send ``request`` (headers, no body) on a raw socket; what the gateway answers before it
    closes the socket (hang protection: HANG)."""
    import socket

    with socket.create_connection(("127.0.0.1", port), timeout=HANG) as sock:
        sock.sendall(request)
        got = b""
        while True:
            data = sock.recv(65536)
            if not data:
                return got
            got += data


def test_SE5_SE1_management_refuses_on_the_headers_before_reading_a_body(
        gateway: tuple[Any, str, str, Path]) -> None:
    """A body announced by a client that is not logged in (or may not use the route) is never
    read: the refusal comes on the headers, and the connection is closed. Before, the gateway
    waited for the whole body (1 MiB of held memory per socket before any login, enough for
    a few hundred sockets to raise the memory alarm and block every publisher)."""
    gw, url, _cmq, _audit = gateway
    port = int(url.rsplit(":", 1)[1])
    import base64

    for auth, reason in ((None, b"Not Authorized"), ("mgr:" + SECRET, b"Not Authorized"),
                         ("mgr:mgr", b"Not administrator user")):
        header = f"Authorization: Basic {base64.b64encode(auth.encode()).decode()}\r\n" if auth else ""
        answer = _raw_answer(port, (f"POST /api/definitions HTTP/1.1\r\nHost: x\r\n{header}"
                                    "Content-Type: application/json\r\nContent-Length: 1000000\r\n\r\n").encode())
        assert answer.startswith(b"HTTP/1.1 401 "), answer[:200]
        assert reason in answer, answer[:400]


def test_SE1_a_definitions_import_up_to_rabbitmq_s_20_mib(gateway: tuple[Any, str, str, Path]) -> None:
    """RabbitMQ takes a definitions upload up to 20 MiB (200,000 queues); this one is 3 MiB
    (padded with JSON whitespace). An announced body over the limit is refused on its headers,
    with RabbitMQ's 400."""
    _gw, url, _cmq, _audit = gateway
    defs = {"queues": [{"name": f"big-{i}", "vhost": "/", "durable": True, "auto_delete": False, "arguments": {}}
                       for i in range(3)]}
    body = json.dumps(defs) + " " * (3 << 20)
    r = requests.post(f"{url}/api/definitions", data=body, auth=("admin", "admin"),
                      headers={"Content-Type": "application/json"}, timeout=HANG)
    assert r.status_code in (200, 201, 204), (r.status_code, r.text[:200])
    assert requests.get(f"{url}/api/queues/%2F/big-2", auth=("admin", "admin"), timeout=HANG).status_code == 200
    port = int(url.rsplit(":", 1)[1])
    answer = _raw_answer(port, ("POST /api/definitions HTTP/1.1\r\nHost: x\r\nAuthorization: Basic YWRtaW46YWRtaW4=\r\n"
                                f"Content-Length: {(20 << 20) + 1}\r\n\r\n").encode())
    # RabbitMQ's answer: 400 "Exceeded HTTP request body size limit", on the headers.
    assert answer.startswith(b"HTTP/1.1 400 ") and b"Exceeded HTTP request body size limit" in answer, answer[:300]


def _assert_tcp_keepalive(gw: Any, kind: str) -> None:
    """The one ``kind`` connection of ``gw`` has TCP keep-alive on, with the gateway's idle time."""
    import socket

    from gateway.admission import KEEPALIVE_IDLE

    conns = [c for c in list(gw.connections) if type(c).__name__ == kind]
    assert len(conns) == 1
    sock = conns[0].transport.get_extra_info("socket")
    assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
    assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE) == KEEPALIVE_IDLE


def test_SE5_mqtt_sockets_have_tcp_keepalive_so_a_vanished_peer_is_found() -> None:
    """MQTT keep alive 0 switches MQTT's own liveness check off (3.1.2.10): a client gone
    without a FIN would hold its socket and session forever. The gateway's MQTT sockets have
    TCP keep-alive on (found by the kernel within about 2 minutes)."""

    import paho.mqtt.client as paho


    with gateway_in_thread(hosts=("127.0.0.1",), data_dir=None, mqtt_port=0, mqtt_host="127.0.0.1") as gw:
        client = paho.Client(paho.CallbackAPIVersion.VERSION2, client_id="no-keepalive", protocol=paho.MQTTv311)
        client.username_pw_set("guest", "guest")
        client.connect("127.0.0.1", gw.mqtt.port, keepalive=0)
        client.loop_start()
        try:
            deadline = time.monotonic() + HANG
            while not client.is_connected():
                assert time.monotonic() < deadline
                time.sleep(0.02)
            _assert_tcp_keepalive(gw, "MQTTConnection")
        finally:
            client.disconnect()
            client.loop_stop()


def test_SE5_W5_bodies_before_login_cannot_raise_the_memory_alarm(tmp_path: Path) -> None:
    """Sockets that announce a 4 MB body on the CMQ API (whose signature is in the body, so
    no caller is known before it is read), send all of it but its last byte, and wait: together past the memory mark, they raised the memory alarm and blocked every AMQP
    publisher of the gateway until their body deadline. Bodies being read on one listener now
    take at most a quarter of the mark; the sockets past it are answered 503 on their
    headers, and the alarm stays down."""
    import socket

    from gateway.config import GatewayConfig

    mark = 32 << 20
    with gateway_in_thread(hosts=("127.0.0.1",), data_dir=None, cmq_api_port=0, cmq_api_host="127.0.0.1",
                           limits=dataclasses.replace(GatewayConfig().limits, memory_high_watermark=mark,
                                                      http_body_timeout=HANG)) as gw:
        port = int(dict(gw.operator_addresses())["CMQ API"].rsplit(":", 1)[1])
        size = 4_000_000
        held: list[socket.socket] = []
        refused = 0
        try:
            for _ in range(10):  # 10 x 4 MB: past the 32 MiB mark
                sock = socket.create_connection(("127.0.0.1", port), timeout=HANG)
                held.append(sock)
                sock.sendall(f"POST /v2/index.php HTTP/1.1\r\nHost: x\r\nContent-Length: {size}\r\n"
                             "Content-Type: application/x-www-form-urlencoded\r\n\r\n".encode())
                try:
                    sock.sendall(b"a" * (size - 1))
                except OSError:  # answered and closed on its headers
                    pass
            # Every byte sent is in the gateway's hands (or refused): wait until each socket is
            # either answered (503 at once) or quiet, then look at the alarm.
            for sock in held:
                sock.settimeout(0.5)
                try:
                    answer = sock.recv(200)
                except TimeoutError:
                    continue  # still waiting for its last byte: held by the gateway
                except OSError:
                    answer = b""
                if answer.startswith(b"HTTP/1.1 503 ") or answer == b"":
                    refused += 1
            assert refused > 0
            assert not gw.memory_over() and not gw.alarms.memory, "the memory alarm was raised before any login"
        finally:
            for sock in held:
                sock.close()


@pytest.mark.parametrize("store", STORES)
def test_A1_W2_mqtt_publish_and_subscribe_refusals_are_audited(request: pytest.FixtureRequest, store: str,
                                                               tmp_path: Path) -> None:
    """A user whose permissions refuse a publish and a subscription gets MQTT 5's 0x87 for
    each, and each is audited (``auth_failure``, ``protocol: "mqtt"``), as on the HTTP APIs;
    on JetStream as on the embedded store (SE1)."""
    import paho.mqtt.client as paho

    store_url = str(request.getfixturevalue("nats_single").store_url) if store == "jetstream" else None

    audit = tmp_path / "audit"
    users = UserDB({"guest": User("guest", hash_password("guest"), ("administrator",)),
                    "limited": User("limited", hash_password("limited"))},
                   {("guest", "/"): Permission(), ("limited", "/"): Permission(".*", "^$", "^$")},
                   ["/"], frozenset())
    with gateway_in_thread(hosts=("127.0.0.1",), data_dir=str(tmp_path / "data") if store_url else None,
                           mqtt_port=0, mqtt_host="127.0.0.1", users=users, audit=AuditSettings(dir=str(audit)),
                           store=store_url) as gw:
        client = paho.Client(paho.CallbackAPIVersion.VERSION2, client_id="limited-1", protocol=paho.MQTTv5)
        client.username_pw_set("limited", "limited")
        codes: dict[str, int] = {}
        client.on_connect = lambda _c, _u, _f, rc, _p: codes.__setitem__("connack", rc.value)
        client.on_subscribe = lambda _c, _u, _m, rcs, _p: codes.__setitem__("suback", rcs[0].value)
        client.on_publish = lambda _c, _u, _m, rc, _p: codes.__setitem__("puback", rc.value)
        client.connect("127.0.0.1", gw.mqtt.port)
        client.loop_start()
        try:
            deadline = time.monotonic() + HANG
            while "connack" not in codes:
                assert time.monotonic() < deadline
                time.sleep(0.02)
            assert codes["connack"] == 0
            client.subscribe("orders/#", qos=1)
            client.publish("orders/1", b"x", qos=1)
            while not {"suback", "puback"} <= set(codes):
                assert time.monotonic() < deadline, codes
                time.sleep(0.02)
            assert (codes["suback"], codes["puback"]) == (0x87, 0x87)
        finally:
            client.disconnect()
            client.loop_stop()
        records = _until(gw, audit, lambda rs: len([r for r in rs if r["event"] == "auth_failure"]) >= 2)
    refusals = [r for r in records if r["event"] == "auth_failure"]
    assert sorted(r["reason"].split(" ")[0] for r in refusals) == ["publish", "subscribe"], refusals
    assert all(r["user"] == "limited" and r["protocol"] == "mqtt" and r["peer"].startswith("127.0.0.1:")
               for r in refusals)


def test_SE6_disk_alarm_refuses_http_publishers_on_the_cmq_and_management_apis(tmp_path: Path) -> None:
    """The disk alarm (its limit above any disk's free space here) holds the HTTP APIs'
    publishers as the memory alarm does: CMQ's SendMessage and PublishMessage get 4410, the
    management API's publish 503, and nothing is stored."""
    from gateway.config import GatewayConfig

    keys = {ADMIN_ID: CmqKey("admin", ADMIN_KEY)}
    limits = dataclasses.replace(GatewayConfig().limits, disk_free_limit=1 << 60)
    with gateway_in_thread(hosts=("127.0.0.1",), data_dir=str(tmp_path / "data"), users=_users(), limits=limits,
                           management_port=0, management_host="127.0.0.1", cmq_api_port=0,
                           cmq_api_host="127.0.0.1", cmq_keys=keys) as gw:
        addresses = dict(gw.operator_addresses())
        cmq = CmqClient(f"http://{addresses['CMQ API']}", ADMIN_ID, ADMIN_KEY)
        deadline = time.monotonic() + HANG
        while not gw.alarms.disk:  # decided at the first tick
            assert time.monotonic() < deadline
            time.sleep(0.02)
        cmq.ok("CreateQueue", queueName="diskq")
        cmq.ok("CreateTopic", topicName="diskt")
        for action, params in (("SendMessage", {"queueName": "diskq", "msgBody": "x"}),
                               ("PublishMessage", {"topicName": "diskt", "msgBody": "x"})):
            answer = cmq.call(action, **params)
            assert answer["code"] == 4410 and "SE6" in answer["message"], (action, answer)
        url = f"http://{addresses['management API']}"
        body = {"routing_key": "diskq", "properties": {}, "payload": "x", "payload_encoding": "string"}
        r = requests.post(f"{url}/api/exchanges/%2F/amq.default/publish", json=body, auth=("admin", "admin"),
                          timeout=HANG)
        assert r.status_code == 503 and "SE6" in r.json()["reason"], r.text
        assert cmq.ok("GetQueueAttributes", queueName="diskq")["activeMsgNum"] == 0


async def test_M14_management_publish_answers_once_the_message_is_durable(tmp_path: Path) -> None:
    """RabbitMQ publishes over HTTP on a channel in confirm mode and answers at the
    basic.ack. Here the answer left before the store's group commit had even begun (a kill
    -9 then lost a message the client was told was published); now the store position of
    the message is durable when the response is prepared."""
    import aiohttp
    from aiohttp import web

    from gateway.management.app import make_app
    from gateway.server import running_gateway

    async with running_gateway(0, str(tmp_path / "data"), hosts=("127.0.0.1",)) as gw:
        app = make_app(gw)
        seen: list[tuple[str, int, int]] = []

        async def prepared(request: web.Request, response: web.StreamResponse) -> None:
            # The same loop turn as the handler's return: the group commit cannot run between.
            seen.append((request.path, gw.broker.store.last_lsn, gw.broker.durable_lsn))
        app.on_response_prepare.append(prepared)
        runner = web.AppRunner(app)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        url = f"http://127.0.0.1:{runner.addresses[0][1]}"
        try:
            async with aiohttp.ClientSession(auth=aiohttp.BasicAuth("guest", "guest")) as http:
                async with http.put(f"{url}/api/queues/%2F/durable-q", json={"durable": True}) as r:
                    assert r.status in (201, 204)
                body = {"routing_key": "durable-q", "properties": {"delivery_mode": 2}, "payload": "kept",
                        "payload_encoding": "string"}
                async with http.post(f"{url}/api/exchanges/%2F/amq.default/publish", json=body) as r:
                    assert r.status == 200 and (await r.json())["routed"] is True
        finally:
            await runner.cleanup()
        path, written, durable = seen[-1]
        assert path.endswith("/publish") and written > 0
        assert durable >= written, (written, durable)


def test_SE5_malformed_arguments_are_rabbitmq_s_400_not_a_500(gateway_on: tuple[Any, str, str, Path]) -> None:
    """Found by fuzzing the management API's bodies: ``arguments`` that is not a JSON object
    on a queue, an exchange or a binding was an HTTP 500 (a ValueError in the handler);
    RabbitMQ answers 400 bad_request."""
    _gw, url, _cmq, _audit = gateway_on
    auth = ("admin", "admin")
    assert requests.put(f"{url}/api/exchanges/%2F/args-x", json={"type": "topic"}, auth=auth,
                        timeout=HANG).status_code in (201, 204)
    assert requests.put(f"{url}/api/queues/%2F/args-q", json={}, auth=auth, timeout=HANG).status_code in (201, 204)
    for arguments in ("abc", [1], 5):
        for method, path, body in (("PUT", "/api/queues/%2F/args-q2", {"arguments": arguments}),
                                   ("PUT", "/api/exchanges/%2F/args-x2", {"type": "topic", "arguments": arguments}),
                                   ("POST", "/api/bindings/%2F/e/args-x/q/args-q", {"arguments": arguments})):
            r = requests.request(method, f"{url}{path}", json=body, auth=auth, timeout=HANG)
            assert r.status_code == 400 and r.json()["error"] == "bad_request", (method, path, arguments, r.text[:200])


def test_SE5_a_body_nested_past_python_s_recursion_limit_is_a_400_not_a_500(
        gateway_on: tuple[Any, str, str, Path]) -> None:
    """Found by scripts/fuzz_http.py --requests on JetStream (on both stores alike): a JSON body
    of 10,000 nested lists (20 KB, far below the body limit) made json.loads raise
    RecursionError, an HTTP 500 on every PUT/POST route; it is a body that is not JSON."""
    gw, url, _cmq, _audit = gateway_on
    for method, path in (("POST", "/api/definitions"), ("PUT", "/api/queues/%2F/deep-q"),
                         ("PUT", "/api/exchanges/%2F/deep-x")):
        for body in (b"[" * 10_000, b'{"a":' * 10_000):
            r = requests.request(method, f"{url}{path}", data=body, auth=("admin", "admin"), timeout=HANG,
                                 headers={"content-type": "application/json"})
            assert r.status_code == 400 and r.json()["error"] == "bad_request", (method, path, r.text[:200])
    assert "deep-q" not in gw.broker.vhost("/").queues


def test_L2_SE5_a_queue_name_past_255_bytes_is_refused_not_stored_to_break_every_list(
        gateway_on: tuple[Any, str, str, Path]) -> None:
    """Found by the CI (a fuzz request's name of 300 bytes, then a management user's queue
    list a 400 in a later test on the same JetStream server): the HTTP API declared a queue
    whose name no AMQP short string holds (255 bytes), in the compatible profile only reported
    (PF4) as a CMQ name breach; every queue list, the console's and the CMQ view's, then
    answered 400 (L2) for as long as the queue lived. Exchanges were refused already. RabbitMQ
    4.x answers the same PUT 400 bad_request ("queue should be less than 255 bytes")."""
    gw, url, _cmq, _audit = gateway_on
    auth = ("admin", "admin")
    long_name, longest = "x" * 300, "y" * 255
    r = requests.put(f"{url}/api/queues/%2F/{long_name}", json={}, auth=auth, timeout=HANG)
    assert r.status_code == 400 and r.json()["rule"] == "L2", r.text[:200]
    imported = requests.post(f"{url}/api/definitions", auth=auth, timeout=HANG, json={
        "queues": [{"name": "z" * 256, "vhost": "/", "durable": True, "auto_delete": False, "arguments": {}}]})
    assert imported.status_code == 200 and imported.json()["complete"] is False, imported.text[:300]
    assert requests.put(f"{url}/api/queues/%2F/{longest}", json={}, auth=auth,
                        timeout=HANG).status_code in (201, 204)  # the longest AMQP name is a name
    for path in ("/api/queues/%2F", "/api/queues", "/api/cmq/queues"):
        listed = requests.get(f"{url}{path}", auth=auth, timeout=HANG)
        assert listed.status_code == 200, (path, listed.text[:200])
        names = {q.get("name", q.get("queue")) for q in listed.json()}
        assert longest in names and long_name not in names and "z" * 256 not in names, path
    assert set(gw.broker.vhost("/").queues) >= {longest}
    assert not {long_name, "z" * 256} & set(gw.broker.vhost("/").queues)


def test_SE5_mqtt_max_connections_and_a_login_beside_a_full_listener(tmp_path: Path) -> None:
    """limits.max_connections holds on the MQTT listener as on the others: with 3 silent
    sockets held there, a fourth is closed at accept, while AMQP logins and the management
    API are still served (each listener has its own count)."""
    import socket

    from gateway.config import GatewayConfig

    limits = dataclasses.replace(GatewayConfig().limits, max_connections=3)
    with gateway_in_thread(hosts=("127.0.0.1",), data_dir=None, mqtt_port=0, mqtt_host="127.0.0.1",
                           management_port=0, management_host="127.0.0.1", limits=limits) as gw:
        held = [socket.create_connection(("127.0.0.1", gw.mqtt.port), timeout=HANG) for _ in range(3)]
        try:
            deadline = time.monotonic() + HANG
            while gw.admission.gate("mqtt").count < 3:
                assert time.monotonic() < deadline
                time.sleep(0.02)
            # The gateway accepts and resets the fourth (SO_LINGER 0): the RST can reach the
            # client before its connect() returns (CI saw ECONNRESET there), or after.
            got = None
            try:
                with socket.create_connection(("127.0.0.1", gw.mqtt.port), timeout=HANG) as extra:
                    extra.sendall(b"\x10\x00")  # the start of a CONNECT: never read
                    got = extra.recv(16)
            except (ConnectionResetError, BrokenPipeError):
                got = b""
            assert got == b""
            assert gw.admission.gate("mqtt").refused >= 1
            conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", gw.port))
            conn.close()
            url = f"http://{dict(gw.operator_addresses())['management API']}"
            assert requests.get(f"{url}/api/overview", auth=("guest", "guest"), timeout=HANG).status_code == 200
        finally:
            for sock in held:
                sock.close()


def test_SE5_amqp_sockets_have_tcp_keepalive_so_a_vanished_peer_with_heartbeat_0_is_found() -> None:
    """AMQP heartbeat 0 (the client's choice) switches AMQP's own liveness check off: a
    client gone without a FIN would hold its socket, channels and unacknowledged deliveries
    forever. The gateway's AMQP sockets have TCP keep-alive on, as its MQTT sockets do."""

    import pika


    with gateway_in_thread(hosts=("127.0.0.1",), data_dir=None) as gw:
        conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", gw.port, heartbeat=0))
        try:
            _assert_tcp_keepalive(gw, "AMQPConnection")
        finally:
            conn.close()


def test_A1_W2_amqp_refusals_are_audited(tmp_path: Path) -> None:
    """A declare and a publish the user's permissions refuse close the channel with 403
    ACCESS_REFUSED, as RabbitMQ does, and each is audited (``auth_failure``,
    ``protocol: "amqp"``), as the HTTP and MQTT refusals are."""
    audit = tmp_path / "audit"
    users = UserDB({"guest": User("guest", hash_password("guest"), ("administrator",)),
                    "limited": User("limited", hash_password("limited"))},
                   {("guest", "/"): Permission(), ("limited", "/"): Permission("^mine$", "^$", "^$")},
                   ["/"], frozenset())
    with gateway_in_thread(hosts=("127.0.0.1",), data_dir=None, users=users,
                           audit=AuditSettings(dir=str(audit))) as gw:
        creds = pika.PlainCredentials("limited", "limited")
        conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", gw.port, credentials=creds))
        try:
            ch = conn.channel()
            ch.queue_declare("mine")  # configure: allowed
            with pytest.raises(pika.exceptions.ChannelClosedByBroker) as declared:
                ch.queue_declare("theirs")
            assert declared.value.reply_code == 403
            ch = conn.channel()
            ch.confirm_delivery()
            with pytest.raises(pika.exceptions.ChannelClosedByBroker) as published:
                ch.basic_publish("", "mine", b"x")
            assert published.value.reply_code == 403
        finally:
            conn.close()
        records = _until(gw, audit, lambda rs: len([r for r in rs if r["event"] == "auth_failure"]) >= 2)
    refusals = [r for r in records if r["event"] == "auth_failure"]
    assert sorted(r["reason"].split(":")[0] for r in refusals) == ["configure", "write"], refusals
    assert all(r["user"] == "limited" and r["protocol"] == "amqp" and r["peer"].startswith("127.0.0.1:")
               for r in refusals)
