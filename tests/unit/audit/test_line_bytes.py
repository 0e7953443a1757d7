"""A2: the msgspec line writer of the broker's per-message rows (``Row.put``) writes byte for
byte the line of the json-based formatter (``format_line``, schema v1), over generated records:
unicode (escapes, control characters, astral planes), floats (exponents, -0.0, NaN, infinities),
integers past 64 bits, bools where numbers belong, None fields, timestamps and keys outside the
schema."""

from __future__ import annotations

import json
import time
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.audit.record import FIELD_TYPES, format_line, format_ts, line_writer
from gateway.audit.rows import ACK, ROWS, Row
from gateway.audit.writer import AuditLog

_text = st.text(st.characters(blacklist_categories=("Cs",)), max_size=16)  # no lone surrogates
_int = st.one_of(st.integers(0, 2**40), st.integers(-(2**70), 2**70), st.booleans())
_float = st.floats(allow_nan=True, allow_infinity=True)
_VALUE = {
    "string": st.one_of(st.none(), _text, st.integers(-5, 5)),
    "long": st.one_of(st.none(), _int),
    "int": st.one_of(st.none(), _int),
    "double": st.one_of(st.none(), _float, st.integers(-(2**53), 2**53)),
    "array<string>": st.one_of(st.none(), st.lists(st.one_of(_text, st.integers()), max_size=3)),
    "timestamp": st.one_of(st.none(), st.floats(0, 4e9), _text),
    "boolean": st.one_of(st.none(), st.booleans()),
}
_ts = st.floats(0, 4e9).map(format_ts)


def _put(writer: Any, *args: Any) -> bytes | type[BaseException]:
    out = bytearray(b"earlier line\n")  # appended to, never rewritten
    try:
        writer(out, *args)
    except Exception as e:
        assert out == b"earlier line\n"
        return type(e)
    assert out.startswith(b"earlier line\n")
    return bytes(out[len(b"earlier line\n"):])


def _line(ts: str, event: str, vhost: str, fields: dict[str, Any]) -> bytes | type[BaseException]:
    """format_line's bytes, or the error it raises (int("x") for an integer field, say)."""
    try:
        return format_line(ts, event, vhost, fields).encode()
    except Exception as e:
        return type(e)


@st.composite
def _row_and_values(draw: st.DrawFn) -> tuple[Row, tuple[Any, ...]]:
    row = draw(st.sampled_from(ROWS))
    return row, draw(st.tuples(*(_VALUE[FIELD_TYPES[k]] for k in row.keys)))


@settings(max_examples=500, deadline=None)
@given(_row_and_values(), _text, _ts)
def test_A2_row_lines_are_the_json_formatter_s_bytes(rv: tuple[Row, tuple[Any, ...]], vhost: str, ts: str) -> None:
    row, values = rv
    expected = _line(ts, row.event, vhost, row.fields(values))
    assert _put(row.put, ts, row.event, vhost, *values) == expected


_ANY_KEY = st.one_of(st.sampled_from(sorted(FIELD_TYPES) + ["v", "ts", "event", "vhost"]), _text)
_ANY_VALUE = st.one_of(st.none(), _text, _int, _float, st.lists(_text, max_size=2),
                       st.dictionaries(_text, st.integers(), max_size=2))


@settings(max_examples=500, deadline=None)
@given(st.lists(st.tuples(_ANY_KEY, _ANY_VALUE), max_size=6, unique_by=lambda kv: kv[0]), _text, _text, _ts)
def test_A2_any_shape_is_the_json_formatter_s_bytes(pairs: list[tuple[str, Any]], event: str, vhost: str,
                                                    ts: str) -> None:
    """Keys outside the schema, the reserved ones (v, ts, event, vhost: never overridden) and
    values of any type, as a shape's writer sees them."""
    shape = tuple(k for k, _ in pairs)
    values = [v for _, v in pairs]
    expected = _line(ts, event, vhost, dict(pairs))
    assert _put(line_writer(shape), ts, event, vhost, *values) == expected


def test_A2_a_value_msgspec_refuses_takes_the_json_path() -> None:
    """A lone surrogate cannot be UTF-8: the writer raises as format_line's encode does, and
    leaves what the buffer held before."""
    put = line_writer(("queue",))
    out = bytearray(b"kept\n")
    try:
        put(out, "2024-05-01T10:00:00.000001Z", "ack", "/", "\ud800")
    except UnicodeEncodeError:
        pass
    else:
        raise AssertionError("a lone surrogate was written")
    assert out == b"kept\n"


@settings(max_examples=500, deadline=None)
@given(st.floats(0, 4e9))
def test_A2_timestamps_keep_six_digit_microseconds(t: float) -> None:
    """format_ts's table lookups write what ``{us:06d}`` wrote, rounding carried included."""
    sec = int(t)
    us = round((t - sec) * 1_000_000)
    if us >= 1_000_000:
        sec, us = sec + 1, us - 1_000_000
    expected = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(sec)) + f".{us:06d}Z"
    assert format_ts(t) == expected


@settings(max_examples=50, deadline=None)
@given(st.lists(st.floats(1.7e9, 1.7e9 + 3), min_size=1, max_size=40).map(sorted))
def test_A2_the_writer_stamps_each_record_as_format_ts(tmp_path_factory: Any, times: list[float]) -> None:
    """The writer's per-second shortcut gives each line the ts format_ts gives its time."""
    log = AuditLog(str(tmp_path_factory.mktemp("audit")), process=False, _thread=False)
    buf, nlines, _, _ = log._format([(t, ACK.id, "/", ("u", "p", "q", "m", 1.5)) for t in times],
                                    bytearray(), 0, "", "")
    stamps = [json.loads(line)["ts"] for line in bytes(buf).splitlines()]
    assert nlines == len(times)
    assert stamps == [format_ts(t) for t in times]
    log._write(buf, nlines)
    log._close_file()
