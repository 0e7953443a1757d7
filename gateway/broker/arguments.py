"""Queue and consume arguments: ``x-cmq-*`` and RabbitMQ's ``x-*`` (SPEC M7, M15).

The x-cmq-* arguments become CMQ queue attributes; RabbitMQ arguments keep their RabbitMQ
meaning where CMQ has none. Values are checked for type here; ranges are checked by
semantics.queue_attrs (L6-L8, Q8), which raises LimitError naming the rule.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from semantics.errors import PRECONDITION_FAILED, CMQError

__all__ = ["EXCHANGE_EQUIVALENCE", "QUEUE_EQUIVALENCE", "RECEIVE_METADATA", "QueueArgs", "amqp_type",
           "check_exchange_args", "check_queue_kind_args", "check_rabbit_args", "equivalent_args", "parse_queue_args", "receive_metadata", "rewind_to", "text",
           "utf8"]

# x-cmq-* argument -> semantics.queue_attrs.QueueAttributes field (SPEC M7).
CMQ_ATTRS = {
    "x-cmq-visibility-timeout": "visibility_timeout",
    "x-cmq-msg-retention-seconds": "msg_retention_seconds",
    "x-cmq-max-msg-size": "max_msg_size",
    "x-cmq-max-msg-heap-num": "max_msg_heap_num",
    "x-cmq-rewind-seconds": "rewind_seconds",
    "x-cmq-polling-wait-seconds": "polling_wait_seconds",
    "x-cmq-max-receive-count": "max_receive_count",
    "x-cmq-max-time-to-live": "max_time_to_live",
    "x-cmq-delay-seconds": "delay_seconds",
}


@dataclass
class QueueArgs:
    """What a queue.declare's arguments ask for: ``attrs`` are keyword arguments for
    semantics.queue_attrs.QueueAttributes; the rest is kept by the broker."""

    attrs: dict[str, Any] = field(default_factory=dict)
    dead_letter_exchange: str | None = None            # x-dead-letter-exchange (M13)
    dead_letter_routing_key: str | None = None
    delivery_limit: int | None = None                  # x-delivery-limit without a CMQ DLQ
    expires_ms: int | None = None                      # x-expires
    single_active_consumer: bool = False               # x-single-active-consumer
    receive_metadata: bool = False                     # x-cmq-receive-metadata (M11, PF5)
    max_priority: int = 0                              # x-max-priority: 0 is a plain queue


def _int(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise CMQError("M7", f"invalid arg '{name}' for queue: {value!r} is not a number",
                       reply_code=PRECONDITION_FAILED, value=value)
    return int(value)


def text(value: str | bytes) -> str:
    """A field's text: a longstr that is not UTF-8 decodes to bytes, compared as text here
    (with U+FFFD where it is not UTF-8), never raising."""
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value


def utf8(value: Any) -> bool:
    """Whether ``value`` is text: a str, or bytes that are UTF-8 (RabbitMQ's longstr; our
    field-table decoder gives bytes for a byte array and for a longstr that is not UTF-8)."""
    if isinstance(value, bytes):
        try:
            value.decode("utf-8")
        except UnicodeDecodeError:
            return False
        return True
    return isinstance(value, str)


def _str(name: str, value: Any) -> str:
    if isinstance(value, bytes) and utf8(value):
        return value.decode()
    if not isinstance(value, str):
        raise CMQError("M7", f"invalid arg '{name}' for queue: {value!r} is not a string",
                       reply_code=PRECONDITION_FAILED, value=value)
    return value


def amqp_type(v: object) -> str:
    """RabbitMQ's name of a field's AMQP type, as the decoded Python value suggests it."""
    if isinstance(v, bool):
        return "bool"
    if isinstance(v, int):
        return "signedint" if -2**31 <= v < 2**31 else "long"
    if isinstance(v, float):
        return "double"
    if isinstance(v, bytes):
        return "binary"
    if isinstance(v, Mapping):
        return "table"
    if isinstance(v, list | tuple):
        return "array"
    return "longstr"


_INTEGER_ARGS = {"x-expires": "positive", "x-message-ttl": "non_negative", "x-max-length": "non_negative",
                 "x-max-length-bytes": "non_negative", "x-max-priority": "priority"}
_STRING_ARGS = ("x-dead-letter-exchange", "x-dead-letter-routing-key", "x-overflow")


def check_rabbit_args(arguments: Mapping[str, Any] | None, queue: str, vhost: str) -> None:
    """RabbitMQ's own checks of its queue arguments, refused in its words (406, M16), before
    the CMQ attributes are checked (those name the CMQ rule)."""
    if not arguments:
        return

    def bad(arg: str, why: str) -> CMQError:
        return CMQError("M16", f"invalid arg '{arg}' for queue '{queue}' in vhost '{vhost}': {why}",
                        reply_code=PRECONDITION_FAILED, value=arguments.get(arg))

    for arg, rule in _INTEGER_ARGS.items():
        if arg not in arguments:
            continue
        v = arguments[arg]
        if isinstance(v, bool) or not isinstance(v, int):
            raise bad(arg, f'"expected integer, got {amqp_type(v)}"')
        if v < 0:
            raise bad(arg, f"{{value_negative,{v}}}")
        if rule == "positive" and v == 0:
            raise bad(arg, "{value_zero,0}")
        if rule == "priority" and v > 255:
            raise bad(arg, f"{{max_value_exceeded,{v}}}")
    for arg in _STRING_ARGS:
        if arg in arguments and not utf8(arguments[arg]):
            raise CMQError("M16", f"invalid type '{amqp_type(arguments[arg])}' for arg '{arg}' in queue "
                           f"'{queue}' in vhost '{vhost}'", reply_code=PRECONDITION_FAILED, value=arguments[arg])
    overflow = arguments.get("x-overflow")
    if overflow is not None and text(overflow) not in ("drop-head", "reject-publish", "reject-publish-dlx"):
        raise bad("x-overflow", "invalid_overflow")
    if "x-dead-letter-routing-key" in arguments and "x-dead-letter-exchange" not in arguments:
        raise bad("x-dead-letter-routing-key", "routing_key_but_no_dlx_defined")
    sac = arguments.get("x-single-active-consumer")
    if sac is not None and not isinstance(sac, bool):
        raise bad("x-single-active-consumer", f"{{unacceptable_type,{amqp_type(sac)}}}")


def check_queue_kind_args(arguments: Mapping[str, Any] | None, queue: str, vhost: str, *, durable: bool = True,
                          exclusive: bool = False, auto_delete: bool = False) -> None:
    """RabbitMQ's checks of x-queue-type, x-queue-mode and x-queue-version (406, M16): a typo
    ("Quorum") made a classic queue here where RabbitMQ refuses it; a quorum queue or a stream
    is durable, not exclusive, not auto-delete. For clients' declares only: a queue a store
    already holds loads as it was declared (VHost.declare_queue_here)."""
    if not arguments:
        return
    for arg, values, what in (("x-queue-type", ("classic", "quorum", "stream"), "type"),
                              ("x-queue-mode", ("default", "lazy"), "mode")):
        v = arguments.get(arg)
        if v is None:
            continue
        why = (f"{{unacceptable_type,{amqp_type(v)}}}" if not utf8(v) else
               None if text(v) in values else f"\"unsupported queue {what} '{text(v)}'\"")
        if why is not None:
            raise CMQError("M16", f"invalid arg '{arg}' for queue '{queue}' in vhost '{vhost}': {why}",
                           reply_code=PRECONDITION_FAILED, value=v)
    if text(arguments.get("x-queue-type") or "") in ("quorum", "stream"):
        for refused, prop in ((auto_delete, "auto-delete"), (exclusive, "exclusive-owner"), (not durable, "non-durable")):
            if refused:
                raise CMQError("M16", f"invalid property '{prop}' for queue '{queue}' in vhost '{vhost}'",
                               reply_code=PRECONDITION_FAILED, value=prop)
    v = arguments.get("x-queue-version")
    if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v not in (1, 2)):
        why = f"\"unsupported queue version '{v}'\"" if isinstance(v, int) and not isinstance(v, bool) else \
            f"\"expected integer, got {amqp_type(v)}\""
        raise CMQError("M16", f"invalid arg 'x-queue-version' for queue '{queue}' in vhost '{vhost}': {why}",
                       reply_code=PRECONDITION_FAILED, value=v)


def check_exchange_args(arguments: Mapping[str, Any] | None, exchange: str, vhost: str) -> None:
    """RabbitMQ's check of an exchange's alternate-exchange argument (406, M16): a name, or the
    exchange would be stored with one no publish can use (and the HTTP API took it too)."""
    ae = (arguments or {}).get("alternate-exchange")
    if ae is not None and not utf8(ae):
        raise CMQError("M16", f"invalid type '{amqp_type(ae)}' for arg 'alternate-exchange' in exchange "
                       f"'{exchange}' in vhost '{vhost}'", reply_code=PRECONDITION_FAILED, value=ae)


# M11 / PF5: a queue or consumer argument asking for the CMQ receive metadata on deliveries.
RECEIVE_METADATA = "x-cmq-receive-metadata"


def receive_metadata(arguments: Mapping[str, Any] | None) -> bool:
    """True when ``arguments`` ask for the receive metadata (true, 1 or "true")."""
    if not arguments:
        return False
    value = arguments.get(RECEIVE_METADATA)
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    if isinstance(value, str):
        return value.strip().lower() in ("true", "1", "yes")
    return value is True or (type(value) is int and value == 1)


def parse_queue_args(arguments: Mapping[str, Any] | None) -> QueueArgs:
    out = QueueArgs()
    args = arguments or {}
    out.receive_metadata = receive_metadata(args)
    for name, value in args.items():
        if name in CMQ_ATTRS:
            out.attrs[CMQ_ATTRS[name]] = _int(name, value)
        elif name == "x-cmq-dead-letter-queue":
            out.attrs["dead_letter_queue"] = _str(name, value)
        elif name == "x-dead-letter-exchange":
            out.dead_letter_exchange = _str(name, value)
        elif name == "x-dead-letter-routing-key":
            out.dead_letter_routing_key = _str(name, value)
        elif name == "x-max-length":
            out.attrs["max_length"] = _int(name, value)
        elif name == "x-overflow":
            out.attrs["overflow"] = _str(name, value)
        elif name == "x-message-ttl":
            out.attrs["message_ttl_ms"] = _int(name, value)
        elif name == "x-single-active-consumer":
            out.single_active_consumer = value is True
        elif name == "x-max-priority":
            out.max_priority = _int(name, value)
        elif name == "x-expires":
            out.expires_ms = _int(name, value)
            if out.expires_ms <= 0:
                raise CMQError("M7", f"invalid arg 'x-expires' for queue: {value!r} must be positive",
                               value=value)
    if "x-delivery-limit" in args:
        # RabbitMQ quorum queues count deliveries; CMQ counts receives: the same (M7, Q8).
        # With a CMQ dead-letter queue it is CMQ's maxReceiveCount; otherwise the broker
        # enforces it (dead-lettering through x-dead-letter-exchange, or dropping).
        limit = _int("x-delivery-limit", args["x-delivery-limit"])
        if "dead_letter_queue" in out.attrs:
            out.attrs["max_receive_count"] = limit
        else:
            out.delivery_limit = limit
    return out


def rewind_to(arguments: Mapping[str, Any] | None) -> float | None:
    """M15: ``x-stream-offset`` (a timestamp: AMQP timestamp, datetime or Unix seconds) or
    ``x-cmq-rewind-to`` (Unix seconds). Stream offsets that are not times (``first``,
    ``last``, ``next``, numeric offsets in a stream) have no CMQ meaning: refused."""
    if not arguments:
        return None
    if "x-cmq-rewind-to" in arguments:
        return float(_int("x-cmq-rewind-to", arguments["x-cmq-rewind-to"]))
    if "x-stream-offset" in arguments:
        value = arguments["x-stream-offset"]
        if hasattr(value, "timestamp"):
            return float(value.timestamp())
        if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
            return float(value)
        raise CMQError("M15", f"x-stream-offset {value!r} is not a timestamp; only a rewind to a "
                       "time is supported", value=value)
    return None


# The arguments RabbitMQ 3.10 compares when a queue or exchange is declared again (others
# are ignored on a redeclare, as there), plus every x-cmq-* argument: CMQ attributes.
QUEUE_EQUIVALENCE = frozenset((
    "x-expires", "x-message-ttl", "x-dead-letter-exchange", "x-dead-letter-routing-key",
    "x-max-length", "x-max-length-bytes", "x-max-in-memory-length", "x-max-in-memory-bytes",
    "x-max-priority", "x-overflow", "x-queue-mode", "x-queue-version", "x-single-active-consumer",
    "x-queue-type", "x-quorum-initial-group-size", "x-delivery-limit", "x-max-age",
    "x-stream-max-segment-size-bytes", "x-initial-cluster-size", "x-queue-leader-locator",
))
EXCHANGE_EQUIVALENCE = frozenset(("alternate-exchange",))


def equivalent_args(a: Mapping[str, Any] | None, b: Mapping[str, Any] | None,
                    compared: frozenset[str] | None = None) -> str | None:
    """The first argument that differs between two declares, or None (for the 406
    'inequivalent arg' RabbitMQ sends on a redeclare). ``compared``: the non-x-cmq arguments
    that count; None compares all."""
    a = a or {}
    b = b or {}
    for key in sorted(set(a) | set(b)):
        if compared is not None and key not in compared and not key.startswith("x-cmq-"):
            continue
        if a.get(key) != b.get(key):
            return key
    return None
