"""Channel lifecycle, content assembly and the faults RabbitMQ closes the connection for
(SPEC M16, connection-level codes), each with the exact code and class/method IDs."""

from __future__ import annotations

import struct

import pytest
from amqp_pipe import PROTOCOL_HEADER, Pipe, content_frames, method_frame
from pamqp import commands as C
from pamqp import frame

from gateway.protocol import (
    ChannelClose,
    ChannelCloseOk,
    ChannelFlow,
    ChannelOpen,
    ConnectionCloseOk,
    Content,
    Method,
    Properties,
    ProtocolError,
    ServerConnection,
)

PUBLISH = method_frame(1, C.Basic.Publish(exchange="ex", routing_key="rk"))


def _open(channels: tuple[int, ...] = (1,), **kw: int) -> Pipe:
    pipe = Pipe(ServerConnection({}, heartbeat=0, **kw))
    pipe.handshake(frame_max=kw.get("frame_max", 131072), channel_max=kw.get("channel_max", 2047))
    for ch in channels:
        pipe.open_channel(ch)
    return pipe


def _closed_with(pipe: Pipe, events: list, code: int, class_id: int, method_id: int, channel: int = 0) -> str:
    """The last event is the ProtocolError and the server queued the matching close."""
    assert isinstance(events[-1], ProtocolError)
    err = events[-1]
    assert (err.reply_code, err.class_id, err.method_id, err.channel) == (code, class_id, method_id, channel)
    closes = [f for ch, f in pipe.read() if isinstance(f, C.Connection.Close)]
    assert len(closes) == 1
    close = closes[0]
    assert (close.reply_code, close.reply_text, close.class_id, close.method_id) == (
        code, err.reply_text, class_id, method_id)
    return close.reply_text


def _frame(ftype: int, channel: int, payload: bytes, end: int = 0xCE) -> bytes:
    return struct.pack(">BHI", ftype, channel, len(payload)) + payload + bytes((end,))


def test_channel_open_close_by_client() -> None:
    pipe = _open(())
    assert pipe.send(1, C.Channel.Open()) == [ChannelOpen(1)]
    assert [type(f) for _, f in pipe.read()] == [C.Channel.OpenOk]
    events = pipe.send(1, C.Channel.Close(reply_code=200, reply_text="bye", class_id=0, method_id=0))
    assert events == [ChannelClose(1, 200, "bye", 0, 0)]
    assert [(ch, type(f)) for ch, f in pipe.read()] == [(1, C.Channel.CloseOk)]
    assert pipe.send(1, C.Channel.Open()) == [ChannelOpen(1)]  # the number can be reused


def test_channel_closed_by_server_ignores_all_but_close_ok() -> None:
    """After we send channel.close only close / close-ok count on that channel (even a
    half-sent content is dropped)."""
    pipe = _open()
    pipe.feed(PUBLISH)
    pipe.server.close_channel(1, 404, "NOT_FOUND - no exchange 'ex' in vhost '/'", 60, 40)
    ((ch, close),) = pipe.read()
    assert (ch, close.reply_code, close.class_id, close.method_id) == (1, 404, 60, 40)
    events = pipe.feed(content_frames(1, b"late body") + method_frame(1, C.Basic.Qos(prefetch_count=1)))
    assert events == []
    pipe.server.send_method(1, C.Basic.Qos())  # dropped: the channel is closing
    assert pipe.read() == []
    pipe.send(1, C.Channel.Close(reply_code=200, reply_text="", class_id=0, method_id=0))
    assert [type(f) for _, f in pipe.read()] == [C.Channel.CloseOk]
    assert pipe.send(1, C.Channel.CloseOk()) == [ChannelCloseOk(1)]
    assert pipe.send(1, C.Channel.Open()) == [ChannelOpen(1)]


def test_channel_flow_is_answered() -> None:
    pipe = _open()
    assert pipe.send(1, C.Channel.Flow(active=True)) == [ChannelFlow(1, True)]
    ((_, ok),) = pipe.read()
    assert isinstance(ok, C.Channel.FlowOk) and ok.active is True


def test_M16_channel_flow_active_false_is_540_as_rabbitmq() -> None:
    """M16: RabbitMQ 3.x (checked against 3.10.8) closes the connection with 540
    NOT_IMPLEMENTED "active=false" (class 20, method 20) and sends no flow-ok."""
    pipe = _open()
    events = pipe.send(1, C.Channel.Flow(active=False))
    assert _closed_with(pipe, events, 540, 20, 20) == "NOT_IMPLEMENTED - active=false"


def test_other_methods_come_out_as_method_events() -> None:
    pipe = _open()
    (event,) = pipe.send(1, C.Queue.Declare(queue="q", durable=True, arguments={"x-max-length": 10}))
    assert isinstance(event, Method) and event.channel == 1
    assert (event.method.queue, event.method.durable, event.method.arguments) == ("q", True, {"x-max-length": 10})


def test_auto_replies_from_the_broker_are_not_sent_twice() -> None:
    pipe = _open()
    pipe.server.send_method(1, C.Channel.OpenOk())
    pipe.server.send_method(1, C.Channel.CloseOk())
    assert pipe.read() == []


@pytest.mark.parametrize("body", [b"", b"x", b"y" * 4088, b"z" * 10000])
def test_publish_content_assembled(body: bytes) -> None:
    pipe = _open(frame_max=4096)
    props = C.Basic.Properties(content_type="text/plain", delivery_mode=2, headers={"k": "v"})
    events = pipe.feed(PUBLISH + content_frames(1, body, props, frame_max=4096))
    assert len(events) == 1
    content = events[0]
    assert isinstance(content, Content)
    assert (content.channel, content.method.exchange, content.method.routing_key) == (1, "ex", "rk")
    assert content.body == body
    assert content.properties == Properties(props.marshal())
    assert (content.properties.content_type, content.properties.delivery_mode) == ("text/plain", 2)


def test_content_and_frames_one_byte_at_a_time_and_with_trailing_bytes() -> None:
    """Every decoder gets the whole input, one byte at a time, and bytes of the next frame."""
    data = (PUBLISH + content_frames(1, b"a" * 5000, C.Basic.Properties(message_id="m"), frame_max=4096)
            + method_frame(1, C.Basic.Ack(delivery_tag=7)))
    whole = _open(frame_max=4096).feed(data)
    pipe = _open(frame_max=4096)
    split = []
    for i in range(len(data)):
        split += pipe.feed(data[i:i + 1])
    trailing = _open(frame_max=4096)
    with_tail = trailing.feed(data + method_frame(1, C.Basic.Qos(prefetch_count=3))[:5])
    for events in (whole, split, with_tail):
        assert [type(e) for e in events] == [Content, Method]
        assert events[0].body == b"a" * 5000 and events[0].properties.message_id == "m"
        assert events[1].method.delivery_tag == 7
    assert [type(e) for e in trailing.feed(method_frame(1, C.Basic.Qos(prefetch_count=3))[5:])] == [Method]


@pytest.mark.parametrize("body", [b"", b"x" * 16, b"y" * 1000])
def test_one_frame_publish_fast_path_equals_frame_by_frame(body: bytes) -> None:
    """A publish whose three frames are all buffered takes the one-pass path; split at every
    byte it goes frame by frame; both give the same events, for several in a row, and a
    malformed header or a body on another channel still fails exactly as frame by frame."""
    props = C.Basic.Properties(content_type="text/plain", headers={"k": 1})
    one = PUBLISH + content_frames(1, body, props)
    data = one * 3 + method_frame(1, C.Basic.Ack(delivery_tag=7))
    whole = _open().feed(data)
    pipe = _open()
    split = []
    for i in range(len(data)):
        split += pipe.feed(data[i:i + 1])
    assert [type(e) for e in whole] == [Content, Content, Content, Method]
    for a, b in zip(whole, split, strict=True):
        assert type(a) is type(b)
        if isinstance(a, Content):
            assert (a.channel, a.method.exchange, a.method.routing_key, a.properties, a.body) == (
                b.channel, b.method.exchange, b.method.routing_key, b.properties, b.body)
    # The fast path declines, and the assembler reports, a header for another class.
    bad_header = _frame(2, 1, struct.pack(">HHQ", 50, 0, 1) + b"\x00\x00") + _frame(3, 1, b"x")
    events = _open().feed(PUBLISH + bad_header)
    _closed_with_any = events[-1]
    assert isinstance(_closed_with_any, ProtocolError) and _closed_with_any.reply_code == 505


def test_basic_ack_fast_path_equals_frame_by_frame() -> None:
    """basic.ack frames read whole take the short path; the events equal those of the same
    bytes fed one at a time, and an ack in the middle of a content is still 505."""
    data = b"".join(method_frame(1, C.Basic.Ack(delivery_tag=t, multiple=t % 2 == 0)) for t in (1, 2, 2**62))
    whole = _open().feed(data)
    pipe = _open()
    split = []
    for i in range(len(data)):
        split += pipe.feed(data[i:i + 1])
    for events in (whole, split):
        assert [(type(e), e.channel, e.method.delivery_tag, e.method.multiple) for e in events] == [
            (Method, 1, 1, False), (Method, 1, 2, True), (Method, 1, 2**62, True)]
    events = _open().feed(PUBLISH + method_frame(1, C.Basic.Ack(delivery_tag=1)))
    assert isinstance(events[-1], ProtocolError) and events[-1].reply_code == 505
    unopened = _open().feed(method_frame(2, C.Basic.Ack(delivery_tag=1)))
    assert isinstance(unopened[-1], ProtocolError) and unopened[-1].reply_code == 504


def test_single_frame_body_is_not_copied_twice() -> None:
    pipe = _open()
    (content,) = pipe.feed(PUBLISH + content_frames(1, b"x" * 100))
    assert type(content.body) is bytes and len(content.body) == 100


# --------------------------------------------------------------------------- faults


def test_W3_frame_above_frame_max_is_501() -> None:
    """W3: a frame above the negotiated frame_max is 501 FRAME_ERROR (RabbitMQ lets the
    payload itself reach frame_max, its 8-octet fudge)."""
    pipe = _open(frame_max=4096)
    assert pipe.feed(PUBLISH) == []
    events = pipe.feed(_frame(2, 1, b"\x00" * 4097))
    text = _closed_with(pipe, events, 501, 0, 0, channel=1)
    assert text == ("FRAME_ERROR - type 2, frame_too_large: payload of 4097 octets exceeds the negotiated "
                    "frame_max 4096")
    assert pipe.server.closed  # framing is lost: no wait for close-ok


def test_W3_frame_of_exactly_frame_max_payload_is_accepted() -> None:
    pipe = _open(frame_max=4096)
    events = pipe.feed(PUBLISH + _frame(2, 1, b"\x00\x3c\x00\x00" + (4096).to_bytes(8, "big") + b"\x00\x00")
                       + _frame(3, 1, b"x" * 4096))
    assert [type(e) for e in events] == [Content]


def test_bad_frame_end_octet_is_501() -> None:
    pipe = _open()
    events = pipe.feed(_frame(1, 1, frame.marshal(C.Basic.Qos(), 1)[7:-1], end=0xCD))
    text = _closed_with(pipe, events, 501, 0, 0, channel=1)
    assert text.startswith("FRAME_ERROR - type 1, all octets = ") and text.endswith("invalid_frame_end_marker 205")
    assert pipe.server.closed


def test_unknown_frame_type_is_501() -> None:
    pipe = _open()
    events = pipe.feed(_frame(7, 1, b"abc"))
    assert _closed_with(pipe, events, 501, 0, 0, channel=1) == "FRAME_ERROR - type 7, all octets = b'abc': unknown_frame"


def test_unknown_class_or_method_is_540_with_its_ids() -> None:
    """RabbitMQ's reader dies on an unknown method ID; we close with 540 naming the IDs."""
    pipe = _open()
    events = pipe.feed(_frame(1, 1, b"\x00\x3c\x00\x63"))
    assert _closed_with(pipe, events, 540, 60, 99, channel=1) == "NOT_IMPLEMENTED - unknown method class 60 method 99"


def test_malformed_method_arguments_are_501_cannot_decode_as_rabbitmq() -> None:
    """RabbitMQ's decode_method_fields fails with frame_error "cannot decode", naming the method."""
    pipe = _open()
    qos = frame.marshal(C.Basic.Qos(prefetch_count=1), 1)[7:-1]
    events = pipe.feed(_frame(1, 1, qos[:-2]))
    assert _closed_with(pipe, events, 501, 60, 10, channel=1).startswith("FRAME_ERROR - cannot decode ")


def test_method_frame_too_short_for_its_ids_is_501() -> None:
    pipe = _open()
    events = pipe.feed(_frame(1, 1, b"\x00\x3c"))
    _closed_with(pipe, events, 501, 0, 0, channel=1)


def test_method_on_a_channel_never_opened_is_504() -> None:
    pipe = _open()
    events = pipe.send(2, C.Basic.Qos(prefetch_count=1))
    assert _closed_with(pipe, events, 504, 60, 10, channel=2) == "CHANNEL_ERROR - expected 'channel.open'"


def test_second_channel_open_is_504() -> None:
    pipe = _open()
    events = pipe.send(1, C.Channel.Open())
    assert _closed_with(pipe, events, 504, 20, 10, channel=1) == "CHANNEL_ERROR - second 'channel.open' seen"


def test_content_on_a_channel_never_opened_is_505() -> None:
    pipe = _open()
    events = pipe.feed(content_frames(3, b"x"))
    _closed_with(pipe, events, 505, 0, 0, channel=3)


def test_content_header_without_publish_is_505() -> None:
    pipe = _open()
    events = pipe.feed(content_frames(1, b"x"))
    assert (_closed_with(pipe, events, 505, 0, 0, channel=1)
            == "UNEXPECTED_FRAME - expected method frame, got content header frame instead")


def test_body_before_header_is_505_against_basic_publish() -> None:
    pipe = _open()
    events = pipe.feed(PUBLISH + _frame(3, 1, b"x"))
    assert (_closed_with(pipe, events, 505, 60, 40, channel=1)
            == "UNEXPECTED_FRAME - expected content header, got content body frame instead")


def test_method_while_content_is_expected_is_505() -> None:
    pipe = _open()
    events = pipe.feed(PUBLISH + method_frame(1, C.Basic.Qos()))
    assert (_closed_with(pipe, events, 505, 60, 40, channel=1)
            == "UNEXPECTED_FRAME - expected content header, got method frame instead")


def test_method_while_body_is_expected_is_505() -> None:
    pipe = _open()
    events = pipe.feed(PUBLISH + content_frames(1, b"abc")[:-11] + method_frame(1, C.Basic.Qos()))
    assert (_closed_with(pipe, events, 505, 60, 40, channel=1)
            == "UNEXPECTED_FRAME - expected content body, got method frame instead")


def test_body_larger_than_header_says_is_505() -> None:
    pipe = _open()
    header = content_frames(1, b"abc")[:-11]
    events = pipe.feed(PUBLISH + header + _frame(3, 1, b"abcd"))
    _closed_with(pipe, events, 505, 60, 40, channel=1)


def test_content_header_for_another_class_is_505() -> None:
    pipe = _open()
    events = pipe.feed(PUBLISH + _frame(2, 1, b"\x00\x32\x00\x00" + (3).to_bytes(8, "big") + b"\x00\x00"))
    assert (_closed_with(pipe, events, 505, 60, 40, channel=1)
            == "UNEXPECTED_FRAME - expected content header for class 60, got one for class 50 instead")


def test_malformed_properties_are_501() -> None:
    pipe = _open()
    events = pipe.feed(PUBLISH + _frame(2, 1, b"\x00\x3c\x00\x00" + (3).to_bytes(8, "big") + b"\x80\x00\x09"))
    assert _closed_with(pipe, events, 501, 60, 40, channel=1).startswith("FRAME_ERROR - unable to parse")


def test_heartbeat_on_a_channel_is_505() -> None:
    pipe = _open()
    events = pipe.feed(_frame(8, 1, b""))
    _closed_with(pipe, events, 505, 0, 0, channel=1)


def test_content_on_channel_zero_is_505() -> None:
    pipe = _open()
    events = pipe.feed(content_frames(0, b"x"))
    _closed_with(pipe, events, 505, 0, 0, channel=0)


def test_channel_frame_before_connection_open_is_505() -> None:
    pipe = Pipe()
    pipe.feed(PROTOCOL_HEADER)
    pipe.read()
    events = pipe.send(1, C.Channel.Open())
    _closed_with(pipe, events, 505, 0, 0, channel=1)


def test_channel_method_on_channel_zero_is_504() -> None:
    pipe = _open()
    events = pipe.send(0, C.Basic.Qos())
    assert (_closed_with(pipe, events, 504, 60, 10)
            == "CHANNEL_ERROR - unexpected method in connection state running")


def test_too_many_channels_is_530() -> None:
    pipe = _open((1, 2), channel_max=2)
    events = pipe.send(3, C.Channel.Open())
    assert (_closed_with(pipe, events, 530, 20, 10, channel=3)
            == "NOT_ALLOWED - number of channels opened (2) has reached the negotiated channel_max (2)")


def test_channel_number_above_channel_max_is_accepted_as_rabbitmq_does() -> None:
    """RabbitMQ counts open channels against channel_max; it does not refuse high numbers."""
    pipe = _open((), channel_max=2)
    assert pipe.send(500, C.Channel.Open()) == [ChannelOpen(500)]


def test_after_a_protocol_error_only_close_ok_counts() -> None:
    pipe = _open()
    events = pipe.send(2, C.Basic.Qos())
    _closed_with(pipe, events, 504, 60, 10, channel=2)
    assert pipe.send(1, C.Basic.Qos()) == []
    assert pipe.send(0, C.Connection.CloseOk()) == [ConnectionCloseOk()]
    assert pipe.server.closed


def test_oversized_message_closes_the_channel_406_and_drops_the_body() -> None:
    pipe = _open(max_message_size=10)
    events = pipe.feed(PUBLISH + content_frames(1, b"x" * 11))
    assert events == []
    ((ch, close),) = pipe.read()
    assert (ch, close.reply_code, close.class_id, close.method_id) == (1, 406, 60, 40)
    assert close.reply_text == "PRECONDITION_FAILED - message size 11 is larger than configured max size 10"


def test_local_protocol_errors_are_raised_to_our_own_code() -> None:
    """Our own misuse (not the peer's) raises LocalProtocolError and changes nothing."""
    from gateway.protocol import LocalProtocolError
    pipe = _open()
    with pytest.raises(LocalProtocolError):
        pipe.server.send_tune()
    with pytest.raises(LocalProtocolError):
        pipe.server.send_content(0, C.Basic.Deliver(), None, b"x")
    with pytest.raises(LocalProtocolError):
        pipe.server.send_method(0, C.Basic.Qos())
    assert pipe.read() == []
    assert pipe.server.is_open(1)


def test_sends_to_a_channel_the_client_closed_are_dropped() -> None:
    """The broker may race with the client's channel.close: such sends are dropped."""
    pipe = _open()
    pipe.send(1, C.Channel.Close(reply_code=200, reply_text="", class_id=0, method_id=0))
    pipe.read()
    pipe.server.send_deliver(1, "ctag", 1, False, "", "q", b"\x00\x00", b"body")
    pipe.server.send_ack(1, 1)
    pipe.server.send_method(1, C.Basic.CancelOk(consumer_tag="ctag"))
    assert pipe.read() == []


def test_send_content_and_deliver_reach_a_pamqp_client() -> None:
    pipe = _open(frame_max=4096)
    props = Properties.build(content_type="text/plain", headers={"x-cmq-receive-count": 2})
    pipe.server.send_deliver(1, "ctag", 9, True, "ex", "rk", props.raw, b"b" * 5000)
    pipe.server.send_content(1, C.Basic.Return(reply_code=312, reply_text="NO_ROUTE", exchange="ex",
                                               routing_key="rk"), props, b"r")
    frames = pipe.read()
    assert [type(f).__name__ for _, f in frames] == ["Deliver", "ContentHeader", "ContentBody", "ContentBody",
                                                     "Return", "ContentHeader", "ContentBody"]
    deliver, head = frames[0][1], frames[1][1]
    assert (deliver.consumer_tag, deliver.delivery_tag, deliver.redelivered) == ("ctag", 9, True)
    assert head.body_size == 5000 and head.properties.headers == {"x-cmq-receive-count": 2}
    assert frames[2][1].value + frames[3][1].value == b"b" * 5000


def test_a_long_stream_in_odd_chunks_compacts_and_loses_nothing() -> None:
    """Frames straddling reads for well over the compaction threshold (64 KiB)."""
    pipe = _open(frame_max=4096)
    data = b"".join(PUBLISH + content_frames(1, bytes([i]) * 1000 + str(i).encode(), frame_max=4096)
                    for i in range(200))
    events = []
    for pos in range(0, len(data), 777):
        events += pipe.feed(data[pos:pos + 777])
    assert [e.body for e in events] == [bytes([i]) * 1000 + str(i).encode() for i in range(200)]
