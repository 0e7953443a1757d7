"""MQTT sessions, retained messages and client-id takeover shared by every gateway on one
JetStream store (docs/CLUSTER.md, SPEC MQ3-MQ5, CL1).

What an MQTT session is made of is already a broker's: its queue (a CMQ queue, so a stream)
and its subscriptions (bindings) are in ``CMQ_META`` like any declaration. What was left in
one gateway's memory is shared here:

* the session record ``ms/<vhost>/<client id>`` (filters, QoS 2 packet identifiers) and the
  retained messages ``mr/<vhost>/<topic>`` are records of ``CMQ_META`` like the others
  (gateway.jetstream.store.SHARED_KINDS); a retained message set or cleared through another
  gateway updates this gateway's copy (its watcher below);
* client-id takeover (MQTT-3.1.4-2): before a gateway answers a CONNECT it *claims* the
  client id: a core NATS message to every gateway, each of which closes its connection of
  that client id (DISCONNECT 0x8E, as a takeover on one gateway), ends or keeps its delayed
  will as the new connection resumes the session or not (MQTT-3.1.3-9), forgets its copy of
  the session and answers once its own writes are acknowledged and the stream of a clean
  session's queue is deleted (the new connection may make one of the same name at once).
  The claiming gateway waits for every live gateway's answer (at most CLAIM_WAIT: a gateway
  just killed answers nothing), then until it has applied every bucket change made before
  (the old gateway's last session record, the deletion of a clean session's queue), deletes
  a clean session's queue still held by a gateway that did not answer, and only then reads
  the session and answers CONNACK.

Every cluster broker makes one (``ClusterBroker.mqtt``) and answers claims, MQTT served or
not; the MQTT service attaches to it. The embedded store never builds this:
``MQTTService.cluster`` stays None and CONNECT is answered at once, as before.

Exactly once across a crash (MQ8) holds here as on the embedded store, by the same path: the
session record is a ``CMQ_META`` write under the store's LSN, and ``durable_lsn`` passes it
once JetStream acknowledged it and every write before it; that is what a persistent session's
PUBLISH, PUBREL and PUBCOMP wait for (``MQTTSession._after_save``, through the broker's
``confirm_waiters`` as confirms). What differs:

* a message leaves its queue by a ``+ACK`` to JetStream, not by a store write. It is sent
  before the record that frees its identifier (QoS 1) or completes it (QoS 2), on the same
  NATS connection, so the server has the ack before it has that record; a gateway killed
  before its client flushed loses the ack and every later write with it, and the message comes
  back after the consumer's ack_wait under its stored identifier (DUP), or acknowledged unsent
  when its PUBREL was owed;
* the gateway cannot tell at resume which stored QoS 1 identifiers lost their message to an
  ack that JetStream took just before the kill (the embedded store looks in the queue,
  ``MQTTService._drop_settled``): those stay reserved in the record, at most one receive
  window of identifiers a crash;
* the LSN check of an incoming QoS 2 identifier (``MQTTService._drop_unrouted``) needs the
  embedded journal's order; here the record and the message are writes to two streams. The
  record goes first, on the messages' own connection (``JetStreamStore.ORDERED_KINDS``), and
  names the message IDs it routed; a resend of an identifier of a resumed session is routed
  again under those IDs, which each stream that has the message already drops as a duplicate
  (its ``duplicate_window``, 2 minutes: a client that resends later than that may get a copy
  twice, never none).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from typing import TYPE_CHECKING, Any

from gateway.mqtt.session import queue_name, session_key
from semantics.store.keys import parse_key

if TYPE_CHECKING:
    from gateway.jetstream.broker import ClusterBroker
    from gateway.mqtt.server import MQTTService

__all__ = ["CLAIM_SUBJECT", "MQTTCluster"]

log = logging.getLogger("cmq_gateway.mqtt")

CLAIM_SUBJECT = "cmq.mqtt.claim"
# A live gateway answers a claim in milliseconds; one killed a moment ago (still counted alive
# by the presence bucket for DEAD_AFTER seconds) never does: the CONNECT waits this long then.
CLAIM_WAIT = 2.0
CATCH_UP_WAIT = 5.0  # the bucket's changes reach this gateway's watch (normally milliseconds)


class MQTTCluster:
    """Made by every cluster broker, MQTT served or not: a claimer waits for every live
    gateway's answer, so a gateway without MQTT answers too (it holds no client id)."""

    def __init__(self, broker: ClusterBroker) -> None:
        self.broker = broker
        self.service: MQTTService | None = None
        self._sub: Any = None

    async def start(self) -> None:
        self._sub = await self.broker.link.nc.subscribe(CLAIM_SUBJECT, cb=self._on_claim)

    def attach(self, service: MQTTService) -> None:
        """This gateway serves MQTT: its sessions, retained messages and takeovers."""
        self.service = service
        self.broker.record_watchers["mr"] = self._retained_changed
        self.broker.record_watchers["ms"] = self._session_changed

    # -- this gateway takes a client id ---------------------------------------------------------

    async def claim(self, vhost: str, client_id: str, resume: bool) -> None:
        """Before CONNACK: no other gateway holds ``client_id`` any longer, and what they
        wrote of its session is read here. ``resume``: the new connection resumes a
        persistent session (a delayed will of the old one is then not sent)."""
        broker = self.broker
        me, presence = broker.gateway_id, broker.presence
        others = {gw for gw in list(presence.seen) if gw != me and presence.alive(gw)}
        if others:
            await self._ask(others, json.dumps({"gw": me, "vhost": vhost, "client_id": client_id,
                                                "resume": resume}).encode())
        if not await broker.watch.caught_up(CATCH_UP_WAIT):
            log.warning("mqtt: connect of %r answered before the metadata watch caught up", client_id)
        # A clean session's queue is exclusive to its gateway's connection; that connection is
        # being taken over, so its queue goes now even if its gateway is dead and not yet known
        # to be (it would be reaped DEAD_AFTER seconds later; the client would find it locked).
        vh = broker.vhosts.get(vhost)
        name = queue_name(vhost, client_id)
        if vh is not None and broker.membership.release(vhost, name):
            broker.begin_batch()
            try:
                vh.delete_queue(None, name, if_unused=False, if_empty=False, reason="owner_closed")
            finally:
                broker.end_batch()

    async def _ask(self, others: set[str], payload: bytes) -> None:
        nc = self.broker.link.nc
        inbox = nc.new_inbox()
        answered: set[str] = set()
        done = asyncio.Event()

        async def got(msg: Any) -> None:
            answered.add(bytes(msg.data).decode(errors="replace"))
            if others <= answered:
                done.set()

        try:
            sub = await nc.subscribe(inbox, cb=got)
        except Exception as e:  # noqa: BLE001 - NATS away: nobody can be told
            log.warning("mqtt: cannot claim a client id: %r", e)
            return
        try:
            await nc.publish(CLAIM_SUBJECT, payload, reply=inbox)
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(done.wait(), CLAIM_WAIT)
        except Exception as e:  # noqa: BLE001
            log.warning("mqtt: claim of a client id not sent: %r", e)
        finally:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()

    # -- another gateway takes one ------------------------------------------------------------

    async def _on_claim(self, msg: Any) -> None:
        try:
            r = json.loads(msg.data)
            sender, key, resume = str(r["gw"]), (str(r["vhost"]), str(r["client_id"])), bool(r["resume"])
        except (ValueError, KeyError, TypeError):
            return
        broker, service = self.broker, self.service
        if sender == broker.gateway_id:
            return
        state = service.sessions.get(key) if service is not None else None
        if state is not None and service is not None:
            broker.begin_batch()
            try:
                if state.live is not None:
                    state.live.taken_over()  # MQ5, MQTT-3.1.4-2: its client connected elsewhere
                timer = state.will_timer
                if timer is not None:
                    timer.cancel()
                    state.will_timer = None
                    if not (resume and state.persistent):  # the old session ends now: so does the delay
                        service.publish_will(state, *state.will_timer_args)
                if service.sessions.get(key) is state:
                    del service.sessions[key]  # the session is the other gateway's now
            except Exception:  # noqa: BLE001 - the claim is answered whatever happened here
                log.exception("mqtt: giving up client %r to gateway %s failed", key[1], sender)
            finally:
                broker.end_batch()
            with contextlib.suppress(Exception):
                # Its last writes (session record, queue deletion) are in the bucket.
                await broker.store.durable(broker.store.last_lsn, CATCH_UP_WAIT)
                gone = broker.messages.streams.deleting.get((key[0], queue_name(*key)))
                if gone is not None:  # a clean session's queue: its stream, before the new one's is made
                    await asyncio.wait_for(asyncio.shield(gone), CATCH_UP_WAIT)
        if msg.reply:
            with contextlib.suppress(Exception):
                await broker.link.nc.publish(msg.reply, broker.gateway_id.encode())

    def consumed_elsewhere(self, q: Any) -> bool:
        """A live gateway other than this one has consumers on ``q`` (the presence bucket)."""
        return self.broker.presence.others_consume(q)

    # -- records another gateway wrote ----------------------------------------------------------

    def _retained_changed(self, key: str, value: bytes | None) -> None:
        """MQ5: a retained message set or cleared through another gateway."""
        _kind, names = parse_key(key)
        if self.service is not None:
            # A long topic's key is mr/<vhost>/#/<digest> (gateway.mqtt.retained, MQ8).
            self.service.retained.changed(names[0], names[1], value, names[2] if len(names) > 2 else "")

    def _session_changed(self, key: str, value: bytes | None) -> None:
        """A session record written elsewhere: a copy kept here since its client left is
        stale (a claim normally removed it already; this covers one that was missed)."""
        _kind, names = parse_key(key)
        sessions = self.service.sessions if self.service is not None else {}
        k = (names[0], names[1])
        if len(names) > 2:  # a long client id's key names it by a digest (session_key, MQ8)
            k = next((c for c in sessions if c[0] == names[0] and session_key(*c) == key), k)
        state = sessions.get(k)
        if state is not None and state.live is None and state.will_timer is None:
            del sessions[k]
