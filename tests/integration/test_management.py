"""The management API over real HTTP against a real gateway driven by aio-pika (SPEC M1, D9,
W5, L6, Q6). Exact values after known workloads."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import aio_pika
import aiohttp
import aiormq
import pytest
import pytest_asyncio

from gateway.config import Limits
from gateway.management.openapi import openapi_document
from gateway.management.testing import OperatorGateway, operator_gateway
from semantics.clock import ManualClock

AUTH = {"Authorization": aiohttp.encode_basic_auth("guest", "guest")}


@pytest_asyncio.fixture(loop_scope="function")
async def og() -> AsyncIterator[OperatorGateway]:
    async with operator_gateway(clock=ManualClock()) as g:
        yield g


@pytest_asyncio.fixture(loop_scope="function")
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(headers=AUTH) as s:
        yield s


async def get(http: aiohttp.ClientSession, url: str, status: int = 200) -> Any:
    async with http.get(url) as r:
        assert r.status == status, await r.text()
        return await r.json()


async def test_M1_queue_counts_after_publish_5_get_2(og: OperatorGateway, http: aiohttp.ClientSession) -> None:
    """Publish 5, get 2 unacked: messages 5, ready 3, unacknowledged 2, as KEDA and Flower read them."""
    conn = await aio_pika.connect(og.amqp_url)
    async with conn:
        ch = await conn.channel()
        q = await ch.declare_queue("jobs", durable=True)
        for i in range(5):
            await ch.default_exchange.publish(aio_pika.Message(f"m{i}".encode()), routing_key="jobs")
        got = [await q.get(no_ack=False) for _ in range(2)]
        queue = await get(http, f"{og.management_url}/api/queues/%2F/jobs")
        # KEDA's rabbitmq scaler: messages and message_stats.publish_details.rate.
        assert (queue["messages"], queue["messages_ready"], queue["messages_unacknowledged"]) == (5, 3, 2)
        assert (queue["name"], queue["vhost"], queue["durable"], queue["auto_delete"], queue["exclusive"],
                queue["arguments"], queue["state"], queue["consumers"]) == ("jobs", "/", True, False, False,
                                                                            {}, "running", 0)
        assert queue["message_stats"]["publish"] == 5
        assert queue["message_stats"]["deliver_get"] == 2
        assert isinstance(queue["message_stats"]["publish_details"]["rate"], float)
        # Flower: GET /api/queues/{vhost} and filters by name.
        listed = await get(http, f"{og.management_url}/api/queues/%2F?columns=name,messages")
        flower = {x["name"]: (x["messages"], x["messages_ready"], x["messages_unacknowledged"]) for x in listed}
        assert flower == {"jobs": (5, 3, 2)}
        await got[0].ack()
        await ch.declare_queue("jobs", passive=True)  # a round trip: the ack has been handled
        queue = await get(http, f"{og.management_url}/api/queues/%2F/jobs")
        assert (queue["messages"], queue["messages_ready"], queue["messages_unacknowledged"],
                queue["message_stats"]["ack"]) == (4, 3, 1, 1)
        vhosts = await get(http, f"{og.management_url}/api/vhosts")
        assert [(v["name"], v["messages"], v["messages_ready"], v["messages_unacknowledged"]) for v in vhosts] \
            == [("/", 4, 3, 1)]
        overview = await get(http, f"{og.management_url}/api/overview")
        assert overview["queue_totals"]["messages"] == 4
        assert (overview["object_totals"]["queues"], overview["object_totals"]["connections"],
                overview["object_totals"]["channels"]) == (1, 1, 1)
        assert overview["message_stats"]["publish"] == 5


async def test_M1_paged_queue_list_as_rabbitmq(og: OperatorGateway, http: aiohttp.ClientSession) -> None:
    conn = await aio_pika.connect(og.amqp_url)
    async with conn:
        ch = await conn.channel()
        for name in ("a1", "a2", "b1"):
            await ch.declare_queue(name)
        page = await get(http, f"{og.management_url}/api/queues/%2F?page=1&page_size=2&name=a&use_regex=false")
        assert ({k: v for k, v in page.items() if k != "items"}, [q["name"] for q in page["items"]]) == (
            {"filtered_count": 2, "item_count": 2, "page": 1, "page_count": 1, "page_size": 2, "total_count": 3},
            ["a1", "a2"])


async def test_auth_401_without_or_with_wrong_login(og: OperatorGateway) -> None:
    async with aiohttp.ClientSession() as anon:
        async with anon.get(f"{og.management_url}/api/overview") as r:
            assert (r.status, r.headers["WWW-Authenticate"], await r.json()) == (
                401, 'Basic realm="RabbitMQ Management"', {"error": "not_authorized", "reason": "Not Authorized"})
        bad = {"Authorization": aiohttp.encode_basic_auth("guest", "nope")}
        async with anon.get(f"{og.management_url}/api/queues", headers=bad) as r:
            assert r.status == 401
        async with anon.get(f"{og.management_url}/api/whoami", headers=AUTH) as r:
            assert (r.status, await r.json()) == (200, {"name": "guest", "tags": ["administrator"]})


async def test_404_shape_for_missing_objects(og: OperatorGateway, http: aiohttp.ClientSession) -> None:
    missing = {"error": "Object Not Found", "reason": "Not Found"}
    assert await get(http, f"{og.management_url}/api/queues/%2F/none", 404) == missing
    assert await get(http, f"{og.management_url}/api/queues/nohost", 404) == missing
    assert await get(http, f"{og.management_url}/api/exchanges/%2F/none", 404) == missing


async def test_M1_exchanges_bindings_connections_channels_consumers(og: OperatorGateway,
                                                                    http: aiohttp.ClientSession) -> None:
    conn = await aio_pika.connect(og.amqp_url)
    async with conn:
        ch = await conn.channel()
        await ch.set_qos(prefetch_count=7)
        x = await ch.declare_exchange("events", aio_pika.ExchangeType.TOPIC, durable=True)
        q = await ch.declare_queue("audit")
        await q.bind(x, "user.*")
        await q.bind(x, "order.#")
        tag = await q.consume(lambda m: asyncio.sleep(0), consumer_tag="c-audit")
        ex = await get(http, f"{og.management_url}/api/exchanges/%2F/events")
        assert (ex["name"], ex["type"], ex["durable"], ex["auto_delete"], ex["internal"], ex["arguments"]) == (
            "events", "topic", True, False, False, {})
        names = [e["name"] for e in await get(http, f"{og.management_url}/api/exchanges/%2F")]
        assert names == ["", "amq.direct", "amq.fanout", "amq.headers", "amq.match", "amq.topic", "events"]
        bindings = await get(http, f"{og.management_url}/api/bindings/%2F")
        assert [(b["source"], b["destination"], b["destination_type"], b["routing_key"]) for b in bindings] == [
            ("", "audit", "queue", "audit"), ("events", "audit", "queue", "user.*"),
            ("events", "audit", "queue", "order.#")]
        conns = await get(http, f"{og.management_url}/api/connections")
        assert [(c["user"], c["vhost"], c["channels"], c["state"], c["peer_host"]) for c in conns] == [
            ("guest", "/", 1, "running", "127.0.0.1")]
        chans = await get(http, f"{og.management_url}/api/channels")
        assert [(c["number"], c["consumer_count"], c["prefetch_count"], c["confirm"],
                 c["connection_details"]["name"]) for c in chans] == [(1, 1, 7, True, conns[0]["name"])]
        consumers = await get(http, f"{og.management_url}/api/consumers")
        assert [(c["consumer_tag"], c["queue"], c["ack_required"], c["prefetch_count"],
                 c["channel_details"]["connection_name"]) for c in consumers] == [
            ("c-audit", {"name": "audit", "vhost": "/"}, True, 7, conns[0]["name"])]
        await q.cancel(tag)


async def test_definitions_export_then_import_into_a_fresh_gateway(og: OperatorGateway,
                                                                    http: aiohttp.ClientSession) -> None:
    conn = await aio_pika.connect(og.amqp_url)
    async with conn:
        ch = await conn.channel()
        x = await ch.declare_exchange("billing", aio_pika.ExchangeType.DIRECT, durable=True)
        q = await ch.declare_queue("invoices", durable=True, arguments={"x-cmq-visibility-timeout": 60})
        await q.bind(x, "invoice")
    exported = await get(http, f"{og.management_url}/api/definitions")
    assert exported["queues"] == [{"name": "invoices", "vhost": "/", "durable": True, "auto_delete": False,
                                   "arguments": {"x-cmq-visibility-timeout": 60}}]
    assert exported["exchanges"] == [{"name": "billing", "vhost": "/", "type": "direct", "durable": True,
                                      "auto_delete": False, "internal": False, "arguments": {}}]
    assert exported["bindings"] == [{"source": "billing", "vhost": "/", "destination": "invoices",
                                     "destination_type": "queue", "routing_key": "invoice", "arguments": {}}]
    async with operator_gateway() as fresh:
        async with http.post(f"{fresh.management_url}/api/definitions", data=json.dumps(exported),
                             headers={"Content-Type": "application/json"}) as r:
            assert r.status == 200, await r.text()
            report = await r.json()
        assert report["complete"] and report["not_imported"] == []
        assert {k: report["imported"][k] for k in ("exchanges", "queues", "bindings")} == \
            {"exchanges": 1, "queues": 1, "bindings": 1}
        again = await get(http, f"{fresh.management_url}/api/definitions")
        assert {k: again[k] for k in ("queues", "exchanges", "bindings", "vhosts")} == \
            {k: exported[k] for k in ("queues", "exchanges", "bindings", "vhosts")}
        cmq = await get(http, f"{fresh.management_url}/api/cmq/queues/%2F/invoices")
        assert cmq["attributes"]["visibilityTimeout"] == 60


async def test_L6_topic_max_message_size_changed_through_the_api(og: OperatorGateway,
                                                                  http: aiohttp.ClientSession) -> None:
    """L6: MaximumMessageSize is changeable after creation; outside 1 KB-1024 KB is refused,
    and in the cmq profile (PF2) so is a larger body (compatible reports it: test_profiles_wire)."""
    og.broker.set_vhost_profile("/", "cmq")
    conn = await aio_pika.connect(og.amqp_url)
    async with conn:
        ch = await conn.channel()
        await ch.declare_exchange("small", aio_pika.ExchangeType.FANOUT)
        url = f"{og.management_url}/api/cmq/topics/%2F/small/attributes"
        async with http.put(url, json={"maxMsgSize": 1024}) as r:
            assert (r.status, (await r.json())["maxMsgSize"]) == (200, 1024)
        async with http.put(url, json={"maxMsgSize": 512}) as r:
            body = await r.json()
            assert (r.status, body["rule"]) == (400, "L6")
        topic = await get(http, f"{og.management_url}/api/cmq/topics/%2F/small")
        assert (topic["maxMsgSize"], topic["filterType"], topic["msgRetentionSeconds"]) == (1024, "tag", 86400)
        ch2 = await conn.channel()
        x = await ch2.get_exchange("small")
        with pytest.raises(aiormq.exceptions.ChannelPreconditionFailed) as refused:
            await x.publish(aio_pika.Message(b"x" * 1025), routing_key="")
        assert "MaximumMessageSize 1024 (CMQ limit L6)" in str(refused.value)


async def test_Q6_rewind_and_purge_through_the_api(og: OperatorGateway, http: aiohttp.ClientSession) -> None:
    """Q6: deleted messages stay rewindable; a rewind makes those produced at or after T Active."""
    clock: ManualClock = og.broker.clock
    t0 = clock.now()
    conn = await aio_pika.connect(og.amqp_url)
    async with conn:
        ch = await conn.channel()
        q = await ch.declare_queue("ledger", arguments={"x-cmq-rewind-seconds": 3600})
        for i in range(3):
            await ch.default_exchange.publish(aio_pika.Message(f"e{i}".encode()), routing_key="ledger")
            clock.advance(10)
        for _ in range(3):
            m = await q.get(no_ack=False)
            await m.ack()
        await ch.declare_queue("ledger", passive=True)
        url = f"{og.management_url}/api/cmq/queues/%2F/ledger"
        view = await get(http, url)
        assert (view["activeMsgNum"], view["inactiveMsgNum"], view["rewindMsgNum"],
                view["attributes"]["rewindSeconds"]) == (0, 0, 3, 3600)
        async with http.post(f"{url}/rewind", json={"rewindTo": t0 + 10}) as r:
            body = await r.json()
            assert (r.status, body["rewound"], body["activeMsgNum"]) == (200, 2, 2)
        async with http.post(f"{url}/rewind", json={"rewindTo": t0}) as r:
            assert (r.status, (await r.json())["rule"]) == (400, "Q6")  # rewind moves forward only
        async with http.delete(f"{url}/messages") as r:
            assert (r.status, await r.json()) == (200, {"purged": 2})


async def test_W5_alarm_health_check_and_blocked_state() -> None:
    """W5: while the memory the broker holds is above the mark (one queued message is above
    1 byte) both alarm health checks fail with RabbitMQ's 503 and body; the overview and the
    metrics show what the alarm was decided on."""
    async with operator_gateway(limits=Limits(memory_high_watermark=1)) as g, \
            aiohttp.ClientSession(headers=AUTH) as http:
        conn = await aio_pika.connect(g.amqp_url)
        ch = await conn.channel()
        q = await ch.declare_queue("", exclusive=True)
        await ch.default_exchange.publish(aio_pika.Message(b"held"), routing_key=q.name)
        for _ in range(200):  # hang protection: the server checks after each read turn
            if g.gateway.blocked:
                break
            await asyncio.sleep(0.05)
        for path, where in (("alarms", "in the cluster"), ("local-alarms", "on the node")):
            async with http.get(f"{g.management_url}/api/health/checks/{path}") as r:
                assert (r.status, await r.json()) == (503, {
                    "status": "failed", "reason": f"There are alarms in effect {where}",
                    "alarms": [{"node": "cmq-gateway@localhost", "resource": "memory"}]})
        overview = await get(http, f"{g.management_url}/api/overview")
        assert overview["mem_alarm"] is True and overview["disk_free_alarm"] is False
        assert overview["mem_used"] > overview["mem_limit"] == 1
        async with http.get(f"{g.metrics_url}/metrics") as r:
            text = await r.text()
        assert 'cmq_gateway_alarm{resource="memory"} 1' in text
        assert "cmq_gateway_memory_held_bytes " in text and "cmq_gateway_memory_rss_bytes " in text
        await conn.close()
    async with operator_gateway() as g, aiohttp.ClientSession(headers=AUTH) as http:
        assert await get(http, f"{g.management_url}/api/health/checks/alarms") == {"status": "ok"}
        assert await get(http, f"{g.management_url}/api/health/checks/local-alarms") == {"status": "ok"}


async def test_openapi_describes_every_cmq_route(og: OperatorGateway, http: aiohttp.ClientSession) -> None:
    """Every /api/cmq route the application serves is in the OpenAPI document, and only those."""
    from gateway.management.app import make_app

    app = make_app(og.gateway)
    served = set()
    for route in app.router.routes():
        info = route.resource.get_info() if route.resource is not None else {}
        path = info.get("path") or info.get("formatter")
        if path and path.startswith("/api/cmq") and route.method != "HEAD":
            served.add((path.rstrip("/"), route.method.lower()))  # with its trailing-slash twin
    async with aiohttp.ClientSession() as anon, anon.get(f"{og.management_url}/api/cmq/openapi.json") as r:
        doc = await r.json()
    assert doc == json.loads(json.dumps(openapi_document()))
    assert doc["openapi"].startswith("3.")
    described = {(p, m) for p, ops in doc["paths"].items() for m in ops}
    assert described == served
    for (p, m) in described:
        op = doc["paths"][p][m]
        params = {x["name"] for x in op["parameters"]}
        assert params == {seg[1:-1] for seg in p.split("/") if seg.startswith("{")}, (p, m)
