"""When a nats-py connection's subscriptions are known to the server, for a test that then
publishes to them from another connection.

Core NATS drops a message published on a subject nobody is known to want, so such a test
must not publish before the server has taken the SUB. nats-py's ``flush()`` alone does not
say so: it writes its PING straight to the socket (nats-py 2.16 ``Client._send_ping``), ahead
of the SUBs ``subscribe`` left queued for its flusher task, and the server may answer that
PING before it reads them. test_cluster_wire's round "a" lost its first message so in 2 of
~6 CI runs (the server never sent it: /connz out_msgs).
"""

from __future__ import annotations

from typing import Any


async def subscribed(nc: Any) -> None:
    """Returns once the server has every SUB ``nc`` was asked for so far. A flush's PONG is
    read only after the flusher task has written what was queued before its PING (subscribe
    woke that task first), unless the task was still draining an earlier write: then again.
    The last flush's PING follows the SUBs on the socket, and the server answers in order."""
    queued = list(nc._pending)
    await nc.flush()
    while any(c is q for c in nc._pending for q in queued):
        await nc.flush()
    await nc.flush()
