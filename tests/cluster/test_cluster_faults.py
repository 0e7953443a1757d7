"""CL3 and CL4 under faults: gateways killed with SIGKILL, NATS servers killed, the whole NATS
cluster restarted, and the timers and queue kinds (visibility, exclusive, auto-delete, single
active consumer) that must behave as on one gateway when several serve one queue.

Counting follows scripts/crash_trials.py: a confirmed message is lost when it is neither acked
by a consumer nor found by the final drain; a message whose confirm never came is not lost.
"""

from __future__ import annotations

import asyncio
import threading
import time

import pika
import pika.exceptions
import pytest

from tests.support import cluster_load
from tests.support.amqp_checks import connection, drain, eventually, passive_queue, publish_confirmed
from tests.support.gateway_procs import GatewayGroup
from tests.support.natsd import NatsCluster

SEEN_WITHIN = 10.0


def _declare(url: str, name: str, **arguments: object) -> None:
    with connection(url) as conn:
        conn.channel().queue_declare(name, durable=True, arguments=arguments or None)


# --- a killed gateway -----------------------------------------------------------------------

def test_CL3_a_killed_gateways_unacked_deliveries_come_back_after_the_visibility_timeout(
        nats_cluster: NatsCluster, spawn_gateways, unique: str) -> None:  # type: ignore[no-untyped-def]
    gw1, gw2 = spawn_gateways(nats_cluster.store_url, 2)
    vt = 3
    _declare(gw1.url, unique, **{"x-cmq-visibility-timeout": vt})
    eventually(lambda: passive_queue(gw2.url, unique) == (0, 0), SEEN_WITHIN)
    bodies = [b"held%02d" % i for i in range(10)]
    publish_confirmed(gw2.url, "", unique, bodies)
    # A consumer on gw1 takes all ten and acks none.
    conn = pika.BlockingConnection(pika.URLParameters(gw1.url))
    ch = conn.channel()
    ch.basic_qos(prefetch_count=10)
    held = []
    for method, _, body in ch.consume(unique, inactivity_timeout=10):
        assert method is not None, f"gw1 delivered only {held}"
        held.append(body)
        if len(held) == 10:
            break
    gw1.kill9()  # no channel.close reaches anyone: nothing is requeued at once
    try:
        conn.close()
    except Exception:  # noqa: S110  # the gateway is gone: nobody to say goodbye to
        pass
    got = drain(gw2.url, unique, expect=10, timeout=vt + 30)
    assert sorted(b for b, _ in got) == bodies, got  # each once: the drain waits for duplicates
    assert all(redelivered for _, redelivered in got), got  # receive count 2 (M11)
    # The restarted gateway does not hand them out a third time.
    gw1.start()
    assert drain(gw1.url, unique, expect=1, timeout=vt + 2) == []


def test_CL3_unacked_deliveries_of_a_killed_gateway_are_not_back_before_the_visibility_timeout(
        nats_cluster: NatsCluster, spawn_gateways, unique: str) -> None:  # type: ignore[no-untyped-def]
    """Q2 across a crash: until the visibility timeout the message is Inactive everywhere, so
    no other gateway delivers it while the dead one might still have been processing it."""
    gw1, gw2 = spawn_gateways(nats_cluster.store_url, 2)
    vt = 6
    _declare(gw1.url, unique, **{"x-cmq-visibility-timeout": vt})
    publish_confirmed(gw1.url, "", unique, [b"one"])
    with connection(gw1.url) as conn:
        method, _, body = eventually(lambda: conn.channel().basic_get(unique), SEEN_WITHIN)
        got_at = time.monotonic()
        gw1.kill9()
    early = drain(gw2.url, unique, expect=1, timeout=max(0.5, vt - 2 - (time.monotonic() - got_at)))
    assert early == [], f"delivered again {time.monotonic() - got_at:.1f}s after the receive, before VT {vt}"
    late = drain(gw2.url, unique, expect=1, timeout=vt + 15)
    assert late == [(b"one", True)]


# --- timers fire once -----------------------------------------------------------------------

def test_CL4_a_visibility_timeout_fires_once_across_three_gateways(
        cluster_gateways: GatewayGroup, unique: str) -> None:
    """The message received on gw1 and not acked becomes Active once: exactly one of the
    consumers waiting on gw2 and gw3 gets it; after that consumer acks, nobody gets it again.
    gw1's late ack is stale (Q3): no error, deletes nothing more."""
    gw1, gw2, gw3 = cluster_gateways
    vt = 2
    _declare(gw1.url, unique, **{"x-cmq-visibility-timeout": vt})
    for gw in (gw2, gw3):
        eventually(lambda gw=gw: passive_queue(gw.url, unique) == (0, 0), SEEN_WITHIN)
    publish_confirmed(gw3.url, "", unique, [b"once"])
    got: dict[str, list[tuple[bytes, bool]]] = {"gw2": [], "gw3": []}
    stop = threading.Event()

    def consume(url: str, into: list) -> None:  # type: ignore[type-arg]
        with connection(url) as c:
            ch = c.channel()
            ch.basic_qos(prefetch_count=1)
            for method, _, body in ch.consume(unique, inactivity_timeout=0.2):
                if method is not None:
                    into.append((body, method.redelivered))
                    ch.basic_ack(method.delivery_tag)
                if stop.is_set():
                    break
            ch.cancel()

    with connection(gw1.url) as conn:
        ch1 = conn.channel()
        m1 = eventually(lambda: ch1.basic_get(unique)[0], SEEN_WITHIN)
        threads = [threading.Thread(target=consume, args=(g.url, got[k])) for k, g in (("gw2", gw2), ("gw3", gw3))]
        for t in threads:
            t.start()
        eventually(lambda: got["gw2"] or got["gw3"], vt + 15, what="redelivery after the visibility timeout")
        time.sleep(2 * vt + 1)  # a second firing would deliver it again by now
        stop.set()
        for t in threads:
            t.join(30)
        ch1.basic_ack(m1.delivery_tag)  # stale
        assert ch1.queue_declare(unique, passive=True).method.message_count == 0  # channel still open
    assert sorted(got["gw2"] + got["gw3"]) == [(b"once", True)], got


def test_CL4_Q4_a_delayed_message_is_delivered_once_when_its_delay_ends(
        cluster_gateways: GatewayGroup, unique: str) -> None:
    gw1, gw2, gw3 = cluster_gateways
    _declare(gw1.url, unique)
    for gw in (gw2, gw3):
        eventually(lambda gw=gw: passive_queue(gw.url, unique) == (0, 0), SEEN_WITHIN)
    with connection(gw1.url) as conn:
        ch = conn.channel()
        ch.confirm_delivery()
        ch.basic_publish("", unique, b"later", pika.BasicProperties(delivery_mode=2, headers={"x-delay": 2000}))
        sent = time.monotonic()
    results: dict[str, list[tuple[bytes, bool]]] = {}

    def take(key: str, url: str) -> None:
        results[key] = drain(url, unique, expect=1, timeout=8)

    threads = [threading.Thread(target=take, args=(k, g.url)) for k, g in (("gw2", gw2), ("gw3", gw3))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert time.monotonic() - sent >= 1.9
    everything = results["gw2"] + results["gw3"]
    assert [b for b, _ in everything] == [b"later"], results
    # Q4 then M11: the first receive of a delayed message is not a redelivery.
    assert everything[0][1] is False, results


# --- exclusive, auto-delete, single active consumer ------------------------------------------

def test_CL4_an_exclusive_queue_is_locked_on_other_gateways_and_goes_with_its_connection(
        cluster_gateways: GatewayGroup, unique: str) -> None:
    gw1, gw2, gw3 = cluster_gateways
    owner = pika.BlockingConnection(pika.URLParameters(gw1.url))
    try:
        owner.channel().queue_declare(unique, exclusive=True)
        # Another gateway's client: declare, consume and get are 405 RESOURCE_LOCKED.
        def locked(action) -> int:  # type: ignore[no-untyped-def]
            with connection(gw2.url) as c:
                ch = c.channel()
                try:
                    action(ch)
                except pika.exceptions.ChannelClosedByBroker as e:
                    return e.reply_code
                return 200

        assert eventually(lambda: locked(lambda ch: ch.queue_declare(unique, passive=True)) == 405,
                          SEEN_WITHIN, what="passive declare of another's exclusive queue")
        assert locked(lambda ch: ch.queue_declare(unique, exclusive=True)) == 405
        assert locked(lambda ch: ch.basic_consume(unique, lambda *a: None)) == 405
        assert locked(lambda ch: ch.basic_get(unique)) == 405
        # Publishing to it from elsewhere is allowed (as in RabbitMQ) and reaches the owner.
        publish_confirmed(gw3.url, "", unique, [b"to the owner"])
        och = owner.channel()
        m = eventually(lambda: och.basic_get(unique, auto_ack=True)[2], SEEN_WITHIN)
        assert m == b"to the owner"
    finally:
        owner.close()
    for gw in (gw2, gw3):
        eventually(lambda gw=gw: passive_queue(gw.url, unique) == 404, SEEN_WITHIN,
                   what=f"the exclusive queue gone on {gw.name} once its connection closed")


def test_CL4_an_exclusive_queue_goes_with_its_killed_gateway(
        nats_cluster: NatsCluster, spawn_gateways, unique: str) -> None:  # type: ignore[no-untyped-def]
    """As in a RabbitMQ cluster, where an exclusive queue is deleted with its owner's node:
    after the owner gateway dies no client could ever use the queue again, and its name
    would stay locked (405) for everyone."""
    gw1, gw2 = spawn_gateways(nats_cluster.store_url, 2)
    owner = pika.BlockingConnection(pika.URLParameters(gw1.url))
    owner.channel().queue_declare(unique, exclusive=True)
    eventually(lambda: passive_queue(gw2.url, unique) == 405, SEEN_WITHIN)
    gw1.kill9()
    with pytest.raises(Exception):  # noqa: B017  # the socket is dead: any pika error
        owner.close()
    # A generous bound: whatever liveness check the gateways use, a minute is plenty.
    eventually(lambda: passive_queue(gw2.url, unique) == 404, 60, interval=1.0,
               what="the dead gateway's exclusive queue deleted")
    with connection(gw2.url) as conn:
        conn.channel().queue_declare(unique, exclusive=True)  # the name is free again


def test_CL4_an_auto_delete_queue_lives_while_any_gateway_has_a_consumer(
        cluster_gateways: GatewayGroup, unique: str) -> None:
    gw1, gw2, _ = cluster_gateways
    c1 = pika.BlockingConnection(pika.URLParameters(gw1.url))
    c2 = pika.BlockingConnection(pika.URLParameters(gw2.url))
    try:
        ch1 = c1.channel()
        ch1.queue_declare(unique, auto_delete=True)
        tag1 = ch1.basic_consume(unique, lambda *a: None)
        ch2 = c2.channel()
        eventually(lambda: passive_queue(gw2.url, unique) not in (404,), SEEN_WITHIN)
        got: list[bytes] = []
        ch2.basic_consume(unique, lambda ch, m, p, b: (got.append(b), ch.basic_ack(m.delivery_tag)))
        ch1.basic_cancel(tag1)  # gw1's last consumer leaves; gw2's is still there
        time.sleep(1.0)
        assert passive_queue(gw1.url, unique) != 404, "deleted while gw2 still had a consumer"
        publish_confirmed(gw1.url, "", unique, [b"still here"])
        deadline = time.monotonic() + SEEN_WITHIN
        while not got and time.monotonic() < deadline:
            c2.process_data_events(0.2)
        assert got == [b"still here"]
        ch2.close()  # the last consumer anywhere: now it goes (as on one broker)
    finally:
        for c in (c1, c2):
            if c.is_open:
                c.close()
    eventually(lambda: passive_queue(gw1.url, unique) == 404, SEEN_WITHIN, what="auto-delete after the last consumer")


def test_CL4_single_active_consumer_across_gateways(cluster_gateways: GatewayGroup, unique: str) -> None:
    gw1, gw2, gw3 = cluster_gateways
    _declare(gw3.url, unique, **{"x-single-active-consumer": True})
    for gw in (gw1, gw2):
        eventually(lambda gw=gw: passive_queue(gw.url, unique) == (0, 0), SEEN_WITHIN)
    got: dict[str, list[bytes]] = {"gw1": [], "gw2": []}
    c1 = pika.BlockingConnection(pika.URLParameters(gw1.url))
    c2 = pika.BlockingConnection(pika.URLParameters(gw2.url))
    try:
        ch1, ch2 = c1.channel(), c2.channel()
        tag1 = ch1.basic_consume(unique, lambda ch, m, p, b: (got["gw1"].append(b), ch.basic_ack(m.delivery_tag)))
        c1.process_data_events(0.5)  # gw1's consumer is the first: the active one
        ch2.basic_consume(unique, lambda ch, m, p, b: (got["gw2"].append(b), ch.basic_ack(m.delivery_tag)))
        publish_confirmed(gw3.url, "", unique, [b"a%d" % i for i in range(10)])
        deadline = time.monotonic() + SEEN_WITHIN
        while len(got["gw1"]) + len(got["gw2"]) < 10 and time.monotonic() < deadline:
            c1.process_data_events(0.1)
            c2.process_data_events(0.1)
        assert (got["gw1"], got["gw2"]) == ([b"a%d" % i for i in range(10)], []), got
        ch1.basic_cancel(tag1)  # the active consumer leaves: gw2's takes over
        publish_confirmed(gw3.url, "", unique, [b"b%d" % i for i in range(5)])
        deadline = time.monotonic() + SEEN_WITHIN
        while len(got["gw2"]) < 5 and time.monotonic() < deadline:
            c1.process_data_events(0.1)
            c2.process_data_events(0.1)
        assert got["gw2"] == [b"b%d" % i for i in range(5)], got
    finally:
        for c in (c1, c2):
            if c.is_open:
                c.close()


# --- NATS servers killed ----------------------------------------------------------------------

def _stream_leaders(cluster: NatsCluster) -> dict[str, int]:
    """How many streams each live server leads (from /jsz of the server that answers)."""
    counts: dict[str, int] = {s.name: 0 for s in cluster.servers}
    for s in cluster.servers:
        if not s.running:
            continue
        jsz = s.jsz("?accounts=true&streams=true")
        for account in jsz.get("account_details") or []:
            for stream in account.get("stream_detail") or []:
                leader = (stream.get("cluster") or {}).get("leader")
                if leader in counts:
                    counts[leader] += 1
        return counts
    return counts


async def _two_gateways(cluster: NatsCluster, spawn_gateways, unique: str, n: int,  # type: ignore[no-untyped-def]
                       vt: int) -> tuple[list, list[str]]:
    """Two gateways on the cluster and ``n`` queues declared through the first, seen by the second."""
    gws = await asyncio.to_thread(spawn_gateways, cluster.store_url, 2)
    queues = [f"{unique}-{i}" for i in range(n)]
    await cluster_load.declare(gws[0].url, queues, vt)
    await cluster_load.wait_seen(gws[1].url, queues)
    return gws, queues


async def test_CL3_killing_one_of_three_nats_servers_under_load_loses_no_confirmed_message(
        fresh_nats_cluster: NatsCluster, spawn_gateways, unique: str) -> None:  # type: ignore[no-untyped-def]
    cluster = fresh_nats_cluster
    vt = 2
    gws, queues = await _two_gateways(cluster, spawn_gateways, unique, 3, vt)
    ledger = cluster_load.Ledger()
    leaders = _stream_leaders(cluster)
    victim = max(leaders, key=lambda n: leaders[n])  # the node leading the most streams
    killed_at = 0.0

    async def fault() -> None:
        nonlocal killed_at
        await asyncio.sleep(3)
        killed_at = time.monotonic()
        cluster.kill9(victim)

    await cluster_load.run_load([g.url for g in gws], [g.url for g in gws], queues, ledger, 10, unique, fault)
    ended = time.monotonic()
    found = await cluster_load.drain([g.url for g in gws], queues, idle=vt + 3, ledger=ledger)
    v = cluster_load.verdict(ledger, found)
    report = f"{v.line()}; killed {victim}; errors {ledger.errors[:5]}; slowest confirm {ledger.slowest_confirm:.1f}s"
    assert v.confirmed > 0 and v.lost == 0 and v.phantoms == 0, report + f"; lost {v.lost_ids}\n" + \
        "\n".join(g.log_tail(1500) for g in gws)
    # The gateways kept serving: confirms went on after the kill, no client was cut off.
    assert ledger.confirmed_between(killed_at + 1, ended) > 0, report
    assert all(g.running for g in gws), report
    assert not ledger.errors, report


async def test_CL3_restarting_the_whole_nats_cluster_loses_no_confirmed_message(
        fresh_nats_cluster: NatsCluster, spawn_gateways, unique: str) -> None:  # type: ignore[no-untyped-def]
    cluster = fresh_nats_cluster
    vt = 2
    gws, queues = await _two_gateways(cluster, spawn_gateways, unique, 2, vt)
    ledger = cluster_load.Ledger()
    # Publishers only: everything confirmed must still be there after the restart.
    await cluster_load.run_load([g.url for g in gws], [], queues, ledger, 4, unique + "-a")
    # SIGKILL all three, then start them on their dirs. After a kill of every replica, nats-server
    # 2.9 reports healthy only once each stream's Raft group caught up; on a loaded machine one
    # run here needed more than the harness's two minutes (a snapshot waits for catch-ups).
    await asyncio.to_thread(cluster.restart_all, timeout=300.0)
    # The gateways were not restarted: they reconnect to NATS and serve again.
    again = cluster_load.Ledger()
    deadline = time.monotonic() + 60
    while not again.confirmed and time.monotonic() < deadline:
        await cluster_load.run_load([gws[1].url], [], queues[:1], again, 1, unique + "-b")
    assert again.confirmed, f"no publish confirmed within 60 s of the restart: {again.errors[:5]}"
    found = await cluster_load.drain([g.url for g in gws], queues, idle=vt + 3, ledger=ledger)
    ledger.published |= again.published
    ledger.confirmed.update(again.confirmed)
    v = cluster_load.verdict(ledger, found)
    assert v.confirmed > 0 and v.lost == 0 and v.phantoms == 0 and v.duplicates == 0, \
        v.line() + f"; lost {v.lost_ids}\n" + "\n".join(g.log_tail(1500) for g in gws)
    assert all(g.running for g in gws)


def test_CL3_no_confirm_while_the_stream_has_no_quorum(
        fresh_nats_cluster: NatsCluster, spawn_gateways, unique: str) -> None:  # type: ignore[no-untyped-def]
    """A confirm means JetStream acknowledged the replicated write: with two of three servers
    down no write can be acknowledged, so no confirm (ack) may come; once they are back,
    publishing confirms again and the earlier confirmed messages are all there."""
    cluster = fresh_nats_cluster
    (gw,) = spawn_gateways(cluster.store_url, 1)
    _declare(gw.url, unique)
    publish_confirmed(gw.url, "", unique, [b"before"])
    down = [s.name for s in cluster.servers[:2]]
    for name in down:
        cluster.kill9(name)
    outcome = "no answer"
    try:
        with connection(gw.url, socket_timeout=10) as conn:
            ch = conn.channel()
            ch.confirm_delivery()
            done = threading.Event()
            result: list[str] = []

            def publish() -> None:
                try:
                    ch.basic_publish("", unique, b"during", pika.BasicProperties(delivery_mode=2))
                    result.append("ack")
                except pika.exceptions.NackError:
                    result.append("nack")
                except Exception as e:  # a closed channel or connection is an honest refusal
                    result.append(f"error {type(e).__name__}")
                done.set()

            # pika's blocking publish waits for the confirm: give it 5 s on a thread.
            t = threading.Thread(target=publish, daemon=True)
            t.start()
            done.wait(5)
            outcome = result[0] if result else "no answer"
    except Exception as e:
        outcome = f"error {type(e).__name__}"
    assert outcome != "ack", "confirmed a write that no quorum acknowledged"
    # Back up with a meta leader is enough here: whether the queue confirms again is what this
    # test checks next. nats-server 2.9 may report a consumer replica of the revived servers
    # "not current" for minutes after a quorum loss (seen under CI's load), which is not ours.
    assert sorted(cluster.revive(current=False)) == sorted(down)
    eventually(lambda: publish_confirmed(gw.url, "", unique, [b"after"]) is None, 120, interval=1.0,
               what="confirms again once the quorum is back")
    # The queue's consumer is a Raft group of its own: it delivers once it has a leader again,
    # which took 0.2-6 s here on a quiet machine after the stream confirmed again and longer
    # than 15 s under CI's load (a drain of 15 s found nothing). The gateway used 0.07 s of CPU
    # in 10 s without a consumer leader (no busy retry). Late is not lost: up to 120 s, as above.
    bodies: list[bytes] = []
    deadline = time.monotonic() + 120
    while not {b"before", b"after"} <= set(bodies) and time.monotonic() < deadline:
        bodies += [b for b, _ in drain(gw.url, unique, expect=3, timeout=5)]
    assert b"before" in bodies and b"after" in bodies, bodies
