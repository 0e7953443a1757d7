"""A5 for HTTP push: a stop while the audit writer waits for room on a full disk sends no push
whose records it gives up. The push is not sent and no outcome is reported, so the message
stays owed to the subscription (journaled, D7) and the next start pushes it; nothing counts it
as delivered meanwhile. The gateway runs in this event loop with its audit dir on a real full
tmpfs; the subscriber is a real aiohttp server, the publisher aio-pika. The stop's request
(what the SIGTERM handler does, gateway.server._ask_stop) is ``AuditLog.ask_stop()``."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
from pathlib import Path
from typing import Any

import aio_pika
import aiohttp
import aiormq

from gateway.config import AuditSettings, Limits
from gateway.management.testing import LOOPBACK_PUSH, operator_gateway
from semantics.clock import ManualClock
from tests.integration.test_http_push import Subscriber, _serve
from tests.small_disk import fill, free, small_disk
from tests.support.audit_files import records

HANG = 30.0  # seconds: a bound on a hang, never a measurement
AUTH = aiohttp.BasicAuth("guest", "guest")


async def _until(check: Any) -> None:
    async def wait() -> None:
        while not check():
            await asyncio.sleep(0.02)
    await asyncio.wait_for(wait(), HANG)


async def test_A5_a_push_is_withheld_at_a_stop_on_a_full_disk_and_sent_after_the_restart(tmp_path: Path) -> None:
    sub = Subscriber(ManualClock(), fail_first=0)  # answers 200 to every push
    runner = await _serve(sub)
    url = sub.url

    def got() -> list[str]:
        return [json.loads(r["body"])["msgBody"] for r in sub.requests]
    limits = dataclasses.replace(Limits(), disk_free_limit=0)  # no disk alarm: the writer itself waits
    try:
        with small_disk(tmp_path / "disk", "2m") as disk:
            audit = AuditSettings(dir=str(disk / "audit"))
            async with operator_gateway(str(tmp_path / "data"), audit=audit, limits=limits, push=LOOPBACK_PUSH) as og, \
                    aiohttp.ClientSession(auth=AUTH) as http:
                conn = await aio_pika.connect(og.amqp_url)
                ch = await conn.channel()
                ex = await ch.declare_exchange("orders", aio_pika.ExchangeType.DIRECT, durable=True)
                async with http.post(f"{og.management_url}/api/cmq/topics/%2F/orders/subscriptions",
                                     json={"subscriptionName": "hook", "protocol": "http", "endpoint": url,
                                           "notifyStrategy": "BACKOFF_RETRY"}) as r:
                    assert r.status == 201, await r.text()
                await ex.publish(aio_pika.Message(b"before", delivery_mode=2), routing_key="k")
                await _until(lambda: len(got()) == 1)  # pushes go out while the disk has room
                log = og.gateway.audit
                assert log.flush(HANG)

                fill(disk)
                log.ask_stop()  # SIGTERM's handler: a hand-off now gives up instead of waiting
                # Records until the writer process, waiting for room, has a full pipe: a
                # hand-off then gives up (False) with records still here.
                for i in range(1_000):
                    for j in range(1_000):
                        log.emit("publish", "/", queue="filler", msg_id=f"f{i}.{j}", size=1)
                    if not log.handoff():
                        break
                else:
                    raise AssertionError("the audit writer never stalled on the full disk")
                pusher = og.pusher
                sent = pusher.sent
                # The AMQP transport's own A5: the turn that read the publish has bytes for the
                # client and cannot hand off its records, so it closes the connection.
                with contextlib.suppress(aiormq.exceptions.AMQPConnectionError):
                    await ex.publish(aio_pika.Message(b"during", delivery_mode=2), routing_key="k")
                await _until(lambda: pusher.withheld == 1)
                await asyncio.wait_for(pusher.idle(), HANG)
                assert got() == ["before"]  # not sent
                assert (pusher.sent, pusher.failed) == (sent, 0)  # neither sent nor failed
                with contextlib.suppress(Exception):
                    await conn.close()
            free(disk)

            async with operator_gateway(str(tmp_path / "data"), audit=audit, limits=limits, push=LOOPBACK_PUSH) as og:
                await _until(lambda: len(got()) == 2)  # the restart pushes what was owed
                during = json.loads(sub.requests[1]["body"])["msgId"]

                def delivered() -> list[dict[str, Any]]:
                    assert og.gateway.audit.flush(HANG)
                    return [r for r in records(disk / "audit", include_open=True)
                            if r["event"] == "deliver" and r.get("msg_id") == during]
                await _until(delivered)
                assert len(delivered()) == 1  # once: by the restart's push, none by the withheld one
        assert got() == ["before", "during"]
    finally:
        await runner.cleanup()
