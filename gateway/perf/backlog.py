"""Scenario 6: how much broker memory a retained message costs, and how long a restart takes
to bring a backlog back.

Memory is the broker's RSS before and after publishing N persistent messages (with confirms,
so all of them are stored) into one durable queue nobody consumes, divided by N. RSS comes
from /proc/<pid>/status (`--broker-pid`), or for RabbitMQ from `rabbitmqctl status` (its
`memory.total.rss`). A broker that pages messages to disk shows a small figure: that is its
real cost, not an error.

Restart: the optional hook command (e.g. `systemctl restart rabbitmq-server`) is run, and the
time is taken until a connection succeeds and a passive queue.declare reports all N messages.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
import subprocess
import time
from dataclasses import dataclass
from typing import Any

from pamqp import commands

from gateway.perf.client import AmqpClient, AmqpError, parse_uri
from gateway.perf.frames import encode_properties, publish_template
from gateway.perf.stats import ConfirmTracker

__all__ = ["BacklogResult", "broker_rss", "run_backlog"]

_WINDOW = 1024
_BATCH = 64


@dataclass
class BacklogResult:
    messages: int
    publish_seconds: float
    rss_before: int | None
    rss_after: int | None
    bytes_per_message: float | None
    restart_seconds: float | None
    recovered: int | None
    error: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def broker_rss(pid: int | None, rabbitmqctl: bool) -> int | None:
    """The broker's resident memory in bytes, or None when neither source was given."""
    if pid is not None:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
        return None
    if rabbitmqctl:
        out = subprocess.run(
            ["rabbitmqctl", "status", "--formatter", "json"],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        ).stdout
        return int(json.loads(out)["memory"]["total"]["rss"])
    return None


async def _publish(uri: str, queue: str, count: int, size: int) -> None:
    client = await AmqpClient.connect(parse_uri(uri))
    try:
        await client.open_channel(1)
        await client.rpc(1, commands.Queue.Declare(queue=queue, durable=True), commands.Queue.DeclareOk)
        await client.rpc(1, commands.Confirm.Select(), commands.Confirm.SelectOk)
        tracker = ConfirmTracker()
        room = asyncio.Event()

        def on_confirm(tag: int, multiple: bool, ok: bool) -> None:
            tracker.confirm(tag, multiple, ok)
            room.set()

        client.on_confirm = on_confirm
        tpl = publish_template(1, "", queue, size, encode_properties(delivery_mode=2), client.frame_max)
        sent = 0
        while tracker.acked + tracker.nacked < count:
            free = min(_WINDOW - (sent - tracker.acked - tracker.nacked), count - sent, _BATCH)
            if free <= 0:
                room.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(room.wait(), 1.0)
                if client.error is not None:
                    raise client.error
                continue
            await client.writable()
            client.write(tpl.render(time.monotonic_ns()) * free)
            sent += free
            await asyncio.sleep(0)
        if tracker.nacked:
            raise AmqpError(f"the broker nacked {tracker.nacked} of {count} messages")
    finally:
        await client.close()


async def _message_count(uri: str, queue: str) -> int:
    client = await AmqpClient.connect(parse_uri(uri), timeout=5.0)
    try:
        await client.open_channel(1)
        ok = await client.rpc(1, commands.Queue.Declare(queue=queue, passive=True), commands.Queue.DeclareOk)
        assert isinstance(ok, commands.Queue.DeclareOk)
        return int(ok.message_count or 0)
    finally:
        await client.close()


async def _delete(uri: str, queue: str) -> None:
    client = await AmqpClient.connect(parse_uri(uri))
    try:
        await client.open_channel(1)
        await client.rpc(1, commands.Queue.Delete(queue=queue), commands.Queue.DeleteOk, timeout=600.0)
    finally:
        await client.close()


def run_backlog(
    uri: str,
    count: int,
    size: int = 1024,
    broker_pid: int | None = None,
    rabbitmqctl: bool = False,
    restart_cmd: str | None = None,
    recover_timeout: float = 600.0,
) -> BacklogResult:
    queue = f"perf-{secrets.token_hex(4)}-backlog"
    rss_before = broker_rss(broker_pid, rabbitmqctl)
    t0 = time.monotonic()
    error = None
    restart_s = None
    recovered = None
    rss_after = None
    try:
        asyncio.run(_publish(uri, queue, count, size))
        publish_s = time.monotonic() - t0
        time.sleep(1.0)  # let the broker settle (queue index writes) before reading memory
        rss_after = broker_rss(broker_pid, rabbitmqctl)
        if restart_cmd:
            t1 = time.monotonic()
            subprocess.run(restart_cmd, shell=True, check=True, timeout=recover_timeout)
            while time.monotonic() - t1 < recover_timeout:
                try:
                    recovered = asyncio.run(_message_count(uri, queue))
                except (OSError, AmqpError, TimeoutError):
                    recovered = None
                if recovered is not None and recovered >= count:
                    restart_s = time.monotonic() - t1
                    break
                time.sleep(0.2)
    except Exception as exc:
        publish_s = time.monotonic() - t0
        error = repr(exc)
    finally:
        try:
            asyncio.run(_delete(uri, queue))
        except Exception as exc:
            error = error or f"cleanup failed: {exc!r}"
    per_msg = (rss_after - rss_before) / count if rss_after is not None and rss_before is not None else None
    return BacklogResult(count, publish_s, rss_before, rss_after, per_msg, restart_s, recovered, error)
