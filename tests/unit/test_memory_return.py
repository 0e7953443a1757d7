"""Freed memory goes back to the OS once a backlog drained (issue 15), once per drain."""

from __future__ import annotations

from gateway.memory import MemoryReturn


def test_trims_once_when_held_falls_under_a_quarter_of_a_large_peak() -> None:
    calls: list[int] = []
    m = MemoryReturn()
    m._trim = lambda pad: calls.append(pad) or 1
    big = MemoryReturn.MIN_PEAK * 2
    assert not m.tick(big)
    assert not m.tick(big // 2)  # still over a quarter of the peak
    assert m.tick(big // 8)
    assert not m.tick(big // 8)  # once: the peak is what is held now
    assert calls == [0]


def test_small_peaks_never_trim() -> None:
    m = MemoryReturn()
    m._trim = lambda pad: 1
    assert not m.tick(MemoryReturn.MIN_PEAK - 1)
    assert not m.tick(0)
