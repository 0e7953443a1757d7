"""The hand-encoded hot frames of the load generator, byte for byte against pamqp."""

from __future__ import annotations

import pytest
from pamqp import body, commands, frame, header

from gateway.perf.frames import (
    HEARTBEAT,
    basic_ack,
    content_header,
    encode_properties,
    parse_deliver,
    parse_publisher_ack,
    publish_method,
    publish_template,
)
from gateway.perf.stats import ConfirmTracker, LatencyHistogram, bucket_index, bucket_value


@pytest.mark.parametrize(
    ("channel", "exchange", "key", "mandatory"),
    [(1, "", "q", False), (7, "perf-x", "g3.a.b", True), (2047, "perf:x_1.y-z", "é" * 100, False)],
)
def test_publish_method_matches_pamqp(channel: int, exchange: str, key: str, mandatory: bool) -> None:
    expected = frame.marshal(
        commands.Basic.Publish(exchange=exchange, routing_key=key, mandatory=mandatory), channel
    )
    assert publish_method(channel, exchange, key, mandatory) == expected


@pytest.mark.parametrize(
    ("delivery_mode", "headers"),
    [(1, None), (2, None), (2, {"x-cmq-tags": ["tag1", "tag2", "tag3", "tag4"]})],
)
def test_content_header_matches_pamqp(delivery_mode: int, headers: dict[str, object] | None) -> None:
    props = commands.Basic.Properties(delivery_mode=delivery_mode, headers=headers)  # type: ignore[arg-type]
    expected = frame.marshal(header.ContentHeader(0, 1024, props), 3)
    assert content_header(3, 1024, encode_properties(delivery_mode, headers)) == expected


@pytest.mark.parametrize(("tag", "multiple"), [(1, False), (5, True), (2**63 - 1, True)])
def test_basic_ack_matches_pamqp(tag: int, multiple: bool) -> None:
    assert basic_ack(9, tag, multiple) == frame.marshal(commands.Basic.Ack(tag, multiple), 9)


def test_heartbeat_matches_pamqp() -> None:
    from pamqp.heartbeat import Heartbeat

    assert frame.marshal(Heartbeat(), 0) == HEARTBEAT


@pytest.mark.parametrize(("size", "frame_max"), [(16, 131072), (1024, 131072), (300, 100), (92, 100)])
def test_publish_template_is_publish_header_and_body_frames(size: int, frame_max: int) -> None:
    ts = 0x0102030405060708
    tpl = publish_template(1, "ex", "rk", size, encode_properties(2), frame_max)
    payload = ts.to_bytes(8, "big") + bytes(size - 8)
    expected = frame.marshal(commands.Basic.Publish(exchange="ex", routing_key="rk"), 1)
    expected += frame.marshal(header.ContentHeader(0, size, commands.Basic.Properties(delivery_mode=2)), 1)
    chunk = frame_max - 8
    for start in range(0, size, chunk):
        expected += frame.marshal(body.ContentBody(payload[start : start + chunk]), 1)
    assert tpl.render(ts) == expected


def test_publish_template_refuses_a_body_without_room_for_the_timestamp() -> None:
    with pytest.raises(ValueError, match="at least 8"):
        publish_template(1, "", "q", 7, encode_properties(1), 131072)


def test_parse_deliver_reads_what_pamqp_wrote() -> None:
    raw = frame.marshal(commands.Basic.Deliver("ctag-é", 2**40 + 3, True, "perf-x", "g1.a.b"), 5)
    # The payload starts after the 7-byte frame head.
    assert parse_deliver(raw, 7) == ("ctag-é", 2**40 + 3, True, "perf-x", "g1.a.b")
    raw = frame.marshal(commands.Basic.Deliver("", 1, False, "", "q"), 1)
    assert parse_deliver(memoryview(raw)[7:]) == ("", 1, False, "", "q")


@pytest.mark.parametrize("method", [commands.Basic.Ack(77, True), commands.Basic.Nack(12, False, True)])
def test_parse_publisher_ack_reads_what_pamqp_wrote(method: commands.Basic.Ack | commands.Basic.Nack) -> None:
    raw = frame.marshal(method, 1)
    assert parse_publisher_ack(raw, 7) == (method.delivery_tag, method.multiple)


def test_histogram_buckets_are_exact_below_128_and_within_1_6_percent_above() -> None:
    for v in range(128):
        assert bucket_value(bucket_index(v)) == v
    for v in (128, 1000, 12345, 10**6, 3 * 10**9):
        rep = bucket_value(bucket_index(v))
        assert abs(rep - v) / v <= 1 / 64


def test_histogram_percentiles_and_merge() -> None:
    h = LatencyHistogram()
    for us in range(1, 101):  # 1..100 µs
        h.record_ns(us * 1000)
    assert (h.percentile(50), h.percentile(99), h.max_us, h.count) == (50.0, 99.0, 100, 100)
    main = LatencyHistogram()
    base: dict[int, int] = {}
    main.merge_cumulative(h.take_delta(), base)
    h.record_ns(7000)
    main.merge_cumulative(h.take_delta(), base)  # cumulative counts: bucket 7 now holds 2
    assert (main.count, main.counts[7]) == (101, 2)
    assert h.take_delta() == {}


def test_confirm_tracker_single_multiple_and_out_of_order() -> None:
    t = ConfirmTracker()
    assert t.confirm(2, False, True) == 1  # above the low mark: held aside
    assert t.low == 1
    assert t.confirm(1, False, True) == 1  # closes the gap: low jumps past 2
    assert t.low == 3
    assert t.confirm(5, False, False) == 1
    assert t.confirm(6, True, True) == 3  # 3, 4 and 6; 5 was already nacked
    assert (t.low, t.acked, t.nacked) == (7, 5, 1)
    assert t.confirm(4, False, True) == 0  # a duplicate settles nothing
