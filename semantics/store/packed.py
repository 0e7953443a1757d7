"""The packed tier of the store's map: the bulk of the entries a start loads, in arrays.

Why (issue 15, target 3a: a retained message costs its index entry, not its body): after a
restart with 10^6 retained messages the map held 10^6 key strings (~96 B each), 10^6 location
ints (~40 B) and a dict entry each (~40 B): 175 B per message. Almost all of those keys are
message keys, ``<stem><16 lowercase hex digits>`` (persistence.message_key: the queue's
prefix, ``msg-``, the process prefix, then a counter; semantics.message_ids), with a stem
shared by every message one process published to one queue, and their values are locations
(format.py: file id << 72 | offset << 32 | length). Here such an entry costs 37 bytes:

    per entry, by its position p (0, 1, ... among the packed entries, in the map's order;
    Store._pos places the dict's keys among them):
        gid[p] (u32: its stem), ctr[p] (u64: the counter), fid[p] (u32: file id),
        low[p] (u64: offset << 32 | length), live[p] (u8: 0 once deleted or put again)
    per stem g: sctr[g] (u64, ascending counters), spos[g] (u32, their positions)

A lookup is the stem's dict lookup, one ``int(tail, 16)`` and an index guessed from the
stem's counters (a bisect when the guess misses); the keys found lately are remembered. The
store keeps writing to its plain dict (the hot tier, looked at first); a put of a packed key
moves it there and a delete tombstones it. A backlog published to a running store reaches the
tier too: once the dict holds many entries the tier does not place, the store's sync thread
appends the oldest of them (``append``, Store._fold), so a live backlog costs what a restored
one does. A tier mostly tombstones is rebuilt with its live entries alone (``repacked``), or
dropped when few are left (Store._drop_packed).

Built from a checkpoint's runs without a key string per entry (``add_run``: the keys' bytes
are taken apart by column with strided slices, chunk by chunk, when every key of the run has
one stem), or from a replayed map (``pack_map``: blocks of one stem and file as runs, the
rest one entry at a time); written back the same way (``runs``, ``join_keys``). Queues
published interleaved make short stretches: those go one entry at a time (RUN_MIN).
"""

from __future__ import annotations

import sys
from array import array
from bisect import bisect_left
from collections.abc import Iterable, Iterator
from itertools import accumulate, compress, groupby, islice, repeat
from operator import itemgetter, lt, rshift

__all__ = ["PACK_MIN", "RUN_MIN", "Packed", "PackedBuilder", "pack_map"]

# A start that loads fewer packable entries than this keeps them all in the dict.
PACK_MIN = 1024

_HEX = b"0123456789abcdef"
_TAIL = 16
_FILE_SHIFT = 72  # format.location's layout
_LOW_MAX = 1 << 64  # a location whose offset is at 4 GiB or more does not fit in low
_LITTLE = sys.byteorder == "little"
RUN_MIN = 64  # shorter runs go one entry at a time (a checkpoint writes them as entries)
_SEEN_MAX = 8192  # Packed.seen is cleared at this size
_CHUNK = 2048  # keys per step of add_run and join_keys: some 100 KB, inside a CPU cache


class Packed:
    """The arrays of the module docstring; read and tombstoned under the store's lock."""

    __slots__ = ("ctr", "fid", "gid", "guess", "seen", "live", "low", "n_live", "sctr", "spos", "stem_ids",
                 "stems")

    def __init__(self, stems: list[str], gid: array, ctr: array, fid: array, low: array,
                 sctr: list[array], spos: list[array]) -> None:
        self.stems = stems
        self.stem_ids = {s: g for g, s in enumerate(stems)}
        self.gid, self.ctr, self.fid, self.low = gid, ctr, fid, low
        self.sctr, self.spos = sctr, spos
        # Per stem: (its first counter, entries per counter step), for find's first guess.
        self.guess = [_guess(a) for a in sctr]
        self.live = bytearray(b"\1") * len(ctr)
        self.n_live = len(ctr)
        # Keys found lately and their positions: a message's body is read (get) when it is
        # delivered, and its ack asks whether it is there, then deletes it (a prefetch later).
        self.seen: dict[str, int] = {}

    def __len__(self) -> int:
        return self.n_live

    @classmethod
    def empty(cls) -> Packed:
        return cls([], array("I"), array("Q"), array("I"), array("Q"), [], [])

    def append(self, key: str, loc: int) -> bool:
        """Add live ``key`` at the next position (the store folding its oldest dict entries in);
        False (nothing added) when it cannot be packed, or when its counter is not above its
        stem's last (a stem's counters stay ascending: publishes committed out of order stay
        in the dict). Call ``settle`` once a batch of appends is done."""
        low = loc & _LOW_BITS
        tail = key[-_TAIL:]
        if len(key) <= _TAIL or low >= _LOW_MAX or loc < 0 or tail.strip(_HEX_STR):
            return False
        c = int(tail, 16)
        g = self._stem(key[:-_TAIL])
        a = self.sctr[g]
        if a and a[-1] >= c:
            return False
        a.append(c)
        self.spos[g].append(len(self.ctr))
        self.gid.append(g)
        self.ctr.append(c)
        self.fid.append(loc >> _FILE_SHIFT)
        self.low.append(low)
        self.live.append(1)
        self.n_live += 1
        return True

    def append_run(self, keys: list[str], values: list[int]) -> bool:
        """``append`` for a whole slice at once, with no Python step per entry where it has one
        stem (one queue's backlog) and a sort by stem where it has several (queues published
        interleaved): True when all went in; False, nothing changed, when one cannot (a value
        in memory, a key that is not ``<stem><16 lowercase hex digits>``, a stem whose
        counters do not rise above its last): then append them one by one."""
        n = len(keys)
        try:
            fid = array("I", map(rshift, values, repeat(_FILE_SHIFT)))
            low = array("Q", map(_LOW_BITS.__and__, values))
        except (TypeError, OverflowError):  # a value in memory; past 4 GiB
            return False
        parsed = _parse(keys)
        if parsed is None:
            return False
        stems, ctr = parsed
        groups: list[tuple[str, list[int] | None, array]] = []  # (stem, its indexes or all, counters)
        if stems.count(stems[0]) == n:
            groups.append((stems[0], None, ctr))
        else:
            order = sorted(range(n), key=stems.__getitem__)  # stable: each stem's in slice order
            for stem, idx in groupby(order, key=stems.__getitem__):
                at = list(idx)
                groups.append((stem, at, array("Q", map(ctr.__getitem__, at))))
        for stem, _, cs in groups:
            g = self.stem_ids.get(stem)
            if not all(map(lt, cs, islice(cs, 1, None))) or (g is not None and self.sctr[g] and self.sctr[g][-1] >= cs[0]):
                return False
        base = len(self.ctr)
        gid = array("I", bytes(4 * n))
        for stem in dict.fromkeys(stems):  # new stems numbered as append would: first seen first
            self._stem(stem)
        for stem, where, cs in groups:
            g = self.stem_ids[stem]
            self.sctr[g].extend(cs)
            if where is None:
                self.spos[g].extend(range(base, base + n))
                gid = array("I", [g]) * n
            else:
                self.spos[g].extend(map(base.__add__, where))
                for i in where:
                    gid[i] = g
        self.gid.extend(gid)
        self.ctr.extend(ctr)
        self.fid.extend(fid)
        self.low.extend(low)
        self.live.extend(bytes([1]) * n)
        self.n_live += n
        return True

    def _stem(self, stem: str) -> int:
        """The id of ``stem``, a new one (no entries yet) when it has none."""
        g = self.stem_ids.get(stem)
        if g is None:
            g = self.stem_ids[stem] = len(self.stems)
            self.stems.append(stem)
            self.sctr.append(array("Q"))
            self.spos.append(array("I"))
            self.guess.append((0, 0.0))  # settle() makes it
        return g

    def settle(self) -> None:
        """find's guesses again, after appends."""
        self.guess = [_guess(a) for a in self.sctr]

    def repacked(self, live: bytes, places: Iterable[int]) -> tuple[Packed, array]:
        """The entries alive in ``live`` (a copy of ``self.live``) alone, in the same order, as
        a new tier, and where each position went: ``rank[p]``, the number of entries kept
        before ``p`` (``len(live) + 1`` of them, so that a place after the last position maps
        too). The tombstones at ``places`` (the dict's keys' places, Store._pos) stay, dead:
        two keys placed at different positions must not come to share one, where the dict's
        order would decide between them. Reads only what a put or delete does not change, so
        it runs outside the store's lock; ``catch_up`` then replays the deletes made since."""
        keep = bytearray(live)
        n = len(keep)
        for p in places:
            if p < n:
                keep[p] = 1
        rank = array("I", [0])
        rank.extend(accumulate(keep))
        gid, ctr, fid, low = (array(a.typecode, compress(a[:n], keep)) for a in (self.gid, self.ctr, self.fid, self.low))
        sctr: list[array] = []
        spos: list[array] = []
        for cs, ps in zip(self.sctr, self.spos, strict=True):
            kept = bytes(map(keep.__getitem__, ps))
            sctr.append(array("Q", compress(cs, kept)))
            spos.append(array("I", map(rank.__getitem__, compress(ps, kept))))
        fresh = Packed(list(self.stems), gid, ctr, fid, low, sctr, spos)
        fresh.live = bytearray(compress(live, keep))
        fresh.n_live = fresh.live.count(1)
        return fresh, rank

    def catch_up(self, old: Packed, live: bytes, rank: array) -> None:
        """Tombstone here what ``old`` lost since its copy ``live`` was taken (this tier being
        ``old.repacked(live, ...)``); the caller holds the store's lock."""
        now = old.live
        step = 4096
        for a in range(0, len(live), step):
            if live[a:a + step] != now[a:a + step]:
                for p in range(a, min(a + step, len(live))):
                    if live[p] and not now[p]:
                        self.kill(rank[p])

    def find(self, key: str) -> int:
        """The position of live ``key``, or -1."""
        p: int | None = self.seen.get(key)
        if p is not None:
            return p if self.live[p] else -1
        g = self.stem_ids.get(key[:-_TAIL])  # a stem is never empty: no key of 16 or less
        if g is None:
            return -1
        tail = key[-_TAIL:]
        try:
            c = int(tail, 16)
        except ValueError:
            return -1
        a = self.sctr[g]
        if not a or c > a[-1] or c < a[0]:
            return -1  # a put of a new key (the running process's next counter): no search
        # Counters are spread about evenly (one process's counter, its messages spread over
        # a few queues): a guess from the stem's first counter and mean step is usually the
        # very index, which spares the 20 probes of a bisect of 10^6.
        base, step = self.guess[g]
        i = int((c - base) * step)
        n = len(a)
        if not 0 <= i < n or a[i] != c:
            lo, hi = max(0, i - 16), min(n, i + 17)
            i = bisect_left(a, c, lo, hi) if lo < hi and a[lo] <= c <= a[hi - 1] else bisect_left(a, c)
            if i == n or a[i] != c:
                return -1
        p = self.spos[g][i]
        # int() also takes "0x", "_", "+", spaces and upper case: only the exact spelling
        # (16 lowercase hex digits: nothing left once they are stripped) matches.
        if not self.live[p] or tail.strip(_HEX_STR):
            return -1
        seen = self.seen
        if len(seen) >= _SEEN_MAX:
            seen.clear()
        seen[key] = p
        return p

    def get(self, key: str) -> int | None:
        """The location of live ``key``, or None."""
        p = self.find(key)
        return None if p < 0 else self.fid[p] << _FILE_SHIFT | self.low[p]  # type: ignore[no-any-return]

    def take(self, key: str) -> int | None:
        """Tombstone live ``key``: its location, or None when it is not here."""
        p = self.find(key)
        if p < 0:
            return None
        self.live[p] = 0
        self.n_live -= 1
        return self.fid[p] << _FILE_SHIFT | self.low[p]  # type: ignore[no-any-return]

    def value(self, p: int) -> int:
        return self.fid[p] << _FILE_SHIFT | self.low[p]  # type: ignore[no-any-return]

    def key(self, p: int) -> str:
        return f"{self.stems[self.gid[p]]}{self.ctr[p]:016x}"

    def kill(self, p: int) -> None:
        self.live[p] = 0
        self.n_live -= 1

    def positions(self, prefix: str = "") -> list[int]:
        """The live positions whose key starts with ``prefix``, ascending."""
        out: list[int] = []
        groups = 0
        live = self.live
        for g, stem in enumerate(self.stems):
            if stem.startswith(prefix):
                ps = self.spos[g]
            elif prefix.startswith(stem):
                ps = [p for p in self.spos[g] if self.key(p).startswith(prefix)]  # type: ignore[assignment]
            else:
                continue
            found = [p for p in ps if live[p]]
            if found:
                groups += 1
                out.extend(found)
        if groups > 1 or not all(map(lt, out, islice(out, 1, None))):
            out.sort()
        return out

    def entries(self, prefix: str, with_values: bool) -> tuple[list[str], list[int]] | None:
        """The live keys under ``prefix`` in position order and their values (when asked,
        else []), made by runs (10^6 keys at a start-up scan or a clean stop: no Python step
        per key); None when ``prefix`` ends inside some stem's keys (use ``positions``)."""
        whole = set()
        for g, stem in enumerate(self.stems):
            if stem.startswith(prefix):
                whole.add(g)
            elif prefix.startswith(stem):
                return None
        keys: list[str] = []
        values: list[int] = []
        if whole:
            for g, f, counters, low in self.runs(0, len(self.live)):
                if g in whole:
                    keys += self.join_keys(g, counters).decode().split("\0")
                    if with_values:
                        values += map((f << _FILE_SHIFT).__or__, low)
        return keys, values

    def runs(self, start: int, stop: int) -> Iterator[tuple[int, int, array, array]]:
        """(stem id, file id, counters, low bits) of the live entries of positions ``start``
        to ``stop``, in order, cut wherever the stem or the file changes: a checkpoint's
        runs without a Python step per entry where long stretches share both."""
        gid, fid, live = self.gid, self.fid, self.live
        a = start
        while a < stop:
            g, f = gid[a], fid[a]
            b, step = a + 1, 64
            end = min(a + 16, stop)
            while b < end and gid[b] == g and fid[b] == f:  # short stretches (queues interleaved)
                b += 1
            while b == end and b < stop:  # gallop over whole stretches of (g, f), then find the cut
                c = min(b + step, stop)
                if gid[b:c].count(g) == c - b and fid[b:c].count(f) == c - b:
                    b = end = c
                    step *= 2
                    continue
                while b < c and gid[b] == g and fid[b] == f:
                    b += 1
                break
            alive = live[a:b]
            if alive.count(1) == b - a:
                yield g, f, self.ctr[a:b], self.low[a:b]
            elif any(alive):
                yield g, f, array("Q", compress(self.ctr[a:b], alive)), array("Q", compress(self.low[a:b], alive))
            a = b

    def join_keys(self, g: int, counters: array) -> bytes:
        """The UTF-8 keys of stem ``g`` with these counters, joined by NUL, made without a
        string per key (the inverse of PackedBuilder.add_run)."""
        stem = self.stems[g].encode()
        head, n = len(stem), len(counters)
        stride = head + _TAIL + 1
        c = array("Q", counters)
        if _LITTLE:
            c.byteswap()
        digits = c.tobytes().hex().encode()
        out = bytearray((stem + bytes(_TAIL + 1)) * n)
        for a in range(0, n, _CHUNK):  # by chunks that stay in the cache, as add_run
            m = min(_CHUNK, n - a)
            chunk = out[a * stride:(a + m) * stride]
            for j in range(_TAIL):
                chunk[head + j::stride] = digits[a * _TAIL + j:(a + m) * _TAIL:_TAIL]
            out[a * stride:(a + m) * stride] = chunk
        del out[-1:]
        return bytes(out)


class PackedBuilder:
    """Collects packable entries in map order (positions 0, 1, ...), then ``finish``."""

    def __init__(self) -> None:
        self.stems: list[str] = []
        self.stem_ids: dict[str, int] = {}
        self.stem_pos: list[array] = []
        self.gid = array("I")
        self.ctr = array("Q")
        self.fid = array("I")
        self.low = array("Q")

    def __len__(self) -> int:
        return len(self.ctr)

    def _stem(self, stem: str) -> int:
        g = self.stem_ids.get(stem)
        if g is None:
            g = self.stem_ids[stem] = len(self.stems)
            self.stems.append(stem)
            self.stem_pos.append(array("I"))
        return g

    def add(self, key: str, loc: int) -> bool:
        """Add one entry at the next position; False (nothing added) when it cannot be packed."""
        low = loc & ((1 << _FILE_SHIFT) - 1)
        tail = key[-_TAIL:]
        if len(key) <= _TAIL or low >= _LOW_MAX or tail.strip(_HEX_STR) or loc < 0:
            return False
        g = self._stem(key[:-_TAIL])
        self.stem_pos[g].append(len(self.ctr))
        self.gid.append(g)
        self.ctr.append(int(tail, 16))
        self.fid.append(loc >> _FILE_SHIFT)
        self.low.append(low)
        return True

    def add_located(self, keys: list[str], file_id: int, low: array) -> bool:
        """Add a checkpoint run whose keys have several stems (queues published interleaved,
        which ``add_run`` refuses), with a sort by stem instead of a Python step per key;
        False (nothing added) when a key is not ``<stem><16 lowercase hex digits>``."""
        n = len(keys)
        parsed = _parse(keys) if len(low) == n else None
        if parsed is None:
            return False
        stems, ctr = parsed
        for stem in dict.fromkeys(stems):
            self._stem(stem)
        gids = array("I", map(self.stem_ids.__getitem__, stems))
        base = len(self.ctr)
        for g, idx in groupby(sorted(range(n), key=gids.__getitem__), key=gids.__getitem__):
            self.stem_pos[g].extend(map(base.__add__, idx))
        self.gid.extend(gids)
        self.ctr.extend(ctr)
        self.fid.extend(array("I", [file_id]) * n)
        self.low.extend(low)
        return True

    def add_run(self, blob: bytes, n: int, file_id: int, low: array) -> bool:
        """Add a checkpoint run of ``n`` keys (``blob``: their UTF-8 bytes joined by NUL) in
        one file with these low location bits, without a string per key; False (nothing
        added) unless every key has the same length and stem and a lowercase hex tail."""
        if n < RUN_MIN or len(low) != n:
            return False
        width = blob.find(0) if n > 1 else len(blob)
        stride = width + 1
        if width <= _TAIL or len(blob) != n * stride - 1:
            return False
        head = width - _TAIL
        # By chunks of keys that stay in the CPU's cache (a column of 10^6 keys read with a
        # stride is a pass over all of them): the 16 digit columns go to ``digits``, and
        # what is left once they are zeroed must be the first key's stem and a NUL, n times.
        digits = bytearray(_TAIL * n)
        record = blob[:head] + bytes(_TAIL + 1)
        padded = blob + b"\0"
        zeros = bytes(_CHUNK)
        for a in range(0, n, _CHUNK):
            m = min(_CHUNK, n - a)
            chunk = bytearray(padded[a * stride:(a + m) * stride])
            for j in range(_TAIL):
                digits[a * _TAIL + j:(a + m) * _TAIL:_TAIL] = chunk[head + j::stride]
                chunk[head + j::stride] = zeros[:m]
            if chunk != record * m:
                return False
        if digits.translate(None, _HEX):
            return False
        try:
            stem = blob[:head].decode()
        except UnicodeDecodeError:
            return False
        counters = array("Q")
        counters.frombytes(bytes.fromhex(digits.decode()))
        if _LITTLE:
            counters.byteswap()
        g = self._stem(stem)
        base = len(self.ctr)
        self.stem_pos[g].extend(range(base, base + n))
        self.gid.extend(array("I", [g]) * n)
        self.ctr.extend(counters)
        self.fid.extend(array("I", [file_id]) * n)
        self.low.extend(low)
        return True

    def finish(self) -> Packed:
        sctr: list[array] = []
        spos: list[array] = []
        ctr = self.ctr
        for ps in self.stem_pos:
            if ps[-1] - ps[0] + 1 == len(ps):  # one contiguous range: a slice
                cs = ctr[ps[0]:ps[-1] + 1]
            else:
                cs = array("Q", map(ctr.__getitem__, ps))
            if not all(map(lt, cs, islice(cs, 1, None))):
                order = sorted(range(len(cs)), key=cs.__getitem__)
                cs = array("Q", map(cs.__getitem__, order))
                ps = array("I", map(ps.__getitem__, order))
            sctr.append(cs)
            spos.append(ps)
        return Packed(self.stems, self.gid, ctr, self.fid, self.low, sctr, spos)


_HEX_STR = _HEX.decode()
_LOW_BITS = (1 << _FILE_SHIFT) - 1
_TAIL_OF = itemgetter(slice(-_TAIL, None))
_STEM_OF = itemgetter(slice(None, -_TAIL))
_NOT_HEX = dict.fromkeys(map(ord, _HEX_STR))  # str.translate deletes these: anything left is not hex


def _parse(keys: list[str]) -> tuple[list[str], array] | None:
    """(the stems, the counters) of keys ``<stem><16 lowercase hex digits>``, without a
    Python step per key; None when one is not such a key (or there are none)."""
    if not keys or min(map(len, keys)) <= _TAIL:
        return None
    tails = "".join(map(_TAIL_OF, keys))
    if tails.translate(_NOT_HEX):
        return None
    ctr = array("Q")
    ctr.frombytes(bytes.fromhex(tails))
    if _LITTLE:
        ctr.byteswap()
    return list(map(_STEM_OF, keys)), ctr


def _one_file(values: list[int]) -> tuple[int, array] | None:
    """(their file id, their low bits) when the locations ``values`` are all in one file;
    None when one is not (or is a value kept in memory, or lies past 4 GiB)."""
    try:
        files = set(map(rshift, values, repeat(_FILE_SHIFT)))
        low = array("Q", map(_LOW_BITS.__and__, values))
    except (TypeError, OverflowError):
        return None
    return (files.pop(), low) if len(files) == 1 else None


def _guess(a: array) -> tuple[int, float]:
    return (a[0] if a else 0, (len(a) - 1) / (a[-1] - a[0]) if len(a) > 1 and a[-1] > a[0] else 0.0)


def pack_map(data: dict[str, bytes | int]) -> tuple[dict[str, bytes | int], Packed | None, dict[str, int] | None]:
    """Split a replayed map into (the entries the dict keeps, the packed tier, their
    positions: Store._pos) when enough of it packs, else (data, None, None). Blocks of
    entries that are one checkpoint run as it would be (one stem, one file) go in as such
    (add_run); the others one entry at a time."""
    if len(data) < PACK_MIN:
        return data, None, None
    builder = PackedBuilder()
    rest: dict[str, bytes | int] = {}
    pos: dict[str, int] = {}
    keys = list(data)
    values = list(data.values())
    for a in range(0, len(keys), _CHUNK):
        ks, vs = keys[a:a + _CHUNK], values[a:a + _CHUNK]
        located = _one_file(vs)  # type: ignore[arg-type]
        if located is not None and (builder.add_run("\0".join(ks).encode(), len(ks), *located)
                                    or builder.add_located(ks, *located)):
            continue
        for k, v in zip(ks, vs, strict=True):
            if type(v) is not int or not builder.add(k, v):
                rest[k] = v
                pos[k] = len(builder.ctr)
    if len(builder) < PACK_MIN:
        return data, None, None
    return rest, builder.finish(), pos
