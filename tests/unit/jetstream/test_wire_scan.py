"""The compiled reading of a run of NATS messages (gateway/jetstream/_wire.c) reads every read
as the Python reading of Handlers._take does (issue 28: CPU a message).

Once the Python reading starts a run (a pull's deliveries whose header is a lone Nats-Msg-Id,
a publisher's PubAcks), the compiled one takes the messages after it that belong to the run
and hands the rest back. The two must give every handler the same calls, in the same order
and grouped into the same runs, and leave the same position and the same cut-off remainder:
M11 (a queue's order), CL3 and the PubAck rule (PubAcks read in order, settled as read) hold
only if the deliveries and PubAcks are what the server sent. Reads are random mixes of what a
gateway sees (and of what it should not: odd spacing, numbers that are not plain digits,
subjects that are not UTF-8, ids with whitespace or non-ASCII letters, headers of other
shapes, PINGs), cut at random places into several reads."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.jetstream import wire
from gateway.jetstream.wire import Delivery, Handlers
from tests.unit.jetstream.compiled import PURE, compiled, needs_compiled
from tests.unit.jetstream.nats_fakes import Nc, Sub

# The readings and writings of gateway/jetstream/_wire.c that these modules compare with Python.
_TWINS = ("take_lone", "take_plain", "ack_numbers", "message_head", "stored_lsn", "hpub_lsn")


def test_the_compiled_reading_is_built() -> None:
    """The suite runs the build the README installs, with a C compiler: the compiled reading
    must be what the gateway uses (CMQ_GATEWAY_PURE_PYTHON=1 chooses the Python one on purpose)."""
    if PURE:
        assert wire._scan is None
        return
    assert compiled is not None, "gateway/jetstream/_wire.c was not built (pip install -e . needs a C compiler)"
    assert wire._scan is compiled
    # a build older than the source: its twins would be skipped as missing, not compared
    assert [n for n in _TWINS if not hasattr(compiled, n)] == []


# sid 1: a pull inbox (handler and many); 2: a publisher's inbox (handler, plain, plains);
# 3: a handler alone; 9: nats-py's own subscription (no handler).
SIDS = ["1", "2", "3", "9", "01", "+1", "1_0"]

_token = st.text(alphabet="abcXYZ019-_.$", min_size=1, max_size=10).map(str.encode)
_subject = st.one_of(_token, _token, st.sampled_from([b"\xff\xfe", b"s\xc3\xa9", b"a\tb", b"a\rb", b"a\r"]))
_reply = st.one_of(st.just(b""), _token, st.just(b"$JS.ACK.S.C.1.5.5.1700000000000000000.0"), st.just(b"r\xff"))
_id = st.one_of(
    st.text(alphabet="abc019-", max_size=12),
    st.text(alphabet=" \t\r\x0b\x1c\x1fab\u00e9\u00a0\u0085\u2003", max_size=8),
).map(lambda s: s.encode("utf-8"))
_header = st.one_of(
    _id.map(lambda v: b"NATS/1.0\r\nNats-Msg-Id:" + v + b"\r\n\r\n"),
    _id.map(lambda v: b"NATS/1.0\r\nNats-Msg-Id: " + v + b"\r\n\r\n"),
    st.just(b"NATS/1.0\r\nNats-Msg-Id: \xff\xfe\r\n\r\n"),
    _id.map(lambda v: b"NATS/1.0\r\nNats-Msg-Id:" + v + b"\r\nCmq-Visible-At: 1.5\r\n\r\n"),
    _id.map(lambda v: b"NATS/1.0\r\nNats-Msg-Id:" + v + b"\r\n\r\nx\r\n\r\n"),
    st.sampled_from([b"NATS/1.0 408 Request Timeout\r\nNats-Pending-Messages: 14\r\n\r\n",
                     b"NATS/1.0 404\r\n\r\n", b"NATS/1.0 100\r\n\r\n", b"NATS/1.0\r\n\r\n",
                     b"NATS/1.0\r\nNats-Msg-Id\r\n\r\n", b"NATS/1.0\r\nNats-Msg-Id:\r\n\r\n"]),
)
_body = st.binary(max_size=12)
_puback = st.sampled_from([b'{"stream":"S", "seq":7}', b'{"stream":"S", "seq":0,"duplicate": true}', b"\r\n"])


@st.composite
def _message(draw: st.DrawFn) -> bytes:
    kind = draw(st.sampled_from(["lone", "lone", "lone", "hmsg", "msg", "puback", "puback", "control"]))
    if kind == "control":
        return draw(st.sampled_from([b"PING\r\n", b"+OK\r\n", b"-ERR 'x'\r\n", b"MSG a 1\r\n", b"HMSG a 1 x 9\r\n"]))
    sid = draw(st.sampled_from(SIDS)).encode() if draw(st.integers(0, 5)) == 0 else b"1"
    if kind == "msg":
        sid = draw(st.sampled_from([b"1", b"2", b"2", b"3", b"9"]))
    space = b"  " if draw(st.integers(0, 12)) == 0 else b" "
    subject = draw(_subject)
    if kind == "puback":
        sid = b"2" if draw(st.integers(0, 5)) else sid
        reply = draw(_token) if draw(st.integers(0, 5)) == 0 else b""
        headers, body = None, draw(st.one_of(_puback, _body))
    else:
        reply = draw(_reply)
        headers = draw(_header) if kind == "lone" or kind == "hmsg" else None
        body = draw(_body)
    args = [subject, sid] + ([reply] if reply else [])
    if headers is None and kind != "hmsg":
        op, sizes = b"MSG", [b"%d" % len(body)]
        headers = b""
    else:
        headers = headers or b""
        hsize, size = len(headers), len(headers) + len(body)
        if draw(st.integers(0, 15)) == 0:
            hsize, size = draw(st.sampled_from([(size + 1, size), (0, size), (hsize, size - 1)]))
        op, sizes = b"HMSG", [b"%d" % hsize, b"%d" % size]
    return space.join([op, *args, *sizes]) + b"\r\n" + headers + body + b"\r\n"


def _read_all(scan: Any, reads: list[bytes], direct: bool) -> list[Any]:
    """Every call the handlers get and every answer of ``_take``, the reads fed as
    Handlers' parse_read feeds them (what a read left cut off goes before the next); a
    command for nats-py's parser is stepped over, as that parser would read it, and a read
    the reading gives up on (ValueError) is left."""
    saved = wire._scan
    wire._scan = scan
    try:
        handlers = Handlers(Nc())
        seen: list[Any] = []

        def one(d: Delivery, sid: int) -> None:
            seen.append(("one", sid, d.subject, d.reply, d.data, d.headers))

        def many(ds: list[Delivery], sid: int) -> None:
            seen.append(("many", sid, [(d.subject, d.reply, d.data, d.headers) for d in ds]))

        def plain(subject: bytes, data: bytes, sid: int) -> None:
            seen.append(("plain", sid, subject, data))

        def plains(items: list[tuple[bytes, bytes]], sid: int) -> None:
            seen.append(("plains", sid, list(items)))

        handlers.add(Sub(1), lambda d: one(d, 1), many=lambda ds: many(ds, 1))
        handlers.add(Sub(2), lambda d: one(d, 2), lambda s, d: plain(s, d, 2), plains=lambda ps: plains(ps, 2))
        handlers.add(Sub(3), lambda d: one(d, 3))
        for data in reads:
            rest, handlers._rest = handlers._rest, b""
            data = rest + data if rest else data
            pos = 0
            while True:
                try:
                    pos, other = handlers._take(data, pos, direct)
                except ValueError as e:  # a number int() cannot read: the reading's own error
                    seen.append(("raised", str(e)))
                    break
                seen.append(("took", pos, other))
                if other is not None:
                    continue
                if not 0 <= pos < len(data):
                    break
                eol = data.find(b"\r\n", pos)
                if eol < 0:
                    break
                pos = eol + 2  # nats-py's parser reads the line
        seen.append(("rest", handlers._rest))
        return seen
    finally:
        wire._scan = saved


@needs_compiled("take_lone", "take_plain")
@settings(max_examples=400, deadline=None)
@given(st.lists(_message(), min_size=1, max_size=24), st.lists(st.integers(0, 400), max_size=4),
       st.booleans())
def test_compiled_runs_read_as_the_python_reading(messages: list[bytes], cuts: list[int], direct: bool) -> None:
    """M11, CL3, the PubAck rule: the same calls, runs, positions and remainder either way."""
    data = b"".join(messages)
    at = sorted({c % (len(data) + 1) for c in cuts})
    reads = [data[a:b] for a, b in zip([0, *at], [*at, len(data)], strict=True) if b > a]
    assert _read_all(compiled, reads, direct) == _read_all(None, reads, direct)


def _delivery(sid: int, n: int, msg_id: str, reply: bool = True) -> bytes:
    headers = b"NATS/1.0\r\nNats-Msg-Id: %s\r\n\r\n" % msg_id.encode()
    body = b"body%d" % n
    ack = b" $JS.ACK.S.C.1.%d.%d.1700000000000000000.0" % (n, n) if reply else b""
    return b"HMSG Q %d%s %d %d\r\n%s%s\r\n" % (sid, ack, len(headers), len(headers) + len(body), headers, body)


@needs_compiled("take_lone", "take_plain")
def test_the_compiled_reading_takes_the_run_after_its_first() -> None:
    """The compiled reading does take the run (not only hand everything back): a pull's
    deliveries and a publisher's PubAcks after the first of each run, stopping at the first
    message of another kind; what it took is what the Python reading gives."""
    data = (b"".join(_delivery(1, n, f"id{n}") for n in range(5)) + b"PING\r\n")
    out: list[Any] = []
    first = data.index(b"HMSG", 1)
    pos = compiled.take_lone(data, first, 1, Delivery, "Nats-Msg-Id", out)
    assert pos == data.index(b"PING")
    assert [(d.subject, d.reply, d.data, d.headers) for d in out] == [
        ("Q", f"$JS.ACK.S.C.1.{n}.{n}.1700000000000000000.0", b"body%d" % n, {"Nats-Msg-Id": f"id{n}"})
        for n in range(1, 5)]
    acks = b"MSG _INBOX.p.1 2 3\r\nabc\r\nMSG _INBOX.p.2 2 2\r\nde\r\nMSG _INBOX.p.3 3 1\r\nf\r\n"
    pairs: list[Any] = []
    assert compiled.take_plain(acks, 0, 2, pairs) == acks.index(b"MSG _INBOX.p.3")
    assert pairs == [(b"_INBOX.p.1", b"abc"), (b"_INBOX.p.2", b"de")]
    reads = [data[:40], data[40:]]
    assert _read_all(compiled, reads, False) == _read_all(None, reads, False)


@needs_compiled("take_lone", "take_plain")
def test_deliveries_are_made_as_their_class_makes_them() -> None:
    """take_lone fills a plain __slots__ class's four slots itself (wire.Delivery: its
    __init__ not called) and calls any other class: either way the same fields, and objects
    that live on, are changed and go as any other (refcounts, GC)."""
    import gc
    import sys

    data = b"".join(_delivery(1, n, f"id{n}") for n in range(3))

    class Called:
        def __init__(self, subject: str, reply: str, data: bytes, headers: dict[str, str]) -> None:
            self.subject, self.reply, self.data, self.headers = subject, reply, data, headers

    fields = []
    for cls in (Delivery, Called, Delivery):
        out: list[Any] = []
        assert compiled.take_lone(data, 0, 1, cls, "Nats-Msg-Id", out) == len(data)
        assert all(type(d) is cls for d in out)
        fields.append([(d.subject, d.reply, d.data, d.headers) for d in out])
    assert fields[0] == fields[1] == fields[2] == [
        ("Q", f"$JS.ACK.S.C.1.{n}.{n}.1700000000000000000.0", b"body%d" % n, {"Nats-Msg-Id": f"id{n}"})
        for n in range(3)]
    fields.clear()
    d = out[0]
    refs = sys.getrefcount(d.headers), sys.getrefcount(d.reply), sys.getrefcount(d.data)
    assert gc.is_tracked(d) and refs == (2, 2, 2)  # held by the delivery alone (and the call)
    d.reply = "changed"
    assert d.reply == "changed"
    del out, d
    gc.collect()


@needs_compiled("take_lone", "take_plain")
def test_every_cut_of_a_read_reads_as_the_python_reading() -> None:
    """A read cut anywhere (inside a control line, a header, a body, its closing CRLF): what
    was whole is taken, what was cut off goes before the next read, either way the same."""
    data = (b"".join(_delivery(1, n, f"id{n}") for n in range(3)) + _delivery(1, 3, "x", reply=False)
            + b"MSG _INBOX.p.1 2 3\r\nabc\r\nMSG _INBOX.p.2 2 2\r\nde\r\n" + _delivery(1, 4, "y")
            + b"MSG _INBOX.p.3 2 1\r\nf\r\n")
    for cut in range(1, len(data)):
        reads = [data[:cut], data[cut:]]
        assert _read_all(compiled, reads, False) == _read_all(None, reads, False), cut
