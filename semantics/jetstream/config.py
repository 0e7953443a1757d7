"""Stream and consumer configuration of one CMQ queue (docs/CLUSTER.md, "What holds what").

Plain dicts of the JetStream API's field names (times in seconds; the IO side converts), so
that the mapping from CMQ attributes is tested without a server.
"""

from __future__ import annotations

from typing import Any

from semantics.queue_attrs import QueueAttributes

from .names import queue_stream, queue_subject

__all__ = ["ACK_WAIT_MARGIN", "DUPLICATE_WINDOW", "MAX_ACK_PENDING", "consumer_config", "stream_config"]

# The consumer's ack_wait is the visibility timeout plus this: the gateway holding a delivery
# sees its own timer first and naks (Active again everywhere at once); JetStream's timer only
# fires for a delivery whose gateway is gone (CL3).
ACK_WAIT_MARGIN = 1.0
DUPLICATE_WINDOW = 120.0  # Nats-Msg-Id dedup: a publish retried after a lost PubAck is one message
MAX_ACK_PENDING = 20_000  # L8: at most 20,000 in-flight messages per queue


def stream_config(vhost: str, queue: str, attrs: QueueAttributes, *, replicas: int,
                  durable: bool = True) -> dict[str, Any]:
    """Q1/L7: max_age is the retention; L8: max_msgs the heap limit, refusing new ones; Q6: a
    queue with rewind keeps acked messages (limits retention), others drop them on ack."""
    return {
        "name": queue_stream(vhost, queue),
        "subjects": [queue_subject(vhost, queue)],
        "retention": "limits" if attrs.rewind_seconds > 0 else "workqueue",
        "storage": "file" if durable else "memory",
        "max_age": float(attrs.msg_retention_seconds),
        "max_msgs": int(attrs.max_msg_heap_num),
        "discard": "new",
        "duplicate_window": DUPLICATE_WINDOW,
        "num_replicas": replicas,
    }


def consumer_config(attrs: QueueAttributes) -> dict[str, Any]:
    """Q1: ack_wait is the visibility timeout (plus the margin); receive counts are
    JetStream's num_delivered, judged by the gateway (Q8), so no max_deliver."""
    return {
        "durable_name": "cmq",
        "ack_policy": "explicit",
        "deliver_policy": "all",
        "ack_wait": float(attrs.visibility_timeout) + ACK_WAIT_MARGIN,
        "max_deliver": -1,
        "max_ack_pending": MAX_ACK_PENDING,
    }
