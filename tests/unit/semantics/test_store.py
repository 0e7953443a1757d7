"""The durable store: API, reopen, LSNs, compaction boundaries and group commit across threads.

M14 rests on this: a confirm is sent only for what ``sync()`` reported durable.
"""

from __future__ import annotations

import os
import threading

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from semantics.store import Store, StoreClosedError, StoreFailedError, StoreLockedError
from semantics.store import store as store_module
from semantics.store.checkpoint import remove_checkpoint
from semantics.store.format import BATCH_HEADER, OFFLOAD_MIN, RECORD_HEADER
from tests.small_disk import fill, free, small_disk


@pytest.fixture(params=["memory", "disk"])
def store(request: pytest.FixtureRequest, tmp_path: os.PathLike[str]):
    s = Store.open(None if request.param == "memory" else os.fspath(tmp_path), fsync=False)
    yield s
    s.close()


def test_put_get_delete_items(store: Store) -> None:
    assert store.put("q/v/a", b"1") == 1
    assert store.put("q/v/b", b"2") == 2
    assert store.put("m/v/a/1", b"body") == 3
    assert store.get("q/v/a") == b"1"
    assert store.delete("q/v/a") == 4
    assert store.get("q/v/a") is None
    assert store.delete("absent") == 5  # deleting nothing still takes an LSN, and is fine
    assert sorted(store.items()) == [("m/v/a/1", b"body"), ("q/v/b", b"2")]
    assert sorted(store.items("q/")) == [("q/v/b", b"2")]
    assert len(store) == 2 and "q/v/b" in store


def test_M14_durable_lsn_moves_only_on_sync(store: Store) -> None:
    """M14: the durable LSN, which confirms wait for, advances only when sync() returns."""
    store.put("a", b"x")
    store.put("b", b"y")
    assert store.durable_lsn == 0
    assert store.last_lsn == 2
    assert store.sync() == 2
    assert store.durable_lsn == 2
    assert store.sync() == 2  # nothing new: same LSN, no empty batch


def test_items_may_be_mutated_while_iterating(store: Store) -> None:
    for i in range(10):
        store.put(f"k{i}", b"v")
    for key, _ in store.items():
        store.delete(key)
        store.put(key + "x", b"w")
    assert sorted(k for k, _ in store.items()) == sorted(f"k{i}x" for i in range(10))


def test_value_is_copied_from_mutable_buffers(store: Store) -> None:
    buf = bytearray(b"abc")
    store.put("k", buf)  # type: ignore[arg-type]
    buf[0] = ord("z")
    assert store.get("k") == b"abc"


def test_reopen_keeps_state_and_continues_lsns(tmp_path) -> None:
    d = os.fspath(tmp_path)
    big = os.urandom(1 << 20)  # values reach 1 MB (topic messages, L6)
    with Store.open(d) as s:
        s.put("a", b"1")
        s.put("big", big)
        s.delete("a")
        s.put("u/guest", b"")
        assert s.sync() == 4
    with Store.open(d) as s:
        assert dict(s.items()) == {"big": big, "u/guest": b""}
        assert (s.durable_lsn, s.last_lsn) == (4, 4)
        # The clean close left a checkpoint: the two live entries, no journal record replayed.
        assert s.recovery.checkpoint and s.recovery.records == 2
        assert s.recovery.torn_bytes == 0 and s.recovery.aside_path is None
        assert s.put("b", b"2") == 5


def test_close_syncs_pending(tmp_path) -> None:
    d = os.fspath(tmp_path)
    s = Store.open(d)
    s.put("a", b"1")
    s.close()
    with Store.open(d) as s:
        assert s.get("a") == b"1"


def test_closed_store_refuses(tmp_path) -> None:
    s = Store.open(os.fspath(tmp_path))
    s.close()
    s.close()  # idempotent
    with pytest.raises(StoreClosedError):
        s.put("a", b"1")


def test_second_open_of_one_directory_is_refused(tmp_path) -> None:
    with Store.open(os.fspath(tmp_path)), pytest.raises(StoreLockedError):
        Store.open(os.fspath(tmp_path))


def test_one_batch_per_sync_on_disk(tmp_path) -> None:
    d = os.fspath(tmp_path)
    with Store.open(d, fsync=False) as s:
        s.put("ab", b"xyz")
        s.delete("ab")
        assert s.pending_bytes == (RECORD_HEADER.size + 2 + 3) + (RECORD_HEADER.size + 2)
        s.sync()
        assert s.pending_bytes == 0
        size = os.path.getsize(os.path.join(d, "journal-00000001.log"))
    # One batch header and two records: the exact framing the format promises.
    assert size == BATCH_HEADER.size + (RECORD_HEADER.size + 2 + 3) + (RECORD_HEADER.size + 2)


def test_failed_fsync_is_retried_by_writing_the_batch_anew(tmp_path, monkeypatch) -> None:
    """M14/W5: after a failed fsync nothing is reported durable, the store keeps working in
    memory, and the next sync cuts the segment back and writes the batch anew (never merely
    fsyncing pages whose write-back may have failed)."""
    s = Store.open(os.fspath(tmp_path))
    s.put("a", b"1")

    def broken_disk(fd: int) -> None:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(store_module.os, "fsync", broken_disk)
    with pytest.raises(StoreFailedError):
        s.sync()
    monkeypatch.undo()
    assert (s.durable_lsn, s.failed is not None) == (0, True)
    segment = os.path.join(tmp_path, "journal-00000001.log")
    assert os.path.getsize(segment) == 0  # what the failed batch wrote was cut off
    s.put("b", b"2")
    assert s.sync() == 2
    assert s.failed is None
    s.close()
    # One batch holding both records, written once.
    assert os.path.getsize(segment) == BATCH_HEADER.size + 2 * (RECORD_HEADER.size + 2)
    with Store.open(os.fspath(tmp_path)) as again:
        assert (again.get("a"), again.get("b"), again.last_lsn) == (b"1", b"2", 2)


def test_W5_full_disk_keeps_the_batch_and_resumes_when_space_returns(tmp_path) -> None:
    """W5/M14 on a real full file system (a small tmpfs): the write fails with ENOSPC, the
    store goes on in memory (a delete is not refused), and writes everything once there is
    room again; what was durable before stays durable."""
    with small_disk(tmp_path / "disk") as disk:
        s = Store.open(os.fspath(disk / "store"))
        s.put("kept", b"k")
        assert s.sync() == 1
        fill(disk)
        s.put("big", b"x" * 200_000)
        with pytest.raises(StoreFailedError):
            s.sync()
        assert (s.durable_lsn, type(s.failed)) == (1, OSError)
        s.delete("kept")  # an ack's delete: journalled later, not refused
        with pytest.raises(StoreFailedError):
            s.sync()  # still full
        free(disk)
        assert s.sync() == 3
        assert s.failed is None
        s.close()
        with Store.open(os.fspath(disk / "store")) as again:
            assert (again.get("kept"), len(again.get("big") or b""), again.last_lsn) == (None, 200_000, 3)


def test_W5_store_opens_on_a_full_disk(tmp_path) -> None:
    """A restart on a disk that is still full opens the store (it reads; it writes later)."""
    with small_disk(tmp_path / "disk") as disk:
        s = Store.open(os.fspath(disk / "store"))
        s.put("a", b"1")
        s.sync()
        s.close()
        fill(disk)
        with Store.open(os.fspath(disk / "store")) as again:
            assert again.get("a") == b"1"
            again.put("b", b"2" * 10_000)  # more than the segment's last page has left
            with pytest.raises(StoreFailedError):
                again.sync()
            free(disk)
            assert again.sync() == 2


def test_W5_torn_tail_on_a_full_disk_is_cut_off_without_its_copy(tmp_path) -> None:
    """The torn last batch (never confirmed) is normally copied aside before it is cut off;
    on a full disk there is no room for the copy, and the store still opens."""
    with small_disk(tmp_path / "disk") as disk:
        s = Store.open(os.fspath(disk / "store"))
        s.put("a", b"1")
        s.sync()
        s.close()
        segment = disk / "store" / "journal-00000001.log"
        good = segment.stat().st_size
        s2 = Store.open(os.fspath(disk / "store"))
        s2.put("b", b"2" * 50_000)
        s2.sync()
        s2.close()
        with open(segment, "r+b") as f:
            f.truncate(good + 30_000)  # the second batch, torn
        fill(disk)
        with Store.open(os.fspath(disk / "store")) as again:
            assert (again.get("a"), again.get("b")) == (b"1", None)
            assert (again.recovery.torn_bytes, again.recovery.aside_path) == (30_000, None)
        assert segment.stat().st_size == good


# -- compaction --------------------------------------------------------------------------------

BATCH_OF_ONE = BATCH_HEADER.size + RECORD_HEADER.size + 1 + 100  # key "k", 100-byte value


def test_compaction_due_exactly_past_both_thresholds(tmp_path) -> None:
    with Store.open(os.fspath(tmp_path), fsync=False, compact_min_bytes=3 * BATCH_OF_ONE) as s:
        for _ in range(3):
            s.put("k", b"v" * 100)
            s.sync()
        assert not s.compaction_due  # 3 batches == min bytes: not above it
        assert s.maybe_compact() is False
        s.put("k", b"v" * 100)
        s.sync()
        # 4 batches (592 bytes) are above the min bytes and above twice the live record (240)
        assert s.compaction_due
        assert s.maybe_compact() is True
        assert not s.compaction_due


def test_compaction_due_exactly_past_the_ratio(tmp_path) -> None:
    live = RECORD_HEADER.size + 1 + 100
    with Store.open(os.fspath(tmp_path), fsync=False, compact_min_bytes=0) as s:
        s.put("k", b"v" * 100)
        s.sync()
        assert s._journal_bytes == BATCH_OF_ONE and s._live_bytes == live
        assert not s.compaction_due  # 148 journal bytes <= 2 x 120 live bytes
        s.put("k", b"w" * 100)
        assert s.compaction_due  # pending bytes count too: 148 + 120 > 240


def test_compaction_not_due_while_live_data_dominates(tmp_path) -> None:
    with Store.open(os.fspath(tmp_path), fsync=False, compact_min_bytes=1000) as s:
        for i in range(50):  # every key distinct: the journal is all live data
            s.put(f"k{i:03d}", b"v" * 100)
        s.sync()
        assert not s.compaction_due


def test_compaction_keeps_state_drops_old_files_and_lsns(tmp_path) -> None:
    d = os.fspath(tmp_path)
    with Store.open(d, compact_min_bytes=0) as s:
        for i in range(100):
            s.put(f"m/v/q/{i % 10}", f"{i}".encode())
        s.delete("m/v/q/3")
        s.sync()
        s.put("after", b"pending")  # appended, not yet synced: must survive compaction
        assert s.maybe_compact() is True
        assert sorted(os.listdir(d)) == ["LOCK", "journal-00000002.log", "snapshot-00000002.snap"]
        expected = {f"m/v/q/{i}": f"{90 + i}".encode() for i in range(10) if i != 3}
        expected["after"] = b"pending"
        assert dict(s.items()) == expected
        assert s.durable_lsn == 102
        s.put("later", b"x")
        s.sync()
        expected["later"] = b"x"
    remove_checkpoint(d, do_fsync=False)  # as a killed process leaves it: the snapshot is read
    with Store.open(d) as s:
        assert dict(s.items()) == expected
        assert s.recovery.snapshot_records == 10
        assert s.recovery.records == 11
        assert s.put("next", b"") == 104


def test_compaction_twice_and_in_memory_never(tmp_path) -> None:
    d = os.fspath(tmp_path)
    with Store.open(d, compact_min_bytes=0) as s:
        s.put("a", b"1")
        assert s.maybe_compact(force=True)
        s.put("a", b"2")
        assert s.maybe_compact(force=True)
        assert sorted(os.listdir(d)) == ["LOCK", "journal-00000003.log", "snapshot-00000003.snap"]
    with Store.open(d) as s:
        assert dict(s.items()) == {"a": b"2"}
    m = Store.open(None, compact_min_bytes=0)
    m.put("a", b"1")
    assert m.maybe_compact(force=True) is False


# -- group commit across threads ---------------------------------------------------------------


@pytest.mark.parametrize("compacting", [False, True])
def test_put_on_one_thread_sync_on_another(tmp_path, compacting: bool) -> None:
    """The event loop thread appends while a worker thread syncs (and compacts)."""
    d = os.fspath(tmp_path)
    n = 20_000
    s = Store.open(d, fsync=False, compact_min_bytes=20_000 if compacting else 1 << 40)
    done = threading.Event()
    seen: list[int] = []
    compactions = 0

    def worker() -> None:
        nonlocal compactions
        while not done.is_set():
            seen.append(s.sync())
            compactions += s.maybe_compact()
        seen.append(s.sync())

    t = threading.Thread(target=worker)
    t.start()
    for i in range(n):
        s.put(f"k{i % 1000}", i.to_bytes(4, "big"))
        if i % 7 == 0:
            s.delete(f"k{(i * 13) % 1000}")
    done.set()
    t.join()
    expected = dict(s.items())
    assert seen == sorted(seen)  # durable LSNs never go back
    assert seen[-1] == s.last_lsn
    assert (compactions > 0) is compacting
    s.close()
    with Store.open(d) as again:
        assert dict(again.items()) == expected
        assert again.recovery.torn_bytes == 0
        assert again.durable_lsn == seen[-1]


def test_concurrent_syncs_do_not_interleave(tmp_path) -> None:
    d = os.fspath(tmp_path)
    s = Store.open(d, fsync=False)
    barrier = threading.Barrier(4)

    def syncer(me: int) -> None:
        barrier.wait()
        for i in range(500):
            s.put(f"t{me}/{i}", bytes([me]) * 300)
            s.sync()

    threads = [threading.Thread(target=syncer, args=(m,)) for m in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    s.close()
    with Store.open(d) as again:
        assert again.recovery.torn_bytes == 0 and again.recovery.damaged == []
        assert len(again) == 2000
        assert all(v == bytes([int(k[1])]) * 300 for k, v in again.items())


# -- the model: any sequence of operations, syncs, compactions and reopens ----------------------

_ops = st.lists(
    st.one_of(
        st.tuples(st.just("put"), st.sampled_from("abcdef"), st.binary(max_size=40)),
        # Values the store leaves on disk once written (OFFLOAD_MIN and up).
        st.tuples(st.just("put"), st.sampled_from("abcdef"), st.binary(min_size=OFFLOAD_MIN, max_size=400)),
        st.tuples(st.just("delete"), st.sampled_from("abcdef"), st.just(b"")),
        st.tuples(st.sampled_from(["sync", "compact", "reopen"]), st.just(""), st.just(b"")),
    ),
    max_size=40,
)


@settings(max_examples=60, deadline=None)
@given(ops=_ops)
def test_store_behaves_like_a_dict(tmp_path_factory, ops) -> None:
    d = os.fspath(tmp_path_factory.mktemp("model"))
    model: dict[str, bytes] = {}
    lsn = 0
    s = Store.open(d, fsync=False, compact_min_bytes=0)
    try:
        for op, key, value in ops:
            if op == "put":
                lsn += 1
                assert s.put(key, value) == lsn
                model[key] = value
            elif op == "delete":
                lsn += 1
                assert s.delete(key) == lsn
                model.pop(key, None)
            elif op == "sync":
                assert s.sync() == lsn
            elif op == "compact":
                s.maybe_compact(force=True)
            else:
                s.close()
                s = Store.open(d, fsync=False, compact_min_bytes=0)
                assert s.last_lsn == lsn
            assert dict(s.items()) == model
            assert {k: s.get(k) for k in model} == model
            assert {k: (h, n) for k, h, n in s.heads("", 50)} == {k: (v[:50], len(v)) for k, v in model.items()}
    finally:
        s.close()
