"""AMQP field tables with the value types RabbitMQ uses, kept exactly.

Hand-written because pamqp re-chooses an integer's width from its value and encodes every
Python float as a 32-bit ``f``: a header published as ``l`` 5 would come back as ``b`` 5.
Deliveries must give the consumer the very bytes the publisher sent (SPEC M11), so
``Properties.encode_with`` splices tables with :func:`table_entries` instead of re-encoding,
and new values are encoded here with an explicit type.

Types (RabbitMQ's ``rabbit_binary_parser``): ``t`` bool, ``b``/``B`` int8/uint8, ``s``/``u``
int16/uint16, ``I``/``i`` int32/uint32, ``l`` int64 (``L`` read as int64, as pamqp does),
``f`` float32, ``d`` float64, ``D`` decimal, ``S`` long string, ``x`` byte array, ``T``
timestamp, ``F`` table, ``A`` array, ``V`` void.
"""

from __future__ import annotations

import datetime
import decimal
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = [
    "Typed",
    "decode_table",
    "decode_value",
    "encode_table",
    "encode_table_body",
    "encode_value",
    "skip_value",
    "table_entries",
]

_U8 = struct.Struct(">B")
_U32 = struct.Struct(">I")

# Fixed-width types: tag -> (struct, size).
_FIXED: dict[int, struct.Struct] = {
    ord("t"): struct.Struct(">B"),
    ord("b"): struct.Struct(">b"),
    ord("B"): struct.Struct(">B"),
    ord("s"): struct.Struct(">h"),
    ord("u"): struct.Struct(">H"),
    ord("I"): struct.Struct(">i"),
    ord("i"): struct.Struct(">I"),
    ord("l"): struct.Struct(">q"),
    ord("L"): struct.Struct(">q"),
    ord("f"): struct.Struct(">f"),
    ord("d"): struct.Struct(">d"),
    ord("T"): struct.Struct(">Q"),
}
_DECIMAL = struct.Struct(">BI")
_LONG_TAGS = frozenset(b"SxAF")  # a 32-bit length, then that many bytes


@dataclass(frozen=True, slots=True)
class Typed:
    """A value with an explicit AMQP type tag, e.g. ``Typed("I", 5)`` for a signed int32."""

    tag: str
    value: Any


def skip_value(buf: bytes | bytearray | memoryview, pos: int) -> int:
    """Return the offset just past the tagged value at ``pos`` (without decoding it)."""
    tag = buf[pos]
    pos += 1
    fixed = _FIXED.get(tag)
    if fixed is not None:
        end = pos + fixed.size
    elif tag in _LONG_TAGS:
        end = pos + 4 + _U32.unpack_from(buf, pos)[0]
    elif tag == 0x44:  # D
        end = pos + 5
    elif tag == 0x56:  # V
        end = pos
    else:
        raise ValueError(f"unknown field type {chr(tag)!r}")
    if end > len(buf):
        raise ValueError("field value runs past its table")
    return end


def table_entries(buf: bytes | bytearray | memoryview, start: int, end: int) -> list[tuple[bytes, int, int]]:
    """Walk a table body (no length prefix) -> ``[(key, entry_start, entry_end)]``."""
    out = []
    pos = start
    while pos < end:
        klen = buf[pos]
        key = bytes(buf[pos + 1:pos + 1 + klen])
        vend = skip_value(buf, pos + 1 + klen)
        if vend > end:
            raise ValueError("field table entry runs past the table")
        out.append((key, pos, vend))
        pos = vend
    return out


def decode_value(buf: bytes | bytearray | memoryview, pos: int) -> tuple[Any, int]:
    """Decode the tagged value at ``pos`` -> ``(value, next_pos)``."""
    tag = buf[pos]
    pos += 1
    fixed = _FIXED.get(tag)
    if fixed is not None:
        (v,) = fixed.unpack_from(buf, pos)
        end = pos + fixed.size
        if tag == 0x74:  # t
            return bool(v), end
        if tag == 0x54:  # T
            try:
                return datetime.datetime.fromtimestamp(v, tz=datetime.UTC), end
            except (OverflowError, ValueError, OSError):
                return Typed("T", v), end  # past what a datetime holds (year 9999), kept as sent
        return v, end
    if tag in _LONG_TAGS:
        (n,) = _U32.unpack_from(buf, pos)
        pos += 4
        end = pos + n
        if end > len(buf):
            raise ValueError("field value runs past its table")
        if tag == 0x53:  # S: text when it is UTF-8, as pamqp and pika give it
            raw = bytes(buf[pos:end])
            try:
                return raw.decode("utf-8"), end
            except UnicodeDecodeError:
                return raw, end
        if tag == 0x78:  # x
            return bytes(buf[pos:end]), end
        if tag == 0x46:  # F
            return _decode_entries(buf, pos, end), end
        items = []
        while pos < end:
            v, pos = decode_value(buf, pos)
            items.append(v)
        return items, end
    if tag == 0x44:  # D
        scale, raw_value = _DECIMAL.unpack_from(buf, pos)
        return decimal.Decimal(raw_value).scaleb(-scale), pos + 5
    if tag == 0x56:  # V
        return None, pos
    raise ValueError(f"unknown field type {chr(tag)!r}")


def _decode_entries(buf: bytes | bytearray | memoryview, pos: int, end: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    while pos < end:
        klen = buf[pos]
        key = bytes(buf[pos + 1:pos + 1 + klen]).decode("utf-8", "surrogateescape")
        value, pos = decode_value(buf, pos + 1 + klen)
        out[key] = value
    if pos != end:
        raise ValueError("field table entry runs past the table")
    return out


def decode_table(buf: bytes | bytearray | memoryview, pos: int = 0) -> tuple[dict[str, Any], int]:
    """Decode a length-prefixed table at ``pos`` -> ``(dict, next_pos)``."""
    (n,) = _U32.unpack_from(buf, pos)
    end = pos + 4 + n
    if end > len(buf):
        raise ValueError("field table runs past its frame")
    return _decode_entries(buf, pos + 4, end), end


def _long(data: bytes) -> bytes:
    return _U32.pack(len(data)) + data


def encode_value(value: Any) -> bytes:
    """Encode one tagged value. Plain Python values take RabbitMQ's own choice of type
    (an int is ``l``, a float ``d``, a str ``S``); wrap in :class:`Typed` to choose."""
    if isinstance(value, Typed):
        tag = ord(value.tag)
        v = value.value
        fixed = _FIXED.get(tag)
        if fixed is not None:
            if tag == 0x54 and isinstance(v, datetime.datetime):
                v = int(v.timestamp())
            return bytes((tag,)) + fixed.pack(v)
        if tag == 0x53:  # S
            return b"S" + _long(v.encode("utf-8") if isinstance(v, str) else bytes(v))
        if tag == 0x78:  # x
            return b"x" + _long(bytes(v))
        if tag == 0x44:
            return b"D" + _encode_decimal(v)
        if tag == 0x46:
            return b"F" + encode_table(v)
        if tag == 0x41:
            return b"A" + _long(b"".join(encode_value(i) for i in v))
        if tag == 0x56:
            return b"V"
        raise ValueError(f"unknown field type {value.tag!r}")
    if isinstance(value, bool):
        return b"t\x01" if value else b"t\x00"
    if isinstance(value, int):
        return b"l" + _FIXED[ord("l")].pack(value)
    if isinstance(value, float):
        return b"d" + _FIXED[ord("d")].pack(value)
    if isinstance(value, str):
        return b"S" + _long(value.encode("utf-8"))
    if isinstance(value, bytes | bytearray | memoryview):
        return b"x" + _long(bytes(value))
    if isinstance(value, decimal.Decimal):
        return b"D" + _encode_decimal(value)
    if isinstance(value, datetime.datetime):
        return b"T" + _FIXED[ord("T")].pack(int(value.timestamp()))
    if isinstance(value, Mapping):
        return b"F" + encode_table(value)
    if isinstance(value, list | tuple):
        return b"A" + _long(b"".join(encode_value(i) for i in value))
    if value is None:
        return b"V"
    raise TypeError(f"cannot encode {type(value).__name__} in a field table")


def _encode_decimal(value: decimal.Decimal) -> bytes:
    sign, digits, exponent = value.as_tuple()
    if sign or not isinstance(exponent, int):
        raise ValueError(f"AMQP decimals are unsigned and finite: {value}")
    scale = max(0, -exponent)
    raw_value = int(value.scaleb(scale))
    return _DECIMAL.pack(scale, raw_value)


def encode_table_body(table: Mapping[str, Any]) -> bytes:
    """The entries of a table without the length prefix, in the mapping's order."""
    parts = []
    for key, value in table.items():
        k = key.encode("utf-8", "surrogateescape")  # a key that was not UTF-8 goes back as it came
        if len(k) > 255:
            raise ValueError(f"field table key over 255 bytes: {key[:32]!r}...")
        parts.append(bytes((len(k),)) + k + encode_value(value))
    return b"".join(parts)


def encode_table(table: Mapping[str, Any]) -> bytes:
    """A length-prefixed field table."""
    return _long(encode_table_body(table))
