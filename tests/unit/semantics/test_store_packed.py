"""The packed tier of the store's map (semantics/store/packed.py, issue 15 target 3a): a store
that reopens into it (from a clean close's checkpoint or a replay of the journal) answers
every question exactly as one plain dict would, in the same order, over random puts,
deletes, syncs, compactions, clean closes and killed processes."""

from __future__ import annotations

import random
from collections.abc import Callable

import pytest

from semantics.store import Store, packed
from semantics.store import store as store_module
from semantics.store.checkpoint import remove_checkpoint

PREFIXES = ["m/%2F/q1/msg-0a1b2c3d4e5f", "m/%2F/q2/msg-0a1b2c3d4e5f", "m/%2F/q1/msg-ffeeddccbbaa", "m/v%2Fx/q1/msg-00"]
ODD = ["q/%2F/q1", "q/%2F/q2", "m/%2F/q1/odd", "m/%2F/q1/msg-0A1B", "x/" + "0x" + "1" * 14, "m/%2F/q1/" + "f" * 16]
SCANS = ["", "m/", "m/%2F/", "m/%2F/q1/", "m/%2F/q1/msg-0a1b2c3d4e5f00", "q/", "x/", "nothing/"]


def _value(rng: random.Random) -> bytes:
    # Mostly values left on disk (locations: what packs), some kept in memory.
    n = rng.choice([1000, 1000, 1000, 200, 130, 5, 0])
    return rng.randbytes(n)


class _History:
    """A store and the plain dict it must match; keys mostly message keys with counters."""

    def __init__(self, d: str, rng: random.Random) -> None:
        self.d, self.rng = d, rng
        self.model: dict[str, bytes] = {}
        self.counters = dict.fromkeys(PREFIXES, 0)
        self.reopen_share = 1.0  # of the steps that would reopen the store, those that do
        self.s = Store.open(d, fsync=False, compact_min_bytes=1 << 16, compact_ratio=1.5)

    def new_key(self) -> str:
        if self.rng.random() < 0.1:
            return self.rng.choice(ODD)
        prefix = self.rng.choice(PREFIXES)
        self.counters[prefix] += self.rng.choice([1, 1, 1, 7, 1 << 33])
        return f"{prefix}{self.counters[prefix]:016x}"

    def step(self) -> None:
        rng, s, model = self.rng, self.s, self.model
        r = rng.random()
        if r < 0.45 or not model:
            key = self.new_key() if rng.random() < 0.7 or not model else rng.choice(list(model))
            value = _value(rng)
            s.put(key, value)
            model[key] = value
        elif r < 0.8:
            key = rng.choice(list(model)) if rng.random() < 0.9 else self.new_key()
            s.delete(key)
            model.pop(key, None)
        elif r < 0.9:
            s.sync()
        elif r < 0.93:
            s.sync()
            s.maybe_compact(force=True)
        elif rng.random() >= self.reopen_share:
            s.sync()
        elif r < 0.965:
            s.close()  # clean: leaves a checkpoint
            self.s = Store.open(self.d, fsync=False, compact_min_bytes=1 << 16, compact_ratio=1.5)
        else:
            s.sync()
            s.close(sync=False)  # as if killed after the sync: no checkpoint, a replay
            # (one is left only when nothing was written since the open: still exact)
            remove_checkpoint(self.d, do_fsync=False)
            self.s = Store.open(self.d, fsync=False, compact_min_bytes=1 << 16, compact_ratio=1.5)

    def check(self) -> None:
        s, model = self.s, self.model
        assert len(s) == len(model)
        for prefix in SCANS:
            want = [k for k in model if k.startswith(prefix)]
            assert s.keys(prefix) == want, prefix
            assert list(s.items(prefix)) == [(k, model[k]) for k in want], prefix
            assert list(s.heads(prefix, 10)) == [(k, model[k][:10], len(model[k])) for k in want], prefix
        for key in self.rng.sample(list(model), min(20, len(model))) + [self.new_key(), ODD[0], "m/"]:
            assert s.get(key) == model.get(key), key
            assert (key in s) == (key in model), key


@pytest.mark.parametrize("seed", range(6))
def test_packed_store_matches_a_dict(tmp_path: str, monkeypatch: pytest.MonkeyPatch, seed: int) -> None:
    monkeypatch.setattr(packed, "PACK_MIN", 1)  # pack at every open, however small
    h = _History(str(tmp_path), random.Random(seed))
    reopened = packed_seen = 0
    try:
        for i in range(1500):
            h.step()
            if h.s._packed is not None:
                packed_seen += 1
            if i % 25 == 0:
                h.check()
        h.check()
        reopened = h.s.recovery.records
    finally:
        h.s.close()
    assert packed_seen > 100 and reopened  # the packed tier was there for a good part of it


@pytest.mark.parametrize("seed", range(6))
def test_a_running_store_folds_into_the_tier_and_still_matches_a_dict(tmp_path: str, monkeypatch: pytest.MonkeyPatch,
                                                                      seed: int) -> None:
    """The same random histories with the running store's fold, repack and drop at tiny
    sizes, so that each happens again and again between the puts, deletes, compactions and
    reopenings (with no packing at an open: what is packed was folded in while running)."""
    monkeypatch.setattr(packed, "PACK_MIN", 1 << 30)
    for name, value in (("FOLD_AT", 12), ("FOLD_KEEP", 4), ("FOLD_SLICE", 5), ("DROP_BELOW", 3),
                        ("PLACE_MAX", 8)):
        monkeypatch.setattr(store_module, name, value)
    calls = {"_fold": 0, "_repack": 0, "_drop_packed": 0}

    def counting(name: str) -> Callable[[Store], None]:
        run = getattr(Store, name)

        def counted(self: Store) -> None:
            before = self._packed
            size = len(before.live) if before is not None else 0
            run(self)
            after = self._packed
            calls[name] += after is not before or (after is not None and len(after.live) > size)
        return counted

    for name in calls:
        monkeypatch.setattr(Store, name, counting(name))
    h = _History(str(tmp_path), random.Random(1000 + seed))
    h.reopen_share = 0.1  # a tier lives long enough to be mostly tombstones
    try:
        for i in range(3000):
            h.step()
            if i % 25 == 0:
                h.check()
        h.check()
    finally:
        h.s.close()
    assert min(calls.values()) >= 3, calls  # made or grown, rebuilt, dropped, again and again


def test_a_live_backlog_folds_in_order_and_reopens(tmp_path: str) -> None:
    """A backlog published to a running store: a sync that finds more than FOLD_AT message
    keys in the dict folds all but the newest FOLD_KEEP into the tier, keeping the one-dict order around the keys that stay (a
    declaration, a small value, a counter out of order); a reopen finds the same map."""
    d = str(tmp_path)
    n = store_module.FOLD_AT + 5000
    stem = "m/%2F/q/msg-0123456789ab"
    keys = [f"{stem}{i + 10:016x}" for i in range(n)]
    expected: dict[str, bytes] = {}
    s = Store.open(d, fsync=False)
    try:
        for i, k in enumerate(keys):
            if i == 100:
                expected["q/%2F/q"] = b"queue"
            if i == 200:
                expected[f"{stem}{3:016x}"] = b"late" * 100  # counted before its neighbours
            expected[k] = b"%08d" % i * 20  # left on disk (format.OFFLOAD_MIN)
            if i % 1000 == 0:
                for key, v in expected.items():
                    if key not in s:
                        s.put(key, v)
                s.sync()
        for key, v in expected.items():
            if key not in s:
                s.put(key, v)
        s.sync()
        assert s._packed is not None and s._packed.n_live >= n - store_module.FOLD_AT
        assert s._pos is not None and len(s._map) - len(s._pos) <= store_module.FOLD_AT
        assert s._packed.n_live + len(s._map) == len(expected)
        assert s.keys() == list(expected) and len(s) == len(expected)
        assert s.get(keys[7]) == expected[keys[7]] and s.get(f"{stem}{3:016x}") == b"late" * 100
        for k in keys[:1000]:
            s.delete(k)
            del expected[k]
        s.sync()
        assert list(s.items("m/")) == [(k, v) for k, v in expected.items() if k.startswith("m/")]
        s.maybe_compact(force=True)
        assert list(s.items()) == list(expected.items())
    finally:
        s.close()
    with Store.open(d, fsync=False) as s:
        assert list(s.items()) == list(expected.items())


@pytest.mark.parametrize("checkpoint", [True, False])
def test_a_drained_packed_tier_goes(tmp_path: str, checkpoint: bool) -> None:
    """10^4 messages reopened packed (from the checkpoint, or replayed: whole blocks of one
    stem go in at once there too), deleted one by one: the tier is dropped once mostly
    tombstones, and the survivors keep their order."""
    d = str(tmp_path)
    keys = [f"m/%2F/q/msg-0123456789ab{i:016x}" for i in range(10_000)]
    with Store.open(d, fsync=False) as s:
        s.put("q/%2F/q", b"queue")
        for i, k in enumerate(keys):
            s.put(k, b"x" * 300)
            if i % 1000 == 0:
                s.sync()
    if not checkpoint:
        remove_checkpoint(d, do_fsync=False)
    s = Store.open(d, fsync=False)
    assert s.recovery.checkpoint == checkpoint and s._packed is not None and len(s._map) == 1
    s.put("q/%2F/q2", b"queue")
    s.close()  # its checkpoint holds the packed tier as whole runs (checkpoint.LocatedRun)
    s = Store.open(d, fsync=False)
    try:
        assert s.recovery.checkpoint and s._packed is not None and len(s._map) == 2
        assert s.keys() == ["q/%2F/q", *keys, "q/%2F/q2"] and s.get(keys[5000]) == b"x" * 300
        for k in keys[:9_000]:
            s.delete(k)
        s.sync()
        assert s._packed is None
        assert s.keys() == ["q/%2F/q", *keys[9_000:], "q/%2F/q2"]
        assert s.get(keys[-1]) == b"x" * 300 and s.get(keys[0]) is None
    finally:
        s.close()


def test_a_repack_built_from_a_copy_catches_up_with_the_deletes_made_meanwhile() -> None:
    """Store._repack builds the new tier outside the lock from a copy of the live flags; the
    entries deleted meanwhile are dead in the new tier too, the others are found where the
    rank says, and a tombstone a dict key is placed at stays (dead) in between."""
    stem = "m/%2F/q/msg-0123456789ab"
    keys = [f"{stem}{i:016x}" for i in range(1, 20_001)]
    old = packed.Packed.empty()
    assert old.append_run(keys, [(3 << 72) | (i * 300 << 32) | 250 for i in range(len(keys))])
    for p in range(0, len(keys), 3):
        old.kill(p)  # deleted before the copy
    live = bytes(old.live)
    fresh, rank = old.repacked(live, [3, 30_000])  # a place at a tombstone, one past the end
    meanwhile = list(range(1, len(keys), 7))
    for p in meanwhile:
        if old.live[p]:
            old.kill(p)
    fresh.catch_up(old, live, rank)
    assert fresh.n_live == old.n_live and len(fresh.live) == live.count(1) + 1
    assert rank[3] + 1 == rank[4] and not fresh.live[rank[3]]  # the placed tombstone kept
    for p, key in enumerate(keys):
        assert (fresh.find(key) >= 0) == bool(old.live[p]), p
        if old.live[p]:
            assert fresh.find(key) == rank[p] and fresh.get(key) == old.value(p)


@pytest.mark.parametrize("stems", [1, 3])
def test_a_slice_appended_at_once_is_the_tier_one_by_one_would_make(stems: int) -> None:
    """Packed.append_run (the fold's slices: one queue's backlog, or queues published
    interleaved) makes the very arrays that appending entry by entry makes, and refuses,
    changing nothing, a slice that entry-by-entry would not take whole."""
    rng = random.Random(stems)
    prefixes = [f"m/%2F/q{i}/msg-0123456789ab" for i in range(stems)]
    counter = 100
    keys, values = [], []
    for i in range(3000):
        counter += rng.choice([1, 1, 2, 1 << 33])
        keys.append(f"{rng.choice(prefixes)}{counter:016x}")
        values.append((rng.choice([4, 5]) << 72) | (i * 300 << 32) | 250)
    whole, single = packed.Packed.empty(), packed.Packed.empty()
    for a in range(0, len(keys), 1000):
        assert whole.append_run(keys[a:a + 1000], values[a:a + 1000])
        assert all(single.append(k, v) for k, v in zip(keys[a:a + 1000], values[a:a + 1000], strict=True))
    whole.settle()
    single.settle()
    for name in ("stems", "gid", "ctr", "fid", "low", "live", "sctr", "spos", "n_live", "guess"):
        assert getattr(whole, name) == getattr(single, name), name
    assert [whole.find(k) for k in keys[::97]] == list(range(0, 3000, 97))
    before = (len(whole.ctr), list(whole.stems))
    counter += 1
    late = [f"{prefixes[0]}{counter + 5:016x}", f"{prefixes[-1]}{counter + 9:016x}", f"{prefixes[0]}{counter:016x}"]
    bad = [late, [keys[0]], [f"{prefixes[0]}{counter + 20:016X}"], [f"{prefixes[0]}{counter + 30:016x}"]]
    for ks, vs in zip(bad, [[1 << 72] * 3, [1 << 72], [1 << 72], [b"in memory"]], strict=True):
        assert not whole.append_run(ks, vs)  # type: ignore[arg-type]
        assert (len(whole.ctr), whole.stems) == before


@pytest.mark.parametrize("checkpoint", [True, False])
def test_queues_published_interleaved_reopen_packed_in_order(tmp_path: str, checkpoint: bool) -> None:
    """Three queues published in turn: a checkpoint's runs (or a replay's chunks) hold keys of
    three stems, which go into the tier whole (PackedBuilder.add_located), in the map's order."""
    d = str(tmp_path)
    keys = [f"m/%2F/q{i % 3}/msg-0123456789ab{i + 1:016x}" for i in range(6000)]
    with Store.open(d, fsync=False) as s:
        s.put("q/%2F/q0", b"queue")
        for i, k in enumerate(keys):
            s.put(k, b"%08d" % i * 20)
            if i % 1000 == 999:
                s.sync()
    if not checkpoint:
        remove_checkpoint(d, do_fsync=False)
    with Store.open(d, fsync=False) as s:
        assert s.recovery.checkpoint == checkpoint
        assert s._packed is not None and s._packed.n_live == len(keys) and list(s._map) == ["q/%2F/q0"]
        assert s.keys() == ["q/%2F/q0", *keys] and s.keys("m/%2F/q1/") == keys[1::3]
        assert s.get(keys[4444]) == b"%08d" % 4444 * 20


def test_a_live_backlog_of_small_values_folds_and_survives_a_compaction(tmp_path: str) -> None:
    """Values under format.OFFLOAD_MIN stay in memory, which no tier can hold; once a backlog
    builds, the store leaves every value on disk, so a backlog of small messages folds too
    (past the few put before it, which the fold places). A compaction then moves the small
    values' locations into its snapshot like the large ones', and a reopen reads them all."""
    d = str(tmp_path)
    n = 3 * store_module.FOLD_AT
    keys = [f"m/%2F/q/msg-0123456789ab{i + 1:016x}" for i in range(n)]
    s = Store.open(d, fsync=False)
    try:
        for i, k in enumerate(keys):
            s.put(k, b"%d" % i)
            if i % 1000 == 999:
                s.sync()
        s.sync()
        assert s._packed is not None and s._packed.n_live > n // 3
        assert s._pos is not None and 0 < len(s._pos) <= store_module.PLACE_MAX
        assert s.keys() == keys and s.get(keys[n // 2]) == b"%d" % (n // 2)
        for k in keys[:1000]:
            s.delete(k)
        s.sync()
        assert s.maybe_compact(force=True)
        assert list(s.items()) == [(k, b"%d" % i) for i, k in enumerate(keys) if i >= 1000]
    finally:
        s.close()
    with Store.open(d, fsync=False) as s:
        assert list(s.items()) == [(k, b"%d" % i) for i, k in enumerate(keys) if i >= 1000]
