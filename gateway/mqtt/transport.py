"""One MQTT connection on a socket: a thin asyncio.Protocol around the sans-IO core.

As the AMQP transport: the bytes of one read are handled in one broker batch and everything
the session queued goes out in one write. Login (MQ1), client takeover, keep-alive and the
will (MQ5) are here; the rest is the session's (gateway/mqtt/session.py). It sits in the
gateway's ``connections`` with the AMQP ones, so shutdown, the periodic tick and the
management API's /api/connections treat it alike.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from typing import TYPE_CHECKING, Any

from pamqp import commands as C

from gateway.admission import tcp_keepalive
from gateway.auth import AuthError
from gateway.memory import HELD
from gateway.mqtt import codec as P
from gateway.mqtt.codec import PUBACK, Ack, Publish
from gateway.mqtt.connection import PINGED, KeepAliveTimeout, MQTTServerConnection, ProtocolError
from gateway.mqtt.session import (
    BACKLOG_LOW,
    DEFAULT_INFLIGHT,
    OPS,
    TOPIC_ALIAS_MAXIMUM,
    MQTTSession,
    SessionState,
    session_key,
)
from gateway.transport import CLOSE_TIMEOUT, EVENTS_PER_TURN, FLOW_CHECK_SECONDS, ClientProtocol

if TYPE_CHECKING:
    from gateway.mqtt.server import MQTTService

__all__ = ["MQTTConnection"]

log = logging.getLogger("cmq_gateway.mqtt")

SESSION_TAKEN_OVER, SERVER_SHUTTING_DOWN, ADMINISTRATIVE_ACTION = 0x8E, 0x8B, 0x98
NEVER_EXPIRES = 0xFFFFFFFF
# CONNACK refusals: (MQTT 5 reason code, MQTT 3.1.1 return code)
BAD_LOGIN, NOT_AUTHORIZED, BAD_CLIENT_ID = (0x86, 4), (0x87, 5), (0x85, 2)


class MQTTConnection(ClientProtocol):
    def __init__(self, service: MQTTService) -> None:
        self.service = service
        self.gw = service.gw
        limits = self.gw.config.limits
        self.core = MQTTServerConnection(max_packet_size=service.max_packet_size,
                                         connect_timeout=limits.handshake_timeout,
                                         preauth_bytes=limits.preauth_bytes)
        self.conn = self.core
        self.transport: asyncio.Transport | None = None
        self.mqtt: MQTTSession | None = None
        self.session: Any = None  # the broker Session (management: channels)
        self.peer = "?"
        self.from_loopback = False
        self.user: str | None = None
        self.vhost: str | None = None
        self.client_id = ""
        self.protocol = "MQTT"
        self.client_properties: dict[str, Any] = {}
        self.opened_at = time.monotonic()
        self.closing_since: float | None = None
        self.blocked = False
        self.publisher = False  # has published: subject to W5 blocking, as AMQP publishers
        self.will: P.Will | None = None
        self.tls_info: dict[str, Any] = {}  # the management API's ssl_* fields (MQTTS)
        self.cert_user: str | None = None  # named by a verified client certificate
        self.auth_mechanism = "PLAIN"  # EXTERNAL after a certificate login (management API)
        self._flush_scheduled = False
        self._backlog = False  # packets left in the core's buffer: handled in a later turn
        self._lost = False
        self._held: asyncio.Task[None] | None = None  # a CONNECT waiting (_connect_after)
        self._gate: Any = None  # the listener's admission gate (SE5), once admitted
        self._preauth = 0  # bytes before CONNACK, counted in HELD.partial (SE5)
        self._parked: Publish | None = None  # a PUBLISH read while an alarm holds publishers (SE6)
        self._flow: list[Any] = []  # the queues whose backlog holds this publisher (flow control)

    # -- asyncio.Protocol -------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        ssl_object = transport.get_extra_info("ssl_object")
        if self._gate is None:  # else admitted before its TLS handshake (gateway.admission.TlsListener)
            gate = self.gw.admission.gate("mqtts" if ssl_object is not None else "mqtt")
            if not gate.enter():  # SE5: the listener's limit and the descriptors' reserve
                from gateway.admission import refuse

                self._lost = True
                refuse(transport)
                return
            self._gate = gate
        self._take(transport)
        tcp_keepalive(transport)  # SE5: a vanished peer found even with MQTT keep alive 0
        if ssl_object is not None:  # MQTTS: the handshake is over, the certificate known
            from gateway.tls import connection_info, peer_username

            self.tls_info = connection_info(ssl_object)
            tls = self.gw.config.tls
            self.cert_user = peer_username(ssl_object, tls.ssl_cert_login_from if tls else "distinguished_name")
        self.core.tick(time.monotonic())

    def data_received(self, data: bytes) -> None:
        self.gw.bytes_in += len(data)
        if not self.core.connected and not self._lost:  # SE5: not logged in: held memory
            self._preauth += len(data)
            HELD.partial += len(data)
        self.core.receive_data(data, time.monotonic())
        if not self._backlog:  # else a turn is scheduled and reading paused
            self._process()

    def _process(self) -> None:
        """At most EVENTS_PER_TURN packets, then the other connections get their turn (as
        the AMQP transport: a flooding publisher must not starve a subscriber's PUBACKs)."""
        if self._held:
            # A CONNECT or a big SUBSCRIBE holds the packets after it (an alarm clearing meanwhile
            # calls this too): they wait, in order, for its end, which calls this again.
            return
        more = False
        gw = self.gw
        broker = gw.broker
        broker.begin_batch()
        try:
            budget = EVENTS_PER_TURN
            core = self.core
            next_event = core.next_event
            next_packet = core.decoder.next_packet
            parked, self._parked = self._parked, None
            if parked is not None and self.mqtt is not None:
                self.mqtt.publish(parked)  # the alarm that held it has cleared
            while not self._lost:
                event: object
                if core._got_connect and not core.closed:  # core.next_event, inline: a call less a packet
                    try:
                        event = next_packet()
                    except P.MalformedPacket as e:
                        event = core.malformed(e)
                    else:
                        if event is None:
                            break
                        if type(event) is not Publish and type(event) is not Ack:
                            event = core.vet(event)
                else:
                    event = next_event()
                    if event is None:
                        break
                s = self.mqtt
                # The packets of every message straight to the session; the rest by _dispatch.
                if type(event) is Publish and s is not None:
                    self.publisher = True
                    if gw.blocked:
                        # SE6: an alarm holds every publisher, one that connected during it
                        # too: this PUBLISH waits (unacknowledged) with the rest unread.
                        self._parked = event
                        break
                    s.publish(event)
                elif type(event) is Ack and s is not None and event.kind == PUBACK:
                    s.puback(event)
                elif event is PINGED:
                    pass  # answered by the core; counted in the turn's budget (a flood yields)
                else:
                    self._dispatch(event)
                    if self._held:
                        break  # CONNECT waits for the other gateways: what follows it waits too
                budget -= 1
                if not budget:
                    more = True
                    break
        except Exception:  # a bug below us must not take the event loop down with it
            log.exception("internal error on MQTT connection %s", self.peer)
            self.core.close(0x80, "internal error")
            more = False
        finally:
            broker.end_batch()
        # A5's hand-off by the turn that made the records, as on AMQP (gateway.transport): a
        # QoS 0 flood writes nothing back, and its records would wait for the next connection
        # with bytes to send, whose reply would then pay for them.
        broker.audit_handoff()
        self._flush()
        if self._preauth and (self.core.connected or self.core.closed):
            HELD.partial -= self._preauth
            self._preauth = 0
        if self._lost or self.transport is None or self._held:
            return
        if gw.memory_over():
            gw.check_alarms()  # as on AMQP: at once, not at the next tick
        if self._parked is not None or (self.publisher and gw.blocked and not self.blocked):
            self.blocked = True
            self._backlog = True  # what is buffered waits in the core until set_blocked(False)
            self.transport.pause_reading()
            return
        s = self.mqtt
        if s is not None and s.routed_keys and not self._flow:
            self._hold_for_backlog(s)
        if more:
            if not self._backlog:
                self._backlog = True
                self.transport.pause_reading()
            asyncio.get_running_loop().call_soon(self._process)
        elif self._backlog:
            self._backlog = False
            if not self.blocked and not self._flow:
                self.transport.resume_reading()

    def _hold_for_backlog(self, s: MQTTSession) -> None:
        """Flow control: reading stops while a consumed queue this turn's messages went to has
        more than BACKLOG_HIGH undelivered; the client's packets wait in its socket, so a
        QoS 1/2 publisher gets no PUBACK and one at QoS 0 is held by TCP, and nothing is
        lost. Not while the client has deliveries of its own in flight: their PUBACKs are
        behind its PUBLISHes, and two clients each publishing to the other would wait forever."""
        if s.inflight:
            s.routed_keys.clear()
            return
        full = s.backlogged()
        if not full:
            return
        self._flow = full
        assert self.transport is not None
        self.transport.pause_reading()
        asyncio.get_running_loop().call_later(FLOW_CHECK_SECONDS, self._flow_check)

    def _flow_check(self) -> None:
        if self._lost or not self._flow:
            return
        s = self.mqtt
        if s is not None and not s.inflight and any(
                not q.deleted and q.consumers and q.cmq.active > BACKLOG_LOW for q in self._flow):
            asyncio.get_running_loop().call_later(FLOW_CHECK_SECONDS, self._flow_check)
            return
        self._flow = []
        if self.transport is not None and not self.blocked and not self._backlog:
            self.transport.resume_reading()

    def eof_received(self) -> bool | None:
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        self._end("closed" if exc is None else str(exc))

    # -- writes -----------------------------------------------------------------------------

    def _flush(self) -> None:
        s = self.mqtt
        if s is not None and s.pending:
            s.deliver_pending()  # normally done at the end of the dispatch (MQTTSession._dispatched)
        super()._flush()

    def _core_closed(self) -> None:
        if self.closing_since is None:
            self.closing_since = time.monotonic()
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()

    # -- packets ----------------------------------------------------------------------------

    def _dispatch(self, event: object) -> None:
        s = self.mqtt
        # The codec's packets are never subclassed: a type test is cheaper than isinstance.
        if type(event) is P.Publish:
            if s is not None:
                self.publisher = True
                s.publish(event)
        elif type(event) is P.Ack:
            if s is None:
                return
            kind = event.kind
            if kind == P.PUBACK or kind == P.PUBREC:
                s.puback(event)
            elif kind == P.PUBREL:
                s.pubrel(event)
            else:
                s.pubcomp(event)
        elif isinstance(event, P.Subscribe):
            if s is not None:
                s.subscribe(event)
        elif isinstance(event, P.Unsubscribe):
            if s is not None:
                s.unsubscribe(event)
        elif isinstance(event, P.Connect):
            self._on_connect(event)
        elif isinstance(event, P.Disconnect):
            if event.reason_code != 0x04:  # "disconnect with will message"
                self.will = None
            self.core.close()
        elif isinstance(event, ProtocolError):
            log.info("MQTT protocol error from %s: 0x%02X %s", self.peer, event.reason_code, event.text)
            self._audit_close(f"protocol error 0x{event.reason_code:02X}: {event.text}")

    def _on_connect(self, p: P.Connect) -> None:
        core = self.core
        v5 = core.level >= 5
        if p.level not in (4, 5):
            core.accept(P.ConnAck(1))  # unacceptable protocol version, in 3.1.1's format
            return
        # As RabbitMQ's management API shows an MQTT connection: {'MQTT', "5.0"} printed.
        self.protocol = "MQTT 5.0" if v5 else "MQTT 3.1.1"
        self.client_properties = {"client_id": p.client_id, "protocol": self.protocol}
        assigned = None
        client_id = p.client_id
        if not client_id:
            if not p.clean_start and not v5:
                self._refuse(BAD_CLIENT_ID, "an empty client id needs a clean session")
                return
            client_id = assigned = "cmq-" + secrets.token_hex(8)
        # MQ1: the vhost as RabbitMQ's plugin: "vhost:user", else the default vhost.
        username = p.username or ""
        vhost = "/"
        if ":" in username:
            vhost, username = username.split(":", 1)
        users = self.gw.config.users
        cert_login = p.username is None and p.password is None and self.cert_user is not None
        if (p.username is None or p.password is None) and not cert_login:
            self._refuse(BAD_LOGIN, "user name and password are required", username or None)
            return
        try:
            if cert_login:
                # As RabbitMQ's ssl_cert_login: no credentials in CONNECT, a verified client
                # certificate names the user (SE2's EXTERNAL); a user name and password, when
                # given, take priority.
                assert self.cert_user is not None
                username = self.cert_user
                user = users.authenticate_external(username, from_loopback=self.from_loopback)
            else:
                assert p.password is not None
                user = users.authenticate("PLAIN", b"\0" + username.encode() + b"\0" + p.password,
                                          from_loopback=self.from_loopback)
        except AuthError as e:
            log.warning("MQTT login refused: user %r, mechanism %s, from %s: %s", username,
                        "EXTERNAL" if cert_login else "PLAIN", self.peer, e.cause)
            self._refuse(BAD_LOGIN, f"{e.cause}: {e}", username)
            return
        self.auth_mechanism = "EXTERNAL" if cert_login else "PLAIN"
        if users.vhost_permission(user.name, vhost) is None:
            self._refuse(NOT_AUTHORIZED, f"access to vhost '{vhost}' refused for user '{user.name}'", user.name,
                         vhost)
            return
        self.user, self.vhost, self.client_id = user.name, vhost, client_id
        cluster = self.service.cluster
        if cluster is not None:  # other gateways may hold this client id (CL1)
            resume = not p.clean_start and (bool(p.properties.get("session_expiry", 0)) if v5 else True)
            self._connect_after(cluster.claim(vhost, client_id, resume), p, client_id, assigned)
            return
        self._start_session(p, client_id, assigned)

    def _connect_after(self, ready: Any, p: P.Connect, client_id: str, assigned: str | None) -> None:
        """CONNECT is answered once ``ready`` is done; the packets after it stay in the
        core's buffer, and reading pauses, until then."""
        self._backlog = True  # data_received leaves the buffer alone
        if self.transport is not None:
            self.transport.pause_reading()
        self._held = asyncio.get_running_loop().create_task(self._connect_when(ready, p, client_id, assigned))

    async def _connect_when(self, ready: Any, p: P.Connect, client_id: str, assigned: str | None) -> None:
        try:
            await ready
        except Exception:  # noqa: BLE001 - answered as on one gateway: the others did not say
            log.exception("MQTT connect of %r: the other gateways could not be asked", client_id)
        self._held = None
        if self._lost:
            return
        broker = self.gw.broker
        broker.begin_batch()
        try:
            self._start_session(p, client_id, assigned)
        except Exception:
            log.exception("internal error on MQTT connection %s", self.peer)
            self.core.close(0x80, "internal error")
        finally:
            broker.end_batch()
        self._process()  # what came after CONNECT; reading resumes there

    def _start_session(self, p: P.Connect, client_id: str, assigned: str | None) -> None:
        service, core = self.service, self.core
        v5 = core.level >= 5
        assert self.vhost is not None and self.user is not None
        key = (self.vhost, client_id)
        state = service.sessions.get(key)
        if state is not None and state.live is not None:
            state.live.taken_over()  # MQ5: the second connection takes the session over
        if state is None:
            state = service.stored_session(self.vhost, client_id)
        if state is not None and state.persistent and state.subs and \
                state.queue not in service.gw.broker.vhost(self.vhost).queues:
            # Its queue expired (MQTT 5 session expiry as x-expires, MQ3): the session is over.
            service.forget(state)
            state = None
        expiry_prop = int(p.properties.get("session_expiry", 0)) if v5 else None
        persistent = (not p.clean_start) if not v5 else bool(expiry_prop)
        expiry = None if not v5 or expiry_prop == NEVER_EXPIRES else expiry_prop
        old_queue = state is not None and state.persistent
        resume = state is not None and not p.clean_start
        resumed = resume and state is not None and state.persistent and persistent
        # The shared subscriptions a discarded session held: their groups may be left empty.
        dropped_shared = list(state.shared) if state is not None and not resumed else []
        if resumed and state is not None:
            state.expiry = expiry
        else:
            if state is not None and state.will_timer is not None:
                state.will_timer.cancel()  # the old session ends now: so does its will's delay
                service.publish_will(state, *state.will_timer_args)
            state = SessionState(self.vhost, client_id, persistent, expiry)
        service.sessions[key] = state
        state.live = self
        if state.will_timer is not None:
            state.will_timer.cancel()  # resumed within the will delay: no will (MQTT-3.1.3-9)
            state.will_timer = None
        receive_max = int(p.properties.get("receive_maximum", 0)) if v5 else 0
        session = self.mqtt = MQTTSession(service, self, state, self.user, self.peer,
                                          min(receive_max or DEFAULT_INFLIGHT, 65535))
        session.client_max_packet = int(p.properties.get("maximum_packet_size", 0)) if v5 else 0
        self.session = session.bs
        if old_queue and not (resume and persistent):
            # A clean start discards what a persistent session left behind (MQ3).
            session._call(OPS, C.Queue.Delete(queue=state.queue, nowait=True))
            service.gw.broker.unpersist(session_key(state.vhost, client_id))
        for shared in dropped_shared:
            session.release_shared(shared)
        present = resumed  # as Mosquitto: a persistent session found, with or without subscriptions
        props: dict[str, Any] = {}
        if v5:
            props = {"maximum_packet_size": service.max_packet_size, "topic_alias_maximum": TOPIC_ALIAS_MAXIMUM,
                     "subscription_id_available": 0}  # shared subscriptions: available (the default)
            if assigned:
                props["assigned_client_id"] = assigned
        core.accept(P.ConnAck(0, present, props))
        self.will = p.will
        session._save()
        session.start(present)
        self.gw.audit.emit("connection_open", self.vhost, user=self.user, peer=self.peer, conn=client_id,
                           protocol="mqtt")

    def _refuse(self, codes: tuple[int, int], reason: str, user: str | None = None, vhost: str = "/") -> None:
        self.gw.audit.emit("auth_failure", vhost, peer=self.peer, user=user, reason=reason, protocol="mqtt")
        self.core.accept(P.ConnAck(codes[0] if self.core.level >= 5 else codes[1]))

    # -- closing ----------------------------------------------------------------------------

    def close_with(self, reason_code: int, text: str) -> None:
        """Close from the server side (MQ6/MQ7): DISCONNECT with the reason for MQTT 5."""
        self.core.close(reason_code, text)
        self.request_flush()

    def taken_over(self) -> None:
        """MQ5: another connection with this client id: DISCONNECT 0x8E and gone, at once,
        so that its session is released before the new one is set up."""
        self.core.close(SESSION_TAKEN_OVER, "session taken over")
        out = self.core.data_to_send()
        if self.transport is not None and not self._lost:
            self.transport.write(out)
            self.transport.close()
        self._end("session taken over")

    def close_for_shutdown(self) -> None:
        self.close_forced("shutdown", SERVER_SHUTTING_DOWN)

    def close_forced(self, reason: str, code: int = ADMINISTRATIVE_ACTION) -> None:
        self.core.close(code, f"broker forced connection closure with reason '{reason}'")
        self._flush()

    def _end(self, reason: str) -> None:
        """The connection is gone: the will of an ungraceful end (MQ5), then the session."""
        if self._lost:
            return
        self._lost = True
        self.gw.connections.discard(self)
        if self._gate is not None:
            self._gate.leave()
            self._gate = None
        HELD.partial -= self._preauth
        self._preauth = 0
        self._parked = None
        s = self.mqtt
        if s is not None:
            try:
                w, self.will = self.will, None
                delay = int(w.properties.get("will_delay", 0)) if w is not None else 0
                if w is not None and delay and s.state.persistent:
                    # MQTT 5 will delay: sent later unless the session is resumed meanwhile
                    # (a session that ends now sends it now, MQTT-3.1.3-9).
                    s.state.will_timer_args = (s.user, self.peer, w)
                    s.state.will_timer = asyncio.get_running_loop().call_later(
                        min(delay, s.state.expiry if s.state.expiry is not None else delay),
                        self.service.publish_will, s.state, *s.state.will_timer_args)
                elif w is not None:
                    self.gw.broker.begin_batch()
                    try:
                        s.route(w.topic, w.payload, w.qos, w.retain, 0, w.properties, will=True)
                    finally:
                        self.gw.broker.end_batch()
                s.on_connection_lost()
            except Exception:
                log.exception("MQTT session cleanup failed for %s", self.peer)
            state = s.state
            if state.live is self:
                state.live = None
                if not state.persistent:
                    self.service.sessions.pop((state.vhost, state.client_id), None)
            self.mqtt = None
            self.session = None
            self._audit_close(reason)

    def _audit_close(self, reason: str) -> None:
        if self.user is not None and not getattr(self, "_closed_audited", False):
            self._closed_audited = True
            self.gw.audit.emit("connection_close", self.vhost or "/", user=self.user, peer=self.peer,
                               reason=reason, conn=self.client_id, protocol="mqtt")

    # -- periodic ---------------------------------------------------------------------------

    def tick(self, now_monotonic: float) -> None:
        if self._lost:
            return
        if self.closing_since is not None and now_monotonic - self.closing_since > CLOSE_TIMEOUT:
            if self.transport is not None:
                self.transport.abort()
            return
        if self.blocked or self._flow:
            self.core.reading_paused(now_monotonic)
        for event in self.core.tick(now_monotonic):
            if isinstance(event, KeepAliveTimeout):
                log.info("MQTT keep-alive timeout from %s", self.peer)
        self._flush()

    def set_blocked(self, blocked: bool) -> None:
        """W5: a publishing client is no longer read from while the gateway is over its mark
        (and one that publishes later is held at its first PUBLISH, SE6: _process)."""
        if self.transport is None or self._lost or blocked == self.blocked or (blocked and not self.publisher):
            return
        self.blocked = blocked
        if blocked:
            self.transport.pause_reading()
        elif self._backlog:
            # A parked PUBLISH, or packets left buffered: handled in a turn of their own,
            # which resumes reading when they are done.
            asyncio.get_running_loop().call_soon(self._process)
        elif not self._flow:
            self.transport.resume_reading()
