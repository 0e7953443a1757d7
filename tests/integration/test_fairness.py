"""A flooded queue must not starve another connection's consumer (issue 15, target 4; W4).

One connection floods queue A: a burst of FLOOD publishes written to its socket at once, more
than the gateway handles in many read turns. Meanwhile a pika consumer on another connection
takes queue B's messages with prefetch 1: it acks each one and asks for queue A's message count
(a passive queue.declare on the same connection) before and after its ack: its next delivery
comes only once the gateway has handled that ack. The difference between the two counts is how
many flood publishes the gateway handled before it came to the slow consumer's input: a count of
messages, not a time, so a loaded machine slows both sides alike.

Unfair, the slow consumer's input waits behind the flood's turns (up to EVENTS_PER_TURN events
each, then the flood's next turn before the sockets are polled again); fair, a busy turn ends as
soon as a light connection has input (gateway.transport.LightPeers).

RabbitMQ is not the reference here: its message count comes from the queue process, which
answers after the publishes already in its mailbox, so the same figure measures its queue's
backlog, not the order in which connections are served. `cmq-gateway perf compare` scenario 8
compares the slow consumer's rate with RabbitMQ's.
"""

from __future__ import annotations

import statistics
import threading
import time
from pathlib import Path

from pamqp import body, commands, frame, header

from gateway.transport import EVENTS_PER_TURN
from tests.integration.differential import blocking
from tests.integration.raw_amqp import RawClient
from tests.integration.test_process import serve

FLOOD = 150_000  # publishes in the burst: the gateway takes seconds for them
CYCLES = 60  # slow-consumer deliveries measured while the flood is being handled
BACKLOG = 500  # on queue B, more than CYCLES
# The slow consumer's work on each message. It makes the consumer light (a few events a
# second); the figure measured is a count of messages, whatever the time.
WORK_SECONDS = 0.01


def _burst(queue: str, count: int) -> bytes:
    one = (frame.marshal(commands.Basic.Publish(exchange="", routing_key=queue), 1)
           + frame.marshal(header.ContentHeader(0, 16, commands.Basic.Properties()), 1)
           + frame.marshal(body.ContentBody(b"f" * 16), 1))
    return one * count


def _flood_per_delivery(port: int, prefix: str) -> list[int]:
    """Flood publishes the gateway handled during each of CYCLES deliveries of the slow
    consumer, while the flood was in progress."""
    qa, qb = f"{prefix}-flood", f"{prefix}-slow"
    url = f"amqp://guest:guest@127.0.0.1:{port}/%2F"
    with blocking(url) as setup:
        ch = setup.channel()
        ch.queue_declare(qa)
        ch.queue_declare(qb)
        for i in range(BACKLOG):
            ch.basic_publish("", qb, b"s%d" % i)
        ch.queue_declare(qb, passive=True)  # a round trip: the backlog is in
    with blocking(url) as conn:
        ch = conn.channel()
        ch.basic_qos(prefetch_count=1)
        counts = ch.connection.channel()  # the message counts, on the slow consumer's connection
        flooder = RawClient(port)
        burst = _burst(qa, FLOOD)
        writer = threading.Thread(target=flooder.sock.sendall, args=(burst,), daemon=True)
        deltas: list[int] = []
        try:
            writer.start()
            for method, _props, _body in ch.consume(qb, inactivity_timeout=60):
                assert method is not None, "the slow consumer got nothing for a minute"
                time.sleep(WORK_SECONDS)
                before = counts.queue_declare(qa, passive=True).method.message_count
                ch.basic_ack(method.delivery_tag)
                after = counts.queue_declare(qa, passive=True).method.message_count
                if after >= FLOOD:
                    break  # the flood is over: what follows measures nothing
                if before:
                    deltas.append(after - before)
                if len(deltas) == CYCLES:
                    break
            ch.cancel()
        finally:
            writer.join(120)
            flooder.sock.close()
            ch.queue_delete(qa)
            ch.queue_delete(qb)
    return deltas


def test_W4_a_flood_does_not_starve_another_connection_s_consumer(tmp_path: Path, unique: str) -> None:
    """While a burst floods queue A, the prefetch-1 consumer of queue B is served after a
    fraction of one flood turn: the median number of flood publishes handled per slow delivery
    stays under a quarter of EVENTS_PER_TURN (unfair scheduling gives it half a turn or more on
    average, as its input waits for the end of the flood's turn)."""
    with serve(tmp_path / "data", "--cmq-api-port", "off", "--mqtt-port", "off") as (_proc, port):
        deltas = _flood_per_delivery(port, unique)
    print(f"\nflood publishes per slow delivery: median {statistics.median(deltas)}, {deltas}")
    assert len(deltas) >= CYCLES // 2, f"the flood ended before the slow consumer was measured: {deltas}"
    assert statistics.median(deltas) < EVENTS_PER_TURN / 4, deltas

