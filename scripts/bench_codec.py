"""µs per operation of the protocol core's hand-written hot paths against pamqp.

    .venv/bin/python scripts/bench_codec.py [--number N]

Measures: basic.publish decode (method only, and method + header + body through the whole
ServerConnection), basic.deliver encode (method + header + body), basic.ack decode/encode,
and Properties.encode_with (M11 headers). Numbers vary with the machine; compare the columns.
"""

from __future__ import annotations

import argparse
import timeit

from pamqp import body as pbody
from pamqp import commands as C
from pamqp import frame, header

from gateway.protocol import Properties, ServerConnection, codec

PROPS = C.Basic.Properties(content_type="application/json", delivery_mode=2, message_id="m-1",
                           headers={"x-cmq-tags": ["a", "b"], "trace": "abc"})
RAW_PROPS = PROPS.marshal()
BODY = b"x" * 256
PUBLISH = frame.marshal(C.Basic.Publish(exchange="orders", routing_key="order.created.eu"), 1)
MESSAGE = (PUBLISH + frame.marshal(header.ContentHeader(0, len(BODY), PROPS), 1)
           + frame.marshal(pbody.ContentBody(BODY), 1))
ACK = frame.marshal(C.Basic.Ack(delivery_tag=12345, multiple=False), 1)


def _open_connection() -> ServerConnection:
    conn = ServerConnection({}, heartbeat=0)
    conn.receive_data(b"AMQP\x00\x00\x09\x01")
    conn.next_event()
    conn.receive_data(frame.marshal(C.Connection.StartOk(mechanism="PLAIN", response="\0a\0b"), 0))
    conn.next_event()
    conn.send_tune()
    conn.receive_data(frame.marshal(C.Connection.TuneOk(channel_max=10, frame_max=131072, heartbeat=0), 0))
    conn.next_event()
    conn.receive_data(frame.marshal(C.Connection.Open(virtual_host="/"), 0))
    conn.next_event()
    conn.send_open_ok()
    conn.receive_data(frame.marshal(C.Channel.Open(), 1))
    conn.next_event()
    conn.data_to_send()
    return conn


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--number", type=int, default=20000)
    n = parser.parse_args().number
    conn = _open_connection()

    def ours_publish_method() -> None:
        codec.decode_method(PUBLISH, 7, len(PUBLISH) - 1)

    def pamqp_publish_method() -> None:
        frame.unmarshal(PUBLISH)

    def ours_publish_message() -> None:
        conn.receive_data(MESSAGE)
        conn.next_event()

    def pamqp_publish_message() -> None:
        data = MESSAGE
        while data:
            used, _, _ = frame.unmarshal(data)
            data = data[used:]

    def ours_deliver() -> None:
        conn.send_deliver(1, "ctag-1", 42, False, "orders", "order.created.eu", RAW_PROPS, BODY)
        conn.data_to_send()

    def pamqp_deliver() -> None:
        b"".join((frame.marshal(C.Basic.Deliver(consumer_tag="ctag-1", delivery_tag=42, redelivered=False,
                                                exchange="orders", routing_key="order.created.eu"), 1),
                  frame.marshal(header.ContentHeader(0, len(BODY), PROPS), 1),
                  frame.marshal(pbody.ContentBody(BODY), 1)))

    def ours_ack_decode() -> None:
        codec.decode_method(ACK, 7, len(ACK) - 1)

    def pamqp_ack_decode() -> None:
        frame.unmarshal(ACK)

    def ours_ack_encode() -> None:
        codec.encode_ack(1, 12345, False)

    def pamqp_ack_encode() -> None:
        frame.marshal(C.Basic.Ack(delivery_tag=12345, multiple=False), 1)

    props = Properties(RAW_PROPS)

    def ours_encode_with() -> None:
        props.encode_with(message_id="msg-00ff", extra_headers={
            "x-cmq-msg-id": "msg-00ff", "x-cmq-enqueue-time": 1700000000, "x-cmq-receive-count": 1})

    def pamqp_properties_roundtrip() -> None:
        p = C.Basic.Properties()
        p.unmarshal(int.from_bytes(RAW_PROPS[:2], "big"), RAW_PROPS[2:])
        p.headers = dict(p.headers or {}, **{"x-cmq-msg-id": "msg-00ff", "x-cmq-enqueue-time": 1700000000,
                                             "x-cmq-receive-count": 1})
        p.marshal()

    assert props.headers is not None
    rows = [
        ("basic.publish method decode", ours_publish_method, pamqp_publish_method),
        ("publish + header + body (256 B) in", ours_publish_message, pamqp_publish_message),
        ("basic.deliver + header + body out", ours_deliver, pamqp_deliver),
        ("basic.ack decode", ours_ack_decode, pamqp_ack_decode),
        ("basic.ack encode", ours_ack_encode, pamqp_ack_encode),
        ("delivery properties (M11 headers)", ours_encode_with, pamqp_properties_roundtrip),
    ]
    print(f"{'operation':40} {'hand-written µs':>16} {'pamqp µs':>10} {'speed-up':>9}")
    for name, ours, ref in rows:
        t_ours = min(timeit.repeat(ours, number=n, repeat=3)) / n * 1e6
        t_ref = min(timeit.repeat(ref, number=n, repeat=3)) / n * 1e6
        print(f"{name:40} {t_ours:16.2f} {t_ref:10.2f} {t_ref / t_ours:8.1f}x")


if __name__ == "__main__":
    main()
