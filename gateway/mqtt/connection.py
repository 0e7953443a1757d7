"""The sans-IO MQTT server connection: bytes in, packets (events) out; packets in, bytes out.

It enforces what is the wire's business (SPEC MQ7): CONNECT first and only once, no packet
a client may not send, the packet size limit, keep-alive at 1.5 times the interval (MQ5).
Everything else (login, sessions, the broker) is the transport's and the session's.
"""

from __future__ import annotations

from dataclasses import dataclass

from gateway.mqtt import codec as P

__all__ = ["KeepAliveTimeout", "MQTTServerConnection", "ProtocolError"]

KEEP_ALIVE_TIMEOUT = 0x8D
# Packets only a server sends: a client that sends one breaks the protocol.
_SERVER_ONLY = (P.CONNACK, P.SUBACK, P.UNSUBACK, P.PINGRESP)
_PUBLISH, _ACK = P.Publish, P.Ack


@dataclass(frozen=True, slots=True)
class ProtocolError:
    """The client broke the protocol; the core has queued what closes the connection
    (a DISCONNECT with ``reason_code`` for MQTT 5, nothing for 3.1.1) and is closed."""

    reason_code: int
    text: str


@dataclass(frozen=True, slots=True)
class Pinged:
    """A PINGREQ, answered already (its PINGRESP is queued): nothing left to do."""


PINGED = Pinged()


@dataclass(frozen=True, slots=True)
class KeepAliveTimeout:
    """Nothing from the client for 1.5 times its keep-alive (MQTT-3.1.2-24); closed."""

    seconds: float


class MQTTServerConnection:
    def __init__(self, *, max_packet_size: int = 1 << 20, connect_timeout: float = 10.0,
                 preauth_bytes: int = 1 << 16) -> None:
        # SE5: before CONNACK a client may send at most ``preauth_bytes`` (its CONNECT and
        # what follows it): a bigger packet is refused as soon as its length is read.
        self.decoder = P.Decoder(min(max_packet_size, preauth_bytes), server=True)
        self.max_packet_size = max_packet_size
        self.connect_timeout = connect_timeout  # from accept, whatever is trickled meanwhile
        self.preauth_bytes = preauth_bytes
        self.preauth_received = 0  # bytes received before CONNACK
        self._accepted: float | None = None
        self.level = 0  # 4 or 5 once CONNECT was read
        self.connected = False  # CONNACK 0 sent
        self.closed = False
        self.keep_alive = 0
        self._out: list[bytes] = []
        self._last_rx: float | None = None
        self._got_connect = False

    # -- input -----------------------------------------------------------------------------

    def receive_data(self, data: bytes, now: float | None = None) -> None:
        if self.closed:
            return
        if not self.connected:
            self.preauth_received += len(data)
            if self.preauth_received > self.preauth_bytes:
                self._fail(P.PACKET_TOO_LARGE, f"more than {self.preauth_bytes} bytes before CONNACK")
                return
        self.decoder.feed(data)
        if now is not None:
            self._last_rx = now

    def next_event(self) -> object | None:
        if self.closed:
            return None
        try:
            packet = self.decoder.next_packet()
        except P.MalformedPacket as e:
            return self.malformed(e)
        if packet is None:
            return None
        cls = type(packet)
        # The two packets of every message (PUBLISH, and the acknowledgements a client may all
        # send) need none of the checks below once CONNECT was read.
        if (cls is _PUBLISH or cls is _ACK) and self._got_connect:
            return packet
        return self.vet(packet)

    # A transport's read loop may call decoder.next_packet itself once CONNECT was read and
    # while not closed (a call less a packet): then a MalformedPacket goes to malformed(), and
    # a packet other than a PUBLISH or an acknowledgement to vet(), as next_event does.

    def malformed(self, e: P.MalformedPacket) -> ProtocolError:
        return self._fail(e.reason_code, str(e))

    def vet(self, packet: P.Packet) -> object:
        """The wire's checks of a decoded packet (MQ7): the event it gives."""
        kind = packet.type
        if not self._got_connect:
            if kind != P.CONNECT:
                return self._fail(P.PROTOCOL_ERROR, "the first packet must be CONNECT")
            self._got_connect = True
            assert isinstance(packet, P.Connect)
            self.level = packet.level if packet.level in (4, 5) else 4
            self.keep_alive = packet.keep_alive
            return packet
        if kind == P.CONNECT:
            return self._fail(P.PROTOCOL_ERROR, "a second CONNECT")  # MQTT-3.1.0-2
        if kind in _SERVER_ONLY:
            return self._fail(P.PROTOCOL_ERROR, f"packet type {kind} is sent by servers only")
        if kind == P.AUTH:
            return self._fail(P.PROTOCOL_ERROR, "AUTH without an authentication method")
        if kind == P.PINGREQ:
            self.send(P.PingResp())
            return PINGED  # not self.next_event(): 10,000 PINGREQs in one read overflowed the stack
        return packet

    def _fail(self, reason_code: int, text: str) -> ProtocolError:
        if self.connected and self.level >= 5:
            self.send(P.Disconnect(reason_code, {"reason_string": text[:200]}))
        self.closed = True
        return ProtocolError(reason_code, text)

    # -- output ----------------------------------------------------------------------------

    def send(self, packet: P.Packet) -> None:
        if not self.closed:
            self._out.append(P.encode(packet, self.level or 4))

    def send_raw(self, data: bytes) -> None:
        if not self.closed:
            self._out.append(data)

    def accept(self, packet: P.ConnAck) -> None:
        """CONNACK; a reason code of 0x80 or more (3.1.1: non-zero) closes the connection."""
        self.send(packet)
        if (self.level >= 5 and packet.reason_code >= 0x80) or (self.level < 5 and packet.reason_code):
            self.closed = True
        else:
            self.connected = True
            self.decoder.max_packet_size = self.max_packet_size

    def close(self, reason_code: int = 0, text: str = "") -> None:
        """Server-initiated close: DISCONNECT with a reason for MQTT 5 (3.1.1 has none)."""
        if self.closed:
            return
        if self.connected and self.level >= 5:
            self.send(P.Disconnect(reason_code, {"reason_string": text[:200]} if text else {}))
        self.closed = True

    def data_to_send(self) -> bytes:
        # Emptied in place, not replaced: the session's hot paths append to this list directly.
        data = b"".join(self._out)
        self._out.clear()
        return data

    # -- time ------------------------------------------------------------------------------

    def reading_paused(self, now: float) -> None:
        """Not read from (a resource alarm holds it): its silence is ours, not a dead peer."""
        self._last_rx = now

    def tick(self, now: float) -> list[object]:
        if self.closed:
            return []
        if self._accepted is None:
            self._accepted = now
        if not self.connected:
            # SE5: CONNACK within connect_timeout of accept; trickled bytes do not extend it.
            if self.connect_timeout and now - self._accepted > self.connect_timeout:
                self.close(KEEP_ALIVE_TIMEOUT, "CONNECT not received in time")
                return [KeepAliveTimeout(self.connect_timeout)]
            return []
        if self._last_rx is None:
            self._last_rx = now
            return []
        limit = self.keep_alive * 1.5
        if limit and now - self._last_rx > limit:
            self.close(KEEP_ALIVE_TIMEOUT, "keep-alive timeout")
            return [KeepAliveTimeout(limit)]
        return []
