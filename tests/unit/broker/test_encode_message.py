"""M14: a stored message's record is the same bytes whether its names were encoded for this
message or taken from the per-queue cache (``persistence._ENCODED_NAMES``), and reads back to
what was written, across cache clears."""

from __future__ import annotations

import struct

from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.broker import persistence as P

_name = st.text(st.characters(blacklist_categories=("Cs",)), max_size=12)


def _reference(vhost: str, queue: str, msg_id: str, enqueue_time: float, exchange: str,
               routing_key: str, properties: bytes, body: bytes) -> bytes:
    """The record's layout written out: head, the four names, the id, NUL, properties, body."""
    names = [s.encode() for s in (vhost, queue, exchange, routing_key)]
    head = struct.pack(">BdHHHHI", 1, enqueue_time, *(len(n) for n in names), len(properties))
    return b"".join([head, *names, msg_id.encode(), b"\x00", properties, body])


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(_name, _name, _name, _name), min_size=1, max_size=6),
       st.lists(st.tuples(st.integers(0, 5), st.binary(max_size=8), st.binary(max_size=8)), max_size=30),
       st.booleans())
def test_M14_cached_names_write_the_same_record(names: list[tuple[str, str, str, str]],
                                                 messages: list[tuple[int, bytes, bytes]], churn: bool) -> None:
    if churn:
        P._ENCODED_NAMES.clear()
    for i, (which, properties, body) in enumerate(messages):
        vhost, queue, exchange, key = names[which % len(names)]
        args = (vhost, queue, f"m-{i}", 1700000000.25 + i, exchange, key, properties, body)
        raw = P.encode_message(*args)
        assert raw == _reference(*args)
        back = P.decode_message(raw)
        assert (back["vhost"], back["queue"], back["exchange"], back["routing_key"], back["msg_id"],
                back["properties"], back["body"]) == (vhost, queue, exchange, key, f"m-{i}", properties, body)
        if churn and i % 7 == 0:
            P._ENCODED_NAMES.clear()


def test_the_cache_stays_bounded() -> None:
    P._ENCODED_NAMES.clear()
    for i in range(P._ENCODED_NAMES_MAX * 2 + 3):
        P.encode_message("/", f"q{i}", "m", 0.0, "", f"q{i}", b"", b"x")
    assert 0 < len(P._ENCODED_NAMES) <= P._ENCODED_NAMES_MAX


def test_M14_names_that_join_to_the_same_bytes_read_back_apart() -> None:
    """Recovery reads records through one names cache (``decode_message_head``): vhost "/" with
    queue "ab", exchange "" and key "ab" joins to the same bytes as queue "a", exchange "b" and
    key "ab". Cached by the bytes alone, the second record read came back in the first's queue
    (a message restored into another queue after a restart)."""
    cache: dict[bytes, tuple[str, str, str, str]] = {}
    records = [("/", "ab", "", "ab"), ("/", "a", "b", "ab"), ("/", "", "ab", "ab"), ("/a", "b", "", "ab")]
    for vhost, queue, exchange, key in records * 2:
        raw = P.encode_message(vhost, queue, "id", 1.0, exchange, key, b"", b"body")
        head = P.decode_message_head(raw, cache)
        assert head is not None and head[1] == (vhost, queue, exchange, key)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(_name, _name, _name, _name), min_size=1, max_size=8))
def test_M14_one_names_cache_reads_every_record_s_own_names(names: list[tuple[str, str, str, str]]) -> None:
    cache: dict[bytes, tuple[str, str, str, str]] = {}
    for vhost, queue, exchange, key in names * 2:
        raw = P.encode_message(vhost, queue, "m", 2.0, exchange, key, b"p", b"b")
        head = P.decode_message_head(raw, cache)
        assert head is not None and head[1] == (vhost, queue, exchange, key) and head[3] == b"p"
