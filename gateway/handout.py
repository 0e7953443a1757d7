"""Messages handed to an HTTP caller only once their audit records are out of the process (A5).

``Broker.audit_handoff()`` answers False when a stop is asked while the audit writer process
can take nothing (a full disk): the records emitted so far are still in this process and the
stop will most likely give them up. The AMQP and MQTT transports then close the connection
without writing, and the broker requeues what was in flight. The HTTP callers (the management
API's get messages, the CMQ API's ReceiveMessage, HTTP push) cannot close a connection in the
middle of a delivery: they put what they received back, as if it had never been received,
and answer as a stopping server does (503).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

__all__ = ["STOPPING", "put_back"]

STOPPING = ("the gateway is stopping and its audit log cannot be written (disk full): "
            "nothing was delivered, the messages stay queued; try again later")


def put_back(receipts: Iterable[Any], release: Callable[[Any, float], bool], now: float) -> None:
    """Make each received message Active again and take its receive back: the caller saw
    nothing, so the next receive is not a redelivery (its dequeue count and first receive
    time are as before) and no maxReceiveCount is spent on it (Q8)."""
    for receipt in receipts:
        m = receipt.message
        if release(receipt, now):
            m.receive_count -= 1
            if m.receive_count <= 0:  # it was this receive that set the first receive time
                m.receive_count = 0
                m.first_receive_time = None
