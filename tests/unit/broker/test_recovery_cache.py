"""A clean stop leaves the queues' cold runs for the next start (gateway.broker.recovery_cache):
taken only when the store reopened from that very stop's checkpoint, and then the same
runs as reading every message record gives; otherwise the records are read, as before."""

from __future__ import annotations

import os
import shutil
from typing import Any

import pytest

from gateway.broker import Broker, recovery
from gateway.broker import persistence as P
from gateway.broker.recovery_cache import CACHE_NAME
from gateway.protocol.properties import Properties
from semantics.clock import ManualClock
from semantics.store.checkpoint import CHECKPOINT_NAME


def _declare(b: Broker, vhost: str, queue: str) -> None:
    b.vhost(vhost).declare_queue(None, queue, passive=False, durable=True, exclusive=False, auto_delete=False,
                                 arguments=None)


async def _publish_some(path: str, clock: ManualClock, start: int, n: int) -> None:
    b = await Broker.open(path, clock=clock)
    for vhost, queue in (("/", "a"), ("/", "b/c"), ("v2", "a")):
        _declare(b, vhost, queue)
    for i in range(start, start + n):
        clock.advance(0.001)
        vhost, queue = [("/", "a"), ("/", "b/c"), ("v2", "a")][i % 3]
        props = Properties.build(delivery_mode=2, headers={"k": i % 4}, message_id=f"m{i}")
        b.vhost(vhost).publish("", queue, props, bytes([i % 256]) * (10 + 40 * (i % 7)))
    # Some go before the stop: the runs hold only what is left.
    q = b.vhosts["/"].queues["a"]
    for _ in range(n // 10):
        r = q.receive(clock.now())
        assert r is not None
        assert q.cmq.delete(r, clock.now())
        b.unpersist_message(q, r.message, body_needed=False)
    await b.close()


def _runs(b: Broker) -> dict[tuple[str, str], list[Any]]:
    """What each queue holds after a start: every message's ID, enqueue time, body and
    properties, in order (delivered one by one)."""
    out: dict[tuple[str, str], list[Any]] = {}
    now = b.clock.now()
    for vname, vh in b.vhosts.items():
        for qname, q in vh.queues.items():
            got = out[(vname, qname)] = []
            while (r := q.receive(now)) is not None:
                m = r.message.payload
                got.append((r.message.msg_id, m.published_at, m.body, m.properties.headers, m.properties.message_id))
    return out


@pytest.fixture
def no_reading(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts the starts that read the message records instead of taking the cache."""
    calls: list[int] = []
    real = recovery.read_runs

    def counted(*args: Any) -> Any:
        calls.append(1)
        return real(*args)

    monkeypatch.setattr(recovery, "read_runs", counted)
    return calls


async def _open_copy(src: str, dst: str, clock: ManualClock, drop: tuple[str, ...] = ()) -> Broker:
    shutil.copytree(src, dst)
    for name in drop:
        os.unlink(os.path.join(dst, name))
    return await Broker.open(dst, clock=clock)


async def test_a_clean_stop_leaves_runs_the_next_start_takes_and_they_match_the_records(tmp_path, no_reading):
    clock = ManualClock()
    d = str(tmp_path / "d")
    for round_ in range(3):  # stop, start, publish more, stop again: each start from the cache
        await _publish_some(d, clock, round_ * 300, 300)
        assert os.path.exists(os.path.join(d, CACHE_NAME))
        calls = len(no_reading)
        read = await _open_copy(d, str(tmp_path / f"read{round_}"), clock, drop=(CACHE_NAME,))
        assert len(no_reading) == calls + 1
        cached = await _open_copy(d, str(tmp_path / f"cached{round_}"), clock)
        assert len(no_reading) == calls + 1  # the cache, not the records
        assert not os.path.exists(os.path.join(str(tmp_path / f"cached{round_}"), CACHE_NAME))
        expected = _runs(read)
        assert sum(map(len, expected.values())) == 270 * (round_ + 1)
        assert _runs(cached) == expected
        await read.close()
        await cached.close()
        # Delivered but never acked: each comes back again at the next start.


async def test_acks_after_a_start_from_the_cache_delete_the_records(tmp_path, no_reading):
    clock = ManualClock()
    d = str(tmp_path / "d")
    await _publish_some(d, clock, 0, 90)
    calls = len(no_reading)
    b = await Broker.open(d, clock=clock)
    assert len(no_reading) == calls
    q = b.vhosts["v2"].queues["a"]
    n = q.message_count
    while (r := q.receive(clock.now())) is not None:
        assert q.cmq.delete(r, clock.now())
        b.unpersist_message(q, r.message, body_needed=False)
    assert not b.store.keys(P.queue_messages_prefix("v2", "a"))
    await b.close()
    b = await Broker.open(d, clock=clock)
    assert b.vhosts["v2"].queues["a"].message_count == 0 and n == 30
    assert b.vhosts["/"].queues["a"].message_count == 21
    await b.close()


async def test_a_cache_of_another_stop_or_damaged_is_not_taken(tmp_path, no_reading):
    clock = ManualClock()
    d = str(tmp_path / "d")
    await _publish_some(d, clock, 0, 60)
    with open(os.path.join(d, CACHE_NAME), "rb") as f:
        old = f.read()
    await _publish_some(d, clock, 60, 60)  # another stop: another checkpoint
    with open(os.path.join(d, CACHE_NAME), "rb") as f:
        good = f.read()
    cases = {"old": old, "torn": good[:len(good) // 2], "flipped": good[:-3] + bytes([good[-3] ^ 1]) + good[-2:]}
    expected = None
    for name, raw in cases.items():
        work = str(tmp_path / name)
        shutil.copytree(d, work)
        with open(os.path.join(work, CACHE_NAME), "wb") as f:
            f.write(raw)
        calls = len(no_reading)
        b = await Broker.open(work, clock=clock)
        assert len(no_reading) == calls + 1, name
        got = _runs(b)
        expected = expected or got
        assert got == expected and sum(map(len, got.values())) == 108
        await b.close()
    # A store that did not come from a checkpoint (a killed process left none).
    calls = len(no_reading)
    b = await _open_copy(d, str(tmp_path / "nockpt"), clock, drop=(CHECKPOINT_NAME,))
    assert len(no_reading) == calls + 1
    assert _runs(b) == expected
    await b.close()
