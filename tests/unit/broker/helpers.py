"""A pamqp-speaking fake client wired to a real ServerConnection and a broker Session."""

from __future__ import annotations

from typing import Any

from pamqp import body as B
from pamqp import commands as C
from pamqp import frame as F
from pamqp import header
from pamqp.base import Frame

from gateway.broker import Broker, Session
from gateway.protocol import events as ev
from gateway.protocol.connection import ServerConnection


class Client:
    def __init__(self, broker: Broker, vhost: str = "/") -> None:
        self.conn = ServerConnection({"capabilities": {}})
        self.flushes = 0
        self.conn.receive_data(b"AMQP\x00\x00\x09\x01")
        self._drain_events()
        self._raw(0, C.Connection.StartOk(client_properties={"capabilities": {"consumer_cancel_notify": True}},
                                          mechanism="PLAIN", response="\x00guest\x00guest"))
        for e in self._drain_events():
            if isinstance(e, ev.StartOk):
                self.conn.send_tune()
        self._raw(0, C.Connection.TuneOk(channel_max=2047, frame_max=131072, heartbeat=0))
        self._raw(0, C.Connection.Open(virtual_host=vhost))
        for e in self._drain_events():
            if isinstance(e, ev.ConnectionOpen):
                self.conn.send_open_ok()
        self.session = Session(broker, self.conn, vhost, "guest", "127.0.0.1:1", self._flush)
        self.read()

    def _flush(self) -> None:
        self.flushes += 1

    def _raw(self, channel: int, frame: Frame) -> None:
        self.conn.receive_data(F.marshal(frame, channel))

    def _drain_events(self) -> list[Any]:
        out = []
        while (e := self.conn.next_event()) is not None:
            out.append(e)
        return out

    def send(self, channel: int, *frames: Frame) -> None:
        for fr in frames:
            self._raw(channel, fr)
        for e in self._drain_events():
            if isinstance(e, ev.ChannelOpen | ev.ChannelClose | ev.ChannelCloseOk | ev.ChannelFlow
                          | ev.Method | ev.Content):
                self.session.on_event(e)

    def publish(self, channel: int, exchange: str, key: str, body: bytes, mandatory: bool = False,
                **props: Any) -> None:
        self.send(channel, C.Basic.Publish(exchange=exchange, routing_key=key, mandatory=mandatory),
                  header.ContentHeader(0, len(body), C.Basic.Properties(**props)), B.ContentBody(body))

    def read(self) -> list[tuple[int, Any]]:
        data = self.conn.data_to_send()
        out = []
        while data:
            used, ch, fr = F.unmarshal(data)
            data = data[used:]
            out.append((ch, fr))
        return out

    def open_channel(self, n: int = 1) -> None:
        self.send(n, C.Channel.Open())
        self.read()

    def methods(self) -> list[Any]:
        return [fr for _, fr in self.read() if not isinstance(fr, header.ContentHeader | B.ContentBody)]


def declare(c: Client, *frames: Frame, channel: int = 1) -> list[Any]:
    """Send the frames and return the methods they were answered with."""
    c.send(channel, *frames)
    return c.methods()


def deliveries(frames: list[tuple[int, Any]]) -> list[tuple[Any, Any, bytes]]:
    """(deliver or get-ok, properties, body) of each message in a list of read frames."""
    out = []
    for i, (_, fr) in enumerate(frames):
        if isinstance(fr, C.Basic.Deliver | C.Basic.GetOk | C.Basic.Return):
            head = frames[i + 1][1]
            body = frames[i + 2][1].value if head.body_size else b""
            out.append((fr, head.properties, body))
    return out


def small_and_big_behind_fanout(broker: Broker) -> Client:
    """A client with fanout ``fan`` bound to queues ``small`` (MaxMsgSize 2048, L6) and ``big``
    (the default 65,536)."""
    c = Client(broker)
    c.open_channel()
    declare(c, C.Exchange.Declare(exchange="fan", exchange_type="fanout"),
            C.Queue.Declare(queue="small", arguments={"x-cmq-max-msg-size": 2048}), C.Queue.Declare(queue="big"),
            C.Queue.Bind(queue="small", exchange="fan"), C.Queue.Bind(queue="big", exchange="fan"))
    return c
