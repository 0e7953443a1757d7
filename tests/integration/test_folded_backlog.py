"""A backlog published to a running gateway and folded into compact records (issue 15:
semantics.queue_cold.LiveRun, gateway.broker.folding) reads back exactly as published, over
the wire with pika: order, bodies on disk and in memory, properties, routing keys, per-message
TTLs, requeues, redeliveries after a lost connection, and a restart in between (M13, M14).

The fold thresholds are lowered (module values read when a queue is made) so that a few
hundred messages fold, not several thousand."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pika
import pytest

import semantics.queue as Q
from gateway.server import gateway_in_thread
from tests.integration.differential import blocking
from tests.support.backlog import publish_backlog

URL = "amqp://guest:guest@127.0.0.1:{port}/"
N = 400


@pytest.fixture(autouse=True)
def small_folds(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(Q, "FOLD_KEEP", 8)
    monkeypatch.setattr(Q, "FOLD_TAIL", 4)
    monkeypatch.setattr(Q, "FOLD_BATCH", 16)


def _props(i: int) -> pika.BasicProperties:
    # A few share their properties (folded with one shared entry), every 7th has a header
    # of its own, every 11th a TTL of its own (never folded: it stays as it is).
    headers = {"kind": "even" if i % 2 == 0 else "odd"}
    if i % 7 == 0:
        headers["i"] = i
    return pika.BasicProperties(delivery_mode=2, headers=headers,
                                content_type="text/plain" if i % 3 else "application/json",
                                expiration="600000" if i % 11 == 0 else None)


def _body(i: int) -> bytes:
    # Both sides of the 256-byte line below which a body stays in memory (and is not folded).
    return (f"{i}:".encode() * 700)[:1000] if i % 5 else f"small {i}".encode()


def _expected(i: int) -> tuple[object, ...]:
    p = _props(i)
    return _body(i), p.headers, p.content_type, p.expiration, "a" if i % 4 else "b", "dx"


def _got(method: object, props: pika.BasicProperties, body: bytes) -> tuple[object, ...]:
    return body, props.headers, props.content_type, props.expiration, method.routing_key, method.exchange  # type: ignore[attr-defined]


def _publish(port: int, first: int, n: int) -> None:
    with blocking(URL.format(port=port)) as conn:
        publish_backlog(conn.channel(), first, n, _body, _props)


def _cold(gw: object) -> int:
    return int(gw.broker.vhosts["/"].queues["backlog"].cmq.cold)  # type: ignore[attr-defined]


def _folded(gw: object) -> int:
    """Cold messages once the last bodies are on disk: a fold happens at a send."""
    deadline = time.monotonic() + 30
    while not _cold(gw) and time.monotonic() < deadline:
        time.sleep(0.05)
    return _cold(gw)


@pytest.fixture
def gateway(tmp_path: Path) -> Iterator[object]:
    with gateway_in_thread(data_dir=str(tmp_path), hosts=("127.0.0.1",)) as gw:
        yield gw


def test_M13_a_folded_backlog_is_delivered_in_order_as_published_with_requeues(gateway: object) -> None:
    gw = gateway
    port = gw.port  # type: ignore[attr-defined]
    _publish(port, 0, N)
    cold = _folded(gw)
    assert cold > N // 2, cold  # most of the backlog is held as compact records
    with blocking(URL.format(port=port)) as conn:
        ch = conn.channel()
        assert ch.queue_declare("backlog", durable=True, passive=True).method.message_count == N
        got = []
        kept = []  # unacked: back at their places when the channel closes (M13)
        for i in range(N):
            method, props, body = ch.basic_get("backlog", auto_ack=False)
            assert method is not None, i
            assert _got(method, props, body) == _expected(i), i
            assert method.redelivered is False
            got.append(i)
            if i % 50 == 25:  # nack with requeue: received again at once, at its place
                ch.basic_nack(method.delivery_tag, requeue=True)
                again = ch.basic_get("backlog", auto_ack=False)
                assert again[0] is not None and again[0].redelivered
                assert _got(*again) == _expected(i)
                ch.basic_ack(again[0].delivery_tag)
            elif i % 3 == 0 and i > N // 2:
                kept.append(i)
            else:
                ch.basic_ack(method.delivery_tag)
        assert ch.basic_get("backlog", auto_ack=False)[0] is None
    with blocking(URL.format(port=port)) as conn:
        ch = conn.channel()
        back = []
        while (m := ch.basic_get("backlog", auto_ack=True))[0] is not None:
            assert m[0].redelivered and _got(*m) == _expected(kept[len(back)])
            back.append(m[2])
        assert back == [_body(i) for i in kept]
    assert _cold(gw) == 0


def test_M14_a_folded_backlog_survives_a_restart_and_a_consumer_gets_it_all_in_order(tmp_path: Path) -> None:
    with gateway_in_thread(data_dir=str(tmp_path), hosts=("127.0.0.1",)) as gw:
        _publish(gw.port, 0, N)
        assert _folded(gw) > N // 2
        with blocking(URL.format(port=gw.port)) as conn:  # a few taken before the restart
            ch = conn.channel()
            for i in range(5):
                m = ch.basic_get("backlog", auto_ack=True)
                assert _got(*m) == _expected(i)
    with gateway_in_thread(data_dir=str(tmp_path), hosts=("127.0.0.1",)) as gw:
        _publish(gw.port, N, N)  # folded behind the restored run
        assert _folded(gw) > N
        with blocking(URL.format(port=gw.port)) as conn:
            ch = conn.channel()
            assert ch.queue_declare("backlog", durable=True, passive=True).method.message_count == 2 * N - 5
            ch.basic_qos(prefetch_count=50)
            got: list[tuple[object, ...]] = []
            for method, props, body in ch.consume("backlog", inactivity_timeout=10):
                assert method is not None, len(got)
                got.append(_got(method, props, body))
                ch.basic_ack(method.delivery_tag)
                if len(got) == 2 * N - 5:
                    break
            ch.cancel()
            assert got == [_expected(i) for i in range(5, 2 * N)]
        assert _cold(gw) == 0
