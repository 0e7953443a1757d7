"""Handlers._take's shortcuts read every message as the general reading does (issue 28).

The control line split at single spaces (the generic split when it holds two spaces), the
subscription ids read through a cache, and a lone ``Nats-Msg-Id`` header read without
``parse_headers``: each delivery must be what ``parse_headers`` and the whitespace split give,
for the headers a gateway sees (a lone id, statuses, several headers, odd spacing) and for
control lines with extra spaces."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.jetstream.wire import Delivery, Handlers, parse_headers
from tests.unit.jetstream.nats_fakes import Nc, Sub

_token = st.text(alphabet="abcdefXYZ0123456789-_.", min_size=1, max_size=12)
_value = st.text(alphabet=" abc-_.:0123456789\t", max_size=20)
_headers = st.one_of(
    _value.map(lambda v: b"NATS/1.0\r\nNats-Msg-Id:" + v.encode() + b"\r\n\r\n"),
    st.tuples(_value, _value).map(lambda kv: b"NATS/1.0\r\nNats-Msg-Id:%s\r\nCmq-Visible-At:%s\r\n\r\n"
                                  % (kv[0].encode(), kv[1].encode())),
    _value.map(lambda v: b"NATS/1.0\r\nNats-Msg-Id :" + v.encode() + b"\r\n\r\n"),
    _value.map(lambda v: b"NATS/1.0\r\nNats-Msg-Id:" + v.encode() + b"\r\n\r\nx\r\n\r\n"),
    st.sampled_from([b"NATS/1.0 408 Request Timeout\r\nNats-Pending-Messages: 14\r\n\r\n",
                     b"NATS/1.0 404\r\n\r\n", b"NATS/1.0 100\r\n\r\n", b"NATS/1.0\r\n\r\n",
                     b"NATS/1.0\r\nNats-Msg-Id\r\n\r\n"]),
)


def _command(subject: str, sid: int, reply: str, headers: bytes | None, body: bytes, spaces: str) -> bytes:
    head = [subject, str(sid)] + ([reply] if reply else [])
    line = spaces.join(["HMSG" if headers else "MSG", *head])
    if headers:
        line += spaces + f"{len(headers)}{spaces}{len(headers) + len(body)}"
        return line.encode() + b"\r\n" + headers + body + b"\r\n"
    return line.encode() + f"{spaces}{len(body)}\r\n".encode() + body + b"\r\n"


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(_token, st.sampled_from([1, 7, 12]), st.one_of(st.just(""), _token),
                          st.one_of(st.none(), _headers), st.binary(max_size=20),
                          st.sampled_from([" ", " ", "  "])), min_size=1, max_size=8))
def test_every_message_reads_as_the_general_reading_gives_it(messages: list[Any]) -> None:
    handlers = Handlers(Nc())
    got: list[tuple[int, Delivery]] = []
    for sid in (1, 7, 12):
        handlers.add(Sub(sid), lambda d, sid=sid: got.append((sid, d)))
    data = b"".join(_command(*m) for m in messages)
    pos, other = handlers._take(data, 0, False)
    assert (pos, other) == (len(data), None)
    want = [(sid, (subject, reply, body, parse_headers(headers) if headers else None))
            for subject, sid, reply, headers, body, _ in messages]
    assert [(sid, (d.subject, d.reply, d.data, d.headers)) for sid, d in got] == want


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(_token, st.sampled_from([1, 7, 12]), st.one_of(st.just(""), _token),
                          st.one_of(st.none(), _headers), st.binary(max_size=20),
                          st.sampled_from([" ", " ", "  "])), min_size=1, max_size=10),
       st.integers(min_value=0, max_value=3))
def test_deliveries_taken_together_keep_the_order_read(messages: list[Any], cut: int) -> None:
    """M11 (a queue's order), CL3 (PubAcks in order): a subscription's ``many`` takes its
    lone-id deliveries and its ``plains`` its messages without headers or reply several at
    once, yet every handler sees what was read in the order read, as one by one (what is
    gathered handed on before any other message, and before the read's end); a read whose
    last message is cut off hands on what came before it."""
    handlers = Handlers(Nc())
    got: list[tuple[int, Delivery]] = []
    batches = 0

    def many(ds: list[Delivery], sid: int) -> None:
        nonlocal batches
        batches += 1
        got.extend((sid, d) for d in ds)

    def plain(subject: bytes, data: bytes, sid: int) -> None:
        got.append((sid, Delivery(subject.decode(), "", data, None)))

    def plains(items: list[tuple[bytes, bytes]], sid: int) -> None:
        nonlocal batches
        batches += 1
        for subject, data in items:
            plain(subject, data, sid)

    for sid in (1, 7, 12):
        handlers.add(Sub(sid), lambda d, sid=sid: got.append((sid, d)),
                     (lambda b, d, sid=sid: plain(b, d, sid)) if sid != 1 else None,
                     (lambda ds, sid=sid: many(ds, sid)) if sid != 12 else None,
                     (lambda ps, sid=sid: plains(ps, sid)) if sid == 7 else None)
    data = b"".join(_command(*m) for m in messages)
    whole = len(data)
    data = data[:whole - cut] if cut else data
    pos, other = handlers._take(data, 0, False)
    taken = messages if not cut else messages[:-1]
    assert (pos, other) == ((whole, None) if not cut else (-1, None))
    want = [(sid, (subject, reply, body, parse_headers(headers) if headers else None))
            for subject, sid, reply, headers, body, _ in taken]
    assert [(sid, (d.subject, d.reply, d.data, d.headers)) for sid, d in got] == want
    gathered = [m for m in taken if (m[1] != 12 and m[3] is not None and m[3].count(b"\r\n") == 3
                                     and list(parse_headers(m[3]) or {}) == ["Nats-Msg-Id"])
                or (m[1] == 7 and m[3] is None and not m[2])]
    assert batches <= len(gathered)
