"""A gateway's event loop held in an audit hand-off (A5): with its audit dir on a full disk,
a publisher and an auto-ack consumer on queue ``stall`` run until the writer process's pipe is
full and deliveries stop. The loop then waits in a hand-off until a stop is asked."""

from __future__ import annotations

import threading
import time

import pika


def stall(params: pika.ConnectionParameters, done: threading.Event, hang: float) -> int:
    """Start both clients (they end when ``done`` is set or the gateway closes them) and
    return once deliveries have stood still for three seconds: how many arrived."""
    received = [0]

    def consume() -> None:
        try:
            conn = pika.BlockingConnection(params)
            ch = conn.channel()
            ch.queue_declare("stall")
            ch.basic_qos(prefetch_count=1000)
            ch.basic_consume("stall", lambda c, m, p, b: received.__setitem__(0, received[0] + 1), auto_ack=True)
            while not done.is_set():
                conn.process_data_events(time_limit=0.2)
        except Exception:  # noqa: BLE001  # the stop closes it
            pass

    def publish() -> None:
        try:
            conn = pika.BlockingConnection(params)
            ch = conn.channel()
            ch.queue_declare("stall")
            while not done.is_set():
                for _ in range(500):
                    ch.basic_publish("", "stall", b"x" * 16)
                conn.process_data_events(time_limit=0)
        except Exception:  # noqa: BLE001  # the stop closes it
            pass

    for target in (consume, publish):
        threading.Thread(target=target, daemon=True).start()
    deadline, last, still = time.monotonic() + hang, -1, 0
    while time.monotonic() < deadline and still < 3:
        time.sleep(1.0)
        still = still + 1 if received[0] == last else 0
        last = received[0]
    assert still >= 3 and received[0] > 0, received
    return received[0]
