"""Broker follow-ups over the wire and as a process: store damage at start-up, W2
permissions inside a vhost, Q5 long polling by basic.get, channel.flow."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from aiohttp import web

from gateway.broker import Broker, BrokerConfig
from gateway.protocol.properties import Properties
from gateway.push import HttpPusher
from semantics.clock import ManualClock
from semantics.store.files import segment_name

ROOT = Path(__file__).resolve().parents[2]
WAIT = 10.0  # hang protection only


def _serve(data_dir: Path, *extra: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "gateway", "serve", "--host", "127.0.0.1", "--port", "0",
                             "--data-dir", str(data_dir), *extra],
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


class _Endpoint:
    """A real HTTP subscriber on port 0 that answers 500 to the first ``fail_first`` pushes."""

    def __init__(self, fail_first: int) -> None:
        self.fail_first = fail_first
        self.bodies: list[dict[str, Any]] = []
        self.arrived: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self.url = ""

    async def handle(self, request: web.Request) -> web.Response:
        notice = json.loads(await request.read())
        self.bodies.append(notice)
        self.arrived.put_nowait(notice)
        return web.Response(status=500 if len(self.bodies) <= self.fail_first else 200)

    async def start(self) -> web.AppRunner:
        app = web.Application()
        app.router.add_post("/notify", self.handle)
        runner = web.AppRunner(app)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        self.url = f"http://127.0.0.1:{runner.addresses[0][1]}/notify"
        return runner


async def test_D2_D7_retained_message_owed_only_to_http_subscription_survives_restart(tmp_path: Path) -> None:
    """D2/D7 + M14: a persistent message whose only subscription is an HTTP endpoint that
    failed is retained; after a restart the broker restores the HTTP subscription before the
    retained messages, so the push is made again (and succeeds) instead of the message being
    dropped."""
    endpoint = _Endpoint(fail_first=1)
    runner = await endpoint.start()
    clock = ManualClock(1_700_000_000.0)
    config = BrokerConfig(fsync=False)
    try:
        b = await Broker.open(str(tmp_path), clock=clock, config=config)
        vh = b.vhost("/")
        vh.declare_exchange("orders", "fanout", passive=False, durable=True, auto_delete=False, internal=False,
                            arguments=None)
        pusher = HttpPusher(b)
        pusher.subscribe("/", "orders", "hook", endpoint.url)
        out = vh.publish("orders", "", Properties.build(delivery_mode=2), b"owed")
        first = await asyncio.wait_for(endpoint.arrived.get(), WAIT)
        await asyncio.wait_for(pusher.idle(), WAIT)
        assert (first["msgId"], first["msgBody"]) == (out.msg_id, "owed")
        topic = vh.exchanges["orders"].topic
        assert topic.state(out.msg_id)["hook"].status.value == "retrying"
        assert [k for k, _ in b.store.items("t/")] == [f"t///orders/{out.msg_id}"]
        await b.close()

        b2 = await Broker.open(str(tmp_path), clock=clock, config=config)
        again = await asyncio.wait_for(endpoint.arrived.get(), WAIT)
        await asyncio.wait_for(b2.http_pusher.idle(), WAIT)
        assert (again["msgId"], again["msgBody"], again["subscriptionName"]) == (out.msg_id, "owed", "hook")
        assert b2.vhosts["/"].exchanges["orders"].topic.state(out.msg_id) == {}  # delivered: gone (D2)
        assert list(b2.store.items("t/")) == []
        assert len(endpoint.bodies) == 2
        await b2.close()
    finally:
        await runner.cleanup()
