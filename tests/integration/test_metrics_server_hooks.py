"""Metrics that need the server's hooks (the patch to gateway/server.py, transport.py and
config.py in the operator's-window report): bytes in/out, and the management API and /metrics
served by the gateway itself from its configuration. These fail until that patch lands."""

from __future__ import annotations

import aio_pika
import aiohttp

from gateway.server import running_gateway

AUTH = {"Authorization": aiohttp.encode_basic_auth("guest", "guest")}


async def test_bytes_in_and_out_and_the_configured_operator_ports() -> None:
    async with running_gateway(0, hosts=("127.0.0.1",), management_port=0, metrics_port=0,
                               management_host="127.0.0.1", metrics_host="127.0.0.1") as gw:
        served = dict(gw.operator_addresses())
        mgmt_port, metrics_port = (int(served[name].rsplit(":", 1)[1]) for name in ("management API", "metrics"))
        conn = await aio_pika.connect(f"amqp://guest:guest@127.0.0.1:{gw.port}/%2F")
        async with conn:
            ch = await conn.channel()
            q = await ch.declare_queue("bytes")
            await ch.default_exchange.publish(aio_pika.Message(b"x" * 1000), routing_key="bytes")
            await q.get()
            async with aiohttp.ClientSession(headers=AUTH) as http:
                async with http.get(f"http://127.0.0.1:{mgmt_port}/api/queues/%2F/bytes") as r:
                    assert (r.status, (await r.json())["messages_unacknowledged"]) == (200, 1)
                async with http.get(f"http://127.0.0.1:{metrics_port}/metrics") as r:
                    lines = dict(line.rsplit(" ", 1) for line in (await r.text()).splitlines()
                                 if line.startswith(("cmq_gateway_received_bytes", "cmq_gateway_sent_bytes")))
        # The 1,000-byte body went in once (publish) and out once (get-ok), plus the framing;
        # the connection's close came after the scrape.
        received, sent = int(lines["cmq_gateway_received_bytes_total"]), int(lines["cmq_gateway_sent_bytes_total"])
        assert 1000 < received < gw.bytes_in and 1000 < sent < gw.bytes_out
