"""The RabbitMQ-compatible answers compared field by field with RabbitMQ's own management
plugin on this machine (127.0.0.1:15672, guest/guest), after the same workload on both
(SPEC M1, D9). Values that are the same by nature are compared for equality; values that
depend on the process (ports, timestamps, rates) for their JSON type."""

from __future__ import annotations

import asyncio
import socket
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import quote

import aio_pika
import aiohttp
import pytest
import pytest_asyncio

from gateway.management.testing import operator_gateway

pytestmark = pytest.mark.rabbitmq

AUTH = {"Authorization": aiohttp.encode_basic_auth("guest", "guest")}
RABBIT_AMQP = "amqp://guest:guest@127.0.0.1:5672/%2F"
RABBIT_HTTP = "http://127.0.0.1:15672"
STATS_WAIT = 30.0  # RabbitMQ publishes its statistics every 5 s; hang protection only


def _up(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


class Side:
    def __init__(self, amqp: str, http_base: str, http: aiohttp.ClientSession) -> None:
        self.amqp, self.base, self.http = amqp, http_base, http

    async def get(self, path: str) -> Any:
        async with self.http.get(self.base + path) as r:
            assert r.status == 200, (self.base, path, r.status)
            return await r.json()

    async def until(self, path: str, ready: Any) -> Any:
        deadline = time.monotonic() + STATS_WAIT
        while True:
            body = await self.get(path)
            if ready(body) or time.monotonic() > deadline:
                return body
            await asyncio.sleep(0.5)


@pytest_asyncio.fixture(loop_scope="function")
async def sides() -> AsyncIterator[tuple[Side, Side]]:
    if not (_up(5672) and _up(15672)):
        raise RuntimeError("RabbitMQ with rabbitmq_management must run on 127.0.0.1 (5672, 15672): "
                           "rabbitmq-plugins enable rabbitmq_management")
    async with operator_gateway() as og, aiohttp.ClientSession(headers=AUTH) as http:
        yield Side(RABBIT_AMQP, RABBIT_HTTP, http), Side(og.amqp_url, og.management_url, http)


async def workload(side: Side, name: str) -> tuple[Any, list[Any]]:
    """A topic exchange, a durable queue bound twice, 5 persistent messages, 2 got unacked."""
    conn = await aio_pika.connect(side.amqp, client_properties={"connection_name": name})
    ch = await conn.channel()
    await ch.set_qos(prefetch_count=3)
    x = await ch.declare_exchange(name, aio_pika.ExchangeType.TOPIC, durable=True)
    q = await ch.declare_queue(name, durable=True)
    await q.bind(x, "a.#")
    await q.bind(x, "b.*")
    for i in range(5):
        await x.publish(aio_pika.Message(f"m{i}".encode(), delivery_mode=aio_pika.DeliveryMode.PERSISTENT),
                        routing_key="a.x")
    got = [await q.get(no_ack=False) for _ in range(2)]
    return conn, got


async def cleanup(side: Side, name: str, conn: Any) -> None:
    await conn.close()
    conn = await aio_pika.connect(side.amqp)
    ch = await conn.channel()
    await ch.queue_delete(name)
    await ch.exchange_delete(name)
    await conn.close()


def same_types(a: dict[str, Any], b: dict[str, Any], keys: list[str]) -> list[str]:
    """The keys whose JSON types differ (int and float count as one number type)."""
    def kind(v: Any) -> str:
        return "number" if isinstance(v, int | float) and not isinstance(v, bool) else type(v).__name__
    return [k for k in keys if kind(a.get(k, KeyError)) != kind(b.get(k, KeyError))]


async def test_M1_queue_exchange_bindings_match_rabbitmq(sides: tuple[Side, Side]) -> None:
    name = f"mgmt-{uuid.uuid4().hex[:8]}"
    results = {}
    for side in sides:
        conn, _ = await workload(side, name)
        try:
            # RabbitMQ's stats come in its own ticks: publish can be counted a tick before the gets.
            queue = await side.until(f"/api/queues/%2F/{name}", lambda b: b.get("messages") == 5 and "state" in b
                                     and b.get("message_stats", {}).get("publish") == 5
                                     and b.get("message_stats", {}).get("deliver_get") == 2)
            exchange = await side.get(f"/api/exchanges/%2F/{name}")
            bindings = await side.get(f"/api/queues/%2F/{name}/bindings")
            defs = await side.get("/api/definitions")
            results[side.base] = (queue, exchange, bindings, defs)
        finally:
            await cleanup(side, name, conn)
    (rq, rx, rb, rd), (gq, gx, gb, gd) = results.values()

    # Queue: the fields KEDA, Flower, rabbitmqadmin and dashboards read.
    equal = ["name", "vhost", "durable", "auto_delete", "exclusive", "arguments", "state", "messages",
             "messages_ready", "messages_unacknowledged", "consumers", "type", "policy",
             "exclusive_consumer_tag", "single_active_consumer_tag", "effective_policy_definition",
             "head_message_timestamp", "operator_policy"]
    assert {k: gq[k] for k in equal} == {k: rq[k] for k in equal}
    assert (gq["messages"], gq["messages_ready"], gq["messages_unacknowledged"]) == (5, 3, 2)
    typed = ["node", "messages_details", "messages_ready_details", "messages_unacknowledged_details",
             "message_stats", "consumer_capacity"]
    assert same_types(gq, rq, typed) == []
    for stat in ("publish", "deliver_get", "ack", "redeliver"):
        assert gq["message_stats"].get(stat, 0) == rq["message_stats"].get(stat, 0), stat
    assert same_types(gq["message_stats"]["publish_details"], rq["message_stats"]["publish_details"],
                      ["rate"]) == []

    # Exchange.
    equal = ["name", "vhost", "type", "durable", "auto_delete", "internal", "arguments"]
    assert {k: gx[k] for k in equal} == {k: rx[k] for k in equal}

    # Bindings of the queue, including the default exchange's.
    def rows(bs: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
        return sorted((b["source"], b["vhost"], b["destination"], b["destination_type"], b["routing_key"],
                       b["arguments"], b["properties_key"]) for b in bs)
    assert rows(gb) == rows(rb)

    # Definitions: the same entries for the same objects.
    def mine(d: dict[str, Any], kind: str) -> list[dict[str, Any]]:
        key = "destination" if kind == "bindings" else "name"
        return sorted((e for e in d[kind] if e[key] == name), key=lambda e: str(sorted(e.items())))
    for kind in ("queues", "exchanges", "bindings"):
        assert mine(gd, kind) == mine(rd, kind), kind
    assert set(rd) - set(gd) == set()  # every top-level key of RabbitMQ's export is there


async def test_M1_connection_channel_and_misc_match_rabbitmq(sides: tuple[Side, Side]) -> None:
    name = f"mgmt-{uuid.uuid4().hex[:8]}"
    results = {}
    for side in sides:
        conn, _ = await workload(side, name)
        try:
            conns = await side.until("/api/connections", lambda cs: any(
                c.get("client_properties", {}).get("connection_name") == name and c.get("channels") == 1 for c in cs))
            mine = next(c for c in conns if c.get("client_properties", {}).get("connection_name") == name)
            conn_name = mine["name"]

            def has_channel(cs: list[dict[str, Any]], conn_name: str = conn_name) -> bool:
                return any(c["connection_details"]["name"] == conn_name
                           and c.get("messages_unacknowledged") == 2 for c in cs)
            chans = await side.until("/api/channels", has_channel)
            chan = next(c for c in chans if c["connection_details"]["name"] == conn_name)
            results[side.base] = (mine, chan, await side.get("/api/whoami"),
                                  await side.get("/api/health/checks/alarms"), await side.get("/api/overview"),
                                  await side.get("/api/vhosts/" + quote("/", safe="")))
        finally:
            await cleanup(side, name, conn)
    (rc, rch, rw, ra, ro, rv), (gc, gch, gw, ga, go, gv) = results.values()

    equal = ["user", "vhost", "protocol", "type", "channels", "auth_mechanism", "ssl", "frame_max",
             "channel_max", "timeout", "peer_host", "state"]
    assert {k: gc[k] for k in equal} == {k: rc[k] for k in equal}
    assert gc["client_properties"] == rc["client_properties"]
    assert same_types(gc, rc, ["name", "node", "host", "port", "peer_port", "connected_at"]) == []
    assert gc["name"] == f"{gc['peer_host']}:{gc['peer_port']} -> {gc['host']}:{gc['port']}"
    assert rc["name"] == f"{rc['peer_host']}:{rc['peer_port']} -> {rc['host']}:{rc['port']}"

    equal = ["number", "user", "vhost", "consumer_count", "messages_unacknowledged", "messages_unconfirmed",
             "prefetch_count", "global_prefetch_count", "confirm", "transactional", "state"]
    assert {k: gch[k] for k in equal} == {k: rch[k] for k in equal}
    assert gch["name"] == f"{gc['name']} (1)" and rch["name"] == f"{rc['name']} (1)"

    assert (gw, ga) == (rw, ra) == ({"name": "guest", "tags": ["administrator"]}, {"status": "ok"})
    assert set(ro["object_totals"]) == set(go["object_totals"])
    assert set(ro["queue_totals"]) <= set(go["queue_totals"])
    assert {e["name"] for e in go["exchange_types"]} == {e["name"] for e in ro["exchange_types"]}
    assert same_types(go, ro, ["management_version", "rabbitmq_version", "product_name", "cluster_name",
                               "node", "listeners", "message_stats"]) == []
    assert same_types(gv, rv, ["name", "tracing", "messages", "messages_ready", "messages_unacknowledged",
                               "cluster_state", "description", "tags", "metadata"]) == []


async def test_W5_node_resources_and_local_alarms_match_rabbitmq(sides: tuple[Side, Side], tmp_path: Any) -> None:
    """W5: /api/nodes carries RabbitMQ's resource fields with RabbitMQ's types (mem_used being
    the bytes the gateway holds; a gateway with a data directory, so that disk_free is its
    file system's), and /api/health/checks/local-alarms answers as RabbitMQ's."""
    rabbit = sides[0]
    async with operator_gateway(str(tmp_path)) as og:
        gateway = Side(og.amqp_url, og.management_url, rabbit.http)
        keys = ["name", "type", "running", "mem_used", "mem_limit", "mem_alarm", "disk_free",
                "disk_free_limit", "disk_free_alarm"]
        (rn,), (gn,) = await rabbit.get("/api/nodes"), await gateway.get("/api/nodes")
        assert same_types(gn, rn, keys) == []
        assert (gn["disk_free_limit"], gn["mem_alarm"], gn["disk_free_alarm"]) == (rn["disk_free_limit"], False, False)
        assert set(await gateway.get(f"/api/nodes/{gn['name']}")) == set(gn)
        assert await rabbit.get("/api/health/checks/local-alarms") == await gateway.get(
            "/api/health/checks/local-alarms") == {"status": "ok"}



# The rates the console's overview charts (issue 29), RabbitMQ's names for them.
CHARTED = ("publish", "confirm", "deliver_get", "ack", "redeliver")


async def test_M1_overview_confirm_and_redeliver_stats_match_rabbitmq(sides: tuple[Side, Side]) -> None:
    """/api/overview's message_stats after 20 confirmed publishes and two gets, the first
    rejected with requeue: ``confirm`` and ``redeliver`` counted as RabbitMQ counts them,
    under its names, each with ``*_details.rate``. Read by a management user of a vhost of
    its own, whose overview counts that vhost only (on both), so other clients of the shared
    RabbitMQ do not change the numbers."""
    uid = uuid.uuid4().hex[:8]
    vhost, user = f"confirm-{uid}", f"confirm-{uid}"
    counts: dict[str, dict[str, Any]] = {}
    stats: dict[str, dict[str, Any]] = {}
    for side in sides:
        own = aiohttp.ClientSession(auth=aiohttp.BasicAuth(user, "pw"))
        port = int(side.amqp.rsplit(":", 1)[1].split("/")[0])
        try:
            for path, body in ((f"/api/vhosts/{vhost}", None),
                               (f"/api/users/{user}", {"password": "pw", "tags": "management"}),
                               (f"/api/permissions/{vhost}/{user}", {"configure": ".*", "write": ".*", "read": ".*"})):
                async with side.http.put(side.base + path, json=body) as r:
                    assert r.status in (201, 204), (side.base, path, r.status)
            conn = await aio_pika.connect(f"amqp://{user}:pw@127.0.0.1:{port}/{vhost}")
            try:
                ch = await conn.channel(publisher_confirms=True)
                q = await ch.declare_queue("q")
                for i in range(20):
                    await ch.default_exchange.publish(aio_pika.Message(f"m{i}".encode()), routing_key="q")
                first = await q.get(no_ack=False)
                await first.reject(requeue=True)
                again = await q.get(no_ack=False)
                assert again.redelivered
                await again.ack()
                mine = Side(side.amqp, side.base, own)
                overview = await mine.until("/api/overview", lambda o: all(
                    o.get("message_stats", {}).get(k) for k in CHARTED))
                stats[side.base] = ms = overview["message_stats"]
                counts[side.base] = {k: ms.get(k) for k in CHARTED}
                if side is sides[1]:  # the gateway's rate (sampled every 5 s) shows the burst
                    rated = await mine.until("/api/overview", lambda o: o["message_stats"]["confirm_details"]["rate"] > 0)
                    assert rated["message_stats"]["confirm_details"]["rate"] > 0
            finally:
                await conn.close()
        finally:
            await own.close()
            for path in (f"/api/users/{user}", f"/api/vhosts/{vhost}"):
                async with side.http.delete(side.base + path):
                    pass
    rabbit, gateway = counts.values()
    assert gateway == rabbit == {"publish": 20, "confirm": 20, "deliver_get": 2, "ack": 1, "redeliver": 1}
    for ms in stats.values():
        for stat in CHARTED:
            assert set(ms[f"{stat}_details"]) == {"rate"}, stat
            assert isinstance(ms[f"{stat}_details"]["rate"], int | float), stat


async def test_M1_a_vhost_s_message_stats_match_rabbitmq(sides: tuple[Side, Side]) -> None:
    """/api/vhosts/{vhost} carries the vhost's own message_stats (issue 29): 12 confirmed
    publishes into a vhost of this test's own, three gets, the first rejected with requeue,
    counted under RabbitMQ's names on both, each with ``*_details.rate``; traffic in another
    vhost does not change them."""
    uid = uuid.uuid4().hex[:8]
    vhost = f"vstats-{uid}"
    counts: dict[str, dict[str, Any]] = {}
    for side in sides:
        port = int(side.amqp.rsplit(":", 1)[1].split("/")[0])
        async with side.http.put(side.base + f"/api/vhosts/{vhost}") as r:
            assert r.status in (201, 204), (side.base, r.status)
        try:
            async with side.http.put(side.base + f"/api/permissions/{vhost}/guest",
                                     json={"configure": ".*", "write": ".*", "read": ".*"}) as r:
                assert r.status in (201, 204), (side.base, r.status)
            conn = await aio_pika.connect(f"amqp://guest:guest@127.0.0.1:{port}/{vhost}")
            other = await aio_pika.connect(side.amqp)  # the default vhost's traffic is not this vhost's
            try:
                ch = await conn.channel(publisher_confirms=True)
                q = await ch.declare_queue("q")
                for i in range(12):
                    await ch.default_exchange.publish(aio_pika.Message(f"m{i}".encode()), routing_key="q")
                och = await other.channel()
                oq = await och.declare_queue(f"vstats-other-{uid}", auto_delete=True)
                await och.default_exchange.publish(aio_pika.Message(b"elsewhere"), routing_key=oq.name)
                first = await q.get(no_ack=False)
                await first.reject(requeue=True)
                for _ in range(2):
                    await (await q.get(no_ack=False)).ack()
                body = await side.until(f"/api/vhosts/{vhost}", lambda v: all(
                    v.get("message_stats", {}).get(k) for k in CHARTED))
                ms = body["message_stats"]
                counts[side.base] = {k: ms.get(k) for k in CHARTED}
                for stat in CHARTED:
                    assert set(ms[f"{stat}_details"]) == {"rate"}, stat
                    assert isinstance(ms[f"{stat}_details"]["rate"], int | float), stat
                listed = next(v for v in await side.get("/api/vhosts") if v["name"] == vhost)
                assert listed["message_stats"]["publish"] == 12
            finally:
                await other.close()
                await conn.close()
        finally:
            async with side.http.delete(side.base + f"/api/vhosts/{vhost}"):
                pass
    rabbit, gateway = counts.values()
    assert gateway == rabbit == {"publish": 12, "confirm": 12, "deliver_get": 3, "ack": 2, "redeliver": 1}


async def test_M1_pages_past_the_end_and_bad_page_parameters_answer_as_rabbitmq(sides: tuple[Side, Side]) -> None:
    """The edges of RabbitMQ's paging: an empty filter's page 1 (page_count 0), a page past
    the last one, and parameters out of range or not numbers, each the same status, error
    and counts on both."""
    none = f"none-{uuid.uuid4().hex[:8]}"
    queries = [f"page=1&page_size=5&name={none}", f"page=2&page_size=5&name={none}", "page=0",
               "page=1&page_size=501", "page=1&page_size=0", "page=x", "page=1&page_size=y"]
    answers = []
    for side in sides:
        seen = []
        for query in queries:
            async with side.http.get(f"{side.base}/api/exchanges/%2F?{query}") as r:
                body = await r.json()
                # total_count left out: RabbitMQ's vhosts hold amq.rabbitmq.trace, the gateway's not
                seen.append((r.status, body.get("error") if r.status != 200 else
                             {k: v for k, v in body.items() if k not in ("items", "total_count")}))
        answers.append(seen)
    assert answers[0] == answers[1]
    assert answers[1][:2] == [(200, {"filtered_count": 0, "item_count": 0, "page": 1, "page_count": 0, "page_size": 5}),
                              (400, "page_out_of_range")]
