"""A5: which stored messages get their publish and enqueue records written again at a start
(gateway.audit.rebuild): exactly those the log does not hold, whether its segments are JSON
lines or compacted to Parquet with the JSON lines removed."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from gateway.audit import AuditLog, compact, layout, rebuild


def _log(directory: Path, ids: list[str]) -> None:
    with AuditLog(str(directory), process=False) as audit:
        for mid in ids:
            audit.emit("publish", "/", queue="q", routing_key="q", msg_id=mid, size=3)
            audit.emit("enqueue", "/", queue="q", msg_id=mid, size=3)


def _stored(ids: list[str]):  # type: ignore[no-untyped-def]
    def stored(since: float) -> list[tuple[str, str, str, str, str, int]]:
        return [("/", "q", mid, "", "q", 3) for mid in ids]
    return stored


@pytest.mark.parametrize("compacted", [False, True])
def test_A5_only_stored_messages_missing_from_the_log_are_rebuilt(tmp_path: Path, compacted: bool,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(compact.MODE_ENV, "off")  # compacted here, by hand
    _log(tmp_path, ["m1", "m2"])
    if compacted:
        for af in list(layout.list_files(str(tmp_path))):
            compact.compact_segment(af.path, remove=True)
        assert not list(layout.list_files(str(tmp_path)))  # only Parquet left
    got = rebuild.missing(str(tmp_path), _stored(["m1", "m2", "m3"]))
    assert [(event, fields["msg_id"], fields["origin"]) for event, _vhost, fields in got] == [
        ("publish", "m3", "rebuilt"), ("enqueue", "m3", "rebuilt")]


def test_A5_only_messages_after_the_log_s_last_record_are_looked_up(tmp_path: Path) -> None:
    _log(tmp_path, ["m1"])
    last = rebuild.last_ts(str(tmp_path))
    assert last is not None and abs(last - time.time()) < 60
    asked: list[float] = []

    def stored(since: float) -> list[tuple[str, str, str, str, str, int]]:
        asked.append(since)
        return []

    assert rebuild.missing(str(tmp_path), stored) == []
    assert asked == [last - rebuild.MARGIN]
