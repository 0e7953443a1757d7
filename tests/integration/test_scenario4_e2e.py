"""Seed scenario 4 (cmq-tag-matching-en.md, topic ``test1``) end to end: AMQP publishers and
consumers, real HTTP subscribers, the gateway's scheduler on a ManualClock, and the CMQ
management views read over HTTP (SPEC D2, D3, D6, D7, D8, D9).

Why a ``direct`` exchange: the seed is the *tag-matching* document, and scenario 4 is a
tag-filtering topic whose three subscribers take every message. ``direct`` is exactly CMQ's
tag-filtering topic (M2): a subscription without tags (HTTP subscriptions without
``filterTag``, and C's AMQP binding with the key ``""``) takes every message, tagged or not
(T1). The messages carry the scenario-1 tags (routing key ``apple`` plus ``x-cmq-tags``),
which changes nothing for untagged subscribers, as the seed's rule summary (row B) says. A
``fanout`` (M4) would route the same, but would not be the tag topic the seed describes.

The subscribers, messages numbered 1-200 at "12:01" and 201-300 at "12:02":

* A: an HTTP endpoint that fails every message from the 101st on ("A fails 100", and after
  12:01 "A will not respond"); EXPONENTIAL_DECAY_RETRY (the default).
* B: an HTTP endpoint that fails messages 91-120 ("B fails 30", 20 of them also failed by A,
  so 110 distinct messages are retained) and, not responding, every new message.
* C: a queue bound to the exchange, consumed by aio-pika; it takes everything.

The expected numbers come from the rules and the seed, as the pure model proves them in
tests/unit/semantics/test_tag_scenarios.py (scenario 4), not from the gateway's output:

* 12:01: C has 200; A was pushed each of the 200 once, 100 succeeded; B 30 failed; the topic
  retains 110 (D2); A waits for 100, B for 30 (D9).
* Blocking (D6, the seed's exponential decay paragraph: "if a message fails, it will be
  retried. If it fails again, subsequent messages will be blocked"): the 101st is retried 1 s
  later, fails again and blocks A; the later 99 are not pushed again while A blocks. By 12:02
  the 101st was pushed at +0, +1, +3, +7, +15, +31 s (D6's 2^0, 2^1, ... waits), the others
  once. B likewise behind its 91st.
* 12:02, republish (D8): 100 new messages; C receives only these (300 in all, each once); A
  and B are blocked, so the new ones are not pushed and are kept: 210 retained, A waits for
  200, B for 130.
* The 101st (91st for B) uses up its 176 retries at 12:01 + 86,015 s and is given up (D6).
  At 12:01 + 86,400 s the rest of the first batch expires for everybody (D3: the retries
  never extended it): 99 expiries for A, 29 for B, the 100 new ones remain retained. At
  12:02 + 86,400 s the second batch expires: 100 for A, 100 for B, nothing retained.

Every mismatch with these numbers is collected and reported together at the end, so that
one run shows everything in which the gateway differs from the seed.
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from typing import Any

import aio_pika
import aiohttp
from aiohttp import web

from gateway.management.testing import LOOPBACK_PUSH, operator_gateway
from semantics.clock import ManualClock
from semantics.retry import exp_decay_schedule

NOON_01 = 1_700_049_660.0   # 2023-11-15 12:01:00 UTC: "publishing test1"
NOON_02 = NOON_01 + 60.0    # 12:02: the republish
DAY = 86_400                # D3 / L7: the topic message lifecycle
WAIT = 10.0                 # hang protection only, never a timing assertion
TOPIC = "test1"
TAGS = ["imac", "iphone", "macbook"]  # with the routing key "apple": scenario 1's four tags
AUTH = aiohttp.BasicAuth("guest", "guest")


class Endpoint:
    """A real HTTP subscriber: answers 500 to the message numbers ``fails(n)`` says, else 200."""

    def __init__(self, clock: ManualClock, fails: Any) -> None:
        self.clock = clock
        self.fails = fails
        self.pushes: list[tuple[int, float, bool, str]] = []  # (number, clock time, ok, msgId)
        self.url = ""

    async def handle(self, request: web.Request) -> web.Response:
        notice = json.loads(await request.read())
        n = int(notice["msgBody"])
        ok = not self.fails(n)
        self.pushes.append((n, self.clock.now(), ok, notice["msgId"]))
        return web.Response(status=200 if ok else 500, text="ok" if ok else "no")

    def tries(self) -> Counter[int]:
        return Counter(n for n, *_ in self.pushes)

    def times(self, n: int) -> list[float]:
        return [t - NOON_01 for m, t, *_ in self.pushes if m == n]

    def msg_id(self, n: int) -> str:
        return next(i for m, _, _, i in self.pushes if m == n)


async def serve(ep: Endpoint) -> web.AppRunner:
    app = web.Application()
    app.router.add_post("/notify", ep.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    ep.url = f"http://127.0.0.1:{runner.addresses[0][1]}/notify"
    return runner


class Diffs:
    """Collects (what, got, expected) mismatches; the test fails at the end with all of them."""

    def __init__(self) -> None:
        self.items: list[str] = []

    def check(self, what: str, got: Any, expected: Any) -> None:
        if got != expected:
            self.items.append(f"{what}: got {got!r}, expected {expected!r}")


async def test_D2_D3_D6_D7_D8_D9_scenario_4_amqp_and_http_subscribers_end_to_end() -> None:
    """D2/D3/D6/D7/D8/D9: seed scenario 4 over AMQP (publisher confirms, a consumed queue C)
    and two real HTTP subscribers A and B (module docstring for the expected numbers)."""
    d = Diffs()
    clock = ManualClock(NOON_01)
    a = Endpoint(clock, lambda n: n > 100)
    b = Endpoint(clock, lambda n: 91 <= n <= 120 or n > 200)
    runners = [await serve(a), await serve(b)]
    try:
        async with operator_gateway(clock=clock, push=LOOPBACK_PUSH) as og, aiohttp.ClientSession(auth=AUTH) as http:
            broker = og.broker
            api = f"{og.management_url}/api/cmq/topics/%2F/{TOPIC}"

            async def get(url: str) -> Any:
                async with http.get(url) as r:
                    assert r.status == 200, await r.text()
                    return await r.json()

            async def view() -> dict[str, Any]:
                """D9 over HTTP: the topic's retained count and each subscription's."""
                topic = await get(api)
                label = {a.url: "A", b.url: "B", "C": "C"}
                subs = {label[s["endpoint"]]: s for s in await get(f"{api}/subscriptions")}
                return {"retained": topic["msgCount"],
                        **{f"waiting {k}": s["msgCount"] for k, s in sorted(subs.items())},
                        **{f"blocked {k}": s["blockedBy"] for k, s in sorted(subs.items())}}

            async def settle() -> None:
                await asyncio.wait_for(og.pusher.idle(), WAIT)

            async def run_until(end: float) -> None:
                """Move the clock from deadline to deadline up to ``end``, letting every push
                report its outcome at the instant it was made (as test_http_push.py does)."""
                for _ in range(20_000):  # hang protection
                    nxt = broker.scheduler.next_deadline()
                    if nxt is None or nxt > end:
                        break
                    broker.advance_time(max(0.0, nxt - clock.now()))
                    await settle()
                else:
                    raise AssertionError("the scheduler never went quiet")
                broker.advance_time(end - clock.now())
                await settle()

            conn = await aio_pika.connect(og.amqp_url)
            try:
                channel = await conn.channel(publisher_confirms=True)
                exchange = await channel.declare_exchange(TOPIC, aio_pika.ExchangeType.DIRECT)
                for name, ep in (("subscriber-A", a), ("subscriber-B", b)):  # L1: 3-64 bytes
                    async with http.post(f"{api}/subscriptions",
                                         json={"subscriptionName": name, "protocol": "http",
                                               "endpoint": ep.url}) as r:
                        assert r.status == 201, await r.text()
                        assert (await r.json())["notifyStrategy"] == "EXPONENTIAL_DECAY_RETRY"
                queue_c = await channel.declare_queue("C", durable=False)
                await queue_c.bind(exchange, routing_key="")  # no tags: takes everything (T1)
                c_got: list[int] = []
                c_more = asyncio.Event()

                async def on_c(message: aio_pika.abc.AbstractIncomingMessage) -> None:
                    c_got.append(int(message.body))
                    await message.ack()
                    c_more.set()

                consumer_ch = await conn.channel()
                await (await consumer_ch.get_queue("C")).consume(on_c)

                async def c_drained(count: int) -> None:
                    """C has ``count`` deliveries and the gateway has every ack (nothing Inactive)."""
                    async def wait() -> None:
                        while True:
                            q = await get(f"{og.management_url}/api/cmq/queues/%2F/C")
                            if len(c_got) >= count and q["activeMsgNum"] == q["inactiveMsgNum"] == 0:
                                return
                            c_more.clear()
                            try:
                                await asyncio.wait_for(c_more.wait(), 0.05)
                            except TimeoutError:
                                pass
                    await asyncio.wait_for(wait(), WAIT)

                async def publish(numbers: range) -> None:
                    for n in numbers:  # each confirmed (M14) before the next
                        await exchange.publish(
                            aio_pika.Message(str(n).encode(), headers={"x-cmq-tags": TAGS}),
                            routing_key="apple")
                    await settle()

                # -- 12:01: publishing test1 ---------------------------------------------------
                await publish(range(1, 201))
                await c_drained(200)
                d.check("12:01 C received", Counter(c_got), Counter(range(1, 201)))
                d.check("12:01 A pushes", a.tries(), Counter(range(1, 201)))
                d.check("12:01 A successes", sorted(n for n, _, ok, _ in a.pushes if ok), list(range(1, 101)))
                d.check("12:01 B pushes", b.tries(), Counter(range(1, 201)))
                d.check("12:01 B failures", sorted(n for n, _, ok, _ in b.pushes if not ok), list(range(91, 121)))
                d.check("12:01 views (D9)", await view(),
                        {"retained": 110, "waiting A": 100, "waiting B": 30, "waiting C": 0,
                         "blocked A": None, "blocked B": None, "blocked C": None})
                d.check("12:01 Topic.retained_count",
                        broker.vhosts["/"].exchanges[TOPIC].topic.retained_count, 110)

                # -- 12:01 -> 12:02: retries on D6's schedule, A and B keep failing --------------
                await run_until(NOON_02)
                first_retries = [0.0, 1.0, 3.0, 7.0, 15.0, 31.0]
                d.check("by 12:02 pushes of A's 101st (s after 12:01)", a.times(101), first_retries)
                d.check("by 12:02 pushes of B's 91st (s after 12:01)", b.times(91), first_retries)
                d.check("by 12:02 A's 102nd-200th pushed more than once (while A blocks)",
                        spans(n for n, k in a.tries().items() if n > 101 and k != 1), "")
                d.check("by 12:02 B's 92nd-120th pushed more than once (while B blocks)",
                        spans(n for n, k in b.tries().items() if n > 91 and k != 1), "")
                d.check("by 12:02 A pushes", len(a.pushes), 200 + 5)
                d.check("by 12:02 B pushes", len(b.pushes), 200 + 5)
                d.check("by 12:02 views (D9)", await view(),
                        {"retained": 110, "waiting A": 100, "waiting B": 30, "waiting C": 0,
                         "blocked A": a.msg_id(101), "blocked B": b.msg_id(91), "blocked C": None})

                # -- 12:02: republish (D8) -------------------------------------------------------
                a_before, b_before = len(a.pushes), len(b.pushes)
                await publish(range(201, 301))
                await c_drained(300)
                d.check("12:02 C received in all (each once)", Counter(c_got), Counter(range(1, 301)))
                d.check("12:02 new pushes to blocked A", a.pushes[a_before:], [])
                d.check("12:02 new pushes to blocked B", b.pushes[b_before:], [])
                d.check("12:02 views (D9)", await view(),
                        {"retained": 210, "waiting A": 200, "waiting B": 130, "waiting C": 0,
                         "blocked A": a.msg_id(101), "blocked B": b.msg_id(91), "blocked C": None})

                # -- a day after 12:01: D6's last retry, then D3 ----------------------------------
                give_up = sum(exp_decay_schedule())  # 86,015 s: the 101st's 176 retries
                await run_until(NOON_01 + give_up)
                expected_101 = [0.0]
                for wait in exp_decay_schedule():
                    expected_101.append(expected_101[-1] + wait)
                d.check("pushes of A's 101st (D6: 177, the last at +86,015 s)", a.times(101), expected_101)
                d.check("pushes of B's 91st (D6: 177, the last at +86,015 s)", b.times(91), expected_101)
                await run_until(NOON_01 + DAY)
                d.check("12:01 + 1 day: discards", await discards(http, og.metrics_url),
                        {"retries_exhausted": 2, "expired": 99 + 29})
                d.check("12:01 + 1 day: views (D3, D9)", {k: v for k, v in (await view()).items()
                                                          if not k.startswith("blocked")},
                        {"retained": 100, "waiting A": 100, "waiting B": 100, "waiting C": 0})
                d.check("12:01 + 1 day: C received nothing more", len(c_got), 300)

                # -- a day after 12:02: the second batch ends too (D3) ---------------------------
                await run_until(NOON_02 + DAY - 0.001)
                d.check("just before 12:02 + 1 day: retained", (await view())["retained"], 100)
                await run_until(NOON_02 + DAY)
                d.check("12:02 + 1 day: discards", await discards(http, og.metrics_url),
                        {"retries_exhausted": 2, "expired": 99 + 29 + 100 + 100})
                d.check("12:02 + 1 day: views (D3, D9)", await view(),
                        {"retained": 0, "waiting A": 0, "waiting B": 0, "waiting C": 0,
                         "blocked A": None, "blocked B": None, "blocked C": None})
                late = max(t for _, t, *_ in a.pushes + b.pushes)
                d.check("no push after a message's lifecycle", late <= NOON_02 + DAY, True)
                d.check("C in all", Counter(c_got), Counter(range(1, 301)))
            finally:
                await conn.close()
    finally:
        for runner in runners:
            await runner.cleanup()
    assert not d.items, "scenario 4 differs from the seed:\n" + "\n".join(d.items)


def spans(numbers: Any) -> str:
    """``1-3,7``: message numbers as ranges, for short failure reports."""
    out: list[list[int]] = []
    for n in sorted(numbers):
        if out and n == out[-1][1] + 1:
            out[-1][1] = n
        else:
            out.append([n, n])
    return ",".join(f"{lo}-{hi}" if hi > lo else str(lo) for lo, hi in out)


async def discards(http: aiohttp.ClientSession, metrics_url: str) -> dict[str, int]:
    """The vhost's topic discards by reason, from the Prometheus endpoint (A1, D3, D6)."""
    async with http.get(f"{metrics_url}/metrics") as r:
        text = await r.text()
    out: dict[str, int] = {}
    for line in text.splitlines():
        if line.startswith('cmq_gateway_discarded_total{vhost="/",reason="'):
            reason = line.split('reason="')[1].split('"')[0]
            if reason in ("retries_exhausted", "expired"):
                out[reason] = int(float(line.rsplit(" ", 1)[1]))
    return out
