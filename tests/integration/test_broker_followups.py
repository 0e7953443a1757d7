"""Broker follow-ups over the wire and as a process: store damage at start-up, W2
permissions inside a vhost, HTTP subscriptions across a restart, channel.flow."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pika
import pika.exceptions
import pytest

from gateway.auth import Permission, User, UserDB, hash_password
from gateway.broker import Broker, BrokerConfig
from gateway.broker import persistence as P
from gateway.protocol.properties import Properties
from gateway.push import HttpPusher
from gateway.server import gateway_in_thread
from semantics.clock import ManualClock
from semantics.store.files import segment_name
from tests.integration.differential import blocking
from tests.integration.test_http_push import Subscriber
from tests.integration.test_http_push import _serve as serve_subscriber

# Issue 14: these also run on the gateway on NATS JetStream (tests/conftest.py).
pytestmark = pytest.mark.both_stores

ROOT = Path(__file__).resolve().parents[2]
WAIT = 10.0  # hang protection only


def _serve(data_dir: Path, *extra: str) -> subprocess.Popen[str]:
    # Free management/metrics ports: the defaults (15672/15692) may be the local RabbitMQ's.
    return subprocess.Popen([sys.executable, "-m", "gateway", "serve", "--host", "127.0.0.1", "--port", "0",
                             "--data-dir", str(data_dir), "--management-port", "0", "--metrics-port", "0",
                             "--cmq-api-port", "0", "--mqtt-port", "off", *extra],
                            cwd=ROOT, stderr=subprocess.PIPE, text=True)


def _three_batches(data_dir: Path) -> list[int]:
    """A data dir whose journal holds three batches (three durable queues, one sync each);
    returns where each batch ends."""
    async def write() -> list[int]:
        b = await Broker.open(str(data_dir), clock=ManualClock(), config=BrokerConfig(fsync=False))
        ends = []
        for name in ("qa", "qb", "qc"):
            b.vhost("/").declare_queue(None, name, passive=False, durable=True, exclusive=False,
                                       auto_delete=False, arguments=None)
            b.sync_now()
            ends.append(os.path.getsize(data_dir / segment_name(1)))
        await b.close()
        # As a killed process leaves it: the tests damage the journal, which only a replay
        # checks (a clean stop's checkpoint skips it, semantics/store/checkpoint.py).
        for name in ("checkpoint.idx", "messages.cache"):
            os.unlink(data_dir / name)
        return ends
    return asyncio.run(write())


def test_corrupt_store_is_one_line_naming_the_file_and_salvage(tmp_path: Path) -> None:
    """semantics.store StoreCorruptError: a flipped byte in the middle batch of the journal
    (confirmed data) makes `cmq-gateway serve` exit 3 with one line naming the file, the
    damaged range and --salvage; nothing changes on disk. With --salvage it starts, logs
    store.recovery with the bytes set aside, and the other two queues are back."""
    ends = _three_batches(tmp_path)
    seg = tmp_path / segment_name(1)
    raw = bytearray(seg.read_bytes())
    at = (ends[0] + ends[1]) // 2
    raw[at] ^= 0xFF
    seg.write_bytes(bytes(raw))
    before = sorted(os.listdir(tmp_path))

    proc = _serve(tmp_path)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 3
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith(f"cmq-gateway: store damaged: {seg}: damaged durable data at offset "
                               f"{ends[0]}..{ends[1]} (")
    assert lines[0].endswith("); nothing was changed on disk; restart with --salvage (or salvage: true "
                             "in the config) to keep every record that verifies and set the damaged "
                             "bytes aside")
    assert "Traceback" not in err
    assert sorted(n for n in os.listdir(tmp_path) if n != "audit") == before  # audit/: the audit log

    proc = _serve(tmp_path, "--salvage")
    assert proc.stderr is not None
    seen = []
    for line in proc.stderr:
        seen.append(line)
        if "listening on" in line:
            break
    proc.terminate()
    proc.communicate(timeout=60)
    recovery = [ln for ln in seen if "store.recovery" in ln]
    assert len(recovery) == 1
    assert f" set_aside_bytes={ends[1] - ends[0]} " in recovery[0]
    assert recovery[0].rstrip().endswith(" damaged=1")

    async def reopen() -> list[str]:
        b = await Broker.open(str(tmp_path), clock=ManualClock(), config=BrokerConfig(fsync=False))
        names = sorted(b.vhosts["/"].queues)
        await b.close()
        return names
    assert asyncio.run(reopen()) == ["qa", "qc"]


async def test_D2_D7_retained_message_owed_only_to_http_subscription_survives_restart(tmp_path: Path) -> None:
    """D2/D7 + M14: a persistent message whose only subscription is an HTTP endpoint that
    failed is retained; after a restart the broker restores the HTTP subscription before the
    retained messages, so the push is made again (and succeeds) instead of the message being
    dropped."""
    clock = ManualClock(1_700_000_000.0)
    endpoint = Subscriber(clock, fail_first=1)
    runner = await serve_subscriber(endpoint)
    config = BrokerConfig(fsync=False)
    try:
        b = await Broker.open(str(tmp_path), clock=clock, config=config)
        vh = b.vhost("/")
        vh.declare_exchange("orders", "fanout", passive=False, durable=True, auto_delete=False, internal=False,
                            arguments=None)
        pusher = HttpPusher(b)
        pusher.subscribe("/", "orders", "hook", endpoint.url)
        out = vh.publish("orders", "", Properties.build(delivery_mode=2), b"owed")
        first = json.loads((await endpoint.next())["body"])
        await asyncio.wait_for(pusher.idle(), WAIT)
        assert (first["msgId"], first["msgBody"]) == (out.msg_id, "owed")
        topic = vh.exchanges["orders"].topic
        assert topic.state(out.msg_id)["hook"].status.value == "retrying"
        assert [k for k, _ in b.store.items(P.RETAINED_PREFIX)] == [P.retained_key("/", "orders", out.msg_id)]
        await b.close()

        b2 = await Broker.open(str(tmp_path), clock=clock, config=config)
        again = json.loads((await endpoint.next())["body"])
        await asyncio.wait_for(b2.http_pusher.idle(), WAIT)
        assert (again["msgId"], again["msgBody"], again["subscriptionName"]) == (out.msg_id, "owed", "hook")
        assert b2.vhosts["/"].exchanges["orders"].topic.state(out.msg_id) == {}  # delivered: gone (D2)
        assert list(b2.store.items(P.RETAINED_PREFIX)) == []
        assert len(endpoint.requests) == 2
        await b2.close()
    finally:
        await runner.cleanup()


# -- W2: permissions inside a vhost ------------------------------------------------------------

_USERS = UserDB({"guest": User("guest", hash_password("guest")), "u": User("u", hash_password("pw"))},
                {("guest", "/"): Permission(),
                 # u may configure and read u-*, write u-* and the default exchange
                 ("u", "/"): Permission("^u-", "^u-|^amq\\.default$", "^u-")},
                ["/"], frozenset())


def _refused(kind: str, name: str) -> str:
    return f"ACCESS_REFUSED - access to {kind} '{name}' in vhost '/' refused for user 'u'"


def test_W2_configure_write_read_checked_per_method_as_rabbitmq() -> None:
    """W2: RabbitMQ's access-control table: declare/delete need configure; publish needs write
    on the exchange; queue.bind write on the queue and read on the exchange; exchange.bind
    write on the destination and read on the source; consume/get/purge read on the queue.
    A refusal is a 403 channel error naming the resource, the vhost and the user; the
    connection stays open."""
    with gateway_in_thread(hosts=("127.0.0.1",), users=_USERS) as gw:
        with blocking(f"amqp://guest:guest@127.0.0.1:{gw.port}/%2F") as admin:
            ach = admin.channel()
            ach.queue_declare("other")
            ach.exchange_declare("x-other", "fanout")
            ach.queue_declare("u-q")
            ach.exchange_declare("u-x", "fanout")
            ach.basic_publish("", "other", b"hidden")
        cases: list[tuple[str, Callable[[Any], Any], str]] = [
            ("queue.declare", lambda ch: ch.queue_declare("other"), _refused("queue", "other")),
            ("exchange.declare", lambda ch: ch.exchange_declare("x-other", "fanout"),
             _refused("exchange", "x-other")),
            ("queue.delete", lambda ch: ch.queue_delete("other"), _refused("queue", "other")),
            ("exchange.delete", lambda ch: ch.exchange_delete("x-other"), _refused("exchange", "x-other")),
            ("queue.bind on a foreign queue", lambda ch: ch.queue_bind("other", "u-x"), _refused("queue", "other")),
            ("queue.bind from a foreign exchange", lambda ch: ch.queue_bind("u-q", "x-other"),
             _refused("exchange", "x-other")),
            ("exchange.bind to a foreign destination", lambda ch: ch.exchange_bind("x-other", "u-x"),
             _refused("exchange", "x-other")),
            ("exchange.bind from a foreign source", lambda ch: ch.exchange_bind("u-x", "x-other"),
             _refused("exchange", "x-other")),
            ("basic.get", lambda ch: ch.basic_get("other"), _refused("queue", "other")),
            ("basic.consume", lambda ch: ch.basic_consume("other", lambda *a: None), _refused("queue", "other")),
            ("queue.purge", lambda ch: ch.queue_purge("other"), _refused("queue", "other")),
            ("basic.publish", lambda ch: (ch.basic_publish("x-other", "", b"m"), ch.queue_declare("u-q")),
             _refused("exchange", "x-other")),
            ("server-named queue", lambda ch: ch.queue_declare(""), None),  # refused: see below
        ]
        with blocking(f"amqp://u:pw@127.0.0.1:{gw.port}/%2F") as conn:
            for what, call, text in cases:
                ch = conn.channel()
                with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
                    call(ch)
                assert info.value.reply_code == 403, what
                if text is not None:
                    assert info.value.reply_text == text, what
                else:
                    assert info.value.reply_text.startswith(
                        "ACCESS_REFUSED - access to queue 'amq.gen-"), what
                    assert info.value.reply_text.endswith("' in vhost '/' refused for user 'u'"), what
            # What the patterns allow works, on the same connection.
            ch = conn.channel()
            ch.queue_declare("u-mine")
            ch.exchange_declare("u-x2", "fanout")
            ch.queue_bind("u-mine", "u-x")
            ch.exchange_bind("u-x2", "u-x")
            ch.basic_publish("", "u-mine", b"direct")
            ch.basic_publish("u-x", "", b"fanned")
            ch.queue_declare("other", passive=True)  # passive declare needs no permission
            got = [ch.basic_get("u-mine", auto_ack=True)[2] for _ in range(2)]
            assert got == [b"direct", b"fanned"]
            assert ch.queue_purge("u-mine").method.message_count == 0
            ch.queue_delete("u-mine")
            assert conn.is_open
        with blocking(f"amqp://guest:guest@127.0.0.1:{gw.port}/%2F") as admin:
            ach = admin.channel()
            assert ach.queue_declare("other", passive=True).method.message_count == 1
            assert ach.queue_declare("u-q", passive=True).method.message_count == 0


# -- channel.flow ------------------------------------------------------------------------------


def _flow(url: str, active: bool) -> tuple[str, Any]:
    """Send channel.flow and report ("ok", flow-ok active) or ("closed", (code, text))."""
    with blocking(url) as conn:
        ch = conn.channel()
        got: dict[str, Any] = {}
        try:
            ch._impl._rpc(pika.spec.Channel.Flow(active=active), lambda f: got.setdefault("ok", f.method.active),
                          [pika.spec.Channel.FlowOk])
            while "ok" not in got:
                conn.process_data_events(time_limit=0.2)
        except pika.exceptions.ConnectionClosedByBroker as e:
            return "closed", (e.reply_code, e.reply_text)
        return "ok", got["ok"]


def test_M16_channel_flow_as_rabbitmq(broker_url: str) -> None:
    """M16/W1: channel.flow active=true is answered flow-ok active=true; active=false closes
    the connection with 540 NOT_IMPLEMENTED "active=false", as RabbitMQ 3.x does (run against
    both)."""
    assert _flow(broker_url, True) == ("ok", True)
    assert _flow(broker_url, False) == ("closed", (540, "NOT_IMPLEMENTED - active=false"))
