"""PubAcks read together (``Publisher._replied_plains``, issue 28) settle every write as
``_replied_plain`` settles them one by one: the PubAck rule (a confirm only for a stored
sequence), CL3's staged duplicates (seq 0: sent again, not confirmed), refusals (a nack) and
replies for no write, in the order read."""

from __future__ import annotations

import asyncio
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.jetstream import publisher
from gateway.jetstream.publisher import Publisher

REPLIES = [
    b'{"stream":"S", "seq":7}',
    b'{"stream":"S","seq":8,"duplicate": true}',
    b'{"stream":"S", "seq":0,"duplicate": true}',  # staged, not stored (CL3)
    b'{"error":{"code":400,"err_code":10077,"description":"maximum messages exceeded"},"stream":"S","seq":0}',
    b'{"stream":"S", "seq":5, "error":{"code":500}}',
    b"not json",
    b'{"stream":"S", "seq":007}',  # leading zeros: stored (int() reads 7)
    b'{"stream":"S", "seq":000,"duplicate": true}',  # staged (0)
    b'{"stream":"S","seq":12x}',  # not the server's text: read by the JSON decoder (unknown)
]


class _Nc:
    def new_inbox(self) -> str:
        return "_INBOX.t"


def _outcome(replies: list[tuple[int, int]], together: bool, in_c: bool = True) -> tuple[list[Any], list[int], list[int]]:
    """What settles, in order, and the writes left and to be sent again; ``in_c`` False: the
    stored PubAcks read in Python even where _wire.c is built (publisher.stored_lsn's reading)."""

    async def run() -> tuple[list[Any], list[int], list[int]]:
        p = Publisher(_Nc(), asyncio.get_running_loop())
        seen: list[Any] = []

        def one(lsn: int, refused: bool, done: Any) -> None:
            done()
            seen.append(("settled", lsn, refused))

        def many(writes: list[tuple[int, Any]]) -> None:
            for lsn, done in writes:
                done()
                seen.append(("settled", lsn, False))

        if together:
            p.settles = (one, many)
        for lsn in range(1, 6):
            p.publish(lsn, "S.q", b"x", {"Nats-Msg-Id": f"m{lsn}"}, lambda lsn=lsn: seen.append(("done", lsn)),
                      None, one)
        p._outbox.clear()  # as if sent (no connection here)
        items = [(f"{p.prefix}.{lsn}".encode() if lsn else b"_INBOX.t.x", REPLIES[r]) for lsn, r in replies]
        if together:
            c_lsn = publisher._stored_lsn
            if not in_c:
                publisher._stored_lsn = None
            try:
                p._replied_plains(items)
            finally:
                publisher._stored_lsn = c_lsn
        else:
            for subject, data in items:
                p._replied_plain(subject, data)
        return seen, sorted(p._writes), sorted(p._again)

    return asyncio.run(run())


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(min_value=0, max_value=7), st.integers(min_value=0, max_value=len(REPLIES) - 1)),
                min_size=1, max_size=12))
def test_CL3_pubacks_read_together_settle_as_one_by_one(replies: list[tuple[int, int]]) -> None:
    assert _outcome(replies, True) == _outcome(replies, True, in_c=False) == _outcome(replies, False)


def test_CL3_a_staged_duplicate_between_stored_ones_is_not_confirmed() -> None:
    seen, left, again = _outcome([(1, 0), (2, 2), (3, 1)], True)
    assert seen == [("done", 1), ("settled", 1, False), ("done", 3), ("settled", 3, False)]
    assert left == [2, 4, 5] and again == [2]


# PubAcks as the server writes them and near misses: the pieces of the text, shuffled in.
_PIECES = [b'{"stream":"', b"S", b'q.x', b'"', b",", b" ", b"\t", b'"seq":', b"0", b"7", b"00", b"12", b"}", b",",
           b'"duplicate": true', b'"error":{"code":500}', b"\xd9\xa3", b"x", b"{", b'"stream":"S",']


@settings(max_examples=1500, deadline=None)
@given(st.lists(st.sampled_from(_PIECES), max_size=12), st.booleans())
def test_CL3_the_stored_reading_is_the_match_with_a_sequence_above_0(pieces: list[bytes], prefixed: bool) -> None:
    """The PubAck rule: _replied_plains tells a stored write by one match (_PUBACK_STORED),
    the same PubAcks _PUBACK's match with int() of its sequence above 0 tells."""
    data = (b'{"stream":"S", "seq":' if prefixed else b"") + b"".join(pieces)
    m = publisher._PUBACK.match(data)
    assert (publisher._PUBACK_STORED.match(data) is not None) == (m is not None and int(m.group(1)) > 0)
