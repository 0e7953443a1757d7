"""Damaged store files: torn tails are set aside and cut, corruption of confirmed data is refused
(or salvaged on request), and damaged bytes are never returned as data.

Every offset of a small journal is tried, so each header field and record byte is covered.
"""

from __future__ import annotations

import os
import shutil

import pytest

from semantics.store import Store, StoreCorruptError
from semantics.store.checkpoint import remove_checkpoint

SEG = "journal-00000001.log"

# Five batches; each one is a list of (key, value or None for delete).
BATCHES: list[list[tuple[str, bytes | None]]] = [
    [("q/v/a", b"alpha"), ("q/v/b", b"beta")],
    [("m/v/a/1", b"x" * 40)],
    [("q/v/a", None), ("m/v/a/2", b"y" * 3)],
    [("m/v/a/1", b"z" * 7), ("u/guest", b"")],
    [("q/v/c", b"gamma"), ("m/v/a/2", None)],
]


def _state(batches: list[list[tuple[str, bytes | None]]]) -> dict[str, bytes]:
    state: dict[str, bytes] = {}
    for batch in batches:
        for key, value in batch:
            if value is None:
                state.pop(key, None)
            else:
                state[key] = value
    return state


def _write(directory: str) -> list[int]:
    """Write BATCHES, one sync each; returns the journal offset where each batch ends."""
    ends = []
    with Store.open(directory, fsync=False) as s:
        for batch in BATCHES:
            for key, value in batch:
                if value is None:
                    s.delete(key)
                else:
                    s.put(key, value)
            s.sync()
            ends.append(os.path.getsize(os.path.join(directory, SEG)))
    return ends


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, list[int], bytes]:
    d = os.fspath(tmp_path_factory.mktemp("pristine"))
    ends = _write(d)
    with open(os.path.join(d, SEG), "rb") as f:
        return d, ends, f.read()


def _copy(pristine_dir: str, where: str) -> str:
    """A copy to damage, without the checkpoint the clean close left: damage is found by
    a replay, which a checkpoint skips by design (a killed process leaves none)."""
    shutil.copytree(pristine_dir, where)
    remove_checkpoint(where, do_fsync=False)
    return where


def _asides(directory: str) -> list[str]:
    return sorted(n for n in os.listdir(directory) if ".torn-" in n or ".corrupt-" in n)


def test_truncation_at_every_offset_keeps_every_whole_batch_before_it(pristine, tmp_path) -> None:
    src, ends, raw = pristine
    for cut in range(len(raw)):
        d = _copy(src, os.path.join(tmp_path, f"cut{cut}"))
        with open(os.path.join(d, SEG), "r+b") as f:
            f.truncate(cut)
        whole = sum(1 for e in ends if e <= cut)
        good_end = ends[whole - 1] if whole else 0
        with Store.open(d, fsync=False) as s:
            assert dict(s.items()) == _state(BATCHES[:whole]), cut
            assert s.recovery.torn_bytes == cut - good_end
            assert os.path.getsize(os.path.join(d, SEG)) == good_end
            if cut > good_end:
                (aside,) = _asides(d)
                assert s.recovery.aside_path == os.path.join(d, aside)
                with open(s.recovery.aside_path, "rb") as f:
                    assert f.read() == raw[good_end:cut]
            else:
                assert _asides(d) == [] and s.recovery.aside_path is None
            s.put("after", b"1")  # appends right after the last good batch
        with Store.open(d, fsync=False) as s:
            assert s.recovery.torn_bytes == 0 and s.get("after") == b"1"
        shutil.rmtree(d)


def test_flipped_byte_in_last_batch_is_a_torn_write(pristine, tmp_path) -> None:
    src, ends, raw = pristine
    for at in range(ends[-2], ends[-1]):
        d = _copy(src, os.path.join(tmp_path, f"flip{at}"))
        with open(os.path.join(d, SEG), "r+b") as f:
            f.seek(at)
            f.write(bytes([raw[at] ^ 0x5A]))
        with Store.open(d, fsync=False) as s:
            assert dict(s.items()) == _state(BATCHES[:-1]), at
            assert s.recovery.torn_bytes == ends[-1] - ends[-2]
        shutil.rmtree(d)


def test_flipped_byte_before_later_batches_is_refused_then_salvaged(pristine, tmp_path) -> None:
    src, ends, raw = pristine
    starts = [0] + ends[:-1]
    for at in range(ends[-2]):
        hit = next(i for i, e in enumerate(ends) if at < e)
        d = _copy(src, os.path.join(tmp_path, f"flip{at}"))
        damaged = raw[:at] + bytes([raw[at] ^ 0xFF]) + raw[at + 1:]
        with open(os.path.join(d, SEG), "wb") as f:
            f.write(damaged)
        with pytest.raises(StoreCorruptError, match=rf"damaged durable data at offset {starts[hit]}\.\.{ends[hit]}"):
            Store.open(d, fsync=False)
        assert _asides(d) == []  # refusing changes nothing on disk
        with Store.open(d, fsync=False, salvage=True) as s:
            # Every batch that verifies is kept; the damaged one is dropped whole.
            assert dict(s.items()) == _state(BATCHES[:hit] + BATCHES[hit + 1:]), at
            assert len(s.recovery.damaged) == 1
            assert s.recovery.torn_bytes == ends[hit] - starts[hit]
            with open(s.recovery.aside_path, "rb") as f:
                assert f.read() == damaged[starts[hit]:ends[hit]]
        remove_checkpoint(d, do_fsync=False)
        with Store.open(d, fsync=False) as s:  # the salvage wrote a clean snapshot
            assert s.recovery.damaged == [] and s.recovery.torn_bytes == 0
            assert dict(s.items()) == _state(BATCHES[:hit] + BATCHES[hit + 1:])
        shutil.rmtree(d)


def test_damaged_snapshot_is_refused_and_salvage_returns_only_intact_values(tmp_path) -> None:
    d = os.fspath(tmp_path / "s")
    with Store.open(d, fsync=False) as s:
        for i in range(20):
            s.put(f"k{i:02d}", f"value-{i}".encode() * 3)
        s.maybe_compact(force=True)
        s.put("after", b"snapshot")
    truth = {f"k{i:02d}": f"value-{i}".encode() * 3 for i in range(20)} | {"after": b"snapshot"}
    snap = os.path.join(d, "snapshot-00000002.snap")
    size = os.path.getsize(snap)
    for at in range(0, size, 7):
        work = _copy(d, os.fspath(tmp_path / f"w{at}"))
        path = os.path.join(work, "snapshot-00000002.snap")
        with open(path, "r+b") as f:
            f.seek(at)
            byte = f.read(1)
            f.seek(at)
            f.write(bytes([byte[0] ^ 0x01]))
        with pytest.raises(StoreCorruptError, match="damaged snapshot"):
            Store.open(work, fsync=False)
        if at < 24:  # the header itself: which LSN the snapshot covers is unknown
            with pytest.raises(StoreCorruptError):
                Store.open(work, fsync=False, salvage=True)
            continue
        with Store.open(work, fsync=False, salvage=True) as s:
            got = dict(s.items())
            assert got["after"] == b"snapshot"
            assert all(truth[k] == v for k, v in got.items()), at
            assert len(got) < len(truth) and len(s.recovery.damaged) == 1
        shutil.rmtree(work)


def test_missing_segment_is_refused(tmp_path) -> None:
    d = os.fspath(tmp_path)
    with Store.open(d, fsync=False) as s:
        s.put("a", b"1")
    os.rename(os.path.join(d, SEG), os.path.join(d, "journal-00000003.log"))
    with pytest.raises(StoreCorruptError, match="earlier segments are missing"):
        Store.open(d)


def test_lsn_gap_between_segments_is_refused(tmp_path) -> None:
    d = os.fspath(tmp_path)
    with Store.open(d, fsync=False) as s:
        s.put("a", b"1")
        s.sync()
        with open(os.path.join(d, SEG), "rb") as f:
            one_batch = f.read()
        s.put("b", b"2")
    # A second segment that starts again at LSN 1: a batch of the journal went missing.
    with open(os.path.join(d, "journal-00000002.log"), "wb") as f:
        f.write(one_batch)
    with pytest.raises(StoreCorruptError, match="batch starts at lsn 1, expected 3"):
        Store.open(d)


def test_leftover_snapshot_temp_file_is_ignored_and_removed(tmp_path) -> None:
    d = os.fspath(tmp_path)
    with Store.open(d, fsync=False) as s:
        s.put("a", b"1")
    with open(os.path.join(d, "snapshot-00000002.snap.tmp"), "wb") as f:
        f.write(b"CQS1 half written")
    with Store.open(d) as s:
        assert dict(s.items()) == {"a": b"1"}
    assert sorted(os.listdir(d)) == ["LOCK", "checkpoint.idx", SEG]
