"""Values left on disk (issue 15): a large value costs its location in memory, not its bytes,
once its batch is written; it is read back by ``get``, survives reopening and compaction
(its location moves into the snapshot), and a failed write keeps it in memory."""

from __future__ import annotations

import os

import pytest

from semantics.store import Store, StoreFailedError
from semantics.store import store as store_module
from semantics.store.format import OFFLOAD_MIN, location_file, snapshot_file_id


def _eio(fd: int) -> None:
    raise OSError(5, "Input/output error")


def _big(i: int) -> bytes:
    return bytes([i % 256]) * 1024


def test_large_values_leave_memory_once_written_and_read_back(tmp_path) -> None:
    with Store.open(os.fspath(tmp_path), fsync=False) as s:
        for i in range(100):
            s.put(f"m/{i}", _big(i))
        s.put("q/small", b"x" * (OFFLOAD_MIN - 1))
        held_pending = s.live_bytes
        assert held_pending > 100 * 1024
        s.sync()
        assert s.live_bytes < held_pending - 100 * (1024 - 64)  # the bodies went, their keys stayed
        assert s.data_bytes > 100 * 1024
        assert type(s._map["m/7"]) is int and type(s._map["q/small"]) is bytes
        assert s.get("m/7") == _big(7)
        assert dict(s.items("m/"))["m/42"] == _big(42)
        assert s.keys("q/") == ["q/small"]


def test_a_value_replaced_before_its_batch_is_written_is_not_pointed_at(tmp_path) -> None:
    with Store.open(os.fspath(tmp_path), fsync=False) as s:
        s.put("k", _big(1))
        s.put("k", _big(2))  # same batch: the map holds the second object only
        s.put("gone", _big(3))
        s.delete("gone")
        s.sync()
        assert s.get("k") == _big(2) and s.get("gone") is None


def test_reopen_indexes_without_loading_and_reads_back(tmp_path) -> None:
    d = os.fspath(tmp_path)
    with Store.open(d, fsync=False) as s:
        for i in range(50):
            s.put(f"m/{i}", _big(i))
        s.delete("m/3")
    with Store.open(d, fsync=False) as s:
        assert all(type(v) is int for v in s._map.values())
        assert s.get("m/49") == _big(49) and s.get("m/3") is None
        heads = {k: (h, n) for k, h, n in s.heads("m/", 10)}
        assert heads["m/5"] == (_big(5)[:10], 1024) and len(heads) == 49


def test_compaction_moves_locations_into_the_snapshot(tmp_path) -> None:
    d = os.fspath(tmp_path)
    with Store.open(d, fsync=False, compact_min_bytes=0) as s:
        for i in range(30):
            s.put(f"m/{i}", _big(i))
        s.sync()
        assert s.get("m/1") == _big(1)  # a read fd on segment 1 is open now
        assert s.maybe_compact(force=True)
        assert {location_file(v) for v in s._map.values()} == {snapshot_file_id(2)}
        assert not os.path.exists(os.path.join(d, "journal-00000001.log"))
        assert all(s.get(f"m/{i}") == _big(i) for i in range(30))
        s.put("m/new", _big(99))  # in segment 2, not in the snapshot
        s.sync()
        assert s.maybe_compact(force=True)
        assert s.get("m/new") == _big(99) and s.get("m/0") == _big(0)
    with Store.open(d, fsync=False) as s:
        assert len(s) == 31 and s.get("m/new") == _big(99) and s.get("m/29") == _big(29)


def test_M14_a_failed_write_keeps_values_in_memory_and_locates_them_after_the_retry(
        tmp_path, monkeypatch) -> None:
    s = Store.open(os.fspath(tmp_path))
    s.put("a", _big(1))
    monkeypatch.setattr(store_module.os, "fsync", _eio)
    with pytest.raises(StoreFailedError):
        s.sync()  # the batch is pending again, with its values
    monkeypatch.undo()
    assert type(s._map["a"]) is bytes
    s.put("b", _big(2))  # behind the put-back batch: its offset moves by that batch's size
    s.sync()
    assert (s.get("a"), s.get("b")) == (_big(1), _big(2))
    assert type(s._map["b"]) is int
    s.close()


def test_map_table_is_given_back_after_a_drain(tmp_path) -> None:
    with Store.open(os.fspath(tmp_path), fsync=False) as s:
        for i in range(20_000):
            s.put(f"m/{i}", b"v")
        s.sync()
        table = s._map
        for i in range(20_000):
            s.delete(f"m/{i}")
        s.put("q/kept", b"1")
        s.sync()
        assert s._map is not table and dict(s.items()) == {"q/kept": b"1"}


def test_prefix_scans_by_kind_follow_every_write(tmp_path) -> None:
    with Store.open(os.fspath(tmp_path), fsync=False) as s:
        for key in ("q/v/a", "q/v/ab", "q/w/a", "m/v/a/1", "plain"):
            s.put(key, b"1")
        assert s.keys("q/") == ["q/v/a", "q/v/ab", "q/w/a"]
        assert s.keys("q/v/a") == ["q/v/a", "q/v/ab"]  # a prefix inside a kind
        assert s.keys("pl") == ["plain"] and s.keys("x/") == []
        s.delete("q/v/ab")
        s.put("q/z", b"2")
        assert s.keys("q/") == ["q/v/a", "q/w/a", "q/z"]
        assert [k for k, _ in s.items("m/")] == ["m/v/a/1"]
