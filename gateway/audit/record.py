"""One audit record as one JSON line (A2), schema version 2.

The writer thread, not ``emit()``, calls ``format_line``: the event loop only appends a tuple.
Field types are normalised here so that readers can rely on one JSON type per field (the Spark
connector parses with an explicit schema; a field of the wrong JSON type would cost it a slow
line-by-line fallback).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from typing import Any

import msgspec

__all__ = [
    "ADMIN_EVENTS",
    "EVENTS",
    "FIELD_TYPES",
    "SCHEMA_VERSION",
    "format_line",
    "format_ts",
    "formatter",
    "line_writer",
]

# 2 (issue 27, A6): ``origin`` says a record is not a client's action as it happened:
# "recovery" (what a start restored: queue_declare, bind, limit_exceeded of saved objects) or
# "rebuilt" (a client's publish/enqueue whose record a crash lost, written again at the start
# from the store, gateway.audit.rebuild). Absent: the client's action, recorded as it happened.
SCHEMA_VERSION = 2

# Administrative changes over the management API (gateway.management.admin_audit).
ADMIN_EVENTS = ("user_created", "user_deleted", "user_password_changed", "user_tags_set", "vhost_created",
                "vhost_deleted", "permission_created", "permission_deleted", "policy_set", "policy_cleared")

# The event names of the audit contract (docs/ARCHITECTURE.md), plus ``audit_dropped``, which
# the writer itself emits when it had to shed records (never silent).
EVENTS = frozenset(
    {
        "connection_open", "connection_close", "auth_failure",
        "exchange_declare", "exchange_delete", "queue_declare", "queue_delete", "queue_purge",
        "bind", "unbind", "publish", "route", "discard", "enqueue", "deliver", "ack", "nack",
        "requeue", "visibility_expire", "stale_ack", "retry", "rewind", "dead_letter",
        "limit_exceeded", "audit_dropped", *ADMIN_EVENTS,
    }
)

# JSON type of each optional field; ``ts``/``next_at`` are UTC ISO-8601 strings with
# microseconds and ``Z``.  Anything else an emitter passes is written as given and ignored by
# the typed reader (forward compatible).
FIELD_TYPES: Mapping[str, str] = {
    "topic": "string", "queue": "string", "subscription": "string", "msg_id": "string",
    "tags": "array<string>", "routing_key": "string", "size": "long", "attempt": "int",
    "reason": "string", "user": "string", "peer": "string", "latency_ms": "double",
    "next_at": "timestamp", "policy": "string", "conn": "string", "dropped": "long",
    "protocol": "string",  # CA4: the API that carried it when not AMQP ("cmq-api", "mqtt")
    # limit_exceeded (PF4): the CMQ rule, the number that broke it and the limit, and the
    # object (``exchange:<name>``, ``queue:<name>``, ``binding:<exchange>-><sub>``).
    "rule": "string", "value": "long", "limit": "long", "object": "string",
    "origin": "string",  # A6: "recovery" | "rebuilt" (see SCHEMA_VERSION)
    "auto_ack": "boolean",  # a deliver that needs no ack (gateway.audit.rows DELIVER_AUTO)
}

_STR_FIELDS = frozenset(k for k, t in FIELD_TYPES.items() if t == "string")
_INT_FIELDS = frozenset(k for k, t in FIELD_TYPES.items() if t in ("int", "long"))

# Formatting a datetime costs microseconds; records arrive many per second, so the
# "YYYY-MM-DDTHH:MM:SS" prefix is cached per whole second.  One tuple, swapped atomically, so
# that two writer threads never pair a second with another second's prefix.
_cache: tuple[int, str] = (-1, "")
# The microseconds as text, in two table lookups: ``f"{us:06d}"`` cost 320 ns, a sixth of the
# writer process's time per record (py-spy); ``MILLI[us // 1000] + MICRO_Z[us % 1000]`` 90 ns.
MILLI = [f"{i:03d}" for i in range(1000)]
MICRO_Z = [f"{i:03d}Z" for i in range(1000)]


def format_ts(t: float) -> str:
    """Unix seconds → ``2024-05-01T10:00:00.123456Z``."""
    global _cache
    sec = int(t)
    us = round((t - sec) * 1_000_000)  # an int already
    if us >= 1_000_000:  # rounding carried into the next second
        sec += 1
        us -= 1_000_000
    cached_sec, prefix = _cache
    if sec != cached_sec:
        prefix = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(sec))
        _cache = (sec, prefix)
    return f"{prefix}.{MILLI[us // 1000]}{MICRO_Z[us % 1000]}"


def _normalise(key: str, value: Any) -> Any:
    if value is None:
        return None
    if key in _STR_FIELDS:
        return value if isinstance(value, str) else str(value)
    if key in _INT_FIELDS:
        return value if type(value) is int else int(value)
    if key == "latency_ms":
        return float(value)
    if key == "tags":
        return [t if isinstance(t, str) else str(t) for t in value]
    if key == "next_at" and isinstance(value, int | float):
        return format_ts(float(value))
    return value


_dumps = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), default=str).encode
# The C string escaper behind json.dumps(ensure_ascii=False): quotes and escapes one str.
_esc = json.encoder.encode_basestring

# Hand-written formatting, because this is a measured hot path: the writer thread formats
# several records per message (publish, enqueue, deliver, ack) while holding the GIL, and the
# generic JSONEncoder (dict built, then walked by iterencode) cost ~11 µs a record, a third of
# the gateway's CPU at 20k msg/s. The record shape is fixed (FIELD_TYPES), so each known key
# has its '","key":' prefix ready and its value written by type. The output is byte for byte
# what ``_dumps`` of the normalised dict gives (tests/unit/audit checks it against it).
_S, _I, _F, _L, _T = range(5)
# A boolean is written by json (true/false), as a key outside the schema is.
_KIND = {k: {"string": _S, "long": _I, "int": _I, "double": _F, "array<string>": _L,
             "timestamp": _T, "boolean": None}[t] for k, t in FIELD_TYPES.items()}
_KEY = {k: f",{_esc(k)}:" for k in FIELD_TYPES}
_RESERVED = frozenset(("v", "ts", "event", "vhost"))
_HEAD = f'{{"v":{SCHEMA_VERSION},"ts":'
_INF = float("inf")


def format_line(ts: str, event: str, vhost: str, fields: Mapping[str, Any]) -> str:
    """One record, newline-terminated; ``ts`` comes from ``format_ts`` (the writer also derives
    the file's dt/hour folder from it, so folder and record always agree).  ``v``/``ts``/
    ``event``/``vhost`` come first and cannot be overridden by a field of the same name."""
    shape = tuple(fields)
    fmt = _SHAPES.get(shape)
    if fmt is None:
        if len(_SHAPES) >= _SHAPES_MAX:
            return _format_generic(ts, event, vhost, fields)
        fmt = _SHAPES[shape] = _compile(shape)
    return fmt(ts, event, vhost, *fields.values())  # type: ignore[no-any-return]


def formatter(shape: tuple[str, ...]) -> Callable[..., str]:
    """The formatter of records with exactly these keys in this order: ``fmt(ts, event, vhost,
    *values)`` gives what ``format_line(ts, event, vhost, dict(zip(shape, values)))`` gives."""
    fmt = _SHAPES.get(shape)
    if fmt is None:
        fmt = _SHAPES[shape] = _compile(shape)
    return fmt


# Each emitter passes the same keys in the same order (a call site is a "shape"), so the
# formatter of a shape is generated once: the values are unpacked positionally and written by
# their schema type, without a lookup per field. ~40% cheaper than the loop below (measured:
# 1.8 -> 1.1 us for a deliver record). A shape past _SHAPES_MAX uses the loop.
_SHAPES: dict[tuple[str, ...], Callable[..., str]] = {}
_SHAPES_MAX = 512


def _fmt_int(v: Any) -> str:
    return int.__repr__(v if type(v) is int else int(v))


def _fmt_str(v: Any) -> str:
    return _esc(v if isinstance(v, str) else str(v))


def _fmt_list(v: Any) -> str:
    return "[" + ",".join([_esc(t if isinstance(t, str) else str(t)) for t in v]) + "]"


def _fmt_float(v: Any) -> str:
    f = float(v)
    # json writes NaN and the infinities as words; repr otherwise.
    return float.__repr__(f) if -_INF < f < _INF else _dumps(f)


def _fmt_ts(v: Any) -> str:
    return _esc(format_ts(float(v))) if isinstance(v, int | float) else _dumps(v)


_KIND_FN = {_S: "_fmt_str", _I: "_fmt_int", _L: "_fmt_list", _F: "_fmt_float", _T: "_fmt_ts"}


def _braces(text: str) -> str:
    """``text`` as literal text inside an f-string."""
    return text.replace("{", "{{").replace("}", "}}")


def _written(args: list[str], shape: tuple[str, ...]) -> list[tuple[str, str, int | None]]:
    """``(argument, key, kind)`` of the keys a record of ``shape`` writes: a reserved key or a
    key given twice is not (the first one given is)."""
    seen: set[str] = set()
    out = []
    for arg, key in zip(args, shape, strict=True):
        if key not in _RESERVED and key not in seen:
            seen.add(key)
            out.append((arg, key, _KIND.get(key)))
    return out


def _compile(shape: tuple[str, ...]) -> Callable[..., str]:
    args = [f"a{i}" for i in range(len(shape))]
    # The usual record first: every value present and already of its schema type (str for
    # strings, int for integers), checked in one condition and written with one f-string.
    # Otherwise each value is tested for None and written by its kind.
    fast_checks: list[str] = []
    fast_parts = [_braces(_HEAD), "{_esc(ts)}", ',"event":{_esc(event)},"vhost":{_esc(vhost)}']
    fast_ok = True
    slow = [f"    out = [{_HEAD!r}, _esc(ts), ',\"event\":', _esc(event), ',\"vhost\":', _esc(vhost)]"]
    for arg, key, kind in _written(args, shape):
        prefix = _KEY[key] if kind is not None else f",{_esc(key)}:"
        if kind is _S:
            fast_checks.append(f"{arg}.__class__ is str")
            fast_parts.append(_braces(prefix) + "{_esc(" + arg + ")}")
            value = f"_esc({arg}) if {arg}.__class__ is str else _fmt_str({arg})"
        elif kind is _I:
            fast_checks.append(f"{arg}.__class__ is int")
            fast_parts.append(_braces(prefix) + "{" + arg + "}")
            value = f"int.__repr__({arg}) if {arg}.__class__ is int else _fmt_int({arg})"
        else:
            fast_ok = False
            value = f"_dumps({arg})" if kind is None else f"{_KIND_FN[kind]}({arg})"
        slow += [f"    if {arg} is not None:", f"        out.append({prefix!r})", f"        out.append({value})"]
    lines = [f"def fmt(ts, event, vhost, {', '.join(args)}):" if args else "def fmt(ts, event, vhost):"]
    if fast_ok:
        lines += [f"    if {' and '.join(fast_checks) or 'True'}:",
                  "        return f" + repr("".join(fast_parts) + "}}\n")]
    lines += slow + ["    out.append('}\\n')", "    return ''.join(out)"]
    namespace: dict[str, Any] = {"_esc": _esc, "_dumps": _dumps, "_fmt_str": _fmt_str, "_fmt_int": _fmt_int,
                                 "_fmt_list": _fmt_list, "_fmt_float": _fmt_float, "_fmt_ts": _fmt_ts}
    exec("\n".join(lines), namespace)  # noqa: S102 (code built from the schema, keys escaped)
    return namespace["fmt"]  # type: ignore[no-any-return]


def _format_generic(ts: str, event: str, vhost: str, fields: Mapping[str, Any]) -> str:
    parts = [_HEAD, _esc(ts), ',"event":', _esc(event), ',"vhost":', _esc(vhost)]
    append = parts.append
    for k, v in fields.items():
        if v is None:
            continue
        kind = _KIND.get(k)
        if kind is _S:
            append(_KEY[k])
            append(_esc(v if isinstance(v, str) else str(v)))
        elif kind is _I:
            append(_KEY[k])
            append(int.__repr__(v if type(v) is int else int(v)))
        elif kind is _L:
            append(_KEY[k])
            append(_fmt_list(v))
        elif kind is _F:
            append(_KEY[k])
            append(_fmt_float(v))
        elif kind is _T:
            append(_KEY[k])
            append(_fmt_ts(v))
        elif k not in _RESERVED:
            append(f",{_esc(k)}:")
            append(_dumps(v))
    append("}\n")
    return "".join(parts)


# The broker's per-message records (gateway.audit.rows) are encoded by msgspec, a compiled
# encoder, straight into one bytearray per batch: the per-shape function only builds the
# record's dict (values already of their schema type pass as they are). orjson was measured
# too and dropped: each line is a bytes object of its own, and holding a batch of them cost
# 3.1 us a record against the str formatter's 1.2 (scenario 1's four records, lines kept until
# written as the writer does); msgspec into a bytearray, 0.9. The bytes are exactly
# ``format_line(...).encode()`` (tests/unit/audit/test_line_bytes.py): msgspec escapes strings
# as json does with ensure_ascii=False, and what it writes otherwise (a float's exponent form,
# NaN) is written by the json-based helpers above and passed as Raw JSON.
_encode_into = msgspec.json.Encoder().encode_into
_Raw = msgspec.Raw


def _raw_float(v: Any) -> msgspec.Raw:
    return _Raw(_fmt_float(v))


def _raw_list(v: Any) -> msgspec.Raw:
    return _Raw(_fmt_list(v))


def _raw_ts(v: Any) -> msgspec.Raw:
    return _Raw(_fmt_ts(v))


def _raw_any(v: Any) -> msgspec.Raw:
    return _Raw(_dumps(v))


def _as_str(v: Any) -> str:
    return str.__str__(v) if isinstance(v, str) else str(v)


def _as_int(v: Any) -> int:
    return int(v)


def line_writer(shape: tuple[str, ...]) -> Callable[..., None]:
    """``put(out, ts, event, vhost, *values)`` appends the record's line to the bytearray
    ``out``: what ``formatter(shape)(ts, event, vhost, *values).encode()`` gives."""
    args = [f"a{i}" for i in range(len(shape))]
    body = [f"d = {{'v': {SCHEMA_VERSION}, 'ts': ts, 'event': event, 'vhost': vhost}}"]
    for arg, key, kind in _written(args, shape):
        if kind is _S:
            value = f"{arg} if {arg}.__class__ is str else _as_str({arg})"
        elif kind is _I:
            value = f"{arg} if {arg}.__class__ is int else _as_int({arg})"
        else:
            value = f"{ {None: '_raw_any', _F: '_raw_float', _L: '_raw_list', _T: '_raw_ts'}[kind]}({arg})"
        body += [f"if {arg} is not None:", f"    d[{key!r}] = {value}"]
    params = ", ".join(["ts", "event", "vhost", *args])
    lines = [f"def put(out, {params}):", "    n = len(out)", "    try:",
             *(f"        {b}" for b in body),
             "        _encode_into(d, out, -1)",
             "    except Exception:",  # whatever msgspec refuses, format_line's path decides
             "        del out[n:]",
             f"        out += _slow({params}).encode()",
             "        return",
             "    out.append(10)"]
    namespace: dict[str, Any] = {
        "_encode_into": _encode_into, "_slow": formatter(shape), "_as_str": _as_str, "_as_int": _as_int,
        "_raw_float": _raw_float, "_raw_list": _raw_list, "_raw_ts": _raw_ts, "_raw_any": _raw_any}
    exec("\n".join(lines), namespace)  # noqa: S102 (code built from the schema, keys repr'd)
    return namespace["put"]  # type: ignore[no-any-return]
