"""A2: the hand-written record formatter writes exactly what json.dumps of the normalised
record writes, for every field type and for fields outside the schema."""

from __future__ import annotations

import json
from typing import Any

import pytest

from gateway.audit import record
from gateway.audit.record import SCHEMA_VERSION, _normalise, format_line

TS = "2024-05-01T10:00:00.000001Z"


class _Str(str):
    """A str subclass: not the fast path's exact type, same JSON."""


def _reference(ts: str, event: str, vhost: str, fields: dict[str, Any]) -> str:
    rec: dict[str, Any] = {"v": SCHEMA_VERSION, "ts": ts, "event": event, "vhost": vhost}
    for k, v in fields.items():
        if k not in rec and v is not None:
            rec[k] = _normalise(k, v)
    return json.dumps(rec, ensure_ascii=False, separators=(",", ":"), default=str) + "\n"


CASES: list[tuple[str, str, dict[str, Any]]] = [
    ("deliver", "/", {"queue": "q", "msg_id": "msg-1", "attempt": 1, "size": 16}),
    ("retry", '/v"h', {"topic": "t\u00e9\n", "subscription": ["a", "b"], "tags": ["a", 7],
                       "attempt": True, "next_at": 1_714_557_615.25, "conn": 12, "size": None,
                       "latency_ms": 3}),
    ("x", "/", {"latency_ms": float("nan"), "other": {"a": [1, 2]}, "v": 5, "ts": "no",
                "next_at": "as given", "weird": b"x"}),
    ("x", "/", {"latency_ms": float("inf"), "size": 3.7, "attempt": -2, "tags": (), "policy": None,
                "reason": "r\x00\\", "dropped": 10**20}),
    ("route", "\u2603", {"subscription": "s", "routing_key": "a.b", "latency_ms": -0.0}),
    ("odd keys", "/", {"a b\"c": 1, "\u00e9": "x", "queue": 5, "tags": ["x"]}),
    ("empty", "/", {}),
    ("ack", "/", {"user": "guest", "peer": "127.0.0.1:2", "queue": "q{}", "msg_id": "m\"1", "size": 16}),
    ("ack", "/", {"user": "guest", "peer": "127.0.0.1:2", "queue": _Str("q"), "msg_id": "m", "size": True}),
]


@pytest.mark.parametrize("generated", [True, False])
@pytest.mark.parametrize(("event", "vhost", "fields"), CASES)
def test_A2_format_line_matches_json_dumps(event: str, vhost: str, fields: dict[str, Any], generated: bool,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """Both the per-shape generated formatter and the generic loop (used past the shape cap)."""
    if not generated:
        monkeypatch.setattr(record, "_SHAPES", {})
        monkeypatch.setattr(record, "_SHAPES_MAX", 0)
    for _ in range(2):  # the second call reuses the compiled shape
        line = format_line(TS, event, vhost, fields)
        assert line == _reference(TS, event, vhost, fields)
        assert line.endswith("\n") and "\n" not in line[:-1]
