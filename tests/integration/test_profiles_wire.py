"""The profiles over the wire (SPEC PF1-PF5).

* compatible (the default): the inputs the cmq profile refuses
  (test_cmq_semantics.test_L3_L4_tag_and_key_limits_refused) pass, and each breach is in the
  audit log (``limit_exceeded``), in ``/metrics`` and in ``GET /api/cmq/limits``;
* differential against RabbitMQ: long routing keys, big bodies and the delivered properties
  are RabbitMQ's in compatible (M11 adds nothing unless asked, PF5).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aio_pika
import aiohttp
import pika
import pytest
import pytest_asyncio

from gateway.config import AuditSettings
from gateway.management.testing import OperatorGateway, operator_gateway
from tests.integration.differential import PROPERTY_FIELDS, blocking, typed
from tests.integration.test_process import serve

# Issue 14: these also run on the gateway on NATS JetStream (tests/conftest.py).
pytestmark = pytest.mark.both_stores

AUTH = aiohttp.BasicAuth("guest", "guest")


@pytest_asyncio.fixture(loop_scope="function")
async def og(tmp_path: Path) -> AsyncIterator[OperatorGateway]:
    async with operator_gateway(str(tmp_path / "data"), audit=AuditSettings(dir=str(tmp_path / "audit"))) as g:
        yield g


def _records(og: OperatorGateway, tmp_path: Path, event: str) -> list[dict[str, Any]]:
    og.gateway.audit.flush(10.0)
    lines = [json.loads(line) for f in sorted((tmp_path / "audit").rglob("*.jsonl*"))
             for line in f.read_text().splitlines()]
    return [r for r in lines if r["event"] == event]


async def _get(http: aiohttp.ClientSession, url: str) -> Any:
    async with http.get(url) as r:
        assert r.status == 200, await r.text()
        return await r.json()


async def test_PF4_cmq_refusals_pass_and_are_reported_in_compatible(og: OperatorGateway, tmp_path: Path) -> None:
    """PF3/PF4: a 17-character tag, six tags, a 65-byte key, sixteen dots, a sixth binding
    key, a 70,000-byte body: all accepted and delivered; each breach reported three ways."""
    conn = await aio_pika.connect(og.amqp_url)
    async with conn:
        ch = await conn.channel()
        direct = await ch.declare_exchange("ex", aio_pika.ExchangeType.DIRECT)
        topic = await ch.declare_exchange("ex.t", aio_pika.ExchangeType.TOPIC)
        q = await ch.declare_queue("q1")
        await q.bind(direct, "t" * 17)
        await direct.publish(aio_pika.Message(b"six tags", headers={"x-cmq-tags": ["b", "c", "d", "e", "f"]}),
                             routing_key="a")
        await direct.publish(aio_pika.Message(b"long tag"), routing_key="t" * 17)
        await q.bind(topic, "k" * 65)
        await q.bind(topic, ".".join("a" * 17))
        for k in ("k1", "k2", "k3", "k4", "k5", "k6"):
            await q.bind(topic, k)
        await topic.publish(aio_pika.Message(b"sixth key"), routing_key="k6")
        await topic.publish(aio_pika.Message(b"x" * 70_000), routing_key="k1")
        bodies = [(await q.get(no_ack=True)).body for _ in range(3)]
        assert bodies == [b"long tag", b"sixth key", b"x" * 70_000]
    records = _records(og, tmp_path, "limit_exceeded")
    got = sorted((r["rule"], r["object"], r["value"], r["limit"]) for r in records)
    assert got == sorted([
        ("L3", "binding:ex->q:q1", 17, 16), ("L3", "exchange:ex", 6, 5), ("L3", "exchange:ex", 17, 16),
        ("L4", "binding:ex.t->q:q1", 65, 64), ("L4", "binding:ex.t->q:q1", 16, 15),
        ("L4", "binding:ex.t->q:q1", 6, 5), ("L4", "binding:ex.t->q:q1", 7, 5), ("L4", "binding:ex.t->q:q1", 8, 5),
        ("L6", "exchange:ex.t", 70_000, 65536), ("L6", "queue:q1", 70_000, 65536),
        # L1/L2: names CMQ could not hold (too short, or a dot) are reported too.
        ("L2", "exchange:ex", 2, 64), ("L2", "exchange:ex.t", 4, 64), ("L2", "queue:q1", 2, 64)])
    assert all(r["user"] == "guest" and r["peer"].startswith("127.0.0.1:") and r["v"] == 2 for r in records)
    async with aiohttp.ClientSession(auth=AUTH) as http:
        async with http.get(f"{og.metrics_url}/metrics") as r:
            text = await r.text()
        counts = {m.group(1): int(m.group(2)) for m in re.finditer(
            r'cmq_gateway_limit_exceeded_total\{vhost="/",rule="(L\d)"\} (\d+)', text)}
        assert counts == {"L2": 3, "L3": 3, "L4": 5, "L6": 2}
        report = await _get(http, f"{og.management_url}/api/cmq/limits/%2F")
        assert (report["vhost"], report["profile"], sorted(report["rules"])) == ("/", "compatible", ["L2", "L3", "L4", "L6"])
        l4 = report["rules"]["L4"]
        assert (l4["count"], l4["objects"], l4["users"]) == (5, ["binding:ex.t->q:q1"], ["guest"])
        [entry] = l4["entries"]
        assert (entry["count"], entry["worst_value"], entry["limit"]) == (5, 65, 64)
        assert entry["example"].endswith("is 65 bytes, more than 64 (CMQ limit L4)")
        assert entry["first_seen"] <= entry["last_seen"]
        everything = await _get(http, f"{og.management_url}/api/cmq/limits")
        assert everything["profile"] == "compatible"
        assert [v["rules"]["L6"]["count"] for v in everything["vhosts"] if v["vhost"] == "/"] == [2]


async def test_PF1_profile_shown_and_changed_per_vhost(og: OperatorGateway) -> None:
    """PF1: connection.start's server_properties, /api/overview and /api/vhosts show the
    profile; an administrator changes a vhost's from now on (a limit then refuses)."""
    conn = await aio_pika.connect(og.amqp_url)
    async with conn, aiohttp.ClientSession(auth=AUTH) as http:
        assert conn.transport.connection.server_properties["cmq_profile"] == "compatible"  # type: ignore[union-attr]
        overview = await _get(http, f"{og.management_url}/api/overview")
        assert (overview["cmq_profile"], overview["cmq_vhost_profiles"]) == ("compatible", {"/": "compatible"})
        url = f"{og.management_url}/api/cmq/vhosts/%2F/profile"
        async with http.put(url, json={"profile": "strictest"}) as r:
            assert r.status == 400
        async with http.put(url, json={"profile": "cmq"}) as r:
            assert (r.status, await r.json()) == (200, {"vhost": "/", "profile": "cmq", "gateway_profile": "compatible",
                                                        "override": True})
        assert (await _get(http, f"{og.management_url}/api/vhosts/%2F"))["cmq_profile"] == "cmq"
        ch = await conn.channel()
        x = await ch.declare_exchange("pf1", aio_pika.ExchangeType.TOPIC)
        q = await ch.declare_queue("pf1q")
        with pytest.raises(aio_pika.exceptions.ChannelPreconditionFailed, match="CMQ limit L4"):
            await q.bind(x, "k" * 65)
        async with http.put(url, json={"profile": None}) as r:
            assert (await r.json())["profile"] == "compatible"


# -- differential: compatible against RabbitMQ --------------------------------------------------


def _direct_long_keys(url: str, unique: str) -> list[tuple[str, bytes]]:
    """A direct exchange bound with keys longer than CMQ's tags (L3: 16 characters), as the
    RabbitMQ client test suites name their queues and keys."""
    keys = ["TestConfirmDeliveryAfterUnroutableMessage", "k" * 255]
    with blocking(url) as conn:
        ch = conn.channel()
        ch.exchange_declare(unique, "direct", auto_delete=True)
        ch.queue_declare(unique, exclusive=True)
        for k in keys:
            ch.queue_bind(unique, unique, k)
        ch.confirm_delivery()
        for k in keys:
            ch.basic_publish(unique, k, k[:8].encode(), mandatory=True)
        out = []
        for _ in keys:
            method, _, body = ch.basic_get(unique, auto_ack=True)
            out.append((method.routing_key, body))
        return out


@pytest.mark.rabbitmq
def test_PF3_long_routing_keys_on_a_direct_exchange_as_rabbitmq(rabbitmq_url: str, gateway_url: str,
                                                                 unique: str) -> None:
    assert _direct_long_keys(gateway_url, unique) == _direct_long_keys(rabbitmq_url, unique)


def _big_bodies(url: str, unique: str) -> list[tuple[int, bytes]]:
    with blocking(url) as conn:
        ch = conn.channel()
        ch.queue_declare(unique, exclusive=True)
        ch.confirm_delivery()
        bodies = [bytes(range(256)) * 400, b"m" * (1 << 20)]  # 100 KB and 1 MiB
        for b in bodies:
            ch.basic_publish("", unique, b)
        got = []
        for _ in bodies:
            _, _, body = ch.basic_get(unique, auto_ack=True)
            got.append((len(body), body[:300]))
        return got


@pytest.mark.rabbitmq
def test_PF3_L6_100KB_and_1MB_bodies_as_rabbitmq(rabbitmq_url: str, gateway_url: str, unique: str) -> None:
    assert _big_bodies(gateway_url, unique) == _big_bodies(rabbitmq_url, unique)


def _delivered_properties(url: str, unique: str) -> list[dict[str, Any]]:
    """What pika receives, typed and unstripped: message_id unset, headers of several types."""
    props = pika.BasicProperties(content_type="application/json", delivery_mode=2, priority=3,
                                 correlation_id="c-1", timestamp=1_700_000_000, app_id="pf5",
                                 headers={"s": "text", "i": 42, "b": True, "l": [1, "two"],
                                          "t": {"nested": 1}})
    with blocking(url) as conn:
        ch = conn.channel()
        ch.queue_declare(unique, exclusive=True)
        ch.confirm_delivery()
        ch.basic_publish("", unique, b"get", props)
        ch.basic_publish("", unique, b"consume", props)
        out = []
        _, p, _ = ch.basic_get(unique, auto_ack=True)
        out.append(p)
        for _, p, _ in ch.consume(unique, auto_ack=True, inactivity_timeout=5):
            out.append(p)
            break
        ch.cancel()
    return [{f: typed(getattr(p, f)) for f in PROPERTY_FIELDS} for p in out]


@pytest.mark.rabbitmq
def test_PF5_properties_delivered_as_published_as_rabbitmq(rabbitmq_url: str, gateway_url: str,
                                                           unique: str) -> None:
    """PF5: in compatible, basic.get-ok and basic.deliver carry exactly what RabbitMQ
    delivers: no x-cmq-* header, no message_id added."""
    gateway = _delivered_properties(gateway_url, unique)
    assert gateway == _delivered_properties(rabbitmq_url, unique)
    assert gateway[0]["message_id"] == ("NoneType", None)


# -- the command line and the config (a real `cmq-gateway serve`) --------------------------------


def _bind_fault(url: str, unique: str) -> object:
    """None when a 65-byte binding key binds (compatible), else the fault (cmq: L4)."""
    with blocking(url) as conn:
        ch = conn.channel()
        ch.exchange_declare(unique, "topic", auto_delete=True)
        ch.queue_declare(unique, exclusive=True)
        try:
            ch.queue_bind(unique, unique, "k" * 65)
        except pika.exceptions.ChannelClosedByBroker as e:
            return e.reply_code, e.reply_text.endswith("(CMQ limit L4)")
        return None


def test_PF1_profile_from_the_command_line_and_per_vhost_from_the_config(tmp_path: Path, unique: str) -> None:
    """PF1: --profile overrides the config's ``profile:``; a vhost's own ``profile`` overrides
    both; connection.start shows the gateway's."""
    config = tmp_path / "gateway.yaml"
    config.write_text(
        "profile: compatible\n"
        "users: [{name: guest, password: guest, tags: administrator}]\n"
        "vhosts: [{name: /}, {name: loose, profile: compatible}]\n"
        "permissions:\n"
        "  - {user: guest, vhost: /, configure: '.*', write: '.*', read: '.*'}\n"
        "  - {user: guest, vhost: loose, configure: '.*', write: '.*', read: '.*'}\n")
    with serve(tmp_path / "data", "--config", str(config), "--profile", "cmq") as (_proc, port):
        with blocking(f"amqp://guest:guest@127.0.0.1:{port}/%2F") as conn:
            assert conn._impl.server_properties["cmq_profile"] == "cmq"  # type: ignore[attr-defined]
        assert _bind_fault(f"amqp://guest:guest@127.0.0.1:{port}/%2F", unique) == (406, True)
        assert _bind_fault(f"amqp://guest:guest@127.0.0.1:{port}/loose", unique) is None


def test_PF1_an_unknown_profile_is_a_config_error(tmp_path: Path) -> None:
    config = tmp_path / "gateway.yaml"
    config.write_text("vhosts: [{name: /, profile: strict}]\n")
    done = subprocess.run([sys.executable, "-m", "gateway", "serve", "--config", str(config), "--port", "0",
                           "--data-dir", str(tmp_path / "data")], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert done.stderr == ("cmq-gateway: config: vhosts[0].profile: expected one of compatible, cmq, "
                           "got 'strict'\n")
