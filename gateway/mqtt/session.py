"""One MQTT client on the broker (SPEC MQ2-MQ6), through the same broker ``Session`` an AMQP
connection gets.

Why through an AMQP session. Permissions (W2), publishing and its confirms (M14), queues,
bindings, consumers, acknowledgements, visibility timeouts (Q1) and the audit rows all live
behind ``gateway.broker.Session``; an MQTT client is given one, with a :class:`Bridge` in
place of the AMQP wire core, and drives it with the methods an AMQP client would send:

* channel 1 consumes the session's queue, channel 2 publishes in confirm mode, channel 3
  declares, binds and unbinds (a refused bind closes that channel only: it is opened again).
* one queue per session, ``amq.mqtt-subscription-<readable part of the id>-<digest>`` (MQ8:
  no AMQP client can declare it first; permissions are checked under RabbitMQ's name for it,
  ``mqtt-subscription-<client id>``, and a session stored before keeps the queue of that name).
  RabbitMQ's plugin keeps one per QoS level; one is enough here because the delivered QoS is
  computed per message from the session's filters. A clean session's queue is exclusive and transient, removed with the
  connection; a persistent session's is durable, with ``x-expires`` for an MQTT 5 session
  expiry (MQ3).
* a subscription ``sensors/+/temp`` is the binding ``sensors.*.temp`` from ``amq.topic``
  (MQ2); the delivered QoS is min(publish QoS, the best matching subscription's QoS).
* PUBACK / PUBREC go out when channel 2's confirm does, that is once the message is durable
  where it must be (MQ4); a QoS 2 packet identifier is remembered from the PUBLISH until the
  PUBREL, per session and across reconnects, so a resent PUBLISH is never routed twice.
* a delivery that is not acknowledged comes again with DUP set after the queue's visibility
  timeout or on reconnect (MQ6), under the packet identifier it had before.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import re
import struct
from collections import Counter, deque
from collections.abc import Container
from functools import partial
from typing import TYPE_CHECKING, Any

from pamqp import commands as C

from gateway.mqtt import codec as P
from gateway.mqtt.topics import (
    filter_to_binding,
    matches,
    routing_key_to_topic,
    topic_to_routing_key,
    valid_filter,
    valid_topic,
)
from gateway.protocol import events as ev
from gateway.protocol.properties import Properties
from semantics.errors import CMQError
from semantics.message_ids import new_msg_id
from semantics.store.keys import make_key

if TYPE_CHECKING:
    from collections.abc import Iterator

    from gateway.mqtt.server import MQTTService

__all__ = ["Bridge", "MQTTSession", "SessionState"]

log = logging.getLogger("cmq_gateway.mqtt")

CONSUME, PUBLISH, OPS = 1, 2, 3
EXCHANGE = "amq.topic"
QOS_HEADER = "x-mqtt-publish-qos"
# Who published it and whether it was retained, for MQTT 5's "no local" and "retain as
# published" subscription options (AMQP consumers see them as plain headers).
PUBLISHER_HEADER, RETAIN_HEADER = "x-mqtt-publisher", "x-mqtt-retain"
NO_LOCAL, RETAIN_AS_PUBLISHED = 0x04, 0x08
# Unacknowledged QoS 1/2 deliveries in flight to one client when it does not say (3.1.1).
DEFAULT_INFLIGHT = 100
NOT_AUTHORIZED, QUOTA_EXCEEDED, UNSPECIFIED = 0x87, 0x97, 0x80
NO_SUBSCRIPTION_EXISTED, PACKET_ID_NOT_FOUND, TOPIC_NAME_INVALID = 0x11, 0x92, 0x90
# Client-to-server topic aliases a connection may set (CONNACK's Topic Alias Maximum), as
# RabbitMQ's mqtt.topic_alias_maximum default.
TOPIC_ALIAS_MAXIMUM = 16
# Shared subscriptions ($share/<group>/<filter>) are consumed on channels from FIRST_SHARED on;
# their delivery tags carry the channel above SHARED_TAG_SHIFT bits, so that one in-flight
# table and one settle path serve the session's queue and the shared ones alike.
FIRST_SHARED, SHARED_TAG_SHIFT = 4, 40
# Flow control (W5's back-pressure, per destination, as RabbitMQ's credit flow): a publisher is
# not read from while a queue its messages went to has a consumer and more than BACKLOG_HIGH
# messages not yet delivered to it, and is read again once each is at BACKLOG_LOW or fewer.
# Acknowledging a publisher faster than its subscribers take the messages built a backlog
# without bound (issue 31: 14-20k PUBACKs a second against 5-7k deliveries).
BACKLOG_HIGH, BACKLOG_LOW = 8192, 4096
# SE5: a SUBSCRIBE or UNSUBSCRIBE is handled this many filters (or retained-message matches)
# per event-loop turn; one of thousands of filters then lets the others in between.
FILTERS_PER_TURN = 64
RETAINED_MATCHES_PER_TURN = 4096
SHARED_TAG = 1 << SHARED_TAG_SHIFT
CLEAN_SHARED_EXPIRES = 86400  # seconds
_PLAIN_GROUP = re.compile(r"[A-Za-z0-9_-]{1,23}")  # the name within CMQ's 64 bytes (L2)


# MQ8: the names of MQTT's own queues. Any client id MQTT allows (up to 65,535 bytes of any
# UTF-8 but U+0000) and any group and filter must give a name that (a) passes every AMQP and
# CMQ name check (255 bytes, L1/L2 in both profiles) and (b) no AMQP client can take first:
# ``mqtt-subscription-<client id>`` failed (a) for `é`, `|` or 300 bytes, and (b) let the
# client id `payroll` consume an AMQP application's queue `mqtt-subscription-payroll`.
# So: the reserved prefix ``amq.`` (queue.declare of ``amq.*`` is 403 for every client, as in
# RabbitMQ; the session declares through the vhost as a server-named queue, as amq.gen-...),
# a readable part of the id made of what any name check takes, and a digest of (vhost, id).
# Permissions (W2) are still checked under the RabbitMQ plugin's names, mqtt-subscription-...,
# which users' patterns name (the broker Session's permission_names); the queue's
# x-mqtt-client-id argument says whose it is (management API).
QUEUE_PREFIX, SHARED_PREFIX = "amq.mqtt-subscription-", "amq.mqtt-share-"
LEGACY_PREFIX = "mqtt-subscription-"  # the names before MQ8, and the names permissions are checked by
CLIENT_ID_ARG = "x-mqtt-client-id"
# A topic longer than a routing key holds (AMQP's short string, 255 bytes), routed by the MQTT
# front end (MQTTSession._long_topic_publishes), carries itself in this header. A topic of at
# most 63 characters is at most 252 bytes: only longer ones are measured.
TOPIC_HEADER, AMQP_KEY_BYTES, SHORT_TOPIC_CHARS = "x-mqtt-topic", 255, 63
# MQTT 5 properties longer than their AMQP property holds, and user properties whose name is
# longer than a table key, in headers of their own (message_properties).
_LONG_HEADERS = {"content_type": "x-mqtt-content-type", "response_topic": "x-mqtt-response-topic"}
LONG_USER_HEADER, CORRELATION_HEADER = "x-mqtt-user-properties", "x-correlation-data"
_READABLE = re.compile(r"[^A-Za-z0-9_-]+")
_LONG_ID = 256  # bytes: a longer client id is a digest in its session's store key


def _digest(*parts: str) -> str:
    return hashlib.sha256("\0".join(parts).encode("utf-8", "surrogatepass")).hexdigest()[:32]


def session_key(vhost: str, client_id: str) -> str:
    """The store key of a persistent session. A client id of up to 65,535 bytes would make a
    key past the store's 64 KiB (escaped, up to three times its size) and past what a NATS
    subject holds (the JetStream store's bucket): a long one is named by its digest, in a
    key of three components that no client id's two-component key can equal."""
    if len(client_id) > _LONG_ID // 4 and len(client_id.encode("utf-8", "surrogatepass")) > _LONG_ID:
        return make_key("ms", vhost, "#", _digest(vhost, client_id))
    return make_key("ms", vhost, client_id)


def queue_name(vhost: str, client_id: str) -> str:
    """The session queue of ``client_id`` in ``vhost``: at most 22 + 24 + 1 + 32 bytes."""
    readable = _READABLE.sub("", client_id)[:24]
    return f"{QUEUE_PREFIX}{readable}-{_digest(vhost, client_id)}"


def legacy_queue_name(client_id: str) -> str:
    """Its name before MQ8, which a session stored then keeps (SessionState.from_json), and
    the name W2 checks the user's rights on."""
    return f"{LEGACY_PREFIX}{client_id}"


def shared_queue_name(group: str, topic_filter: str) -> str:
    """The one queue of a shared subscription group (every member consumes it, so each
    message goes to one of them); the filter as a digest, as it may hold anything."""
    digest = _digest(group, topic_filter)
    return f"{SHARED_PREFIX}{group}-{digest}" if _PLAIN_GROUP.fullmatch(group) else f"{SHARED_PREFIX}{digest}"


def legacy_shared_queue_name(group: str, topic_filter: str) -> str:
    """A group's queue before MQ8 (kept while it exists), and the name W2 checks."""
    digest = hashlib.sha256(f"{group}/{topic_filter}".encode()).hexdigest()[:16]
    return f"{LEGACY_PREFIX}share-{group}-{digest}" if _PLAIN_GROUP.fullmatch(group) else \
        f"{LEGACY_PREFIX}share-{digest}"


def shared_queue_in(queues: Container[str], group: str, topic_filter: str) -> tuple[str, str]:
    """(the queue of a shared subscription group, the name W2 checks on it): the group's
    queue from before MQ8 while it exists, else its amq.mqtt-share-... queue."""
    legacy = legacy_shared_queue_name(group, topic_filter)
    return (legacy if legacy in queues else shared_queue_name(group, topic_filter)), legacy


def split_shared(topic_filter: str) -> tuple[str, str] | None:
    """(group, filter) of ``$share/<group>/<filter>`` (MQTT 5 4.8.2); None when malformed."""
    parts = topic_filter.split("/", 2)
    if len(parts) != 3 or not parts[1] or "+" in parts[1] or "#" in parts[1] or not valid_filter(parts[2]):
        return None
    return parts[1], parts[2]


def reason_of_reply(reply_code: int, reply_text: str) -> int:
    """The same for a refusal that closed a channel (its reply code and text)."""
    if reply_code == 403:
        return NOT_AUTHORIZED
    if "(CMQ limit " in reply_text:
        return QUOTA_EXCEEDED
    return UNSPECIFIED


def reason_of(e: CMQError) -> int:
    """MQTT 5 reason code of a refusal: 403 is W2's, a limit (L*, PF*) a quota (MQ6)."""
    if e.reply_code == 403:
        return NOT_AUTHORIZED
    if e.rule.startswith(("L", "PF")):
        return QUOTA_EXCEEDED
    return UNSPECIFIED


_U32, _I64 = struct.Struct(">I"), struct.Struct(">q")
_ID_KEY = b"\x0cx-cmq-msg-id"
_QOS_KEY = b"\x12" + QOS_HEADER.encode()


def _delivery_headers(raw: bytes) -> tuple[str, int | None] | None:
    """(CMQ msg id, publish QoS) read straight from a delivery's property bytes, as the
    broker writes them (M11 headers; the QoS as a long); None: decode the table instead.
    Decoding the whole table was a fifth of the time of a delivery; the lengths and the QoS
    are read with precompiled structs (int.from_bytes on slices was half of what is left)."""
    i = raw.rfind(_ID_KEY)
    start = i + 18
    if i < 0 or len(raw) < start or raw[i + 13] != 0x53:  # 'S': long string
        return None
    msg_id = raw[start:start + _U32.unpack_from(raw, i + 14)[0]].decode("utf-8", "replace")
    # The publisher's own headers come before the M11 entries the broker appends.
    j = raw.find(_QOS_KEY, 0, i)
    if j < 0:
        return msg_id, None
    if raw[j + 19] != 0x6C:  # 'l': as Properties.build writes an int
        return None
    return msg_id, _I64.unpack_from(raw, j + 20)[0]


# A delivery's property bytes as published (the session's own queue is consumed without M11
# metadata) -> the publish QoS in them (None: none; _UNREADABLE: decode the table instead).
# Every message of one MQTT publisher carries the same bytes object (MQTTSession._props), so
# this is one dict lookup of a cached hash a delivery.
_QOS_OF_PROPS: dict[bytes, object] = {}
_UNREADABLE = object()
_NO_MPROPS: dict[str, Any] = {}  # a delivery without MQTT 5 properties (never written to)


def publish_qos(raw: bytes) -> object:
    """The x-mqtt-publish-qos header of property bytes, read as _delivery_headers reads it:
    an int, None when there is none, or _UNREADABLE (not a long: decode the table)."""
    qos = _QOS_OF_PROPS.get(raw, _UNREADABLE)
    if qos is not _UNREADABLE:
        return qos
    j = raw.find(_QOS_KEY)
    if j < 0:
        qos = None
    elif len(raw) < j + 28 or raw[j + 19] != 0x6C:  # 'l': as Properties.build writes an int
        return _UNREADABLE
    else:
        qos = _I64.unpack_from(raw, j + 20)[0]
    if len(_QOS_OF_PROPS) >= 1024:
        _QOS_OF_PROPS.clear()
    _QOS_OF_PROPS[raw] = qos
    return qos


# (topic, flags byte, payload length) -> the PUBLISH up to its packet identifier: deliveries
# repeat a few topics and sizes, and building this part was most of the cost of a packet.
_PUBLISH_HEADS: dict[tuple[str, int, int, int], bytes] = {}
_U16 = struct.Struct(">H")


def publish_bytes(topic: str, payload: bytes, qos: int, pid: int, dup: bool, level: int,
                  retain: bool = False) -> bytes:
    """A PUBLISH without properties, written directly (every delivery goes through here)."""
    first = 0x30 | (8 if dup else 0) | (qos << 1) | (1 if retain else 0)
    key = (topic, first, len(payload), level)
    head = _PUBLISH_HEADS.get(key)
    if head is None:
        t = topic.encode()
        n = 2 + len(t) + (2 if qos else 0) + (1 if level >= 5 else 0) + len(payload)
        head = P.fixed_header(first, n) + len(t).to_bytes(2, "big") + t
        if len(_PUBLISH_HEADS) >= 4096:
            _PUBLISH_HEADS.clear()
        _PUBLISH_HEADS[key] = head
    if not qos:
        return head + b"\x00" + payload if level >= 5 else head + payload
    return b"".join((head, _U16.pack(pid), b"\x00", payload) if level >= 5 else (head, _U16.pack(pid), payload))


def message_properties(qos: int, retain: bool, client_id: str, mprops: dict[str, Any]) -> Properties:
    """The AMQP properties of an MQTT PUBLISH: its QoS, publisher and retain flag as
    headers, MQTT 5 properties as their AMQP counterparts."""
    headers: dict[str, Any] = {QOS_HEADER: qos, PUBLISHER_HEADER: client_id}
    if retain:
        headers[RETAIN_HEADER] = 1
    long_users = []
    for k, v in mprops.get("user_property", ()):
        if _short(k):
            headers[k] = v
        else:
            long_users.append([k, v])  # a table key holds 255 bytes, an MQTT string 65,535
    if long_users:
        headers[LONG_USER_HEADER] = long_users
    values: dict[str, Any] = {"delivery_mode": 2 if qos else 1, "headers": headers}
    # MQTT strings of up to 65,535 bytes: in their AMQP property when it holds them (a short
    # string, 255 bytes), else whole in a header that the delivery reads back.
    for name, amqp in (("content_type", "content_type"), ("response_topic", "reply_to")):
        value = mprops.get(name)
        if value is not None:
            if _short(value):
                values[amqp] = value
            else:
                headers[_LONG_HEADERS[name]] = value
    if "message_expiry" in mprops:
        values["expiration"] = str(mprops["message_expiry"] * 1000)
    cd = mprops.get("correlation_data")
    if cd is not None:
        try:
            text = cd.decode()
        except UnicodeDecodeError:
            text = None
        if text is not None and _short(text):
            values["correlation_id"] = text
        else:
            headers[CORRELATION_HEADER] = cd
    return Properties.build(**values)


def _short(text: str) -> bool:
    """Whether ``text`` fits an AMQP short string (255 bytes)."""
    return len(text) <= SHORT_TOPIC_CHARS or len(text.encode()) <= AMQP_KEY_BYTES


class SessionState:
    """What outlives one connection of a client id (MQ3, MQ4, MQ8).

    The outgoing half of a persistent session is stored with it and is durable before a
    packet that depends on it leaves (MQTTSession._after_save): which message each packet
    identifier in flight carries (so that a resend, after a reconnect or a restart, goes
    under the same identifier with DUP), and the identifiers whose PUBREL was sent. An
    identifier in either is never given to another message."""

    def __init__(self, vhost: str, client_id: str, persistent: bool, expiry: int | None) -> None:
        self.vhost = vhost
        self.client_id = client_id
        self.queue = queue_name(vhost, client_id)  # from_json: one stored before MQ8 keeps its own
        self.persistent = persistent
        self.expiry = expiry  # MQTT 5 session expiry (seconds); None: never
        self.subs: dict[str, tuple[int, int]] = {}  # filter -> (QoS, options)
        self.shared: dict[str, tuple[int, int]] = {}  # "$share/<group>/<filter>" -> (QoS, options)
        self.inbound_qos2: set[int] = set()  # PUBLISH QoS 2 routed, PUBREL not yet received
        # Of those, the LSN of the record written just before the message (route): a restart
        # whose store ends at that very record lost the message, and forgets the identifier.
        self.inbound_at: dict[int, int] = {}
        # And the CMQ message IDs it was routed under (more than one for a long topic's
        # several publishes): a resend after a restart on JetStream is routed again under the
        # same IDs, which the streams store once (MQTTService.stored_session).
        self.inbound_ids: dict[int, list[str]] = {}
        # Identifiers of inbound_qos2 whose message may not have reached JetStream (resumed
        # from the store on a cluster): a resend of one is routed again. Not stored.
        self.unsure: set[int] = set()
        # outbound QoS 2: PUBREL sent (or about to be), PUBCOMP awaited: packet id -> the
        # message it carried ("" for a retained one). And the messages the client received
        # (PUBREC) whose queue ack was not made yet: one given again by its queue (the ack was
        # lost to a crash or to the connection's end) is acknowledged, not sent. Such a
        # message is kept here past its PUBCOMP until it is acked: on JetStream it comes back
        # only after the consumer's ack_wait, long after the client completed it.
        self.released: dict[int, str] = {}
        self.released_of_msg: dict[str, int] = {}
        self.pid_of_msg: dict[str, int] = {}  # outbound QoS 1/2 in flight: CMQ msg id -> packet id
        self.msg_of_pid: dict[int, str] = {}  # the reverse: those identifiers are not reused
        self.retained_pids: dict[int, str] = {}  # retained messages in flight: packet id -> topic
        self.live: Any = None  # the MQTTConnection using it now
        self.will_timer: Any = None  # an MQTT 5 delayed will waiting (asyncio.TimerHandle)
        self.will_timer_args: tuple[Any, ...] = ()  # (user, peer, Will) it will publish

    def to_json(self) -> bytes:
        """The persistent part: filters, and the packet identifier state that makes QoS 2
        exactly once (and QoS 1 resends DUP) across a restart too (MQ4, MQ8)."""
        return json.dumps({"vhost": self.vhost, "client_id": self.client_id, "queue": self.queue,
                           "expiry": self.expiry,
                           "subs": {f: list(v) for f, v in self.subs.items()},
                           "shared": {f: list(v) for f, v in self.shared.items()},
                           "inbound_qos2": sorted(self.inbound_qos2),
                           "inbound_at": {str(p): self.inbound_at.get(p, 0) for p in self.inbound_qos2},
                           "inbound_ids": {str(p): self.inbound_ids[p] for p in self.inbound_qos2
                                           if p in self.inbound_ids},
                           "released": {str(p): m for p, m in self.released.items()},
                           "received": sorted(m for m in self.released_of_msg if m),
                           "pids": self.pid_of_msg,
                           "retained_pids": {str(p): t for p, t in self.retained_pids.items()}}).encode()

    @classmethod
    def from_json(cls, raw: bytes) -> SessionState:
        r = json.loads(raw)
        s = cls(r["vhost"], r["client_id"], True, r.get("expiry"))
        s.queue = r.get("queue") or legacy_queue_name(s.client_id)  # written before MQ8: the old name
        s.subs = {f: (int(v[0]), int(v[1])) for f, v in r["subs"].items()}
        s.shared = {f: (int(v[0]), int(v[1])) for f, v in r.get("shared", {}).items()}
        s.inbound_qos2 = set(r.get("inbound_qos2", ()))
        s.inbound_at = {int(p): int(lsn) for p, lsn in r.get("inbound_at", {}).items()}
        s.inbound_ids = {int(p): list(ids) for p, ids in r.get("inbound_ids", {}).items()}
        released = r.get("released", ())
        # Records written before MQ8 kept a list of identifiers and only QoS 2's pids.
        s.released = {int(p): m for p, m in released.items()} if isinstance(released, dict) else \
            {int(p): "" for p in released}
        s.released_of_msg = {m: p for p, m in s.released.items() if m}
        for m in r.get("received", ()):
            s.released_of_msg.setdefault(m, 0)
        s.pid_of_msg = {m: int(p) for m, p in r.get("pids", r.get("qos2_pids", {})).items()}
        s.msg_of_pid = {p: m for m, p in s.pid_of_msg.items()}
        s.retained_pids = {int(p): t for p, t in r.get("retained_pids", {}).items()}
        return s

    def inbound_done(self, pid: int) -> bool:
        """PUBREL (or a refusal) for an incoming QoS 2 ``pid``; False: it was not known."""
        self.unsure.discard(pid)
        self.inbound_ids.pop(pid, None)
        self.inbound_at.pop(pid, None)
        if pid in self.inbound_qos2:
            self.inbound_qos2.discard(pid)
            return True
        return False

    def pid_taken(self, pid: int) -> bool:
        """Whether ``pid`` still belongs to a message the client may hold (MQ8)."""
        return pid in self.msg_of_pid or pid in self.released or pid in self.retained_pids

    def remember(self, msg_id: str, pid: int) -> None:
        self.pid_of_msg[msg_id] = pid
        self.msg_of_pid[pid] = msg_id

    def forget_msg(self, msg_id: str) -> None:
        pid = self.pid_of_msg.pop(msg_id, None)
        if pid is not None and self.msg_of_pid.get(pid) == msg_id:
            del self.msg_of_pid[pid]

    def release(self, pid: int, msg_id: str) -> None:
        """PUBREC came for ``pid``: PUBREL is owed until PUBCOMP."""
        self.released[pid] = msg_id
        if msg_id:
            self.released_of_msg[msg_id] = pid

    def completed(self, pid: int) -> bool:
        """PUBCOMP for ``pid``: the identifier is free again (its message stays in
        released_of_msg until its queue ack is made). False: it was not released."""
        return self.released.pop(pid, None) is not None


class Bridge:
    """Stands in for the AMQP wire core under the broker Session: its replies become MQTT."""

    client_properties: dict[str, Any] = {}

    def __init__(self, session: MQTTSession) -> None:
        self.s = session
        self.errors: dict[int, tuple[int, str]] = {}

    def send_method(self, channel: int, method: Any) -> None:
        name = method.name
        if name == "Basic.Ack" and channel == PUBLISH:
            self.s.confirmed(method.delivery_tag, method.multiple, ok=True)
        elif name == "Basic.Nack" and channel == PUBLISH:
            self.s.confirmed(method.delivery_tag, method.multiple, ok=False)
        # Declare-ok, bind-ok, consume-ok...: the session acts on the call's outcome instead.

    def send_ack(self, channel: int, delivery_tag: int, multiple: bool = False) -> None:
        """The broker's coalesced publisher confirms (its fast path for basic.ack)."""
        if channel == PUBLISH:
            self.s.confirmed(delivery_tag, multiple, ok=True)

    def send_content(self, channel: int, method: Any, properties: Any, body: bytes) -> None:
        pass  # basic.return: not used by an MQTT session

    def send_get_ok(self, channel: int, delivery_tag: int, redelivered: bool, exchange: str,
                    routing_key: str, message_count: int, properties: bytes, body: bytes) -> None:
        pass  # an MQTT session never sends basic.get

    def send_deliver(self, channel: int, consumer_tag: str, delivery_tag: int, redelivered: bool,
                     exchange: str, routing_key: str, properties: bytes, body: bytes) -> None:
        if not exchange:  # by the default exchange: a long topic's (MQ8)
            routing_key = self.s.long_topic_key(properties, routing_key)
        if channel == CONSUME:
            # Handled once the dispatch is over (MQTTSession._dispatched): the delivery's
            # CMQ message ID is then in the channel's unacked record.
            self.s.pending.append((delivery_tag, redelivered, routing_key, properties, body))
        else:
            self.s.deliver_shared(channel, delivery_tag, redelivered, routing_key, properties, body)

    def permissions_changed(self) -> None:
        """SE1: the session's publish permission is checked again at the next PUBLISH."""
        self.s._writable = False

    def close_channel(self, channel: int, reply_code: int, reply_text: str, class_id: int = 0,
                      method_id: int = 0) -> None:
        self.errors[channel] = (reply_code, reply_text)

    def close(self, reply_code: int, reply_text: str, class_id: int = 0, method_id: int = 0) -> None:
        self.s.conn.close_with(UNSPECIFIED, reply_text)


class MQTTSession:
    """The session of one live connection: state (kept across reconnects) plus the broker."""

    def __init__(self, service: MQTTService, conn: Any, state: SessionState, user: str, peer: str,
                 receive_maximum: int) -> None:
        from gateway.broker import Session

        self.service = service
        self.conn = conn  # gateway.mqtt.transport.MQTTConnection
        self.core = conn.core
        self.state = state
        self.broker = service.gw.broker
        self.bridge = Bridge(self)
        # Deliveries from the session's own queue, (tag, redelivered, routing key, property
        # bytes, body), handled at the end of the broker's dispatch (_dispatched).
        self.pending: list[tuple[int, bool, str, bytes, bytes]] = []
        self.bs = Session(self.broker, self.bridge, state.vhost, user, peer, self._dispatched)
        self.bs.protocol = "mqtt"  # MQ7: on its publish, deliver and ack records
        self._internal_name(state.queue, legacy_queue_name(state.client_id))
        self.user, self.peer = user, peer
        self.level = self.core.level
        self.inflight_max = receive_maximum
        self.client_max_packet = 0  # MQTT 5 CONNECT maximum_packet_size; 0: none
        # outbound QoS 1/2 in flight: packet id -> (delivery tag or 0 for a retained one, msg id)
        self.inflight: dict[int, tuple[int, str | None]] = {}
        self._next_pid = 1
        # MQ8, a persistent session: packets (or steps) that wait for the session record they
        # depend on to be durable, (store lsn, bytes or a callable) in lsn order; those that
        # wait for the next record (_save_now, once per loop turn: group commit); and the
        # released messages whose ack waits there too: msg id -> its latest delivery tag.
        self.outbox: deque[tuple[int, Any]] = deque()
        self._save_due: list[Any] = []
        self._save_scheduled = False
        self._dirty = False
        self._releasing: dict[str, int] = {}
        # Read by the JetStream broker in every confirm waiter (refused writes): none here.
        self.pending_confirms: tuple[()] = ()
        self._qos_of_topic: dict[str, tuple[str, int]] = {}  # routing key -> (topic, best QoS)
        self._methods: dict[str, Any] = {}  # topic -> its basic.publish (read only by the broker)
        self.routed_keys: set[str] = set()  # routing keys published since the last backlog check
        self.options_used = False  # a filter asks for "no local" or "retain as published"
        self.aliases: dict[int, str] = {}  # MQTT 5 topic aliases of this connection (not the session's)
        self.shared_channels: dict[str, int] = {}  # shared subscription -> the channel consuming its queue
        self.shared_of_channel: dict[int, tuple[str, int]] = {}  # that channel -> (filter, QoS)
        # channel 2's confirms: (seq, packet kind PUBACK/PUBREC, packet id, retained lsn)
        self.confirms: deque[tuple[int, int, int, int]] = deque()
        self.awaiting_rec: set[int] = set()  # QoS 2 routed, PUBREC waits for its confirm
        self._to_ack: list[int] = []  # QoS 0 deliveries and unwanted ones: acked after the turn
        self._ack_scheduled = False
        self._writable = False
        self.consuming = False
        self.no_ack = False  # the consumer takes no acknowledgements (every filter QoS 0)
        self.closed = False
        self._subs_changed()
        for number in (CONSUME, PUBLISH, OPS):
            self.bs.on_event(ev.ChannelOpen(number))
        self.bs.on_event(ev.Method(PUBLISH, C.Confirm.Select()))
        self._props = {(q, r): message_properties(q, r, state.client_id, {}) for q in (0, 1, 2) for r in (False, True)}
        self._plain_props = (self._props[0, False], self._props[1, False])  # publish's common case

    # -- AMQP calls --------------------------------------------------------------------------

    def _call(self, channel: int, method: Any) -> tuple[int, str] | None:
        """Send ``method`` on ``channel``; the error that closed the channel, if any (the
        channel is opened again at once). Declares and deletes are sent ``nowait``: their -ok
        is of no use here, and on a JetStream store it would hold the channel (the bind after
        it, and so the SUBACK's promise) until JetStream's count came back."""
        self.bridge.errors.pop(channel, None)
        self.bs.on_event(ev.Method(channel, method))
        err = self.bridge.errors.pop(channel, None)
        if err is not None:
            self.bs.on_event(ev.ChannelCloseOk(channel))
            self.bs.on_event(ev.ChannelOpen(channel))
        return err

    def start(self, session_present: bool) -> None:
        """After CONNACK: a resumed session finishes QoS 2 handshakes, resends the retained
        messages it had in flight and consumes its queue (whose unacknowledged messages come
        again under their packet identifiers, with DUP: MQ6, MQ8)."""
        for pid in sorted(self.state.released):
            # Behind the record that holds it (a reconnect may come before it was durable).
            self._after_save(bytes((P.PUBREL << 4 | 2, 2, pid >> 8, pid & 0xFF)))
        if self.state.retained_pids:
            self._resend_retained()
        if session_present and self.state.subs:
            self._ensure_queue()
        if session_present:
            for shared, (qos, _opts) in list(self.state.shared.items()):
                if self._consume_shared(shared, qos) is not None:
                    del self.state.shared[shared]  # refused now (its rights were taken away)

    def _internal_name(self, queue: str, checked_as: str) -> None:
        """``queue`` is one of MQTT's own (amq.mqtt-..., MQ8): declared by this session as a
        server-named queue is, and its permissions (W2) checked as ``checked_as``, the name
        RabbitMQ's MQTT plugin gives it, which users' patterns name."""
        if queue.startswith("amq."):
            self.bs.permission_names[queue] = checked_as

    def _shared_queue(self, group: str, topic_filter: str) -> str:
        queue, legacy = shared_queue_in(self.broker.vhost(self.state.vhost).queues, group, topic_filter)
        self._internal_name(queue, legacy)
        return queue

    def _ensure_queue(self) -> tuple[int, str] | None:
        if self.consuming:
            return None
        st = self.state
        args: dict[str, Any] = {}
        if st.persistent and st.expiry is not None:
            args["x-expires"] = max(1, st.expiry) * 1000
        # A resumed session's queue is taken as it is: declared again with another x-expires
        # (the client changed its session expiry) it would be refused as inequivalent.
        queues = self.broker.vhost(st.vhost).queues
        exists = st.queue in queues
        if not exists and not st.queue.startswith(QUEUE_PREFIX):
            # A session stored before MQ8 whose queue is gone: from now on under the name no
            # AMQP client can declare (MQ8).
            st.queue = queue_name(st.vhost, st.client_id)
            self._internal_name(st.queue, legacy_queue_name(st.client_id))
            exists = st.queue in queues
            self._save()
        args[CLIENT_ID_ARG] = st.client_id
        err = self._call(OPS, C.Queue.Declare(queue=st.queue, passive=exists, durable=st.persistent,
                                              exclusive=not st.persistent, arguments=args or None, nowait=True))
        if err is not None:
            return err
        self._call(CONSUME, C.Basic.Qos(prefetch_count=self.inflight_max))
        return self._consume()

    def _consume(self) -> tuple[int, str] | None:
        """Consume the session's queue; without acknowledgements while every filter is QoS 0:
        each delivery is then QoS 0, so the broker may delete it as it goes out (no ack turn)."""
        no_ack = all(qos == 0 for qos, _ in self.state.subs.values())
        if self.consuming:
            if no_ack == self.no_ack:
                return None
            self._call(CONSUME, C.Basic.Cancel(consumer_tag="mqtt"))  # unacked deliveries stay so
            self.consuming = False
        # The CMQ message ID of a delivery is how a redelivery keeps its packet identifier
        # (MQ6): read from the channel's unacked record once the dispatch is over
        # (_dispatched), not asked for as M11 headers, whose writing into every delivery's
        # properties and reading back were a twelfth of the event loop's time a message.
        err = self._call(CONSUME, C.Basic.Consume(queue=self.state.queue, consumer_tag="mqtt", no_ack=no_ack))
        if err is None:
            self.consuming, self.no_ack = True, no_ack
        return err

    # -- SUBSCRIBE / UNSUBSCRIBE (MQ2, MQ3) ------------------------------------------------

    def _subs_changed(self) -> None:
        self._qos_of_topic.clear()
        self.options_used = any(opts & (NO_LOCAL | RETAIN_AS_PUBLISHED) for _, opts in self.state.subs.values())
        if self.consuming:
            self._consume()  # acknowledged or not, as the filters' QoS now need

    def subscribe(self, packet: P.Subscribe) -> None:
        self._in_turns(self._subscribe(packet))

    def _subscribe(self, packet: P.Subscribe) -> Iterator[None]:
        """MQ2: each filter bound (or refused), then the SUBACK with every code in order, then
        the retained messages of the new filters. Pauses (yields) every FILTERS_PER_TURN
        filters and every RETAINED_MATCHES_PER_TURN retained matches (SE5, _in_turns)."""
        codes: list[int] = []
        fresh: list[tuple[str, int]] = []
        # Refusals logged once a packet (how many, and the first), not a line per filter (SE5).
        refused, first_refusal = 0, ("", "")
        # Whether a filter of this slice needs what the consumer or the options do not do
        # yet (acknowledged deliveries, "no local"...): then _subs_changed before the pause,
        # else only the QoS cache is dropped (_subs_changed reads every filter).
        needs = False
        for i, (topic_filter, opts) in enumerate(packet.subscriptions):
            if i and not i % FILTERS_PER_TURN:
                if needs:
                    self._subs_changed()
                else:
                    self._qos_of_topic.clear()
                needs = False
                yield
            qos = opts & 3
            if not valid_filter(topic_filter):
                codes.append(0x8F if self.level >= 5 else 0x80)
                continue
            if topic_filter.startswith("$share/"):
                if opts & NO_LOCAL:  # MQTT-3.8.3-4
                    self.conn.close_with(P.PROTOCOL_ERROR, "no local on a shared subscription")
                    return
                codes.append(self._subscribe_shared(topic_filter, qos, opts))
                continue
            err = self._ensure_queue()
            if err is None and not self._long_filter(topic_filter):
                err = self._call(OPS, C.Queue.Bind(queue=self.state.queue, exchange=EXCHANGE,
                                                   routing_key=filter_to_binding(topic_filter)))
            if err is not None:
                if not refused:
                    first_refusal = (topic_filter, err[1])
                refused += 1
                if err[0] == 403:
                    self._audit_refusal(f"subscribe {topic_filter[:200]} refused: {err[1]}")
                codes.append(reason_of_reply(*err) if self.level >= 5 else 0x80)
                continue
            existed = topic_filter in self.state.subs
            self.state.subs[topic_filter] = (qos, opts)
            needs = needs or (qos > 0 and self.no_ack) or \
                (bool(opts & (NO_LOCAL | RETAIN_AS_PUBLISHED)) and not self.options_used)
            codes.append(qos)
            handling = (opts >> 4) & 3
            if handling == 0 or (handling == 1 and not existed):
                fresh.append((topic_filter, qos))
        if refused:
            log.info("mqtt subscribe refused for %s: %d of %d filters, the first %s: %s", self.user, refused,
                     len(packet.subscriptions), *first_refusal)
        self._subs_changed()
        self._save()
        # MQ3/MQ8: a persistent session's SUBACK once its record (and the bindings before it)
        # is durable: a kill -9 just after an earlier SUBACK lost the subscription.
        self._after_save(P.encode(P.SubAck(packet.packet_id, codes), self.level))
        if fresh:
            # Each filter is matched against every retained message of the vhost.
            each = max(1, self.service.retained.count(self.state.vhost))
            budget = RETAINED_MATCHES_PER_TURN
            for topic_filter, qos in fresh:
                if budget <= 0:
                    budget = RETAINED_MATCHES_PER_TURN
                    yield
                self.service.retained.deliver(self, topic_filter, qos)
                budget -= each

    def unsubscribe(self, packet: P.Unsubscribe) -> None:
        self._in_turns(self._unsubscribe(packet))

    def _unsubscribe(self, packet: P.Unsubscribe) -> Iterator[None]:
        codes = []
        # binding key -> the session's filters bound by it, made at most once a packet (SE5).
        # Two filters share a binding key only through a "*" level ("+" and a literal "*"):
        # filter_to_binding is one-to-one otherwise, so only such a key needs the count.
        held: Counter[str] | None = None
        for i, topic_filter in enumerate(packet.filters):
            if i and not i % FILTERS_PER_TURN:
                self._qos_of_topic.clear()
                yield
            if topic_filter in self.state.shared:
                del self.state.shared[topic_filter]
                self._stop_shared(topic_filter)
                self.release_shared(topic_filter)
                codes.append(0)
                continue
            if self.state.subs.pop(topic_filter, None) is None:
                codes.append(NO_SUBSCRIPTION_EXISTED)
                continue
            binding = filter_to_binding(topic_filter)
            if held is not None:
                held[binding] -= 1  # it was counted when the count was made
            elif "*" in binding.split("."):
                held = Counter(map(filter_to_binding, self.state.subs))
            if (held is None or held[binding] <= 0) and not self._long_filter(topic_filter):
                self._call(OPS, C.Queue.Unbind(queue=self.state.queue, exchange=EXCHANGE, routing_key=binding))
            codes.append(0)
        self._subs_changed()
        self._save()
        self._after_save(P.encode(P.UnsubAck(packet.packet_id, codes), self.level))

    def _in_turns(self, steps: Iterator[None]) -> None:
        """SE5: run ``steps`` (a SUBSCRIBE or an UNSUBSCRIBE) to its first pause now. If it has
        more, the connection is held as behind a CONNECT (transport._connect_after: its later
        packets wait unread, so they keep their order) and the rest runs one slice per
        event-loop turn, the other clients' packets (and a SIGTERM) handled in between."""
        done = object()
        if next(steps, done) is done:
            return
        conn = self.conn
        conn._backlog = True  # data_received leaves the buffer alone
        if conn.transport is not None:
            conn.transport.pause_reading()
        conn._held = asyncio.get_running_loop().create_task(self._turns(steps))

    async def _turns(self, steps: Iterator[None]) -> None:
        conn, broker, done = self.conn, self.broker, object()
        try:
            while True:
                conn.request_flush()  # what the slice sent (deliveries, the SUBACK)
                await asyncio.sleep(0)
                if conn._lost or self.closed:
                    return
                broker.begin_batch()
                try:
                    if next(steps, done) is done:
                        break
                finally:
                    broker.end_batch()
        except Exception:  # as transport._process: a bug below must not leave the client held
            log.exception("internal error on MQTT connection %s", self.peer)
            self.core.close(0x80, "internal error")
        finally:
            conn._held = None
        if not conn._lost:
            conn._process()  # the packets after it; reading resumes there

    # -- shared subscriptions (MQTT 5 4.8.2) -----------------------------------------------------

    def _subscribe_shared(self, shared: str, qos: int, opts: int) -> int:
        """SUBSCRIBE to ``$share/<group>/<filter>``: the group's queue, bound as the filter is
        (MQ2), consumed on a channel of its own; the broker gives each message to one of its
        consumers, that is to one member of the group. Its SUBACK code."""
        parts = split_shared(shared)
        if parts is None:
            return 0x8F if self.level >= 5 else 0x80
        err = self._consume_shared(shared, qos)
        if err is not None:
            log.info("mqtt subscribe %s refused for %s: %s", shared, self.user, err[1])
            if err[0] == 403:
                self._audit_refusal(f"subscribe {shared[:200]} refused: {err[1]}")
            return reason_of_reply(*err) if self.level >= 5 else 0x80
        # No retained messages: MQTT 5 3.3.1.3 sends them on a new non-shared subscription only.
        self.state.shared[shared] = (qos, opts)
        return qos

    def _consume_shared(self, shared: str, qos: int) -> tuple[int, str] | None:
        parts = split_shared(shared)
        assert parts is not None
        group, topic_filter = parts
        channel = self.shared_channels.get(shared)
        if channel is not None:
            self.shared_of_channel[channel] = (topic_filter, qos)  # subscribed again: its new QoS
            return None
        st = self.state
        queue = self._shared_queue(group, topic_filter)
        # The group outlives a member: durable. release_shared deletes it when its last holder
        # goes; x-expires covers what that cannot see: the declaring persistent session's expiry,
        # and for a clean one (gone without a trace in a crash) RabbitMQ's former MQTT
        # subscription_ttl, a day, so that a persistent member joining later is not cut short.
        expires = CLEAN_SHARED_EXPIRES if not st.persistent else None if st.expiry is None else max(1, st.expiry)
        exists = queue in self.broker.vhost(st.vhost).queues
        err = self._call(OPS, C.Queue.Declare(queue=queue, passive=exists, durable=True, nowait=True,
                                              arguments={"x-expires": expires * 1000} if expires else None))
        if err is None and not self._long_filter(topic_filter):
            err = self._call(OPS, C.Queue.Bind(queue=queue, exchange=EXCHANGE,
                                               routing_key=filter_to_binding(topic_filter)))
        if err is not None:
            return err
        channel = FIRST_SHARED
        while channel in self.bs.channels:
            channel += 1
        self.bs.on_event(ev.ChannelOpen(channel))
        self._call(channel, C.Basic.Qos(prefetch_count=self.inflight_max))
        # Known before the consume: what waits in the queue is delivered inside it.
        self.shared_channels[shared] = channel
        self.shared_of_channel[channel] = (topic_filter, qos)
        err = self._call(channel, C.Basic.Consume(queue=queue, consumer_tag=f"mqtt-share-{channel}",
                                                  arguments={"x-cmq-receive-metadata": True}))
        if err is not None:
            self._stop_shared(shared)
        return err

    def _stop_shared(self, shared: str) -> None:
        """UNSUBSCRIBE: its channel closes; what it had in flight goes back to the group."""
        channel = self.shared_channels.pop(shared, None)
        if channel is not None:
            del self.shared_of_channel[channel]
            for pid, (tag, _msg) in list(self.inflight.items()):
                if tag >> SHARED_TAG_SHIFT == channel:
                    del self.inflight[pid]
            self.bs.on_event(ev.ChannelClose(channel, 200, "unsubscribed", 0, 0))

    def release_shared(self, shared: str) -> None:
        """This session no longer holds ``shared``: the group's queue goes too once no session
        consumes it or holds it for later (a persistent one away), or it would fill forever
        (a group made by a session that never expires has no x-expires)."""
        st = self.state
        parts = split_shared(shared)
        if parts is None or self.service.shared_held(st.vhost, shared, but=st.client_id):
            return
        queue = self._shared_queue(*parts)
        q = self.broker.vhost(st.vhost).queues.get(queue)
        if q is not None and not q.consumers and not self.service.consumed_elsewhere(q):
            err = self._call(OPS, C.Queue.Delete(queue=queue, nowait=True))
            if err is not None:
                log.info("mqtt shared subscription queue %s left in place: %s", queue, err[1])

    def deliver_shared(self, channel: int, tag: int, redelivered: bool, routing_key: str, raw_props: bytes,
                       body: bytes) -> None:
        sub = self.shared_of_channel.get(channel)
        topic = routing_key_to_topic(routing_key)
        sub_qos = sub[1] if sub is not None and matches(sub[0], topic) else -1  # $-topics (MQ2)
        self.deliver([(channel << SHARED_TAG_SHIFT | tag, redelivered, routing_key, raw_props, body)], {},
                     (topic, sub_qos))

    def _save(self) -> None:
        if self.state.persistent:
            self._dirty = False
            self.broker.persist(session_key(self.state.vhost, self.state.client_id), self.state.to_json())

    # -- the durable outgoing state (MQ8) ----------------------------------------------------

    def _save_soon(self) -> None:
        """The record changed: written once at the end of this loop turn, whatever else
        changes in it meanwhile (a burst of deliveries is one record, one group commit)."""
        if self.state.persistent:
            self._dirty = True
            self._schedule_save()

    def _schedule_save(self) -> None:
        if not self._save_scheduled:
            self._save_scheduled = True
            asyncio.get_running_loop().call_soon(self._save_now)

    def _after_save(self, item: Any) -> None:
        """Send ``item`` (a packet's bytes; or call it) once the session record as it is now
        is durable; at once for a clean session. What waits keeps its order."""
        if not self.state.persistent:
            if callable(item):
                item()
            else:
                self.core.send_raw(item)
            return
        self._save_due.append(item)
        self._schedule_save()

    def _save_now(self) -> None:
        self._save_scheduled = False
        if self._dirty:
            self._save()
        due, self._save_due = self._save_due, []
        if self.closed or not due:
            return
        # Everything written so far, the record included: a record written by an earlier
        # connection, or one this turn did not change, is covered too.
        lsn = self.broker.store.last_lsn
        outbox = self.outbox
        was_empty = not outbox
        for item in due:
            outbox.append((lsn, item))
        if was_empty:
            self.broker.confirm_waiters.add(self)
        if self.broker.durable_lsn >= lsn:
            self.on_durable(self.broker.durable_lsn)

    def on_durable(self, durable: int) -> bool:
        """The broker's group commit reached ``durable`` (as for a channel's confirms, M14):
        what waited for it goes out. True while some still wait."""
        outbox = self.outbox
        if self.closed:
            outbox.clear()
            return False
        if outbox and outbox[0][0] <= durable:
            self.broker.begin_batch()  # the acks among them: one dispatch per queue
            try:
                while outbox and outbox[0][0] <= durable:
                    item = outbox.popleft()[1]
                    if callable(item):
                        item()
                    else:
                        self.core.send_raw(item)
            finally:
                self.broker.end_batch()
            self.conn.request_flush()
        return bool(outbox)

    def fail_pending_confirms(self) -> None:
        """The broker stops with the store failed: nothing that waits will be durable."""
        self.outbox.clear()

    def _ack_released(self, msg_id: str) -> None:
        """The record that says ``msg_id`` was received (PUBREC) is durable: its message
        may go from the queue (a crash before this leaves it there, and it is acknowledged
        when it comes again; see deliver)."""
        tag = self._releasing.pop(msg_id, 0)
        if tag:
            self._settle(tag)
            # Acked (on JetStream a +ACK sent ahead of the record that now drops it): it will
            # not come again.
            self.state.released_of_msg.pop(msg_id, None)
            self._save_soon()

    def _resend_retained(self) -> None:
        """Retained messages in flight when the session's last connection ended: each sent
        again under its identifier, with DUP, as the topic's retained message is now. One
        cleared since is released instead (PUBREL: the client may hold its identifier; a
        client that does not answers PUBCOMP all the same), so the identifier comes free."""
        state = self.state
        known = self.service.retained._of(state.vhost)
        for pid, topic in sorted(state.retained_pids.items()):
            held = known.get(topic)
            qos = min(held[0], self._topic_qos(topic_to_routing_key(topic))[1]) if held else 0
            if held is not None and qos > 0:
                self.inflight[pid] = (0, None)
                self._after_save(P.encode(P.Publish(topic, held[1], qos, retain=True, dup=True, packet_id=pid),
                                          self.level))
                continue
            del state.retained_pids[pid]
            state.release(pid, "")
            self._save_soon()
            self._after_save(bytes((P.PUBREL << 4 | 2, 2, pid >> 8, pid & 0xFF)))

    # -- PUBLISH from the client (MQ2, MQ4, MQ5) ------------------------------------------------

    def publish(self, packet: P.Publish) -> None:
        """Route the client's PUBLISH; PUBACK / PUBREC once it is durable (confirmed)."""
        if self.level >= 5 and (not packet.topic or "topic_alias" in packet.properties):
            topic = self._aliased_topic(packet)
            if topic is None:
                return
            packet.topic = topic
        topic = packet.topic
        method = self._methods.get(topic)
        if method is None:
            # A topic with a cached basic.publish was found valid when it was made (route).
            if not valid_topic(topic):
                self.conn.close_with(TOPIC_NAME_INVALID, f"topic name {topic!r} is not valid (MQTT-3.3.2-2)")
                return
        elif packet.qos < 2 and self._writable and not packet.retain and not packet.properties \
                and len(topic) <= SHORT_TOPIC_CHARS:
            # route's common case, without its frame: a QoS 0/1 PUBLISH of a topic routed
            # before (so short and valid), no retain, no MQTT 5 properties, write allowed.
            qos, pid = packet.qos, packet.packet_id
            ch = self.bs.channels[PUBLISH]
            self.routed_keys.add(method.routing_key)
            if qos:
                self.confirms.append((ch.publish_seq + 1, P.PUBACK, pid, 0))
            try:
                self.bs.publish_now(ch, method, self._plain_props[qos], packet.payload)
            except CMQError as e:
                self._not_routed(pid, qos, e, False)
            return
        if packet.qos == 2 and packet.packet_id in self.state.inbound_qos2 \
                and packet.packet_id not in self.state.unsure:
            # A resent QoS 2 PUBLISH: routed once already (MQ4); acknowledge it again.
            if packet.packet_id not in self.awaiting_rec:
                self.core.send(P.Ack(P.PUBREC, packet.packet_id))
            return
        self.route(topic, packet.payload, packet.qos, packet.retain, packet.packet_id, packet.properties)

    def _aliased_topic(self, packet: P.Publish) -> str | None:
        """MQTT 5 topic aliases from the client (3.3.2.3.4): a topic name with an alias sets it
        for this connection, an empty one with an alias uses it. None: the connection is being
        closed, with 0x94 for an alias out of 1..TOPIC_ALIAS_MAXIMUM, 0x82 for an empty
        topic name without a known alias."""
        alias = packet.properties.get("topic_alias")
        if alias is not None and not 0 < alias <= TOPIC_ALIAS_MAXIMUM:
            self.conn.close_with(P.TOPIC_ALIAS_INVALID,
                                 f"topic alias {alias} is not in 1..{TOPIC_ALIAS_MAXIMUM} (MQTT-3.3.2-8/9)")
            return None
        if packet.topic:
            if alias is not None and valid_topic(packet.topic):
                self.aliases[alias] = packet.topic
            return packet.topic
        topic = self.aliases.get(alias) if alias is not None else None
        if topic is None:
            self.conn.close_with(P.PROTOCOL_ERROR, "an empty topic name without a known topic alias")
        return topic

    def route(self, topic: str, payload: bytes, qos: int, retain: bool, pid: int,
              mprops: dict[str, Any], will: bool = False) -> None:
        """Publish to ``topic`` on amq.topic; ``will``: a will message (nobody to answer)."""
        try:
            if not self._writable:
                if self.bs.check_access:
                    self.bs.authorize("write", "exchange", EXCHANGE)  # W2, as basic.publish
                self._writable = True  # until permissions_changed
            retained_lsn = 0
            ids: list[str] | None = None
            if retain:
                retained_lsn = self.service.retained.put(self.state.vhost, topic, qos, payload)
            props = self._props[qos, retain] if not mprops else \
                message_properties(qos, retain, self.state.client_id, mprops)
            ch = self.bs.channels[PUBLISH]
            long: list[Any] | None = None
            if len(topic) > SHORT_TOPIC_CHARS and self._long_key(topic):
                long, props = self._long_topic_publishes(topic, qos, retain, mprops)
            else:
                method = self._methods.get(topic)
                if method is None:
                    if len(self._methods) > 1024:
                        self._methods.clear()
                    method = self._methods[topic] = C.Basic.Publish(exchange=EXCHANGE,
                                                                    routing_key=topic_to_routing_key(topic))
                self.routed_keys.add(method.routing_key)
            if qos and not will:
                # Before the call: a confirm that needs no fsync comes back inside it (the
                # last one's, for a long topic's publishes: confirms come in order).
                self.confirms.append((ch.publish_seq + (1 if long is None else len(long)),
                                      P.PUBACK if qos == 1 else P.PUBREC, pid, retained_lsn))
                if qos == 2:
                    state = self.state
                    ids = self._inbound_ids(pid, 1 if long is None else len(long))
                    state.inbound_qos2.add(pid)
                    self.awaiting_rec.add(pid)
                    # Before the message: its confirm then covers both. But a group commit may
                    # take the record without the message (the sync thread swaps the batch out
                    # between two puts): the record names its own LSN (the event loop is the
                    # store's one writer) so that a restart can tell (MQTTService.stored_session).
                    state.inbound_at[pid] = self.broker.store.last_lsn + 1
                    self._save()
            if long is None:
                self.bs.publish_now(ch, method, props, payload, ids[0] if ids else None)
            else:
                for i, method in enumerate(long):
                    self.bs.publish_now(ch, method, props, payload, ids[i] if ids else None)
        except CMQError as e:
            self._not_routed(pid, qos, e, will)

    def _not_routed(self, pid: int, qos: int, e: CMQError, will: bool) -> None:
        """A publish refused: the confirm waited for is dropped, the refusal answered."""
        if qos and not will and self.confirms and self.confirms[-1][2] == pid:
            self.confirms.pop()
            if qos == 2:
                self.state.inbound_done(pid)
            self.awaiting_rec.discard(pid)
        self.refused(pid, qos, e, will)

    def backlogged(self) -> list[Any]:
        """The consumed queues that the messages published since the last call went to and
        that hold more than BACKLOG_HIGH undelivered (flow control, transport._process): one
        topic match per routing key a turn, not per message. (A long topic's publishes, by
        the default exchange, are not counted.)"""
        keys, self.routed_keys = self.routed_keys, set()
        vhost = self.broker.vhost(self.state.vhost)
        ex = vhost.exchanges.get(EXCHANGE)
        topic = getattr(ex, "topic", None)
        if topic is None:
            return []
        queues = vhost.queues
        full: dict[str, Any] = {}
        for key in keys:
            for sub in topic.match((), key):
                endpoint = sub.endpoint
                if type(endpoint) is tuple and endpoint[0] == "q" and endpoint[1] not in full:
                    q = queues.get(endpoint[1])
                    if q is not None and q.consumers and q.cmq.active > BACKLOG_HIGH:
                        full[endpoint[1]] = q
        return list(full.values())

    def _inbound_ids(self, pid: int, n: int) -> list[str]:
        """The CMQ message IDs an incoming QoS 2 message is routed under: new ones, or a
        resend's stored ones if its first routing may not have reached the store (MQ8)."""
        state = self.state
        ids = state.inbound_ids.get(pid) if pid in state.unsure else None
        state.unsure.discard(pid)
        if ids is None or len(ids) != n:
            first = new_msg_id()
            # A long topic's publishes: IDs longer than any new_msg_id, so never another's.
            ids = [first, *(f"{first}{i:04x}" for i in range(1, n))]
        state.inbound_ids[pid] = ids
        return ids

    # -- topics longer than a routing key (MQ8) ----------------------------------------------

    def _long_key(self, key: str) -> bool:
        """Whether ``key`` (a topic, routing or binding key: the same length) is longer than
        AMQP's 255 bytes in a profile that enforces no shorter limit: MQTT allows 65,535, so
        the MQTT front end routes it (a profile whose limit is shorter refuses it, MQ6)."""
        return len(key.encode()) > AMQP_KEY_BYTES and \
            self.broker.vhost(self.state.vhost).profile.enforced.max_key_bytes >= AMQP_KEY_BYTES

    def _long_filter(self, topic_filter: str) -> bool:
        """A filter whose binding key AMQP cannot hold: no binding; the front end matches it
        against the topics that are as long (_long_topic_publishes). (One that short topics
        could match needs some hundred ``+`` levels: those it does not get.)"""
        return len(topic_filter) > SHORT_TOPIC_CHARS and self._long_key(topic_filter)

    def _long_topic_publishes(self, topic: str, qos: int, retain: bool,
                              mprops: dict[str, Any]) -> tuple[list[Any], Properties]:
        """A topic whose routing key AMQP cannot carry: no binding on amq.topic can hold it or
        a filter that matches it, so the message goes by the default exchange to the queue of
        every session (and shared group) whose filters match it, the topic in a header that
        the delivery reads back (Bridge.send_deliver). None matches: one publish that routes
        nowhere, confirmed all the same. AMQP consumers, whose routing keys hold 255 bytes,
        never see such a message; the sessions are those this gateway knows (live, or resumed
        since it started)."""
        vhost = self.state.vhost
        queues = self.broker.vhost(vhost).queues
        targets: dict[str, None] = {}
        for (v, _client), st in self.service.sessions.items():
            if v != vhost:
                continue
            if st.queue in queues and any(matches(f, topic) for f in st.subs):
                targets[st.queue] = None
            for shared in st.shared:
                parts = split_shared(shared)
                if parts is not None and matches(parts[1], topic):
                    queue = shared_queue_in(queues, *parts)[0]
                    if queue in queues:
                        targets[queue] = None
        user = [*mprops.get("user_property", ()), (TOPIC_HEADER, topic)]
        props = message_properties(qos, retain, self.state.client_id, {**mprops, "user_property": user})
        return [C.Basic.Publish(exchange="", routing_key=q) for q in targets or ("",)], props

    def long_topic_key(self, raw_props: bytes, routing_key: str) -> str:
        """The routing key of a delivery by the default exchange: a long topic's, from its
        header; else the queue name it came by."""
        topic = (Properties(raw_props).headers or {}).get(TOPIC_HEADER)
        return topic_to_routing_key(topic) if isinstance(topic, str) else routing_key

    def _audit_refusal(self, reason: str) -> None:
        """A1/W2: a publish or subscription the user's permissions refuse is audited, as the
        HTTP APIs' refusals are: ``auth_failure`` with the user, the peer and why."""
        self.broker.audit.emit("auth_failure", self.state.vhost, user=self.user, peer=self.peer,
                               reason=reason[:512], protocol="mqtt")

    def refused(self, pid: int, qos: int, e: CMQError, will: bool) -> None:
        """MQ6: a refused publish is a reason code (MQTT 5) or a disconnect (3.1.1)."""
        text = e.reply_text if hasattr(e, "reply_text") else str(e)
        log.info("mqtt publish refused for %s: %s", self.user, text)
        if e.reply_code == 403:
            self._audit_refusal(f"publish refused: {text}")
        if will:
            return
        code = reason_of(e)
        if self.level >= 5 and qos:
            self.core.send(P.Ack(P.PUBACK if qos == 1 else P.PUBREC, pid, code, {"reason_string": str(text)[:200]}))
            self.conn.request_flush()
        else:
            self.conn.close_with(code, str(text))

    def confirmed(self, tag: int, multiple: bool, ok: bool) -> None:
        """Channel 2's confirm: the publishes up to ``tag`` are durable (M14) or refused."""
        confirms = self.confirms
        durable = self.broker.durable_lsn
        late: list[tuple[int, int, int]] = []
        # _ack_publish's hot path, inline: the PUBACKs of QoS 1 messages in a row, each as the
        # int of its four bytes, packed into one bytes object when the row ends.
        pubacks: list[int] = []
        while confirms and confirms[0][0] <= tag:
            seq, kind, pid, retained_lsn = confirms.popleft()
            if not multiple and seq != tag:
                confirms.appendleft((seq, kind, pid, retained_lsn))
                break
            if retained_lsn > durable:
                late.append((kind, pid, 0 if ok else UNSPECIFIED))
                continue
            if ok and kind == P.PUBACK:
                pubacks.append(0x40020000 | pid)
                continue
            if pubacks:
                self._send_pubacks(pubacks)
                pubacks = []
            self._ack_publish(kind, pid, 0 if ok else UNSPECIFIED)
        if pubacks:
            self._send_pubacks(pubacks)
        if late:
            asyncio.get_running_loop().create_task(self._ack_after_flush(late))

    def _send_pubacks(self, pubacks: list[int]) -> None:
        core = self.core
        if not core.closed:  # core.send_raw, inline
            core._out.append(struct.pack(f">{len(pubacks)}I", *pubacks))

    def _ack_publish(self, kind: int, pid: int, code: int) -> None:
        if code and self.level < 5:
            self.conn.close_with(code, "the store refused the message (M14)")
            return
        if kind == P.PUBREC:
            self.awaiting_rec.discard(pid)
            if code:
                self.state.inbound_done(pid)
        if code:
            self.core.send(P.Ack(kind, pid, code))
        else:
            self.core.send_raw(bytes((kind << 4, 2, pid >> 8, pid & 0xFF)))  # the hot path's PUBACK

    async def _ack_after_flush(self, late: list[tuple[int, int, int]]) -> None:
        await self.broker.flush()  # a retained message is in the store too (MQ5)
        if not self.closed:
            for kind, pid, code in late:
                self._ack_publish(kind, pid, code)
            self.conn.request_flush()

    def pubrel(self, packet: P.Ack) -> None:
        known = self.state.inbound_done(packet.packet_id)
        comp = P.encode(P.Ack(P.PUBCOMP, packet.packet_id, 0 if known else PACKET_ID_NOT_FOUND), self.level)
        if known:
            self._save_soon()
        # The identifier may be reused once PUBCOMP is out: its release must be durable first,
        # or a restart would take the next message with it for a resend (MQ4). A PUBREL for an
        # identifier not known waits too: its release may be in a record not yet durable.
        self._after_save(comp)

    # -- deliveries to the client (MQ2, MQ4, MQ6) ----------------------------------------------

    def _alloc_pid(self) -> int:
        """A free packet identifier; 0 when all 65535 are in flight."""
        for _ in range(65535):
            pid = self._next_pid
            self._next_pid = pid % 65535 + 1
            if pid not in self.inflight and not self.state.pid_taken(pid):
                return pid
        return 0

    def _topic_qos(self, routing_key: str) -> tuple[str, int]:
        """The MQTT topic of ``routing_key`` and the best QoS of the session's filters that
        match it (-1: none does), kept per routing key: deliveries repeat a few topics."""
        known = self._qos_of_topic.get(routing_key)
        if known is not None:
            return known
        topic = routing_key_to_topic(routing_key)
        sub_qos = -1
        for topic_filter, (qos, _opts) in self.state.subs.items():
            if qos > sub_qos and matches(topic_filter, topic):
                sub_qos = qos
        if len(self._qos_of_topic) > 4096:
            self._qos_of_topic.clear()
        self._qos_of_topic[routing_key] = topic, sub_qos
        return topic, sub_qos

    def _options_qos(self, topic: str, headers: dict[str, Any]) -> tuple[int, bool]:
        """MQTT 5 "no local" and "retain as published" (slow path, only for sessions that use
        them): (best QoS of the filters that take the message, its retain flag)."""
        own = headers.get(PUBLISHER_HEADER) == self.state.client_id
        sub_qos, retain = -1, False
        for topic_filter, (qos, opts) in self.state.subs.items():
            if (opts & NO_LOCAL and own) or not matches(topic_filter, topic):
                continue
            sub_qos = max(sub_qos, qos)
            retain = retain or bool(opts & RETAIN_AS_PUBLISHED and headers.get(RETAIN_HEADER))
        return sub_qos, retain

    def _dispatched(self) -> None:
        """The broker Session's request_flush: called after every dispatch that delivered to
        this session (and whenever else it wrote). The deliveries from the session's own
        queue are handled here, after the channel has recorded them, so that their CMQ
        message IDs come from its unacked records, in the order they were delivered."""
        if self.pending:
            self.deliver_pending()
        self.conn.request_flush()

    def deliver_pending(self) -> None:
        """The deliveries the Bridge collected (see _dispatched); also before any write of
        the connection's bytes (MQTTConnection._flush), should a dispatch have ended
        without its request_flush."""
        if self.pending:
            pending, self.pending = self.pending, []
            ch = self.bs.channels.get(CONSUME)
            self.deliver(pending, ch.unacked if ch is not None else {})

    def deliver(self, items: list[tuple[int, bool, str, bytes, bytes]], unacked: dict[int, Any],
                shared: tuple[str, int] | None = None) -> None:
        """Deliveries as PUBLISHes, (tag, redelivered, routing key, property bytes, body) each,
        in order: one call for a dispatch's worth. ``shared``: (topic, QoS) of a shared
        subscription's delivery (deliver_shared), whose property bytes carry the M11 headers;
        else each message's CMQ ID is in ``unacked``, the session queue channel's records."""
        level = self.level
        state = self.state
        inflight = self.inflight
        core = self.core
        qos_of_topic = self._qos_of_topic
        for tag, redelivered, routing_key, raw_props, body in items:
            if shared is None:
                known = qos_of_topic.get(routing_key)  # _topic_qos's cache, read inline: every delivery
                topic, sub_qos = known if known is not None else self._topic_qos(routing_key)
                u = unacked.get(tag)  # none for a consumer without acknowledgements (QoS 0)
                msg_id: Any = u.msg_id if u is not None else None
            else:
                topic, sub_qos = shared
                msg_id = None
            if sub_qos < 0:
                # No filter of the session takes it ($-topics under a wildcard, MQ2): consumed.
                self._ack_soon(tag)
                continue
            mprops: dict[str, Any] = _NO_MPROPS
            msg_qos: Any = _UNREADABLE
            retain = False
            if level < 5:
                if shared is None:
                    msg_qos = _QOS_OF_PROPS.get(raw_props, _UNREADABLE)  # publish_qos's cache, inline
                    if msg_qos is _UNREADABLE:
                        msg_qos = publish_qos(raw_props)
                else:
                    fast = _delivery_headers(raw_props)
                    if fast is not None:
                        msg_id, msg_qos = fast
            if msg_qos is _UNREADABLE:
                props = Properties(raw_props)
                headers = props.headers or {}
                msg_qos = headers.get(QOS_HEADER)
                if shared is not None:
                    msg_id = headers.get("x-cmq-msg-id")
                if level >= 5:
                    mprops = self._mqtt_properties(props, headers)
                    if self.options_used and shared is None:
                        sub_qos, retain = self._options_qos(topic, headers)
                        if sub_qos < 0:
                            self._ack_soon(tag)  # its own message, for "no local" filters only
                            continue
            if type(msg_qos) is int:
                qos = msg_qos if msg_qos < sub_qos else sub_qos
            else:
                qos = min(sub_qos, int(msg_qos)) if isinstance(msg_qos, int) else sub_qos
            if qos == 0:
                data = publish_bytes(topic, body, 0, 0, False, level, retain) if not mprops else \
                    P.encode(P.Publish(topic, body, 0, retain, properties=mprops), level)
                if not self._too_large(data):
                    core.send_raw(data)
                self._ack_soon(tag)
                continue
            if not isinstance(msg_id, str):
                msg_id = None
            elif msg_id in state.released_of_msg:
                # PUBREC came for it already: its ack was lost (a crash, or the connection ended
                # before the record was durable). Acknowledged once that record is (MQ8).
                if not state.persistent:
                    self._ack_soon(tag)
                    continue
                first = msg_id not in self._releasing
                self._releasing[msg_id] = tag
                if first:
                    self._after_save(lambda m=msg_id: self._ack_released(m))
                continue
            before = state.pid_of_msg.get(msg_id) if msg_id is not None else None
            # Sent before: the queue's receive count says so, or (after a restart, where counts
            # start over) the packet identifier it was sent under (MQ6).
            redelivered = redelivered or before is not None
            pid = before
            if pid is None or pid in inflight and inflight[pid][1] != msg_id:
                pid = self._next_pid  # _alloc_pid's first try, inline: it is nearly always free
                if pid in inflight or pid in state.msg_of_pid or pid in state.released or pid in state.retained_pids:
                    pid = self._alloc_pid()
                    if not pid:
                        continue  # stays unacknowledged: sent again after the visibility timeout (MQ6)
                else:
                    self._next_pid = pid % 65535 + 1
            head = None if mprops or level >= 5 else \
                _PUBLISH_HEADS.get((topic, 0x30 | (8 if redelivered else 0) | (qos << 1) | retain, len(body), level))
            if head is not None:  # publish_bytes's cache hit for 3.1.1, inline: once a delivery
                data = b"".join((head, _U16.pack(pid), body))
            elif not mprops:
                data = publish_bytes(topic, body, qos, pid, redelivered, level, retain)
            else:
                data = P.encode(P.Publish(topic, body, qos, retain, dup=redelivered, packet_id=pid,
                                          properties=mprops), level)
            if self.client_max_packet and self._too_large(data):
                self._ack_soon(tag)
                continue
            inflight[pid] = (tag, msg_id)
            if not state.persistent:
                if msg_id is not None:
                    state.pid_of_msg[msg_id] = pid  # SessionState.remember, inline: once a delivery
                    state.msg_of_pid[pid] = msg_id
                if not core.closed:  # core.send_raw, inline
                    core._out.append(data)
                continue
            if msg_id is not None and before != pid:
                state.pid_of_msg[msg_id] = pid
                state.msg_of_pid[pid] = msg_id
                # Its packet identifier outlives a restart: a resend keeps it and sets DUP, and
                # the identifier is not given to another message while the client may hold it (MQ8).
                self._save_soon()
            self._after_save(data)

    def _too_large(self, data: bytes) -> bool:
        """MQTT-3.1.2-25: a packet larger than the client's maximum is discarded as if
        delivered."""
        return bool(self.client_max_packet) and len(data) > self.client_max_packet

    def _mqtt_properties(self, props: Properties, headers: dict[str, Any]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if props.content_type:
            out["content_type"] = str(props.content_type)
        if props.correlation_id:
            out["correlation_data"] = str(props.correlation_id).encode()
        if props.reply_to:
            out["response_topic"] = str(props.reply_to)
        for name, header in _LONG_HEADERS.items():
            if isinstance(headers.get(header), str):
                out[name] = headers[header]
        cd = headers.get(CORRELATION_HEADER)
        if isinstance(cd, bytes | bytearray):
            out["correlation_data"] = bytes(cd)
        users = [(str(k), str(v)) for k, v in headers.items()
                 if not k.startswith(("x-cmq-", "x-mqtt-")) and k != CORRELATION_HEADER
                 and isinstance(v, str | int | float | bytes)]
        users += [(str(pair[0]), str(pair[1])) for pair in headers.get(LONG_USER_HEADER, ())
                  if isinstance(pair, list) and len(pair) == 2]
        if users:
            out["user_property"] = [(k, v.decode(errors="replace") if isinstance(v, bytes) else v)
                                    for k, v in users]
        return out

    def deliver_retained(self, topic: str, payload: bytes, qos: int) -> None:
        if qos:
            pid = self._alloc_pid()
            if not pid:
                return
            self.inflight[pid] = (0, None)
            if self.state.persistent:
                self.state.retained_pids[pid] = topic  # resent after a reconnect (MQ8)
                self._save_soon()
            self._after_save(P.encode(P.Publish(topic, payload, qos, retain=True, packet_id=pid), self.level))
        else:
            self._after_save(P.encode(P.Publish(topic, payload, 0, retain=True), self.level))  # after SUBACK

    def _ack_soon(self, tag: int) -> None:
        # Inside basic.deliver the delivery is not yet recorded as unacked: ack after it.
        if self.no_ack and tag < SHARED_TAG:
            return  # consumed without acknowledgements: already deleted
        self._to_ack.append(tag)
        if not self._ack_scheduled:
            self._ack_scheduled = True
            asyncio.get_running_loop().call_soon(self._ack_deferred)

    def _ack_deferred(self) -> None:
        self._ack_scheduled = False
        tags, self._to_ack = self._to_ack, []
        if self.closed:
            return
        self.broker.begin_batch()  # one dispatch per queue for all of them
        try:
            for tag in tags:
                self._settle(tag)
        finally:
            self.broker.end_batch()
        self.conn.request_flush()

    def _settle(self, tag: int) -> None:
        if tag >= SHARED_TAG:  # a shared subscription's delivery: its own channel
            ch = self.bs.channels.get(tag >> SHARED_TAG_SHIFT)
            tag &= SHARED_TAG - 1
        else:
            ch = self.bs.channels.get(CONSUME)
        if ch is None or not tag:
            return
        try:
            ch.ack(tag, False)
        except CMQError:
            pass  # already settled (a stale tag after a visibility timeout): nothing to do

    def puback(self, packet: P.Ack) -> None:
        """PUBACK (QoS 1 done) or PUBREC (QoS 2: delivered; PUBREL follows) from the client."""
        pid = packet.packet_id
        entry = self.inflight.pop(pid, None)
        state = self.state
        if entry is None:
            if packet.kind == P.PUBREC and pid in state.released:
                self._after_save(bytes((P.PUBREL << 4 | 2, 2, pid >> 8, pid & 0xFF)))
            return
        tag, msg_id = entry
        if packet.kind == P.PUBACK and not state.persistent and 0 < tag < SHARED_TAG:
            # The hot path, once a QoS 1 message of a clean session's own queue: _settle and
            # _forget inline.
            ch = self.bs.channels.get(CONSUME)
            if ch is not None:
                try:
                    ch.ack(tag, False)
                except CMQError:
                    pass  # already settled (a stale tag after a visibility timeout)
            if msg_id is not None:
                mapped = state.pid_of_msg.pop(msg_id, None)
                if mapped is not None and state.msg_of_pid.get(mapped) == msg_id:
                    del state.msg_of_pid[mapped]
            else:
                state.retained_pids.pop(pid, None)
            return
        if packet.kind == P.PUBACK or packet.reason_code >= 0x80 or not state.persistent:
            self._settle(tag)
            if state.persistent:
                # The identifier leaves the record once the ack is durable: a crash before
                # gives the message again, and it must go under its identifier with DUP (MQ8).
                self._after_save(partial(self._forget, msg_id, pid))
                return
        self._forget(msg_id, pid)
        if packet.kind == P.PUBREC and packet.reason_code < 0x80:
            state.release(pid, msg_id or "")
            if state.persistent:
                # MQ8: PUBREL only once the record saying so is durable, and the message leaves
                # its queue only then too: before, a crash would send it again as new, under a
                # new identifier, to a client that has it already.
                self._save_soon()
                if msg_id is not None:
                    self._releasing[msg_id] = tag
                    self._after_save(lambda m=msg_id: self._ack_released(m))
                self._after_save(bytes((P.PUBREL << 4 | 2, 2, pid >> 8, pid & 0xFF)))
                return
            state.released_of_msg.pop(msg_id or "", None)  # a clean session's: acked above
            self.core.send_raw(bytes((P.PUBREL << 4 | 2, 2, pid >> 8, pid & 0xFF)))

    def _forget(self, msg_id: str | None, pid: int) -> None:
        """The client is done with ``pid`` (and its message is acknowledged)."""
        state = self.state
        if msg_id is not None:
            mapped = state.pid_of_msg.pop(msg_id, None)  # SessionState.forget_msg, inline
            if mapped is not None and state.msg_of_pid.get(mapped) == msg_id:
                del state.msg_of_pid[mapped]
        elif state.retained_pids.pop(pid, None) is None:
            return
        if state.persistent:  # _save_soon's test, here: a clean session's PUBACK saves nothing
            self._save_soon()

    def pubcomp(self, packet: P.Ack) -> None:
        if self.state.completed(packet.packet_id):
            self._save_soon()

    # -- end -------------------------------------------------------------------------------

    def on_connection_lost(self) -> None:
        """Unacknowledged deliveries become Active again (M13) and come back with DUP on the
        next connection (MQ6); a clean session's exclusive queue goes with it (MQ3)."""
        if self.closed:
            return
        if not self.state.persistent:  # a clean session's shared subscriptions end with it
            for shared in list(self.state.shared):
                self._stop_shared(shared)
                self.release_shared(shared)
        self.closed = True
        self.inflight.clear()
        self.pending.clear()  # still unacked in the channel: Active again below (M13)
        # What waited for a record goes with the connection; the next one resends it from
        # the session state (PUBREL) and the queue (PUBLISH, DUP). Identifiers whose message
        # was acknowledged are freed now (else nothing would free them).
        for item in [i for _, i in self.outbox] + self._save_due:
            if isinstance(item, partial) and item.func == self._forget:
                item()
        self.outbox.clear()
        self._save_due.clear()
        self._releasing.clear()
        self.broker.confirm_waiters.discard(self)
        self.bs.on_connection_lost()
