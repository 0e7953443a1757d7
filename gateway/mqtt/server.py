"""The MQTT listener of one gateway (SPEC MQ1): its sessions by (vhost, client id), retained
messages, and the asyncio server. Started by ``gateway.server.Gateway`` when ``mqtt_port``
is set."""

from __future__ import annotations

import asyncio
import logging
import socket
from typing import Any

from gateway.admission import LISTEN_BACKLOG
from gateway.mqtt.codec import Will
from gateway.mqtt.retained import RetainedStore
from gateway.mqtt.session import EXCHANGE, SessionState, message_properties, session_key
from gateway.mqtt.topics import topic_to_routing_key
from semantics.errors import CMQError
from semantics.store.keys import key_prefix

log = logging.getLogger("cmq_gateway.mqtt")

__all__ = ["MQTTService"]


class MQTTService:
    def __init__(self, gw: Any) -> None:
        self.gw = gw
        self.max_packet_size: int = gw.config.mqtt_max_packet_size
        self.sessions: dict[tuple[str, str], SessionState] = {}
        self.retained = RetainedStore(gw.broker)
        self.addresses: list[tuple[str, int]] = []  # plain MQTT, one per host (IPv4 and IPv6)
        self.tls_addresses: list[tuple[str, int]] = []  # MQTT over TLS (RabbitMQ's 8883)
        # On a JetStream store (CL1): sessions, retained messages and takeover shared with the
        # other gateways; None on the embedded store.
        self.cluster: Any = getattr(gw.broker, "mqtt", None)
        if self.cluster is not None:
            self.cluster.attach(self)

    async def serve(self, sock: socket.socket, ssl_context: Any = None) -> asyncio.AbstractServer:
        from gateway.mqtt.transport import MQTTConnection

        (self.tls_addresses if ssl_context is not None else self.addresses).append(sock.getsockname()[:2])
        if ssl_context is None:
            return await asyncio.get_running_loop().create_server(lambda: MQTTConnection(self), sock=sock,
                                                                  backlog=LISTEN_BACKLOG)
        tls = self.gw.config.tls
        # The TLS handshake has its own limit, as on the AMQPS port (SE4); CONNECT's follows it.
        # The socket is counted by the listener's gate from accept, before the handshake (SE5).
        from gateway.admission import TlsListener

        return TlsListener(sock, lambda: MQTTConnection(self), self.gw.admission.gate("mqtts"), ssl_context,
                           tls.handshake_timeout)  # type: ignore[return-value]

    @property
    def address(self) -> tuple[str, int]:
        return (self.addresses or self.tls_addresses)[0]

    @property
    def port(self) -> int:
        return self.address[1]

    @property
    def tls_port(self) -> int:
        return self.tls_addresses[0][1]

    def stored_session(self, vhost: str, client_id: str) -> SessionState | None:
        """A persistent session from before a restart (MQ3)."""
        raw = self.gw.broker.store.get(session_key(vhost, client_id))
        if raw is None:
            return None
        state = SessionState.from_json(raw)
        if self.cluster is None:
            self._drop_settled(state)
            self._drop_unrouted(state)
        else:
            # MQ8: the record of an incoming QoS 2 identifier and its message are writes to
            # two streams; the record may have been stored without the message. A resend of
            # one of these is routed again under the message IDs the record names, which a
            # stream that has the message already takes as a duplicate (its
            # duplicate_window), so it is stored once either way.
            state.unsure = set(state.inbound_qos2)
        return state

    def _drop_unrouted(self, state: SessionState) -> None:
        """MQ4/MQ8: an incoming QoS 2 identifier whose record was the store's last durable
        write when the gateway stopped: the message put just after it never reached the disk,
        so the client's resend must be routed, not taken for a duplicate. (The embedded
        store's journal is durable in LSN order, batch by batch.)"""
        opened = getattr(self.gw.broker, "opened_lsn", None)
        for pid, lsn in state.inbound_at.items():
            if lsn and lsn == opened:
                state.inbound_qos2.discard(pid)

    def _drop_settled(self, state: SessionState) -> None:
        """Packet identifiers whose message is in none of the session's queues any more: a
        QoS 1 message whose ack was durable when the crash came, before the record that
        frees its identifier (MQ8). A QoS 2 message leaves its queue only after the record
        that releases it, so it never shows here. (The embedded store, whose queues hold
        every message; on JetStream such an identifier stays reserved.)"""
        queues = self.gw.broker.vhost(state.vhost).queues
        held = [q for q in (queues.get(name) for name in [state.queue, *self._shared_queues(state)])
                if q is not None and hasattr(q, "cmq")]
        for msg_id in list(state.pid_of_msg):
            if not any(q.cmq.get(msg_id) is not None for q in held):
                state.forget_msg(msg_id)
        # And completed QoS 2 messages kept until their ack, whose ack was durable first.
        released = set(state.released.values())
        for msg_id in list(state.released_of_msg):
            if msg_id not in released and not any(q.cmq.get(msg_id) is not None for q in held):
                del state.released_of_msg[msg_id]

    def _shared_queues(self, state: SessionState) -> list[str]:
        from gateway.mqtt.session import shared_queue_in, split_shared

        queues = self.gw.broker.vhost(state.vhost).queues
        return [shared_queue_in(queues, *parts)[0] for parts in map(split_shared, state.shared) if parts is not None]

    def shared_held(self, vhost: str, shared: str, but: str) -> bool:
        """Whether a session other than client ``but``'s holds the shared subscription
        ``shared``: one in memory (live, or kept since it left), or a persistent one in the store
        (not yet resumed since a restart). Scans the store: only when a subscription ends."""
        for (v, client_id), state in self.sessions.items():
            if v == vhost and client_id != but and shared in state.shared:
                return True
        for _key, raw in self.gw.broker.store.items(key_prefix("ms", vhost)):
            state = SessionState.from_json(raw)
            if state.client_id != but and (vhost, state.client_id) not in self.sessions and shared in state.shared:
                return True
        return False

    def consumed_elsewhere(self, q: Any) -> bool:
        """Sessions on other gateways consume ``q`` (a shared store): a shared subscription's
        queue stays for them."""
        return self.cluster is not None and bool(self.cluster.consumed_elsewhere(q))

    def publish_will(self, state: SessionState, user: str, peer: str, will: Will) -> None:
        """A delayed will falls due (MQ5): published as its client would have, through a
        broker session of its own, unless the client came back meanwhile."""
        state.will_timer = None
        if state.live is not None:
            return
        from pamqp import commands as C

        from gateway.broker import Session
        from gateway.protocol import events as ev

        broker = self.gw.broker
        session = Session(broker, _Silent(), state.vhost, user, peer, lambda: None)
        session.protocol = "mqtt"
        broker.begin_batch()
        try:
            if session.check_access:
                session.authorize("write", "exchange", EXCHANGE)
            if will.retain:
                self.retained.put(state.vhost, will.topic, will.qos, will.payload)
            session.on_event(ev.ChannelOpen(1))
            session.publish_now(session.channels[1], C.Basic.Publish(
                exchange=EXCHANGE, routing_key=topic_to_routing_key(will.topic)),
                message_properties(will.qos, will.retain, state.client_id, will.properties), will.payload)
        except CMQError as e:
            log.info("delayed will of %s refused: %s", state.client_id, e)
        finally:
            session.on_connection_lost()
            broker.end_batch()

    def forget(self, state: SessionState) -> None:
        self.sessions.pop((state.vhost, state.client_id), None)
        self.gw.broker.unpersist(session_key(state.vhost, state.client_id))


class _Silent:
    """The wire of a session that only publishes a will: nothing is answered to anyone."""

    client_properties: dict[str, Any] = {}

    def __getattr__(self, name: str) -> Any:
        return lambda *args, **kwargs: None
