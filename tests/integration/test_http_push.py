"""HTTP(S) subscription endpoints against a real local HTTP server (SPEC D7, D5, D6, D9).

The gateway runs in this event loop on a ManualClock; the subscriber is an aiohttp server on
port 0 that fails the first N pushes. Every retry time is checked exactly: moving the broker's
clock to just before it runs nothing, moving it to the instant runs exactly one push.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import aio_pika
import aiohttp
import pytest_asyncio
from aiohttp import web

from gateway.management.testing import LOOPBACK_PUSH, OperatorGateway, operator_gateway
from semantics.clock import ManualClock
from semantics.retry import exp_decay_schedule

AUTH = {"Authorization": aiohttp.encode_basic_auth("guest", "guest") if hasattr(aiohttp, "encode_basic_auth")
        else aiohttp.BasicAuth("guest", "guest").encode()}
WAIT = 10.0  # hang protection only


class Subscriber:
    """A real HTTP endpoint: answers ``fail_status`` to the first ``fail_first`` pushes."""

    def __init__(self, clock: ManualClock, fail_first: int, fail_status: int = 500) -> None:
        self.clock = clock
        self.fail_first = fail_first
        self.fail_status = fail_status
        self.requests: list[dict[str, Any]] = []
        self.arrived: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self.url = ""

    async def handle(self, request: web.Request) -> web.Response:
        body = await request.read()
        record = {"at": self.clock.now(), "headers": dict(request.headers), "body": body}
        self.requests.append(record)
        self.arrived.put_nowait(record)
        if len(self.requests) <= self.fail_first:
            return web.Response(status=self.fail_status, text="no")
        return web.Response(status=200, text="ok")

    async def next(self) -> dict[str, Any]:
        return await asyncio.wait_for(self.arrived.get(), WAIT)


async def _serve(sub: Subscriber) -> web.AppRunner:
    app = web.Application()
    app.router.add_post("/notify", sub.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    sub.url = f"http://127.0.0.1:{runner.addresses[0][1]}/notify"
    return runner


class Setup:
    def __init__(self, og: OperatorGateway, clock: ManualClock, sub: Subscriber, http: aiohttp.ClientSession,
                 channel: Any, exchange: Any) -> None:
        self.og, self.clock, self.sub, self.http, self.channel, self.exchange = og, clock, sub, http, channel, exchange

    async def subscribe(self, name: str, strategy: str, **extra: Any) -> dict[str, Any]:
        body = {"subscriptionName": name, "protocol": "http", "endpoint": self.sub.url,
                "notifyStrategy": strategy, **extra}
        async with self.http.post(f"{self.og.management_url}/api/cmq/topics/%2F/orders/subscriptions",
                                  json=body) as r:
            assert r.status == 201, await r.text()
            return dict(await r.json())

    async def publish(self, body: bytes, routing_key: str = "paid") -> None:
        await self.exchange.publish(aio_pika.Message(body), routing_key=routing_key)

    async def settle(self) -> dict[str, Any]:
        record = await self.sub.next()
        await asyncio.wait_for(self.og.pusher.idle(), WAIT)
        return record

    def advance(self, seconds: float) -> None:
        self.og.broker.advance_time(seconds)

    @property
    def topic(self) -> Any:
        return self.og.broker.vhosts["/"].exchanges["orders"].topic

    async def subscription_view(self, name: str) -> dict[str, Any]:
        async with self.http.get(f"{self.og.management_url}/api/cmq/topics/%2F/orders/subscriptions") as r:
            assert r.status == 200
            return next(s for s in await r.json() if s["subscriptionName"] == name)


@pytest_asyncio.fixture(loop_scope="function")
async def setup_factory() -> AsyncIterator[Any]:
    stack: list[Any] = []

    async def make(fail_first: int, fail_status: int = 500) -> Setup:
        clock = ManualClock()
        sub = Subscriber(clock, fail_first, fail_status)
        runner = await _serve(sub)
        cm = operator_gateway(clock=clock, push=LOOPBACK_PUSH)
        og = await cm.__aenter__()
        http = aiohttp.ClientSession(headers=AUTH)
        conn = await aio_pika.connect(og.amqp_url)
        channel = await conn.channel(publisher_confirms=True)
        exchange = await channel.declare_exchange("orders", aio_pika.ExchangeType.DIRECT)
        stack.extend([(conn.close, ()), (http.close, ()), (cm.__aexit__, (None, None, None)),
                      (runner.cleanup, ())])
        return Setup(og, clock, sub, http, channel, exchange)

    yield make
    for fn, args in stack:
        await fn(*args)


async def test_D7_json_notify_body_headers_and_success_only_on_200(setup_factory: Any) -> None:
    """D7: one POST per message in CMQ's JSON notify format; 200 settles it, nothing retained."""
    s = await setup_factory(fail_first=0)
    await s.subscribe("paid-hook", "EXPONENTIAL_DECAY_RETRY", filterTag=["paid"])
    await s.publish(b'{"order": 7}')
    record = await s.settle()
    notice = json.loads(record["body"])
    assert set(notice) == {"TopicOwner", "topicName", "subscriptionName", "msgId", "msgBody", "publishTime",
                           "msgTag"}
    assert (notice["topicName"], notice["subscriptionName"], notice["msgBody"], notice["msgTag"],
            notice["publishTime"]) == ("orders", "paid-hook", '{"order": 7}', ["paid"], 1_700_000_000)
    assert notice["msgId"].startswith("msg-")
    headers = record["headers"]
    assert (headers["x-cmq-message-id"], headers["x-cmq-message-tag"], headers["Content-Type"],
            headers["User-Agent"]) == (notice["msgId"], "paid", "text/plain", "Qcloud Notification Service Agent")
    assert s.topic.retained_count == 0
    view = await s.subscription_view("paid-hook")
    assert (view["protocol"], view["endpoint"], view["msgCount"], view["head"]) == ("http", s.sub.url, 0, None)


async def test_D7_a_tag_the_subscription_does_not_take_is_never_pushed(setup_factory: Any) -> None:
    """D7 + T1/T2: a message with another tag is not pushed and not retained."""
    s = await setup_factory(fail_first=0)
    await s.subscribe("paid-hook", "EXPONENTIAL_DECAY_RETRY", filterTag=["paid"])
    await s.publish(b"x", routing_key="refunded")
    await s.publish(b"y", routing_key="paid")
    record = await s.settle()
    assert json.loads(record["body"])["msgBody"] == "y"
    assert len(s.sub.requests) == 1 and s.topic.retained_count == 0


async def test_D7_status_204_is_a_failure_and_is_retried(setup_factory: Any) -> None:
    """D7: success only on HTTP status 200 (the seed); a 204 is retried after 1 s (D6)."""
    s = await setup_factory(fail_first=1, fail_status=204)
    await s.subscribe("hook", "EXPONENTIAL_DECAY_RETRY")
    await s.publish(b"m")
    first = await s.settle()
    assert s.topic.retained_count == 1
    s.advance(1)
    second = await s.settle()
    assert second["at"] - first["at"] == 1.0
    assert s.topic.retained_count == 0


async def test_D6_exponential_decay_retry_times_exactly(setup_factory: Any) -> None:
    """D6: after failures the retries come 1, 2, 4, ... 512, 512, 512 s apart; the subscription's
    waiting count and head state are visible meanwhile (D9); success deletes the message (D2)."""
    fails = 12
    s = await setup_factory(fail_first=fails)
    await s.subscribe("hook", "EXPONENTIAL_DECAY_RETRY")
    await s.publish(b"m")
    times = [(await s.settle())["at"]]
    expected = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 512, 512]
    for i, wait in enumerate(expected):
        view = await s.subscription_view("hook")
        assert (view["msgCount"], view["head"]["attempts"], view["head"]["nextRetryTime"]) == (
            1, i + 1, times[-1] + wait)
        s.advance(wait - 0.25)
        assert (s.og.pusher.in_flight, len(s.sub.requests)) == (0, i + 1)  # not yet due
        s.advance(0.25)
        assert s.og.pusher.in_flight == 1
        times.append((await s.settle())["at"])
    assert [b - a for a, b in zip(times, times[1:], strict=False)] == expected
    assert len(s.sub.requests) == fails + 1
    assert s.topic.retained_count == 0
    assert (await s.subscription_view("hook"))["msgCount"] == 0


async def test_D6_176_retries_then_given_up(setup_factory: Any) -> None:
    """D6: a subscriber that always fails gets 1 + 176 pushes over 86,015 s, then the message
    is given up (discard retries_exhausted in the metrics) and leaves the topic."""
    s = await setup_factory(fail_first=10_000)
    await s.subscribe("hook", "EXPONENTIAL_DECAY_RETRY")
    await s.publish(b"m")
    start = (await s.settle())["at"]
    for wait in exp_decay_schedule():
        s.advance(wait)
        await s.settle()
    assert len(s.sub.requests) == 177
    assert s.sub.requests[-1]["at"] - start == 86_015
    assert s.topic.retained_count == 0
    async with s.http.get(f"{s.og.metrics_url}/metrics") as r:
        text = await r.text()
    assert 'cmq_gateway_discarded_total{vhost="/",reason="retries_exhausted"} 1' in text
    assert 'cmq_gateway_retries_total{vhost="/",policy="EXPONENTIAL_DECAY_RETRY",attempt="177"} 1' in text
    s.advance(1_000)
    assert s.og.pusher.in_flight == 0 and len(s.sub.requests) == 177


async def test_D5_backoff_retry_three_times_10_to_20s_then_next_message(setup_factory: Any) -> None:
    """D5: a failed push is retried 3 times, each 10-20 s after the failure, at exactly the
    scheduled time; then dropped for the subscription, and the next message (blocked behind
    it meanwhile) is pushed at once."""
    s = await setup_factory(fail_first=4)
    await s.subscribe("hook", "BACKOFF_RETRY")
    await s.publish(b"first")
    await s.settle()
    await s.publish(b"second")  # blocked behind the failing head: not pushed
    assert (s.og.pusher.in_flight, len(s.sub.requests)) == (0, 1)
    view = await s.subscription_view("hook")
    assert view["msgCount"] == 2
    first_id = view["blockedBy"]
    waits = []
    for attempt in (1, 2, 3):
        state = s.topic.state(first_id)["hook"]
        wait = state.next_at - s.clock.now()
        assert (state.attempts, 10 <= wait <= 20) == (attempt, True)
        waits.append(wait)
        s.advance(wait - 0.001)
        assert len(s.sub.requests) == attempt
        s.advance(0.001)
        record = await s.settle()
        assert json.loads(record["body"])["msgBody"] == "first"
    # The third retry failed: "first" is given up and "second" goes out at once.
    assert s.topic.state(first_id) == {}
    second = s.sub.requests[4]
    assert (json.loads(second["body"])["msgBody"], second["at"]) == ("second", s.sub.requests[3]["at"])
    assert s.topic.retained_count == 0
    assert len(waits) == 3


async def test_D7_http_subscription_errors_name_the_rule(setup_factory: Any) -> None:
    """D7/L1/L3: a bad URL, name or too many tags are refused with 400 and the rule (the
    tags: in the cmq profile, PF2)."""
    s = await setup_factory(fail_first=0)
    s.og.broker.set_vhost_profile("/", "cmq")
    url = f"{s.og.management_url}/api/cmq/topics/%2F/orders/subscriptions"
    cases = [({"subscriptionName": "hook", "endpoint": "ftp://x"}, None),
             ({"subscriptionName": "a:b", "endpoint": s.sub.url}, "L1"),
             ({"subscriptionName": "hook", "endpoint": s.sub.url, "filterTag": list("abcdef")}, "L3")]
    got = []
    for body, _ in cases:
        async with s.http.post(url, json=body) as r:
            got.append((r.status, (await r.json()).get("rule")))
    assert got == [(400, None), (400, "L1"), (400, "L3")]
    async with s.http.post(url.replace("orders", "nope"), json=cases[0][0]) as r:
        assert r.status == 404
