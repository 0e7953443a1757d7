"""Properties: raw bytes kept, lazy fields, encode_with (M11) and typed field tables."""

from __future__ import annotations

import datetime
import decimal
import struct
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pamqp import commands as C
from pamqp import decode as pdecode

from gateway.protocol import Properties, Typed
from gateway.protocol.fieldtable import decode_table, encode_table
from gateway.protocol.properties import FIELDS

short = st.text(max_size=40).filter(lambda s: len(s.encode("utf-8")) <= 255)
header_values = st.one_of(st.text(max_size=20), st.booleans(), st.integers(-2**63, 2**63 - 1),
                          st.floats(allow_nan=False, width=64), st.binary(max_size=10))
# What pamqp (the reference encoder) can encode without changing: no bytes, no 64-bit floats.
pamqp_header_values = st.one_of(st.text(max_size=20), st.booleans(), st.integers(-2**63, 2**63 - 1))


def _props(headers: st.SearchStrategy) -> st.SearchStrategy:
    return st.fixed_dictionaries({}, optional={
        "content_type": short, "content_encoding": short, "delivery_mode": st.sampled_from([1, 2]),
        "priority": st.integers(0, 255), "correlation_id": short, "reply_to": short, "expiration": short,
        "message_id": short, "timestamp": st.integers(0, 2**32), "type": short, "user_id": short,
        "app_id": short, "headers": st.dictionaries(short, headers, max_size=6),
    })


all_props = _props(header_values)

# Every RabbitMQ field-table type, hand-encoded: the bytes encode_with must keep exactly.
ALL_TYPES_TABLE = b"".join([
    b"\x01tt\x01", b"\x01bb\xff", b"\x01BB\xff", b"\x01ss\xff\xfe", b"\x01uu\xff\xfe",
    b"\x01II\xff\xff\xff\xfe", b"\x01ii\xff\xff\xff\xfe", b"\x01ll" + (5).to_bytes(8, "big"),
    b"\x01ff\x3f\x80\x00\x00", b"\x01dd\x3f\xf0\x00\x00\x00\x00\x00\x00", b"\x01DD\x02\x00\x00\x01\x3b",
    b"\x01SS\x00\x00\x00\x02hi", b"\x01xx\x00\x00\x00\x03\x00\xff\x01", b"\x01TT\x00\x00\x00\x00\x65\x00\x00\x00",
    b"\x01FF\x00\x00\x00\x07\x01kI\x00\x00\x00\x07", b"\x01AA\x00\x00\x00\x07b\x01I\x00\x00\x00\x02",
    b"\x01VV",
])


def _raw_with_headers(table_body: bytes, **others: object) -> bytes:
    base = Properties.build(**others).raw
    flags = int.from_bytes(base[:2], "big") | 0x2000
    # headers is the third property: after content_type / content_encoding, which these tests leave unset
    return flags.to_bytes(2, "big") + len(table_body).to_bytes(4, "big") + table_body + base[2:]


@settings(max_examples=100, deadline=None)
@given(_props(pamqp_header_values))
def test_fields_decode_as_pamqp_does(values: dict) -> None:
    pvalues = dict(values)
    if "type" in pvalues:
        pvalues["message_type"] = pvalues.pop("type")
    if "timestamp" in pvalues:
        pvalues["timestamp"] = datetime.datetime.fromtimestamp(pvalues["timestamp"], tz=datetime.UTC)
    raw = C.Basic.Properties(**pvalues).marshal()
    props = Properties(raw)
    assert props.raw == raw
    for name, _ in FIELDS:
        if name in ("headers", "cluster_id"):
            continue
        expected = values.get(name)
        if expected == "":  # pamqp omits empty strings
            expected = None
        assert getattr(props, name) == expected, name
    assert props.headers == values.get("headers")


@settings(max_examples=100, deadline=None)
@given(all_props)
def test_build_then_read_back(values: dict) -> None:
    props = Properties.build(**values)
    for name, _ in FIELDS:
        assert getattr(props, name) == values.get(name), name
    assert Properties(props.raw) == props


def test_encode_with_keeps_every_original_field_and_type_M11() -> None:
    """M11: the delivery adds message_id and headers; every original byte of every field and
    header entry (all 17 field-table types) is kept."""
    raw = _raw_with_headers(ALL_TYPES_TABLE, delivery_mode=2, priority=3, correlation_id="c", expiration="60000",
                            timestamp=1700000000, type="t", user_id="u", app_id="a", reply_to="r")
    props = Properties(raw)
    out = Properties(props.encode_with(message_id="msg-00ff", extra_headers={
        "x-cmq-msg-id": "msg-00ff", "x-cmq-enqueue-time": 1700000001, "x-cmq-receive-count": 2}))
    assert out.message_id == "msg-00ff"
    for name in ("delivery_mode", "priority", "correlation_id", "expiration", "timestamp", "type", "user_id",
                 "app_id", "reply_to"):
        assert getattr(out, name) == getattr(props, name), name
    start, end = out._spans[2]
    assert out.raw[start + 4:end] == ALL_TYPES_TABLE + (
        b"\x0cx-cmq-msg-idS\x00\x00\x00\x08msg-00ff"
        b"\x12x-cmq-enqueue-timel" + (1700000001).to_bytes(8, "big")
        + b"\x13x-cmq-receive-countl" + (2).to_bytes(8, "big"))
    # and pamqp, a client's decoder, reads the result
    _, table = pdecode.field_table(out.raw[start:end])
    assert table["x-cmq-receive-count"] == 2 and table["s"] == -2 and table["u"] == 65534


def test_encode_with_replaces_a_header_of_the_same_key_and_keeps_the_others() -> None:
    props = Properties.build(headers={"x-cmq-receive-count": 1, "keep": Typed("I", 7)})
    out = Properties(props.encode_with(extra_headers={"x-cmq-receive-count": 2}))
    start, end = out._spans[2]
    assert out.raw[start + 4:end] == b"\x04keepI\x00\x00\x00\x07\x13x-cmq-receive-countl" + (2).to_bytes(8, "big")


def test_encode_with_keeps_the_publishers_message_id_M11() -> None:
    """M11: message_id is the CMQ ID unless the publisher set one."""
    props = Properties.build(message_id="mine")
    assert Properties(props.encode_with(message_id="msg-1")).message_id == "mine"
    assert Properties(Properties().encode_with(message_id="msg-1")).message_id == "msg-1"


def test_encode_with_nothing_to_add_returns_the_same_bytes() -> None:
    props = Properties.build(content_type="text/plain")
    assert props.encode_with() is props.raw


def test_all_field_types_decode() -> None:
    table, end = decode_table(len(ALL_TYPES_TABLE).to_bytes(4, "big") + ALL_TYPES_TABLE)
    assert end == 4 + len(ALL_TYPES_TABLE)
    assert table == {
        "t": True, "b": -1, "B": 255, "s": -2, "u": 65534, "I": -2, "i": 4294967294, "l": 5, "f": 1.0,
        "d": 1.0, "D": decimal.Decimal("3.15"), "S": "hi", "x": b"\x00\xff\x01",
        "T": datetime.datetime.fromtimestamp(0x65000000, tz=datetime.UTC), "F": {"k": 7}, "A": [1, 2], "V": None,
    }


def test_typed_values_encode_with_the_chosen_type() -> None:
    table = {"t": Typed("t", True), "b": Typed("b", -1), "B": Typed("B", 255), "s": Typed("s", -2),
             "u": Typed("u", 65534), "I": Typed("I", -2), "i": Typed("i", 4294967294), "l": Typed("l", 5),
             "f": Typed("f", 1.0), "d": Typed("d", 1.0), "D": decimal.Decimal("3.15"), "S": "hi",
             "x": b"\x00\xff\x01", "T": datetime.datetime.fromtimestamp(0x65000000, tz=datetime.UTC),
             "F": {"k": Typed("I", 7)}, "A": [Typed("b", 1), Typed("I", 2)], "V": None}
    assert encode_table(table) == len(ALL_TYPES_TABLE).to_bytes(4, "big") + ALL_TYPES_TABLE


def test_x_death_as_rabbitmq_builds_it() -> None:
    """Dead-letter headers (x-death) built from Python values, read back by pamqp."""
    when = datetime.datetime(2024, 1, 2, 3, 4, 5, tzinfo=datetime.UTC)
    props = Properties.build(headers={"x-death": [{"count": 1, "reason": "rejected", "queue": "q",
                                                   "time": when, "exchange": "", "routing-keys": ["q"]}]},
                             delivery_mode=2)
    start, end = props._spans[2]
    _, table = pdecode.field_table(props.raw[start:end])
    assert table["x-death"][0] == {"count": 1, "reason": "rejected", "queue": "q", "time": when,
                                   "exchange": "", "routing-keys": ["q"]}


@pytest.mark.parametrize("raw", [
    b"", b"\x00", b"\x80\x00", b"\x80\x00\x05ab", b"\x20\x00\x00\x00\x00\x09\x00", b"\x00\x00\x00",
    b"\x00\x02", b"\x00\x01\x00\x02",
])
def test_malformed_property_lists_are_refused(raw: bytes) -> None:
    with pytest.raises(ValueError):
        Properties(raw)


@pytest.mark.parametrize("cut", range(1, 12))
def test_truncated_property_list_is_refused_at_every_cut(cut: int) -> None:
    raw = Properties.build(content_type="text/plain", delivery_mode=2).raw
    with pytest.raises(ValueError):
        Properties(raw[:-cut])


def _reference_encode_with(props: Properties, message_id: Any, extra_headers: Any) -> bytes:
    """The straightforward splice (field by field, generic table encoder) that the cached
    template of encode_with must reproduce byte for byte."""
    from gateway.protocol.fieldtable import encode_table_body, table_entries

    raw = props.raw
    spans = props._spans
    flags = props._flags
    set_id = message_id is not None and spans[8] is None
    if not set_id and not extra_headers:
        return raw
    parts = []
    for i in range(14):
        span = spans[i]
        if i == 2 and extra_headers:
            flags |= 0x8000 >> i
            added = encode_table_body(extra_headers)
            kept = b""
            if span is not None:
                drop = {k.encode() for k in extra_headers}
                kept = b"".join(raw[s:e] for key, s, e in table_entries(raw, span[0] + 4, span[1])
                                if key not in drop)
            parts.append(struct.pack(">I", len(kept) + len(added)) + kept + added)
        elif i == 8 and set_id:
            flags |= 0x8000 >> i
            data = message_id.encode()
            parts.append(bytes((len(data),)) + data)
        elif span is not None:
            parts.append(raw[span[0]:span[1]])
    return struct.pack(">H", flags) + b"".join(parts)


@pytest.mark.parametrize("props", [
    Properties(),
    Properties.build(delivery_mode=2),
    Properties.build(content_type="text/plain", headers={"a": 1, "x-cmq-receive-count": 7}, priority=3,
                     message_id="mine", timestamp=5, app_id="app"),
    Properties.build(headers={}, type="t", cluster_id="c"),
])
def test_M11_encode_with_template_matches_the_field_by_field_splice(props: Properties) -> None:
    """The template is cached per message: several deliveries with other IDs, receive counts
    and header sets (the cache is rebuilt when the keys change) each give the reference bytes."""
    calls = [
        ("msg-1", {"x-cmq-msg-id": "msg-1", "x-cmq-enqueue-time": 1_714_557_600, "x-cmq-receive-count": 1}),
        ("msg-2", {"x-cmq-msg-id": "msg-2", "x-cmq-enqueue-time": 1_714_557_601, "x-cmq-receive-count": 2}),
        (None, {"x-cmq-receive-count": 3, "x-other": 1.5, "x-flag": True, "x-none": None}),
        ("msg-\u00e9", None),
        ("msg-1", {"x-cmq-msg-id": "msg-1", "x-cmq-enqueue-time": -1, "x-cmq-receive-count": 2**40}),
    ]
    for message_id, extra in calls:
        assert props.encode_with(message_id=message_id, extra_headers=extra) == \
            _reference_encode_with(props, message_id, extra)


@pytest.mark.parametrize("props", [
    Properties(),
    Properties.build(delivery_mode=2),
    Properties.build(content_type="text/plain", headers={"a": 1, "x-cmq-receive-count": 7}, priority=3,
                     message_id="mine", timestamp=5, app_id="app"),
])
def test_M11_encode_delivery_is_encode_with_of_the_three_headers(props: Properties) -> None:
    for msg_id, enqueued, count in (("msg-1", 1_714_557_600, 1), ("msg-\u00e9" * 3, -5, 2**40), ("", 0, 0)):
        expected = props.encode_with(message_id=msg_id, extra_headers={
            "x-cmq-msg-id": msg_id, "x-cmq-enqueue-time": enqueued, "x-cmq-receive-count": count})
        assert props.encode_delivery(msg_id, enqueued, count) == expected
        # and the other way round, with the template cached by encode_delivery
        assert props.encode_with(message_id=msg_id, extra_headers={
            "x-cmq-msg-id": msg_id, "x-cmq-enqueue-time": enqueued, "x-cmq-receive-count": count}) == expected


def test_M11_messages_with_equal_properties_share_one_delivery_template(monkeypatch: pytest.MonkeyPatch) -> None:
    """The split of a property list is made once per distinct list, not once per message."""
    raw = Properties.build(delivery_mode=1, headers={"k": "v"}, app_id="shared-template-test").raw
    splits = []
    real = Properties._split

    def counting(self: Properties, keys: tuple[str, ...], set_id: bool) -> Any:
        splits.append(keys)
        return real(self, keys, set_id)

    monkeypatch.setattr(Properties, "_split", counting)
    first, second = Properties(raw), Properties(bytearray(raw))
    a = first.encode_delivery("msg-1", 7, 1)
    b = second.encode_delivery("msg-2", 8, 2)
    assert len(splits) == 1
    assert b == Properties(raw).encode_with(message_id="msg-2", extra_headers={
        "x-cmq-msg-id": "msg-2", "x-cmq-enqueue-time": 8, "x-cmq-receive-count": 2})
    assert a != b
