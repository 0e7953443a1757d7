"""W5 memory alarm and the content-size limit, on a real `cmq-gateway serve` process.

The memory alarm compares the bytes the broker holds (gateway/memory.py), not RSS: it clears
once the queues drain. Partial bodies are held memory as they arrive, so slow or stalled
large publishes block their senders; a content header above max_message_size is refused.
"""

from __future__ import annotations

import json
import time
import urllib.request
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import pika
from pamqp import commands

from tests.integration.raw_amqp import RawClient
from tests.integration.test_disk_alarm import _config, _health, _until
from tests.integration.test_process import serve

HANG = 30.0  # hang protection only


def _overview(proc: Any) -> dict[str, Any]:
    port = proc.operator["management API"]
    req = urllib.request.Request(f"http://127.0.0.1:{port}/api/overview",
                                 headers={"Authorization": "Basic Z3Vlc3Q6Z3Vlc3Q="})
    with urllib.request.urlopen(req, timeout=10) as r:
        return dict(json.loads(r.read()))


def test_W5_memory_alarm_clears_when_the_queue_drains(tmp_path: Path, unique: str) -> None:
    """Issue 11 item 4: with a 3 MB mark, publishing 50 KB messages into a queue blocks the
    publisher; draining the queue unblocks it (RSS stays where it was; what the broker
    holds does not). The overview shows both numbers."""
    queue = f"{unique}-q"
    mark = 3_000_000
    with serve(tmp_path / "data", "--config", _config(tmp_path, memory_high_watermark=mark)) as (proc, port):
        url = f"amqp://guest:guest@127.0.0.1:{port}/%2F"
        pub = pika.BlockingConnection(pika.URLParameters(url))
        notes: list[str] = []
        pub.add_on_connection_blocked_callback(lambda c, m: notes.append(m.method.NAME))
        pub.add_on_connection_unblocked_callback(lambda c, m: notes.append(m.method.NAME))
        ch = pub.channel()
        ch.queue_declare(queue)
        deadline = time.monotonic() + HANG
        published = 0
        while not notes:
            assert time.monotonic() < deadline and published < 1000, "never blocked"
            ch.basic_publish("", queue, b"m" * 50_000)
            published += 1
            pub.process_data_events(time_limit=0)
        assert notes == ["Connection.Blocked"]
        over = _overview(proc)
        assert over["mem_alarm"] is True and over["mem_used"] > mark
        assert over["mem_rss"] > 0 and over["mem_limit"] == mark
        with pika.BlockingConnection(pika.URLParameters(url)) as consumer:
            cch = consumer.channel()
            drained = 0
            while drained < published:  # what the blocked publisher had sent arrives later
                method, _, _ = cch.basic_get(queue, auto_ack=True)
                if method is None:
                    pub.process_data_events(time_limit=0.05)
                    assert time.monotonic() < deadline, "the queue never filled"
                    continue
                drained += 1
        # Every message published is consumed: nothing is held, so the last word is unblocked
        # (the publishes the blocked publisher had in flight may have blocked it once more).
        _until(lambda: notes[-1] == "Connection.Unblocked", pub)
        assert notes == ["Connection.Blocked", "Connection.Unblocked"] * (len(notes) // 2)
        assert _overview(proc)["mem_alarm"] is False
        pub.close()


def test_W5_partial_bodies_are_held_memory_and_block_their_senders(tmp_path: Path) -> None:
    """Issue 11 item 5: three connections that announce 50 MB bodies and keep sending are
    blocked once what they sent passes the 4 MB mark: the gateway stops reading them, so
    what it holds stays near the mark (before: it read everything, 643 MB against 200)."""
    mark = 4_000_000
    with serve(tmp_path / "data", "--config", _config(tmp_path, memory_high_watermark=mark)) as (proc, port):
        clients = [RawClient(port, {"connection.blocked": True}) for _ in range(3)]
        for c in clients:
            c.start_publish("nowhere", 50_000_000)
            c.sock.setblocking(False)
        chunk = clients[0].body_frame(clients[0].frame_max - 8)
        out = [bytearray() for _ in clients]
        blocked = [False] * len(clients)
        deadline = time.monotonic() + HANG
        while not all(blocked):
            assert time.monotonic() < deadline, f"not blocked: {blocked}"
            for i, c in enumerate(clients):
                if blocked[i]:
                    continue
                if c.readable():
                    c.sock.settimeout(10)
                    _, frame = c.read_frame()
                    c.sock.setblocking(False)
                    assert isinstance(frame, commands.Connection.Blocked), frame
                    assert frame.reason == "low on memory"
                    blocked[i] = True
                    continue
                if not out[i]:
                    out[i] += chunk
                try:
                    del out[i][:c.sock.send(out[i])]
                except BlockingIOError:
                    time.sleep(0.001)
        over = _overview(proc)
        assert over["mem_alarm"] is True
        assert mark < over["mem_used"] < mark + 3 * 1_000_000  # at most about a read per sender more
        for c in clients:
            c.abort()  # a FIN would wait behind the unread bytes: the gateway reads none now
        _until(lambda: _health(proc) == (200, {"status": "ok"}))  # their partial bodies are let go


def test_M16_max_message_size_from_the_configuration(tmp_path: Path) -> None:
    """Issue 11 item 5: max_message_size (RabbitMQ's name) is configurable; a content header
    above it closes the channel with RabbitMQ's 406 and words, before any body byte."""
    with serve(tmp_path / "data", "--config", _config(tmp_path, max_message_size=1000)) as (_proc, port):
        c = RawClient(port)
        c.start_publish("nowhere", 1001)
        close = c.expect(commands.Channel.Close)
        assert (close.reply_code, close.reply_text, close.class_id, close.method_id) == (
            406, "PRECONDITION_FAILED - message size 1001 is larger than configured max size 1000", 60, 40)
        c.close()


def test_M16_content_above_the_default_max_message_size_differential(broker_url: str) -> None:
    """The same frames to RabbitMQ 3.10 and the gateway: a content of 128 MiB + 1 byte closes
    the channel with the same 406 and text. (RabbitMQ answers once the whole body is in;
    the gateway already at the content header, then drops the body frames.)"""
    size = (128 << 20) + 1
    c = RawClient(urlparse(broker_url).port or 5672)
    c.start_publish("nowhere", size)
    frame_bytes = c.body_frame(c.frame_max - 8)
    left = size
    while left >= c.frame_max - 8:
        c.sock.sendall(frame_bytes)
        left -= c.frame_max - 8
    c.sock.sendall(c.body_frame(left))
    close = c.expect(commands.Channel.Close)
    assert (close.reply_code, close.reply_text, close.class_id, close.method_id) == (
        406, "PRECONDITION_FAILED - message size 134217729 is larger than configured max size 134217728", 60, 40)
    c.close()
