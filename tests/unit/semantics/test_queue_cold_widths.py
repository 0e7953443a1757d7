"""A live run keeps a message's size in 4 bytes and its ref in 2 (issue 31 aim 3: 10 of the
~100 bytes a folded message costs at 10^6), and widens that array for one that does not fit:
every message thaws with the size and ref it was folded with."""

from __future__ import annotations

from semantics.message_ids import new_msg_id
from semantics.queue import CmqQueue
from semantics.queue_attrs import QueueAttributes
from semantics.queue_cold import LiveRun

T0 = 1_700_000_000.0


class Freezer:
    """Refs from ``first`` up; remembers what each thaw was given."""

    def __init__(self, first: int) -> None:
        self.first = first
        self.payloads: list[object] = []
        self.thawed: list[tuple[str, int, int]] = []

    def freeze(self, msg_id: str, payload: object, enqueue_time: float) -> int:
        self.payloads.append(payload)
        return self.first + len(self.payloads) - 1

    def thaw(self, index: int, msg_id: str, enqueue_time: float, size: int, ref: int) -> object:
        self.thawed.append((msg_id, size, ref))
        return self.payloads[ref - self.first]


def _fold_and_drain(first: int, size_of: list[int]) -> tuple[Freezer, list[LiveRun], list[tuple[str, int]]]:
    freezer = Freezer(first)
    q = CmqQueue("q", QueueAttributes(msg_retention_seconds=86_400), refuse_size=False)  # sizes past L6
    q.fold_with(freezer, keep=10, tail=5, batch=20)
    ids = [new_msg_id() for _ in size_of]
    for i, (msg_id, size) in enumerate(zip(ids, size_of, strict=True)):
        q.send(("p", msg_id), size, T0 + i, msg_id=msg_id)
    runs = [r for r in q._runs if isinstance(r, LiveRun)]
    assert q.cold > 50 and runs
    got = []
    while (m := q.receive_and_delete(T0 + 1000)) is not None:
        assert m.payload == ("p", m.msg_id)
        got.append((m.msg_id, m.size))
    assert got == list(zip(ids, size_of, strict=True))
    return freezer, runs, got


def test_a_folded_message_costs_4_bytes_of_size_and_2_of_ref() -> None:
    freezer, runs, got = _fold_and_drain(0, [1024 + i for i in range(100)])
    assert all((r.sizes.itemsize, r.refs.itemsize) == (4, 2) for r in runs)
    sizes = dict(got)
    assert freezer.thawed and all(sizes[m] == s for m, s, _ in freezer.thawed)
    assert [ref for _, _, ref in freezer.thawed] == list(range(len(freezer.thawed)))


def test_a_size_past_4_GiB_and_a_ref_past_65535_widen_their_arrays_and_thaw_exact() -> None:
    big = [(5 << 30) + i if i % 7 == 3 else 100 + i for i in range(100)]
    freezer, runs, got = _fold_and_drain(70_000, big)
    assert any(r.sizes.itemsize == 8 for r in runs) and all(r.refs.itemsize == 8 for r in runs)
    sizes = dict(got)
    assert any(s > 1 << 32 for _, s, _ in freezer.thawed)
    assert all(sizes[m] == s for m, s, _ in freezer.thawed)
    assert [ref for _, _, ref in freezer.thawed] == list(range(70_000, 70_000 + len(freezer.thawed)))
