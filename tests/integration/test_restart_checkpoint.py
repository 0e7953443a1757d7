"""A clean stop leaves the store's checkpoint and the queues' cold runs (issue 15); the next
start takes them and removes them at once, so a kill -9 after more confirmed publishes
replays the journal and loses none of them (M14)."""

from __future__ import annotations

import os
from pathlib import Path

import pika

from tests.integration.differential import blocking
from tests.integration.test_process import serve

URL = "amqp://guest:guest@127.0.0.1:{port}/"
LEFT = ("checkpoint.idx", "messages.cache")


def _publish(ch: pika.adapters.blocking_connection.BlockingChannel, ids: range) -> None:
    for i in ids:
        body = (f"{i}:".encode() * 200)[:1000] if i % 2 else f"small {i}".encode()
        ch.basic_publish("", "q", body, pika.BasicProperties(delivery_mode=2, message_id=f"m{i}"))


def _drain(ch: pika.adapters.blocking_connection.BlockingChannel) -> list[str]:
    got = []
    while (m := ch.basic_get("q", auto_ack=True))[0] is not None:
        i = int(m[1].message_id[1:])
        assert m[2] == ((f"{i}:".encode() * 200)[:1000] if i % 2 else f"small {i}".encode())
        got.append(m[1].message_id)
    return got


def test_M14_a_kill_after_a_start_from_the_checkpoint_loses_no_confirmed_message(tmp_path: Path) -> None:
    with serve(tmp_path) as (proc, port):
        with blocking(URL.format(port=port)) as conn:
            ch = conn.channel()
            ch.confirm_delivery()
            ch.queue_declare("q", durable=True)
            _publish(ch, range(200))
        proc.terminate()
        assert proc.wait(timeout=60) == 0
    assert all(os.path.exists(tmp_path / name) for name in LEFT)

    with serve(tmp_path) as (_proc, port):
        assert not os.path.exists(tmp_path / "messages.cache")  # taken
        with blocking(URL.format(port=port)) as conn:
            ch = conn.channel()
            ch.confirm_delivery()
            assert ch.queue_declare("q", durable=True, passive=True).method.message_count == 200
            _publish(ch, range(200, 300))  # confirmed: on disk
        assert not os.path.exists(tmp_path / "checkpoint.idx")  # gone before the first write
        # serve() ends with kill -9: no checkpoint of this run.

    with serve(tmp_path) as (_proc, port), blocking(URL.format(port=port)) as conn:
        ch = conn.channel()
        assert _drain(ch) == [f"m{i}" for i in range(300)]


def test_M14_a_clean_stop_after_a_start_from_the_checkpoint_keeps_acks_and_order(tmp_path: Path) -> None:
    for round_ in range(3):
        with serve(tmp_path) as (proc, port):
            with blocking(URL.format(port=port)) as conn:
                ch = conn.channel()
                ch.confirm_delivery()
                ch.queue_declare("q", durable=True)
                _publish(ch, range(100 * round_, 100 * round_ + 100))
                for _ in range(30):  # the oldest 30 go each round
                    m = ch.basic_get("q", auto_ack=False)
                    assert m[0] is not None
                    ch.basic_ack(m[0].delivery_tag)
                assert ch.queue_declare("q", durable=True, passive=True).method.message_count == 70 * (round_ + 1)
            proc.terminate()
            assert proc.wait(timeout=60) == 0
    with serve(tmp_path) as (_proc, port), blocking(URL.format(port=port)) as conn:
        ch = conn.channel()
        expected = list(range(300))
        for round_ in range(3):  # the first 30 left of each round's queue were acked
            live = [i for i in expected if i < 100 * round_ + 100]
            for i in live[:30]:
                expected.remove(i)
        assert _drain(ch) == [f"m{i}" for i in expected]
