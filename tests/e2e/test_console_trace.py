"""The message trace's reader (gateway/management/trace.py, SPEC UI3) over an audit directory
laid out as the writer lays it out (A3): closed files, the open one, folders by hour."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

from gateway.audit import layout
from gateway.management.trace import trace

NOW = dt.datetime(2026, 11, 28, 12, 30, tzinfo=dt.UTC).timestamp()


def _record(ts: str, event: str, vhost: str, msg_id: str, **fields: object) -> str:
    return json.dumps({"v": 2, "ts": ts, "event": event, "vhost": vhost, "msg_id": msg_id, **fields})


def _write(root: Path, ts: str, seq: int, lines: list[str], *, is_open: bool = False, torn: str = "") -> None:
    folder = root / layout.folder_for(ts)
    folder.mkdir(parents=True, exist_ok=True)
    name = layout.closed_name(ts, seq)
    path = Path(layout.open_path(str(folder / name))) if is_open else folder / name
    path.write_text("".join(line + "\n" for line in lines) + torn)


def test_UI3_trace_reads_closed_and_open_files_of_the_hours_asked(tmp_path: Path) -> None:
    _write(tmp_path, "2026-11-26T09:00:00.000000Z", 1, [  # two days old: outside 24 h
        _record("2026-11-26T09:00:01.000000Z", "publish", "/", "m1")])
    _write(tmp_path, "2026-11-28T11:00:00.000000Z", 2, [
        _record("2026-11-28T11:59:59.000000Z", "publish", "/", "m1", queue="q"),
        _record("2026-11-28T11:59:59.100000Z", "publish", "/", "m2", queue="q"),
        _record("2026-11-28T11:59:59.200000Z", "publish", "other", "m1", queue="q")])
    _write(tmp_path, "2026-11-28T12:00:00.000000Z", 3, [
        _record("2026-11-28T12:00:00.500000Z", "ack", "/", "m1", queue="q"),
        _record("2026-11-28T12:00:00.100000Z", "deliver", "/", "m1", queue="q", attempt=1)],
        is_open=True, torn='{"v":2,"ts":"2026-11-28T12:00:01.000000Z","event":"nack","vhost":"/","msg_id":"m1"')
    out = trace(str(tmp_path), "/", "m1", 24, NOW)
    assert [(r["event"], r["ts"][11:23]) for r in out["events"]] == [
        ("publish", "11:59:59.000"), ("deliver", "12:00:00.100"), ("ack", "12:00:00.500")]
    assert (out["files"], out["truncated"]) == (2, False)
    assert [r["event"] for r in trace(str(tmp_path), "/", "m1", 72, NOW)["events"]][0:2] == ["publish", "publish"]
    assert trace(str(tmp_path), "/", "nope", 24, NOW)["events"] == []
    assert trace(str(tmp_path / "missing"), "/", "m1", 24, NOW) == {
        "vhost": "/", "msg_id": "m1", "hours": 24, "files": 0, "events": [], "truncated": False}
