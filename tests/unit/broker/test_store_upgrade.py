"""semantics.store.versioning with the broker's layout step (persistence.rekey_v0): a data dir
of key format 0 (names joined raw) is rekeyed from the names its values repeat, in one batch
that a crash leaves either whole or absent; a newer format is refused untouched (M14)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.broker import Broker, BrokerConfig
from gateway.broker import persistence as P
from gateway.protocol.properties import Properties
from semantics.clock import ManualClock
from semantics.store import Store, StoreFormatError
from semantics.store.files import segment_name
from semantics.store.keys import make_key
from semantics.store.versioning import FORMAT_KEY, read_version, upgrade
from tests.unit.broker.old_format import old_key, write_old_format_dir

ROOT = Path(__file__).resolve().parents[3]
STEPS = {0: P.rekey_v0}


def _old_dir(path: Path) -> dict[str, bytes]:
    """The old-format dir of old_format.py plus a retained topic message and an HTTP
    subscription whose names hold ``/``; returns its live map."""
    write_old_format_dir(path)
    with Store.open(str(path)) as store:
        store.put(old_key("t", "a/b", "ex", "msg-7"), P.encode_retained(
            "a/b", "ex", "msg-7", 1.0, ["s/1"], "k", [], Properties.build(delivery_mode=2).raw, b"t"))
        store.put(old_key("s", "a", "b/ex", "s/1"), json.dumps(
            {"vhost": "a", "exchange": "b/ex", "name": "s/1", "url": "http://x/"}).encode())
        store.put("zz/unknown", b"kept as it is")
        store.put(old_key("q", "/", "broken"), b"not json")
        return dict(store.items())


def _expected_key(key: str, value: bytes) -> str:
    """The new key, from the names in the value (independently of rekey_v0's dispatch)."""
    kind = key[0]
    if key in ("zz/unknown", old_key("q", "/", "broken")):
        return key
    if kind == "m":
        m = P.decode_message(value)
        return make_key("m", m["vhost"], m["queue"], m["msg_id"])
    if kind == "t":
        t = P.decode_retained(value)
        return make_key("t", t["vhost"], t["exchange"], t["msg_id"])
    r = json.loads(value)
    names = {"x": ("vhost", "name"), "q": ("vhost", "name"), "s": ("vhost", "exchange", "name"),
             "b": ("vhost", "source", "kind", "dest", "key")}[kind]
    return make_key(kind, *(r[n] for n in names))


def _migrated(old: dict[str, bytes]) -> dict[str, bytes]:
    new = {_expected_key(k, v): v for k, v in old.items()}
    new[FORMAT_KEY] = str(P.FORMAT_VERSION).encode()
    return new


def test_M14_format_0_is_rekeyed_from_the_names_in_the_values(tmp_path: Path) -> None:
    old = _old_dir(tmp_path)
    assert old_key("q", "a", "b/c") == old_key("q", "a/b", "c")  # the collision the old store had
    with Store.open(str(tmp_path)) as store:
        done = upgrade(store, P.FORMAT_VERSION, STEPS)
        assert (done.found, done.version) == (0, P.FORMAT_VERSION)
        assert dict(store.items()) == _migrated(old)
    with Store.open(str(tmp_path)) as store:  # durable, and done once
        assert dict(store.items()) == _migrated(old)
        assert upgrade(store, P.FORMAT_VERSION, STEPS).renamed == 0


def test_a_new_key_equal_to_another_record_s_old_key_loses_neither(tmp_path: Path) -> None:
    """Queue ``%2F`` had the old key ``q/x/%2F``, which is queue ``/``'s new key: the old keys
    are all deleted before the new ones are written, so both records end up in place."""
    with Store.open(str(tmp_path)) as store:
        for name in ("%2F", "/"):
            store.put(old_key("q", "x", name), P.encode_json({"vhost": "x", "name": name}))
        upgrade(store, P.FORMAT_VERSION, STEPS)
        got = {json.loads(store.get(P.queue_key("x", n)) or b"null")["name"] for n in ("%2F", "/")}
        assert got == {"%2F", "/"}
        assert len(store) == 3


def test_a_fresh_store_is_stamped_with_the_current_format() -> None:
    store = Store.open(None)
    assert read_version(store) is None
    assert upgrade(store, P.FORMAT_VERSION, STEPS).renamed == 0
    assert read_version(store) == P.FORMAT_VERSION


@pytest.mark.parametrize("stamp", [str(P.FORMAT_VERSION + 1).encode(), b"two"])
async def test_a_newer_or_unreadable_format_is_refused_before_anything_changes(tmp_path: Path, stamp: bytes) -> None:
    with Store.open(str(tmp_path)) as store:
        store.put(FORMAT_KEY, stamp)
        store.put(old_key("q", "/", "a/b"), P.encode_json({"vhost": "/", "name": "a/b"}))
    seg = tmp_path / segment_name(1)
    before = seg.read_bytes()
    with pytest.raises(StoreFormatError, match="store key format"):
        await Broker.open(str(tmp_path), clock=ManualClock(), config=BrokerConfig(fsync=False))
    assert seg.read_bytes() == before
    Store.open(str(tmp_path)).close()  # the refused broker released the directory lock


def _state(path: Path) -> dict[str, bytes]:
    with Store.open(str(path), fsync=False) as store:
        return dict(store.items())


def test_M14_a_crash_anywhere_in_the_upgrade_leaves_the_old_or_the_new_layout(tmp_path: Path) -> None:
    """The upgrade is one batch: the segment cut at any byte inside it (a crash mid-write)
    reopens as exactly the old layout, which the next upgrade completes; cut after it, the new."""
    base = tmp_path / "base"
    old = _old_dir(base)
    seg = base / segment_name(1)
    start = seg.stat().st_size
    with Store.open(str(base)) as store:
        upgrade(store, P.FORMAT_VERSION, STEPS)
    full = seg.read_bytes()
    assert len(full) > start
    new = _migrated(old)
    cuts = sorted({*range(start, len(full), 13), start + 1, len(full) - 1, len(full)})
    for cut in cuts:
        d = tmp_path / f"cut-{cut}"
        shutil.copytree(base, d)
        (d / segment_name(1)).write_bytes(full[:cut])
        state = _state(d)
        if cut == len(full):
            assert state == new
            continue
        assert state == old, f"cut at {cut} of {start}..{len(full)}"
        with Store.open(str(d), fsync=False) as store:
            upgrade(store, P.FORMAT_VERSION, STEPS)
        assert _state(d) == new
        shutil.rmtree(d)


CHILD = """
import os, sys, time
from gateway.broker import persistence as P
from semantics.store import Store
from semantics.store.versioning import upgrade

store = Store.open(sys.argv[1])

def half_then_hang(data):
    # Half of the upgrade's batch reaches the disk, then the process waits to be killed.
    os.write(store._file.fileno(), data[:len(data) // 2])
    os.fsync(store._file.fileno())
    print("half", flush=True)
    time.sleep(120)

store._write_all = half_then_hang
upgrade(store, P.FORMAT_VERSION, {0: P.rekey_v0})
"""


def test_M14_sigkill_in_the_middle_of_the_upgrade_batch_keeps_the_old_layout(tmp_path: Path) -> None:
    """A real process SIGKILLed with half of the upgrade batch on disk: the store reopens as
    the old layout, and a gateway opening it then upgrades it completely."""
    old = _old_dir(tmp_path)
    proc = subprocess.Popen([sys.executable, "-c", CHILD, str(tmp_path)], cwd=ROOT, stdout=subprocess.PIPE,
                            text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "half\n"
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    with Store.open(str(tmp_path)) as store:
        assert store.recovery.torn_bytes > 0
        assert dict(store.items()) == old
        upgrade(store, P.FORMAT_VERSION, STEPS)
    assert _state(tmp_path) == _migrated(old)


@given(st.text(max_size=8), st.text(max_size=8), st.text(max_size=8))
def test_the_cached_message_key_is_the_codec_s_key(vhost: str, queue: str, msg_id: str) -> None:
    """persistence.message_key caches each queue's escaped prefix (the persistent publish
    path): it must build exactly the key the codec builds, escapes and all."""
    assert P.message_key(vhost, queue, msg_id) == make_key("m", vhost, queue, msg_id)
    assert P.message_key(vhost, queue, msg_id).startswith(P.queue_messages_prefix(vhost, queue))
