"""The store folds a live backlog into its packed tier as it builds (issue 31), and a data dir
written before that (the fold past 131,072 entries) opens the same.

Only the running store's thresholds changed (FOLD_AT, FOLD_KEEP, FOLD_SLICE) and a trim of
glibc's heap after folds; the files (format.py, checkpoint.py) are written as before. A
store run with the old thresholds writes what the code before the change wrote, so it stands
for an old data dir here: reopened with the new ones, after a clean close (a checkpoint) or
after a crash (none: the journal is replayed), it holds the same map in the same order, and
keeps folding and reopening from there.
"""

from __future__ import annotations

import random

import pytest

from semantics.store import Store
from semantics.store import store as store_module

STEM = "m/%2F/q/msg-0123456789ab"


def _put_backlog(s: Store, expected: dict[str, bytes], start: int, n: int, rng: random.Random) -> None:
    for i in range(start, start + n):
        k = f"{STEM}{i + 1:016x}"
        expected[k] = b"%08d" % i * 20  # left on disk (format.OFFLOAD_MIN)
        s.put(k, expected[k])
        if i % 500 == 499:
            s.sync()
        if rng.random() < 0.2:  # a consumer acking some of the oldest
            old = next(iter(expected))
            s.delete(old)
            del expected[old]
    s.sync()


@pytest.mark.parametrize("clean", [True, False])
def test_a_data_dir_written_with_the_old_fold_reopens_the_same(tmp_path: str, monkeypatch: pytest.MonkeyPatch,
                                                                clean: bool) -> None:
    d = str(tmp_path)
    rng = random.Random(31)
    expected: dict[str, bytes] = {"q/%2F/q": b"queue"}
    with monkeypatch.context() as old:
        for name, value in (("FOLD_AT", 131072), ("FOLD_KEEP", 65536), ("FOLD_SLICE", 8192),
                            ("PLACE_MAX", 131072), ("DROP_BELOW", 32768), ("TRIM_EVERY", 1 << 60)):
            old.setattr(store_module, name, value)
        s = Store.open(d, fsync=False)
        s.put("q/%2F/q", b"queue")
        _put_backlog(s, expected, 0, 3 * store_module.FOLD_AT // 4, rng)
        assert s._packed is None  # the old thresholds: nothing folded yet
        s.close(sync=clean)  # no sync, no checkpoint: as a process killed after its last commit
    s = Store.open(d, fsync=False)
    try:
        assert s.recovery.checkpoint is clean
        assert s.keys() == list(expected) and len(s) == len(expected)
        assert dict(s.items()) == expected
        _put_backlog(s, expected, 3 * store_module.FOLD_AT // 4, 3 * store_module.FOLD_AT, rng)
        assert s._packed is not None and s._packed.n_live > store_module.FOLD_AT  # folding now
        assert s.keys() == list(expected)
        s.maybe_compact(force=True)
        assert list(s.items()) == list(expected.items())
    finally:
        s.close(sync=clean)
    with Store.open(d, fsync=False) as s:
        assert list(s.items()) == list(expected.items())


def test_a_live_backlog_folds_long_before_the_old_threshold(tmp_path: str) -> None:
    """A backlog of a few times FOLD_AT (the old threshold was 131,072: one of 10^5 never
    folded) is mostly in the tier after its syncs, the newest FOLD_KEEP or so in the dict."""
    s = Store.open(str(tmp_path), fsync=False)
    try:
        expected: dict[str, bytes] = {}
        _put_backlog(s, expected, 0, 4 * store_module.FOLD_AT, random.Random(7))
        assert s._packed is not None and s._pos is not None
        assert len(s._map) - len(s._pos) <= store_module.FOLD_AT
        assert s._packed.n_live + len(s._map) == len(expected) == len(s)
        assert s.keys() == list(expected)
    finally:
        s.close()
