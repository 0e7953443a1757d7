"""The broker's per-message records as rows: a fixed shape and a tuple of values.

Why: a message makes 3-4 records (publish, enqueue or route, deliver, ack). As keyword
arguments each was a dict built on the event loop, marshalled with its keys to the audit
writer process and unmarshalled there into a dict again. A row is a tuple in the shape's key
order, and the writer formats it with the shape's generated formatter, so the line is byte
for byte the one ``format_line`` writes for the same fields (tests/unit/audit checks it).

Every shape is defined here, at import, so a shape's ``id`` (its index in ``ROWS``) is the
same in the gateway and in its audit writer process.
"""

from __future__ import annotations

import inspect
import operator
from collections.abc import Callable
from typing import Any

from gateway.audit.counting import FIELDS_READ, count_key
from gateway.audit.record import formatter, line_writer

__all__ = ["ACK", "ACK_MQTT", "DELIVER", "DELIVER_AUTO", "DELIVER_MQTT", "DELIVER_MQTT_AUTO", "ENQUEUE", "PUBLISH_QUEUE", "PUBLISH_QUEUE_VIA",
           "PUBLISH_TOPIC", "PUBLISH_TOPIC_VIA", "ROUTE", "ROWS", "Row",
           "fields_emitter", "row_emitter", "values_emitter"]


class Row:
    """One record shape: its event and its keys, in the order the values come."""

    __slots__ = ("_count_names", "event", "fmt", "id", "keys", "pick", "pick_indices", "put")

    def __init__(self, event: str, *keys: str) -> None:
        if len(set(keys)) != len(keys):
            raise ValueError(f"row {event}: a key twice")
        self.id = len(ROWS)
        self.event = event
        self.keys = keys
        self.fmt: Callable[..., str] = formatter(keys)
        # put(out, ts, event, vhost, *values): fmt(...).encode() appended to a bytearray.
        self.put: Callable[..., None] = line_writer(keys)
        read = [(k, keys.index(k)) for k in FIELDS_READ.get(event, ()) if k in keys]
        self._count_names = tuple(k for k, _ in read)
        self.pick_indices = tuple(i for _, i in read)
        # pick(values): the values count_key reads, as count_key_picked takes them back.
        self.pick: Callable[[Any], Any] = operator.itemgetter(*self.pick_indices) if read else _nothing
        ROWS.append(self)

    def fields(self, values: tuple[Any, ...] | list[Any]) -> dict[str, Any]:
        """The record as keyword fields (for a sink that takes no rows)."""
        return dict(zip(self.keys, values, strict=True))

    def count_key(self, vhost: str, values: tuple[Any, ...] | list[Any]) -> tuple[Any, ...]:
        return self.count_key_picked(vhost, self.pick(values))

    def count_key_picked(self, vhost: str, picked: Any) -> tuple[Any, ...]:
        """``count_key`` from ``pick(values)``: the writer counts picks, then makes keys."""
        names = self._count_names
        got = (picked,) if len(names) == 1 else picked or ()
        return count_key(self.event, vhost, dict(zip(names, got, strict=True)))


def _nothing(values: Any) -> None:
    return None


ROWS: list[Row] = []

PUBLISH_QUEUE = Row("publish", "queue", "routing_key", "msg_id", "size", "user", "peer")  # M10
PUBLISH_TOPIC = Row("publish", "topic", "routing_key", "msg_id", "tags", "size", "user", "peer")
ROUTE = Row("route", "topic", "msg_id", "routing_key", "subscription", "queue", "tags", "size")
ENQUEUE = Row("enqueue", "queue", "msg_id", "size", "topic", "subscription")
DELIVER = Row("deliver", "user", "peer", "queue", "msg_id", "attempt", "size")
ACK = Row("ack", "user", "peer", "queue", "msg_id", "latency_ms")
# CA4: a publish that came through another API than AMQP names it (``protocol``: "cmq-api",
# "mqtt"); AMQP publishes keep the rows above, so their records are unchanged.
PUBLISH_QUEUE_VIA = Row("publish", *PUBLISH_QUEUE.keys, "protocol")
PUBLISH_TOPIC_VIA = Row("publish", *PUBLISH_TOPIC.keys, "protocol")
# MQ7: an MQTT client's deliveries and acks, with protocol "mqtt" last.
DELIVER_MQTT = Row("deliver", "user", "peer", "queue", "msg_id", "attempt", "size", "protocol")
ACK_MQTT = Row("ack", "user", "peer", "queue", "msg_id", "latency_ms", "protocol")
# A delivery that needs no ack (basic.consume/get with no_ack, MQTT QoS 0): the message is
# settled as it is sent, and no ack record follows; "auto_ack": true says so (spark/SCHEMA.md).
DELIVER_AUTO = Row("deliver", *DELIVER.keys, "auto_ack")
DELIVER_MQTT_AUTO = Row("deliver", *DELIVER_MQTT.keys, "auto_ack")


def fields_emitter(sink: Any) -> Callable[[str, str, dict[str, Any]], None]:
    """``emit_fields(event, vhost, fields)`` for ``sink``: its own (AuditLog, the metrics
    tee, NullAudit take the dict as is), or one that passes the fields as keywords to a sink
    that only has ``emit`` (tests' sinks). Resolved once by whoever holds the sink."""
    emit_fields = getattr(sink, "emit_fields", None)
    if emit_fields is not None:
        return emit_fields  # type: ignore[no-any-return]
    emit = sink.emit

    def as_keywords(event: str, vhost: str, fields: dict[str, Any]) -> None:
        emit(event, vhost, **fields)
    return as_keywords


def values_emitter(sink: Any) -> Callable[..., None]:
    """``emit_values(row, vhost, *values)`` for ``sink``: its own where it has one (AuditLog,
    NullAudit), else ``emit_row(row, vhost, values)`` of ``row_emitter``. Looked up without
    ``__getattr__``: a sink that forwards what it lacks to another (the metrics tee) must
    not be passed by."""
    if inspect.getattr_static(sink, "emit_values", None) is not None:
        return sink.emit_values  # type: ignore[no-any-return]
    emit_row = row_emitter(sink)

    def as_row(row: Row, vhost: str, *values: Any) -> None:
        emit_row(row, vhost, values)
    return as_row


def row_emitter(sink: Any) -> Callable[[Row, str, tuple[Any, ...]], None]:
    """``emit_row(row, vhost, values)`` for ``sink``: its own, or one that hands the row over
    as fields to a sink that takes no rows."""
    emit_row = getattr(sink, "emit_row", None)
    if emit_row is not None:
        return emit_row  # type: ignore[no-any-return]
    emit_fields = fields_emitter(sink)

    def as_fields(row: Row, vhost: str, values: tuple[Any, ...]) -> None:
        emit_fields(row.event, vhost, row.fields(values))
    return as_fields
