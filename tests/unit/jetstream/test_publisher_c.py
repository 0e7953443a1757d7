"""The publisher's C readings and writings (gateway/jetstream/_wire.c, issue 28: CPU a message)
against their Python references: a PubAck's stored LSN (``stored_lsn``: the PubAck rule, CL3)
and a one-header write's HPUB command (``wire.hpub`` with the reply subject ``<prefix>.<lsn>``).
C either gives what Python gives or declines (None), and declines only what it says it does."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.jetstream import publisher, wire
from tests.unit.jetstream.compiled import compiled, needs_compiled

# PubAcks as the server writes them and near misses, in pieces (as test_pubacks_together.py).
_PIECES = [b'{"stream":"', b"S", b'q.x', b'"', b",", b" ", b"\t", b"\x0b", b"\x0c", b"\r\n", b'"seq":', b"0", b"7",
           b"00", b"12", b"}", b",", b'"duplicate": true', b'"error":{"code":500}', b'"error"', b'"erro', b"\xd9\xa3",
           b"x", b"{", b'"stream":"S",', b"\x00"]
# LSN tokens: plain numbers (also longer than C reads), what int() reads and C does not, and junk.
_LSN = st.one_of(
    st.integers(min_value=0, max_value=10**20).map(lambda n: str(n).encode()),
    st.binary(max_size=4),
    st.sampled_from([b"", b"+3", b"-3", b" 7", b"7 ", b"1_0", b"\xd9\xa3", b"0x1", b"3\n", b"007"]),
)


def _plain(token: bytes) -> bool:
    return 0 < len(token) <= 18 and all(48 <= c <= 57 for c in token)


def test_the_publisher_reads_and_writes_in_c() -> None:
    """In C where it was built, unless told not to."""
    assert publisher._stored_lsn is getattr(compiled, "stored_lsn", None)
    assert publisher._hpub_lsn is getattr(compiled, "hpub_lsn", None)


@needs_compiled("stored_lsn")
@settings(max_examples=2000, deadline=None)
@given(st.sampled_from([b"_INBOX.abc", b"", b"_INBOX.a.b", b"x"]), st.booleans(), _LSN,
       st.lists(st.sampled_from(_PIECES), max_size=12), st.booleans())
def test_CL3_a_stored_pubAck_is_read_in_c_as_in_python_or_left_to_python(
        prefix: bytes, dotted: bool, lsn: bytes, pieces: list[bytes], started: bool) -> None:
    subject = prefix + (b"." if dotted else b"") + lsn
    data = (b'{"stream":"S", "seq":' if started else b"") + b"".join(pieces)
    c = compiled.stored_lsn(subject, data)
    py = publisher.stored_lsn(subject, data)
    if c is not None:
        assert c == py
    elif py is not None:
        # declined: only an LSN that is not 1-18 plain digits (the PubAck itself C reads alike)
        assert not _plain(subject[subject.rindex(b".") + 1:])
        assert compiled.stored_lsn(subject[:subject.rindex(b".")] + b".1", data) == 1


@needs_compiled("stored_lsn")
@pytest.mark.parametrize(("data", "lsn"), [
    (b'{"stream":"S", "seq":7}', 12),
    (b'{"stream":"cmq_q_x","seq":8,"duplicate": true}', 12),
    (b'{"stream":"S", "seq":007}', 12),
    (b'{"stream":"S", "seq":0,"duplicate": true}', None),  # staged, not stored (CL3)
    (b'{"stream":"S", "seq":000}', None),
    (b'{"stream":"S", "seq":5, "error":{"code":500}}', None),  # a refusal
    (b'{"error":{"code":400},"stream":"S","seq":0}', None),
    (b'{"stream":"S","seq":12x}', None),
])
def test_CL3_server_pubacks(data: bytes, lsn: int | None) -> None:
    assert compiled.stored_lsn(b"_INBOX.abc.12", data) == publisher.stored_lsn(b"_INBOX.abc.12", data) == lsn


def test_a_reply_without_an_lsn_is_none() -> None:
    for fn in (publisher.stored_lsn, *([compiled.stored_lsn] if hasattr(compiled, "stored_lsn") else [])):
        assert fn(b"nodot", b'{"stream":"S", "seq":7}') is None
        assert fn(b"_INBOX.x.", b'{"stream":"S", "seq":7}') is None


_text = st.one_of(st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789._-:$", max_size=20), st.text(max_size=8))


@needs_compiled("hpub_lsn")
@settings(max_examples=1500, deadline=None)
@given(_text, _text, st.one_of(st.integers(min_value=0, max_value=10**18), st.integers(min_value=-5, max_value=10**20)),
       st.dictionaries(_text, _text, min_size=0, max_size=2), st.binary(max_size=40))
def test_a_one_header_write_is_the_command_hpub_makes(subject: str, prefix: str, lsn: int, headers: dict[str, str],
                                                       payload: bytes) -> None:
    c = compiled.hpub_lsn(subject, prefix, lsn, headers, payload)
    plain = (len(headers) == 1 and 0 <= lsn < 10**18
             and all(s.isascii() for s in (subject, prefix, *headers, *headers.values())))
    if not plain:
        assert c is None
        return
    py = wire.hpub(subject, f"{prefix}.{lsn}", headers, payload)
    assert c == py
    assert type(c[0]) is bytes and type(c[2]) is str and c[1] is subject and c[3] is payload and c[4] is headers


@needs_compiled("stored_lsn", "hpub_lsn")
def test_other_types_are_left_to_python() -> None:
    assert compiled.hpub_lsn("S", "_INBOX.a", True, {"k": "v"}, b"x") is None  # a bool is not an exact int
    assert compiled.hpub_lsn("S", "_INBOX.a", 1, {"k": "v"}, bytearray(b"x")) is None
    assert compiled.hpub_lsn("S", "_INBOX.a", 1, {"k": 1}, b"x") is None
    with pytest.raises(TypeError):
        compiled.stored_lsn("_INBOX.a.1", b"{}")
