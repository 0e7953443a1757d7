"""Crash tests: a child process writes and syncs until it is SIGKILLed (also during compaction,
and at each file-system step of a compaction); the store reopened must hold every confirmed
operation, nothing that was never appended, and exactly the state after some prefix of the
operations (M14: a confirm is only sent for what ``sync()`` returned).

Then the files it left are truncated and bit-flipped at random offsets.
"""

from __future__ import annotations

import importlib.util
import os
import random
import shutil
import subprocess
import sys
import time

import pytest

from semantics.store import Store, StoreCorruptError
from semantics.store.checkpoint import remove_checkpoint
from semantics.store.format import parse_batch

CHILD = os.path.join(os.path.dirname(__file__), "store_crash_child.py")
_spec = importlib.util.spec_from_file_location("store_crash_child", CHILD)
assert _spec is not None and _spec.loader is not None
_child = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_child)
value_for = _child.value_for

pytestmark = pytest.mark.slow

Op = tuple[str, str, int]  # kind ("P"/"D"), key, value size


class History:
    """Every operation the children announced, by LSN, up to the last verified LSN."""

    def __init__(self) -> None:
        self.ops: dict[int, Op] = {}
        self.verified = 0

    def state_at(self, lsn: int, skip: range = range(0)) -> dict[str, bytes]:
        state: dict[str, bytes] = {}
        for n in range(1, lsn + 1):
            if n in skip:
                continue
            kind, key, size = self.ops[n]
            if kind == "P":
                state[key] = value_for(n, size)
            else:
                state.pop(key, None)
        return state


def _run(directory: str, seed: int, rng: random.Random, *, mode: str, die_before: int = 0,
         syncs: int = 0, compact_min: int = 256 << 10) -> tuple[list[str], int]:
    cmd = [sys.executable, CHILD, directory, str(seed), "--compact-min", str(compact_min)]
    if die_before:
        cmd += ["--die-before", str(die_before)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    lines: list[str] = []
    syncs_left = syncs or rng.randint(1, 200)
    while True:
        line = proc.stdout.readline()
        if not line:
            break
        lines.append(line)
        if mode == "after-syncs" and line.startswith("S "):
            syncs_left -= 1
            if syncs_left == 0:
                time.sleep(rng.random() * 0.003)  # land anywhere in the next batch
                break
        elif mode == "in-compaction" and line == "K\n":
            time.sleep(rng.random() * 0.02)  # the snapshot write takes a few ms
            break
    if mode != "die-before":
        proc.kill()
    rc = proc.wait()
    lines.extend(proc.stdout.readlines())
    proc.stdout.close()
    return lines, rc


def _verify(directory: str, history: History, lines: list[str]) -> None:
    confirmed = history.verified
    announced = history.verified
    for line in lines:
        parts = line.split()
        if parts[0] == "S":
            confirmed = int(parts[1])
        elif parts[0] in ("P", "D"):
            lsn = int(parts[1])
            history.ops[lsn] = (parts[0], parts[2], int(parts[3]) if parts[0] == "P" else 0)
            announced = max(announced, lsn)
    with Store.open(directory) as s:
        recovered = s.last_lsn
        assert s.recovery.damaged == []
        assert confirmed <= recovered <= announced  # every confirm kept; nothing unannounced
        assert dict(s.items()) == history.state_at(recovered)
    for lsn in range(recovered + 1, announced + 1):  # lost unconfirmed work; LSNs are reused
        del history.ops[lsn]
    history.verified = recovered


def test_M14_sigkill_loses_nothing_confirmed(tmp_path) -> None:
    """M14: after SIGKILL at random moments (24 kills, half of them during a compaction) every
    synced operation is there, intact, and the state is exactly a prefix of the operations.
    Then a crash before each file-system step of a compaction."""
    directory = os.fspath(tmp_path / "store")
    rng = random.Random(20240607)
    history = History()
    compactions_hit = 0
    for round_no in range(24):
        mode = "in-compaction" if round_no % 2 else "after-syncs"
        lines, rc = _run(directory, round_no, rng, mode=mode)
        assert rc == -9
        compactions_hit += "K\n" in lines
        _verify(directory, history, lines)
    assert compactions_hit >= 12
    step = 0
    while True:
        step += 1
        lines, rc = _run(directory, 100 + step, rng, mode="die-before", die_before=step)
        _verify(directory, history, lines)
        if rc == 0:  # the compaction finished: every step before it has had its crash
            break
        assert rc == 86
    assert step >= 6  # fsync dir, fsync snapshot, replace, fsync dir, unlink, fsync dir
    assert history.verified > 1000

    # -- damage to what the crashes left ---------------------------------------------------
    lines, _ = _run(directory, 999, rng, mode="after-syncs", syncs=10, compact_min=1 << 40)
    _verify(directory, history, lines)
    segments = sorted(n for n in os.listdir(directory) if n.endswith(".log"))
    seg = os.path.join(directory, segments[-1])
    with open(seg, "rb") as f:
        raw = f.read()
    batches = []
    pos = 0
    while pos < len(raw):
        b = parse_batch(raw, pos)
        batches.append((b.start, b.end, range(b.first_lsn, b.first_lsn + len(b.ops))))
        pos = b.end
    assert len(batches) >= 3
    work = os.fspath(tmp_path / "work")
    for trial in range(30):
        shutil.rmtree(work, ignore_errors=True)
        shutil.copytree(directory, work)
        # _verify's clean close left a checkpoint, which would skip the replay that finds
        # the damage (by design: a killed process leaves none).
        remove_checkpoint(work, do_fsync=False)
        at = rng.randrange(len(raw))
        hit = next(i for i, (_, end, _) in enumerate(batches) if at < end)
        start, end, lsns = batches[hit]
        path = os.path.join(work, segments[-1])
        if trial % 2 == 0:  # truncated mid-record: the batches before the cut are kept
            with open(path, "r+b") as f:
                f.truncate(at)
            with Store.open(work) as s:
                assert s.last_lsn == lsns[0] - 1
                assert dict(s.items()) == history.state_at(lsns[0] - 1)
                assert s.recovery.torn_bytes == at - start
            continue
        with open(path, "r+b") as f:
            f.seek(at)
            f.write(bytes([raw[at] ^ (1 << rng.randrange(8))]))
        if hit == len(batches) - 1:  # the last batch: a torn write, set aside
            with Store.open(work) as s:
                assert dict(s.items()) == history.state_at(lsns[0] - 1)
                assert s.recovery.torn_bytes == end - start
            continue
        with pytest.raises(StoreCorruptError, match=f"offset {start}\\.\\.{end}"):
            Store.open(work)
        with Store.open(work, salvage=True) as s:
            assert dict(s.items()) == history.state_at(history.verified, skip=lsns)
            assert s.recovery.torn_bytes == end - start
