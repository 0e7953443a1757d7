"""What the broker journals in the store, under the keys of docs/ARCHITECTURE.md.

Names may hold any byte (and the vhost ``/`` holds a slash), so every record repeats the
names it belongs to in its value; keys only have to be unique and prefix-searchable.

* ``x/<vhost>/<exchange>``  JSON: the durable exchange's declaration
* ``q/<vhost>/<queue>``     JSON: the durable queue's declaration
* ``b/<vhost>/<source>/<kind>/<dest>/<key>``  JSON: one binding key of a durable pair
* ``m/<vhost>/<queue>/<msg_id>``  binary: a persistent message in a durable queue
* ``t/<vhost>/<exchange>/<msg_id>``  binary: a persistent message a durable topic retains
  for retries (D2), with the subscriptions still owed it
"""

from __future__ import annotations

import json
import struct
from decimal import Decimal
from typing import Any

from gateway.protocol.fieldtable import Typed

__all__ = [
    "binding_key",
    "decode_json",
    "decode_message",
    "encode_json",
    "encode_message",
    "exchange_key",
    "message_key",
    "queue_key",
    "decode_retained",
    "encode_retained",
    "retained_key",
]

_MSG_HEAD = struct.Struct(">BdHHHHI")  # version, enqueue time, 4 name lengths, props length
_RET_HEAD = struct.Struct(">BII")  # version, JSON length, props length


def exchange_key(vhost: str, name: str) -> str:
    return f"x/{vhost}/{name}"


def queue_key(vhost: str, name: str) -> str:
    return f"q/{vhost}/{name}"


def binding_key(vhost: str, source: str, kind: str, dest: str, key: str) -> str:
    return f"b/{vhost}/{source}/{kind}/{dest}/{key}"


def message_key(vhost: str, queue: str, msg_id: str) -> str:
    return f"m/{vhost}/{queue}/{msg_id}"


def _plain(value: Any) -> Any:
    """Field-table values as JSON can hold them (bytes and decimals become text, timestamps
    numbers)."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if hasattr(value, "isoformat"):
        return value.timestamp()
    if isinstance(value, Typed):
        return _plain(value.value)
    if isinstance(value, Decimal):
        return str(value)  # exact digits; JSON has no decimal type
    return value


def encode_json(record: dict[str, Any]) -> bytes:
    return json.dumps(_plain(record), separators=(",", ":")).encode()


def decode_json(raw: bytes) -> dict[str, Any]:
    result: dict[str, Any] = json.loads(raw)
    return result


def encode_message(vhost: str, queue: str, msg_id: str, enqueue_time: float, exchange: str,
                   routing_key: str, properties: bytes, body: bytes) -> bytes:
    names = [s.encode() for s in (vhost, queue, exchange, routing_key)]
    head = _MSG_HEAD.pack(1, enqueue_time, *(len(n) for n in names), len(properties))
    return b"".join([head, *names, msg_id.encode(), b"\x00", properties, body])


def decode_message(raw: bytes) -> dict[str, Any]:
    _, enq, lv, lq, le, lr, lp = _MSG_HEAD.unpack_from(raw)
    pos = _MSG_HEAD.size
    out: dict[str, Any] = {"enqueue_time": enq}
    for field, n in (("vhost", lv), ("queue", lq), ("exchange", le), ("routing_key", lr)):
        out[field] = raw[pos:pos + n].decode()
        pos += n
    end = raw.index(b"\x00", pos)
    out["msg_id"] = raw[pos:end].decode()
    pos = end + 1
    out["properties"] = raw[pos:pos + lp]
    out["body"] = raw[pos + lp:]
    return out


def retained_key(vhost: str, exchange: str, msg_id: str) -> str:
    return f"t/{vhost}/{exchange}/{msg_id}"


def encode_retained(vhost: str, exchange: str, msg_id: str, published_at: float, owed: list[str],
                    routing_key: str, tags: list[str], properties: bytes, body: bytes) -> bytes:
    meta = json.dumps({"vhost": vhost, "exchange": exchange, "msg_id": msg_id, "published_at": published_at,
                       "owed": owed, "routing_key": routing_key, "tags": tags},
                      separators=(",", ":")).encode()
    return b"".join([_RET_HEAD.pack(1, len(meta), len(properties)), meta, properties, body])


def decode_retained(raw: bytes) -> dict[str, Any]:
    _, lm, lp = _RET_HEAD.unpack_from(raw)
    pos = _RET_HEAD.size
    out: dict[str, Any] = json.loads(raw[pos:pos + lm])
    pos += lm
    out["properties"] = raw[pos:pos + lp]
    out["body"] = raw[pos + lp:]
    return out
