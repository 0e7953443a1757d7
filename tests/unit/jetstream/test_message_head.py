"""A pulled record's head read in C (_wire.c's message_head, issue 28: CPU a message) as
``persistence.decode_message_head`` reads it, the reference, or left to it (None): on records
``encode_message`` writes and on cut or damaged ones. ``head.stored_message`` makes the same
message either way."""

from __future__ import annotations

import math
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from gateway.broker import persistence as P
from gateway.jetstream import head
from tests.unit.jetstream.compiled import compiled, needs_compiled

_name = st.text(max_size=12)
# message IDs end at a NUL in the record: the gateway's have none
_msg_id = st.one_of(st.text(alphabet="0123456789abcdef-", max_size=40), st.text(max_size=6).filter(lambda t: "\x00" not in t))
_record = st.tuples(_name, _name, _msg_id,
                    st.floats(allow_nan=False), _name, _name, st.binary(max_size=30), st.binary(max_size=30))


def _python(raw: bytes, names: dict[bytes, tuple[str, str, str, str]]) -> tuple[float, bytes, bytes, int] | None:
    try:
        h = P.decode_message_head(raw, names)
    except Exception:  # noqa: BLE001 - what the reference refuses (short, not UTF-8)
        return None
    if h is None:
        return None
    enq, _, _, props, start = h
    return enq, raw[9:start - len(props) - 1 - len(h[2].encode())], props, start


@needs_compiled("message_head")
@settings(max_examples=1500, deadline=None)
@given(_record, st.one_of(st.none(), st.tuples(st.integers(0, 200), st.integers(0, 255)), st.integers(0, 200)))
# the CI's case once decode_message_head's cache held the lengths too (eb77a26): a routing key
# damaged to bad UTF-8, which C leaves undecoded and the reference, given it cached, reads
@example(("", "", "", 0.0, "", "\x80", b"", b""), (21, 0))
def test_the_head_is_read_in_c_as_in_python_or_left_to_python(record: tuple[Any, ...], damage: Any) -> None:
    vhost, queue, msg_id, enq, exchange, key, props, body = record
    raw = P.encode_message(vhost, queue, msg_id, enq, exchange, key, props, body)
    if isinstance(damage, tuple):  # one byte changed
        at, value = damage
        if at < len(raw):
            raw = raw[:at] + bytes([value]) + raw[at + 1:]
    elif isinstance(damage, int):  # cut short
        raw = raw[:damage]
    c = compiled.message_head(raw)
    if c is not None:
        # C does not decode the four names: stored_message has the reference decode them when
        # they are not in its cache yet, so the reference is asked with them cached (by the
        # record's bytes 9 to the names' end: their lengths and bytes, as it keys them)
        py = _python(raw, {c[1]: ("", "", "", "")})
        assert py is not None
        assert c[1:] == py[1:] and (c[0] == py[0] or (math.isnan(c[0]) and math.isnan(py[0])))
    if damage is None and msg_id.isascii():
        assert c is not None  # every record the gateway writes is read in C


# valid property lists (Properties refuses others): none, delivery_mode 2
_props = st.sampled_from([b"\x00\x00", b"\x10\x00\x02"])


@settings(max_examples=300, deadline=None)
@given(_record, _props, st.booleans())
def test_stored_message_is_the_same_read_either_way(record: tuple[Any, ...], props: bytes, in_c: bool) -> None:
    vhost, queue, msg_id, enq, exchange, key, _, body = record
    raw = P.encode_message(vhost, queue, msg_id, enq, exchange, key, props, body)
    c_head = head._message_head
    if not in_c:
        head._message_head = None
    try:
        first = head.stored_message(raw, msg_id)  # names not seen yet: the reference reads them
        again = head.stored_message(raw, msg_id)
    finally:
        head._message_head = c_head
    for m in (first, again):
        assert (m.body, m.properties.raw, m.exchange, m.routing_key, m.published_at, m.msg_id, m.tags) == (
            body, props, exchange, key, enq, msg_id, ())


@needs_compiled("message_head")
def test_not_bytes_is_a_type_error() -> None:
    with pytest.raises(TypeError):
        compiled.message_head("x" * 30)


@pytest.mark.parametrize("in_c", [True, False])
def test_names_whose_bytes_join_alike_are_told_apart(in_c: bool) -> None:
    """A queue "logs.a" gets messages from the default exchange (routing key "logs.a") and from
    exchange "logs" bound with key ".a": their names' bytes join alike, and each delivery must
    still carry its own exchange and routing key."""
    c_head = head._message_head
    if not in_c:
        head._message_head = None
    try:
        for exchange, key in [("", "logs.a"), ("logs", ".a"), ("", "logs.a"), ("logs", ".a")]:
            raw = P.encode_message("/", "logs.a", "m", 1.0, exchange, key, b"\x00\x00", b"x")
            m = head.stored_message(raw, "m")
            assert (m.exchange, m.routing_key) == (exchange, key)
    finally:
        head._message_head = c_head
