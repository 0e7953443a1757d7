"""The overview's totals and the per-queue gauges of /metrics, made cheap for 1,000 queues
(issue 12, item 9), still say exactly what each queue's own view says (SPEC D9)."""

from __future__ import annotations

import aio_pika
import aiohttp

from gateway.management.testing import operator_gateway
from gateway.metrics import _labels
from tests.integration.test_metrics import scrape

AUTH = {"Authorization": aiohttp.encode_basic_auth("guest", "guest")}
NAMES = ["plain", "orders.eu", "orders:us", "x-1"]


async def test_D9_overview_totals_and_queue_gauges_match_every_queue_s_view(tmp_path: object) -> None:
    async with operator_gateway(str(tmp_path)) as og:
        conn = await aio_pika.connect(og.amqp_url)
        async with conn:
            ch = await conn.channel()
            for i, name in enumerate(NAMES):
                q = await ch.declare_queue(name)
                for _ in range(i + 1):
                    await ch.default_exchange.publish(aio_pika.Message(b"m"), routing_key=name)
                if i % 2:
                    await q.get(no_ack=False)  # one unacked
            await (await ch.declare_queue("plain", passive=True)).consume(lambda m: None)  # type: ignore[arg-type,return-value]
            await ch.declare_queue("plain", passive=True)  # a round trip: the above is handled
            async with aiohttp.ClientSession(headers=AUTH) as http:
                async with http.get(f"{og.management_url}/api/queues") as r:
                    queues = await r.json()
                async with http.get(f"{og.management_url}/api/overview") as r:
                    overview = await r.json()
            metrics = await scrape(og)
    assert sorted(q["name"] for q in queues) == sorted(NAMES)
    totals, objects = overview["queue_totals"], overview["object_totals"]
    assert totals["messages_ready"] == sum(q["messages_ready"] for q in queues)
    assert totals["messages_unacknowledged"] == sum(q["messages_unacknowledged"] for q in queues) > 0
    assert totals["messages"] == sum(q["messages"] for q in queues)
    assert (objects["queues"], objects["consumers"]) == (len(NAMES), sum(q["consumers"] for q in queues)) == (4, 1)
    for q in queues:
        labels = f'{{vhost="/",queue="{q["name"]}"}}'
        assert metrics[f"cmq_gateway_queue_messages_ready{labels}"] == q["messages_ready"]
        assert metrics[f"cmq_gateway_queue_messages_unacked{labels}"] == q["messages_unacknowledged"]
        assert metrics[f"cmq_gateway_queue_consumers{labels}"] == q["consumers"]


def test_D9_label_values_are_escaped_as_the_text_format_says() -> None:
    """A vhost may be named anything over HTTP: backslash, quote and newline are escaped."""
    assert _labels({"vhost": 'a"b\\c\nd', "queue": "q"}) == '{vhost="a\\"b\\\\c\\nd",queue="q"}'
