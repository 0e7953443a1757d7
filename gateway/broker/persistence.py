"""What the broker journals in the store, and under which keys (the one place they are built).

Names may hold any byte (and the vhost ``/`` holds a slash), so every record repeats the
names it belongs to in its value, and every key component is escaped by
semantics.store.keys (``%`` -> ``%25``, ``/`` -> ``%2F``; see there why): no two objects
share a key, and a scan prefix (``*_PREFIX``, :func:`queue_messages_prefix`) matches only
the keys of the objects it names.

* ``x/<vhost>/<exchange>``  JSON: the durable exchange's declaration
* ``q/<vhost>/<queue>``     JSON: the durable queue's declaration
* ``b/<vhost>/<source>/<kind>/<dest>/<key>``  JSON: one binding key of a durable pair
* ``m/<vhost>/<queue>/<msg_id>``  binary: a persistent message in a durable queue
* ``p/<vhost>/<policy>``  JSON: a RabbitMQ policy, as definitions spell it
* ``t/<vhost>/<exchange>/<msg_id>``  binary: a persistent message a durable topic retains
  for retries (D2), with the subscriptions still owed it
* ``s/<vhost>/<exchange>/<subscription>``  JSON: an HTTP subscription (D7, gateway.push)
* ``l/<vhost>/<rule>/<object>/<user>``  JSON: an entry of the CMQ limits report (PF4), so
  that a restart neither reports a standing breach again nor forgets it (A6)
* ``u/user/<name>``, ``u/vhost/<name>``, ``u/perm/<vhost>/<user>``  JSON: a user, vhost or
  permission changed at run time, or its tombstone (gateway.accounts, SE4); layout 0 never
  had them
* ``meta/format``  the key layout version (semantics.store.versioning): 1 since the
  components are escaped; 0 (no such key) wrote them raw, and is migrated on open by
  :func:`rekey_v0`, which takes the names from the values because raw keys may collide.
"""

from __future__ import annotations

import json
import logging
import struct
from decimal import Decimal
from typing import Any

from gateway.protocol.fieldtable import Typed
from semantics.store.keys import escape, key_prefix, make_key
from semantics.store.versioning import FORMAT_KEY

__all__ = [
    "ACCOUNTS_PREFIX",
    "BINDINGS_PREFIX",
    "EXCHANGES_PREFIX",
    "FORMAT_KEY",
    "FORMAT_VERSION",
    "LIMITS_PREFIX",
    "MESSAGES_PREFIX",
    "POLICIES_PREFIX",
    "QUEUES_PREFIX",
    "RETAINED_PREFIX",
    "SUBSCRIPTIONS_PREFIX",
    "binding_key",
    "decode_json",
    "decode_message",
    "decode_message_head",
    "message_body",
    "encode_json",
    "encode_message",
    "exchange_key",
    "limit_key",
    "message_key",
    "permission_key",
    "policy_key",
    "queue_key",
    "queue_messages_prefix",
    "rekey_v0",
    "decode_retained",
    "encode_retained",
    "retained_key",
    "subscription_key",
    "user_key",
    "user_vhost_key",
]

_MSG_HEAD = struct.Struct(">BdHHHHI")  # version, enqueue time, 4 name lengths, props length
_RET_HEAD = struct.Struct(">BII")  # version, JSON length, props length


log = logging.getLogger("cmq_gateway.broker")

FORMAT_VERSION = 1

EXCHANGES_PREFIX = key_prefix("x")
QUEUES_PREFIX = key_prefix("q")
BINDINGS_PREFIX = key_prefix("b")
MESSAGES_PREFIX = key_prefix("m")
RETAINED_PREFIX = key_prefix("t")
SUBSCRIPTIONS_PREFIX = key_prefix("s")
ACCOUNTS_PREFIX = key_prefix("u")
POLICIES_PREFIX = key_prefix("p")
LIMITS_PREFIX = key_prefix("l")


def exchange_key(vhost: str, name: str) -> str:
    return make_key("x", vhost, name)


def queue_key(vhost: str, name: str) -> str:
    return make_key("q", vhost, name)


def binding_key(vhost: str, source: str, kind: str, dest: str, key: str) -> str:
    return make_key("b", vhost, source, kind, dest, key)


def limit_key(vhost: str, rule: str, object: str, user: str | None) -> str:
    """An entry of the limits report; a breach with no user (a restart found it) as ``""``."""
    return make_key("l", vhost, rule, object, user or "")


def policy_key(vhost: str, name: str) -> str:
    return make_key("p", vhost, name)


def queue_messages_prefix(vhost: str, queue: str) -> str:
    """The scan prefix of exactly one queue's messages."""
    return key_prefix("m", vhost, queue)


# Persistent publish and ack build a message key each: a queue's prefix is escaped once and
# found with two dict lookups (no tuple to allocate). Bounded per vhost so that a churn of
# uniquely named queues cannot grow it without end.
_queue_prefixes: dict[str, dict[str, str]] = {}
_QUEUE_PREFIXES_MAX = 4096


def message_key(vhost: str, queue: str, msg_id: str) -> str:
    """``make_key("m", vhost, queue, msg_id)``, with the prefix cached (the hot path)."""
    try:
        prefix = _queue_prefixes[vhost][queue]
    except KeyError:
        queues = _queue_prefixes.setdefault(vhost, {})
        if len(queues) >= _QUEUE_PREFIXES_MAX:
            queues.clear()
        prefix = queues[queue] = key_prefix("m", vhost, queue)
    if "%" in msg_id or "/" in msg_id:
        msg_id = escape(msg_id)
    return prefix + msg_id


def subscription_key(vhost: str, exchange: str, name: str) -> str:
    return make_key("s", vhost, exchange, name)


def user_key(name: str) -> str:
    return make_key("u", "user", name)


def user_vhost_key(name: str) -> str:
    return make_key("u", "vhost", name)


def permission_key(vhost: str, user: str) -> str:
    return make_key("u", "perm", vhost, user)


def _plain(value: Any) -> Any:
    """Field-table values as JSON can hold them (bytes become text, decimals and timestamps
    numbers): a client may give any argument any type, as RabbitMQ allows."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, bytes | bytearray):
        return bytes(value).decode("utf-8", "replace")
    if isinstance(value, Decimal):
        return float(value)
    if hasattr(value, "isoformat"):
        return value.timestamp()
    if isinstance(value, Typed):
        return _plain(value.value)
    return value


def encode_json(record: dict[str, Any]) -> bytes:
    return json.dumps(_plain(record), separators=(",", ":")).encode()


def decode_json(raw: bytes) -> dict[str, Any]:
    result: dict[str, Any] = json.loads(raw)
    return result


# A queue's messages share a few (vhost, queue, exchange, routing key): their bytes and
# lengths made once, not four encodes and a generator a message (issue 28: CPU a publish).
_ENCODED_NAMES: dict[tuple[str, str, str, str], tuple[bytes, int, int, int, int]] = {}
_ENCODED_NAMES_MAX = 1024


def _encoded_names(key: tuple[str, str, str, str]) -> tuple[bytes, int, int, int, int]:
    v, q, e, r = (s.encode() for s in key)
    return v + q + e + r, len(v), len(q), len(e), len(r)


def encode_message(vhost: str, queue: str, msg_id: str, enqueue_time: float, exchange: str,
                   routing_key: str, properties: bytes, body: bytes) -> bytes:
    key = (vhost, queue, exchange, routing_key)
    names = _ENCODED_NAMES.get(key)
    if names is None:
        if len(_ENCODED_NAMES) >= _ENCODED_NAMES_MAX:
            _ENCODED_NAMES.clear()
        names = _ENCODED_NAMES[key] = _encoded_names(key)
    joined, lv, lq, le, lr = names
    head = _MSG_HEAD.pack(1, enqueue_time, lv, lq, le, lr, len(properties))
    return b"".join([head, joined, msg_id.encode(), b"\x00", properties, body])


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


def message_body(raw: bytes) -> bytes:
    """The body of an ``encode_message`` record, without decoding the rest."""
    _, _, lv, lq, le, lr, lp = _MSG_HEAD.unpack_from(raw)
    end = raw.index(b"\x00", _MSG_HEAD.size + lv + lq + le + lr)
    return raw[end + 1 + lp:]


def decode_message_head(head: bytes, names: dict[bytes, tuple[str, str, str, str]]
                        ) -> tuple[float, tuple[str, str, str, str], str, bytes, int] | None:
    """(enqueue time, (vhost, queue, exchange, routing key), msg_id, properties, where the
    body starts) from the first bytes of an ``encode_message`` record, or None when they
    do not hold all of that. ``names`` caches the four names by their bytes: 10^6 messages
    of one queue share one tuple of strings, decoded once (recovery: issue 15)."""
    _, enq, lv, lq, le, lr, lp = _MSG_HEAD.unpack_from(head)
    pos = _MSG_HEAD.size
    end = pos + lv + lq + le + lr
    # cached by the four lengths and the names: by the names' bytes alone, vhost "/" with queue
    # "ab" and exchange "" joins as queue "a" with exchange "b" (and exchange "logs" with key
    # ".a" as exchange "" with key "logs.a"), and the second record read got the first's names
    raw = head[9:end]
    four = names.get(raw)
    if four is None:
        a, b, c = 12 + lv, 12 + lv + lq, 12 + lv + lq + le
        four = names[raw] = (raw[12:a].decode(), raw[a:b].decode(), raw[b:c].decode(), raw[c:].decode())
    nul = head.find(b"\x00", end)
    if nul < 0 or nul + 1 + lp > len(head):
        return None
    return enq, four, head[end:nul].decode(), head[nul + 1:nul + 1 + lp], nul + 1 + lp


def retained_key(vhost: str, exchange: str, msg_id: str) -> str:
    return make_key("t", vhost, exchange, msg_id)


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


def _named_key(key: str, value: bytes) -> str | None:
    kind = key[:2]
    if kind in ("x/", "q/"):
        r = decode_json(value)
        return make_key(key[0], r["vhost"], r["name"])
    if kind == "b/":
        r = decode_json(value)
        return binding_key(r["vhost"], r["source"], r["kind"], r["dest"], r["key"])
    if kind == "m/":
        m = decode_message(value)
        return make_key("m", m["vhost"], m["queue"], m["msg_id"])
    if kind == "t/":
        t = decode_retained(value)
        return retained_key(t["vhost"], t["exchange"], t["msg_id"])
    if kind == "s/":
        r = decode_json(value)
        return subscription_key(r["vhost"], r["exchange"], r["name"])
    return None


def rekey_v0(key: str, value: bytes) -> str | None:
    """Layout 0 -> 1: the escaped key of a record, from the names its value repeats (a raw
    key may have been shared by two objects; the value names the one that wrote last). A
    record whose value does not decode stays where it is, as recovery always treated it."""
    try:
        return _named_key(key, value)
    except (ValueError, KeyError, TypeError, struct.error, IndexError):
        log.warning("store key %r: value unreadable, left under its old key", key)
        return None
