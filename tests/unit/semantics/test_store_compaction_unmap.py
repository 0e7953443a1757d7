"""A compaction drops the pages it read through its source maps as it goes (issue 31 aim 3).

Mapped file pages count in the process's RSS: a compaction that copied a backlog of 10^6 1 KB
bodies while it drained took the gateway from 155 to 789 MB until it closed its maps. Every
UNMAP_EVERY bytes of snapshot it now drops them (MADV_DONTNEED: for a shared file mapping the
pages leave the process, the data stays in the page cache and in the file), so what it reads
afterwards from the same maps must still be the same bytes.
"""

from __future__ import annotations

import mmap
import os
import random
import sys

import pytest

from semantics.store import Store
from semantics.store import store as store_module

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux") or not hasattr(mmap, "MADV_DONTNEED"),
                                reason="/proc/self/smaps and MADV_DONTNEED are Linux's")


def _mapped_kb(path: str) -> int:
    """Resident kB of this process's mappings of ``path`` (/proc/self/smaps)."""
    total = 0
    inside = False
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()
            if head and "-" in head[0] and len(head) >= 5:  # a mapping's first line
                inside = line.rstrip("\n").endswith(" " + path)
            elif inside and head[0] == "Rss:":
                total += int(head[1])
    return total


def test_compaction_reads_every_value_back_after_dropping_the_pages_it_read(
        tmp_path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    d = os.fspath(tmp_path)
    monkeypatch.setattr(store_module, "UNMAP_EVERY", 64 << 10)
    resident: list[int] = []  # kB of the source maps still mapped right after each drop
    real = store_module._unmap_read

    def drop_and_look(maps: dict[int, mmap.mmap]) -> None:
        before = sum(_mapped_kb(s._path_of(fid)) for fid in maps)
        real(maps)
        resident.append(sum(_mapped_kb(s._path_of(fid)) for fid in maps))
        assert before > 0  # the snapshot so far was read through them

    monkeypatch.setattr(store_module, "_unmap_read", drop_and_look)
    expected = {f"m/%2F/q/msg-0123456789ab{i:016x}": os.urandom(16) * 128 for i in range(3000)}
    with Store.open(d, compact_min_bytes=0) as s:
        for i, (k, v) in enumerate(expected.items()):
            s.put(k, v)  # 2 KB: left on disk, read back by the compaction through a map
            if i % 300 == 299:
                s.sync()
        s.sync()
        assert s.maybe_compact(force=True)
        assert all(s.get(k) == v for k, v in expected.items())
    # 6 MB of values, a drop after each 1 MB chunk written: the pages went each time, and what
    # was read after a drop (faulted in again) is what the files hold.
    assert len(resident) >= 5
    assert resident == [0] * len(resident)
    with Store.open(d) as s:
        assert dict(s.items()) == expected


@pytest.mark.parametrize("clean", [True, False])
def test_deletes_in_a_row_wait_in_one_buffer_and_replay_in_order(tmp_path: str, clean: bool) -> None:
    """The worker thread does not sync while it compacts, so a drain's deletes wait meanwhile:
    in one bytearray (malloc's heap once past 512 bytes), not two small bytes objects each
    in CPython's arenas, which stayed pinned after the drain (issue 31 aim 3)."""
    d = os.fspath(tmp_path)
    rng = random.Random(31)
    expected: dict[str, bytes] = {}
    s = Store.open(d, compact_min_bytes=0)
    try:
        keys = [f"m/%2F/q/msg-0123456789ab{i:016x}" for i in range(3000)]
        for k in keys:
            expected[k] = k.encode() * rng.randrange(1, 40)
            s.put(k, expected[k])
        s.sync()
        for k in keys[:2000]:
            s.delete(k)
            del expected[k]
        assert len(s._pending) == 2  # the batch header's place and one buffer
        assert type(s._pending[1]) is bytearray
        # Puts and deletes interleaved, synced at random points: the journal holds them in order.
        for _ in range(4000):
            k = rng.choice(keys)
            if rng.random() < 0.5:
                expected[k] = os.urandom(rng.randrange(0, 2000))
                s.put(k, expected[k])
            else:
                s.delete(k)
                expected.pop(k, None)
            if rng.random() < 0.01:
                s.sync()
        assert dict(s.items()) == expected
        s.sync()
    finally:
        s.close(sync=clean)  # not clean: no checkpoint, the journal is replayed
    with Store.open(d) as s:
        assert s.recovery.checkpoint is clean
        assert dict(s.items()) == expected
