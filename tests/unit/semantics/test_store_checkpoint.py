"""The checkpoint a clean close leaves (semantics/store/checkpoint.py): the next open loads the
map from it instead of replaying the journal, and gets exactly what a replay gets; a stale,
torn or foreign checkpoint is ignored (the journal is replayed)."""

from __future__ import annotations

import os
import random
import shutil
from collections.abc import Callable

import pytest

from semantics.store import Store
from semantics.store.checkpoint import CHECKPOINT_NAME, remove_checkpoint
from semantics.store.format import OFFLOAD_MIN


def _state(s: Store) -> tuple[list[tuple[str, bytes]], int, int, int, dict[str, list[str]]]:
    """Everything a reopened store answers: entries in map order (the broker's recovery
    relies on it), LSN, byte counts, and the keys of each kind."""
    kinds = {p: s.keys(p) for p in ("m/", "q/", "x/", "u/", "m/v/q1/")}
    return list(s.items()), s.last_lsn, s.data_bytes, s.live_bytes, kinds


def _replayed(d: str, where: str) -> tuple[Store, object]:
    """Open a copy of ``d`` without its checkpoint: what a replay of the journal gives."""
    shutil.copytree(d, where)
    remove_checkpoint(where, do_fsync=False)
    s = Store.open(where, fsync=False)
    assert not s.recovery.checkpoint
    return s, _state(s)


def _random_history(d: str, rng: random.Random, ops: int) -> None:
    keys = [f"{kind}/v/q{i % 3}/{i}" for kind in ("m", "q", "x") for i in range(40)] + ["u/guest", "nokind"]
    with Store.open(d, fsync=False, compact_min_bytes=1 << 12, compact_ratio=1.5) as s:
        for _ in range(ops):
            key = rng.choice(keys)
            if rng.random() < 0.25:
                s.delete(key)
            else:
                size = rng.choice([0, 5, OFFLOAD_MIN - 1, OFFLOAD_MIN, 1000, 5000])
                s.put(key, rng.randbytes(size))
            if rng.random() < 0.1:
                s.sync()
                s.maybe_compact()


def test_clean_close_writes_a_checkpoint_the_next_open_uses_and_removes(tmp_path) -> None:
    d = os.fspath(tmp_path / "d")
    big = os.urandom(4000)
    with Store.open(d) as s:
        s.put("q/v/a", b"queue")
        s.put("m/v/a/1", big)
        s.put("m/v/a/2", b"small")
        s.delete("q/v/a")
    assert os.path.exists(os.path.join(d, CHECKPOINT_NAME))
    replay, expected = _replayed(d, os.fspath(tmp_path / "copy"))
    replay.close()
    with Store.open(d) as s:
        assert s.recovery.checkpoint and s.recovery.records == 2
        assert _state(s) == expected
        assert s.get("m/v/a/1") == big
        assert s.put("x/v/b", b"next") == 5
        assert os.path.exists(os.path.join(d, CHECKPOINT_NAME))  # nothing written yet: still exact
        s.sync()
        assert not os.path.exists(os.path.join(d, CHECKPOINT_NAME))  # gone before the first write


def test_a_close_with_nothing_written_leaves_the_checkpoint_as_it_was(tmp_path) -> None:
    d = os.fspath(tmp_path / "d")
    with Store.open(d) as s:
        s.put("m/v/a/1", os.urandom(300))
    with open(os.path.join(d, CHECKPOINT_NAME), "rb") as f:
        before = f.read()
    with Store.open(d) as s:
        assert s.recovery.checkpoint and len(s) == 1
    with open(os.path.join(d, CHECKPOINT_NAME), "rb") as f:
        assert f.read() == before
    with Store.open(d) as s:
        assert s.recovery.checkpoint and s.keys() == ["m/v/a/1"]
        s.maybe_compact(force=True)  # a compaction writes too
        assert not os.path.exists(os.path.join(d, CHECKPOINT_NAME))
    with Store.open(d) as s:
        assert s.recovery.checkpoint and s.keys() == ["m/v/a/1"]


@pytest.mark.parametrize("seed", range(12))
def test_checkpoint_gives_what_a_replay_gives(tmp_path, seed) -> None:
    rng = random.Random(seed)
    d = os.fspath(tmp_path / "d")
    for round_ in range(3):  # each open from a checkpoint, then more history on top of it
        _random_history(d, rng, rng.randint(1, 400))
        replay, expected = _replayed(d, os.fspath(tmp_path / f"copy{round_}"))
        with Store.open(d, fsync=False) as s:
            assert s.recovery.checkpoint
            assert _state(s) == expected
            # Both keep working alike: the kinds a checkpoint gave follow later puts.
            for store in (s, replay):
                store.put("q/v/new", b"1")
                store.put("m/v/q1/new", os.urandom(300))
                store.delete("m/v/q1/1")
            assert s.keys("q/") == replay.keys("q/") and s.keys("m/v/q1/") == replay.keys("m/v/q1/")
            s.sync()
        replay.close()


def _outlived_checkpoint(d: str, change: Callable[[Store], None]) -> None:
    """A clean close's checkpoint (``q/v/a`` = 1) that outlives the state it describes: the
    next open makes ``change`` and ends as a killed process (no checkpoint of its own), and
    the saved checkpoint is put back, as if its removal had never reached the disk."""
    with Store.open(d) as s:
        s.put("q/v/a", b"1")
    with open(os.path.join(d, CHECKPOINT_NAME), "rb") as f:
        saved = f.read()
    s = Store.open(d)
    change(s)
    s.close(sync=False)
    with open(os.path.join(d, CHECKPOINT_NAME), "wb") as f:
        f.write(saved)


def test_a_journal_grown_after_the_checkpoint_is_replayed(tmp_path) -> None:
    """A checkpoint whose removal never reached the disk, then more appends and a kill -9."""
    d = os.fspath(tmp_path / "d")

    def grow(s: Store) -> None:
        s.put("q/v/b", os.urandom(500))
        s.delete("q/v/a")
        s.sync()
    _outlived_checkpoint(d, grow)
    with Store.open(d) as s:
        assert not s.recovery.checkpoint
        assert s.keys() == ["q/v/b"] and s.last_lsn == 3


def test_a_compaction_after_the_checkpoint_makes_it_stale(tmp_path) -> None:
    d = os.fspath(tmp_path / "d")

    def compact(s: Store) -> None:
        s.put("q/v/a", b"2")
        s.maybe_compact(force=True)  # a new segment of size 0 and a snapshot
    _outlived_checkpoint(d, compact)
    with Store.open(d) as s:
        assert not s.recovery.checkpoint
        assert dict(s.items()) == {"q/v/a": b"2"}


def test_same_size_other_bytes_is_not_the_journal_the_checkpoint_saw(tmp_path) -> None:
    d = os.fspath(tmp_path / "d")
    with Store.open(d) as s:
        s.put("q/v/a", b"1" * 300)
        s.sync()
        s.put("q/v/b", b"2" * 300)
    seg = os.path.join(d, "journal-00000001.log")
    with open(seg, "r+b") as f:
        f.seek(-1, os.SEEK_END)
        f.write(b"3")  # a damaged last batch: the replay sets it aside as torn
    with Store.open(d) as s:
        assert not s.recovery.checkpoint and s.recovery.torn_bytes > 0
        assert dict(s.items()) == {"q/v/a": b"1" * 300}


def test_torn_or_damaged_checkpoint_is_ignored(tmp_path) -> None:
    d = os.fspath(tmp_path / "d")
    rng = random.Random(7)
    _random_history(d, rng, 300)
    path = os.path.join(d, CHECKPOINT_NAME)
    with open(path, "rb") as f:
        good = f.read()
    replay, expected = _replayed(d, os.fspath(tmp_path / "copy"))
    replay.close()
    cuts = sorted({0, 1, 3, 50, len(good) // 2, len(good) - 1} | {rng.randrange(len(good)) for _ in range(10)})
    flips = [rng.randrange(len(good)) for _ in range(20)]
    for n, damaged in enumerate([good[:c] for c in cuts] +
                                [good[:at] + bytes([good[at] ^ 0x10]) + good[at + 1:] for at in flips]):
        work = os.fspath(tmp_path / f"w{n}")
        shutil.copytree(d, work)
        with open(os.path.join(work, CHECKPOINT_NAME), "wb") as f:
            f.write(damaged)
        with Store.open(work, fsync=False) as s:
            assert not s.recovery.checkpoint, n
            assert _state(s) == expected
            assert not os.path.exists(os.path.join(work, CHECKPOINT_NAME))
        shutil.rmtree(work)


def test_no_checkpoint_when_the_last_sync_failed_or_was_dropped(tmp_path) -> None:
    d = os.fspath(tmp_path / "d")
    s = Store.open(d)
    s.put("q/v/a", b"1")
    s.close(sync=False)  # pending dropped: the map holds what the journal does not
    assert not os.path.exists(os.path.join(d, CHECKPOINT_NAME))
    with Store.open(d) as s:
        assert len(s) == 0
