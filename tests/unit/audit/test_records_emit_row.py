"""Records.emit_row: the audit log's emit_row in C for the packed records (process mode).

It stands for the Python closure that checked the pending limit and the closed flag, called
``add(row.id, vhost, values)`` and woke the writer at ``wake_at``: these tests hold it to the
same packing as ``add`` and to the same shed / wake decisions (SPEC A1: bounded memory, every
shed record counted)."""

from __future__ import annotations

import gc
import weakref
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.audit import fastformat
from gateway.audit.rows import ACK, DELIVER, ENQUEUE, PUBLISH_QUEUE, ROWS, values_emitter
from gateway.audit.writer import AuditLog, _plain

pytestmark = pytest.mark.skipif(fastformat.Records is None, reason="the compiled module is not built")

_VALUE = st.one_of(st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(allow_nan=False),
                   st.text(max_size=5), st.lists(st.text(max_size=3), max_size=2))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(ROWS), st.sampled_from(["/", "v", "é"]),
                          st.lists(_VALUE, max_size=8).map(tuple)), max_size=20))
def test_A1_emit_row_packs_what_add_of_the_row_id_packs(records: list[Any]) -> None:
    by_add, by_emit = fastformat.Records(_plain), fastformat.Records(_plain)
    for row, vhost, values in records:
        by_add.add(row.id, vhost, values)
        by_emit.emit_row(row, vhost, values)
    assert len(by_emit) == len(by_add) == len(records)
    got = [item[1:] for item in fastformat.unpack(by_emit.take())]
    assert got == [item[1:] for item in fastformat.unpack(by_add.take())]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(ROWS), st.sampled_from(["/", "v", "é"]),
                          st.lists(_VALUE, max_size=8).map(tuple)), max_size=20),
       st.integers(0, 20), st.integers(-1, 20))
def test_A1_emit_values_packs_sheds_and_wakes_as_emit_row(records: list[Any], limit: int, wake_at: int) -> None:
    """emit_values(row, vhost, *values), the broker's hot paths' (no tuple a record), is
    emit_row(row, vhost, values): the same packing, the same shed and wake calls."""
    calls: dict[str, list[str]] = {"row": [], "values": []}
    by_row, by_values = fastformat.Records(_plain), fastformat.Records(_plain)
    for name, recs in (("row", by_row), ("values", by_values)):
        recs.watch(limit, wake_at, lambda n=name: calls[n].append("shed"), lambda n=name: calls[n].append("wake"))
    for row, vhost, values in records:
        by_row.emit_row(row, vhost, values)
        by_values.emit_values(row, vhost, *values)
    assert calls["values"] == calls["row"]
    assert len(by_values) == len(by_row) == min(limit, len(records))
    got = [item[1:] for item in fastformat.unpack(by_values.take())]
    assert got == [item[1:] for item in fastformat.unpack(by_row.take())]


def test_A1_emit_values_refuses_what_emit_row_refuses() -> None:
    recs = fastformat.Records(_plain)
    for emit in (lambda *a: recs.emit_row(a[0], a[1], a[2:]), recs.emit_values):
        with pytest.raises(AttributeError):
            emit(object(), "/")
        with pytest.raises(TypeError):
            emit(DELIVER, b"/")
    with pytest.raises(TypeError):
        recs.emit_values(DELIVER)
    with pytest.raises(TypeError):
        recs.emit_row(DELIVER, "/", iter(()))  # values not a tuple or list
    assert len(recs) == 0


def test_A1_emit_row_sheds_past_its_limit_and_wakes_the_writer_once() -> None:
    calls: list[str] = []
    recs = fastformat.Records(_plain)
    recs.watch(3, 1, lambda: calls.append("shed"), lambda: calls.append("wake"))
    for i in range(5):
        recs.emit_row(ENQUEUE, "/", ("q", f"m-{i}", 16, None, None))
    assert len(recs) == 3
    assert calls == ["wake", "shed", "shed"]  # woken as the second record went in
    assert [item[3][1] for item in fastformat.unpack(recs.take())] == ["m-0", "m-1", "m-2"]
    recs.emit_row(ACK, "/", ("guest", "peer", "q", "m-0", 0.5))  # room again after a take
    assert len(recs) == 1 and calls == ["wake", "shed", "shed"]


def test_A1_emit_row_refuses_a_row_without_an_id_and_packs_nothing() -> None:
    recs = fastformat.Records(_plain)
    with pytest.raises(AttributeError):
        recs.emit_row(object(), "/", ())
    with pytest.raises(TypeError):
        recs.emit_row(DELIVER, b"/", ())
    assert len(recs) == 0


def test_A1_a_closed_log_counts_what_emit_row_sheds_and_is_collected(tmp_path: Path) -> None:
    audit = AuditLog(str(tmp_path / "audit"))
    assert audit._records is not None, "process mode packs in C"
    audit.emit_row(PUBLISH_QUEUE, "/", ("q", "q", "m-1", 16, "guest", "peer"))
    audit.close()
    dropped = audit.dropped
    audit.emit_row(PUBLISH_QUEUE, "/", ("q", "q", "m-2", 16, "guest", "peer"))
    assert audit.dropped == dropped + 1
    # The records hold the log's _shed, the log holds the records: the collector frees both.
    ref = weakref.ref(audit)
    del audit
    gc.collect()
    assert ref() is None


class _SlottedRow:
    __slots__ = ("id",)


class _DictRow:
    pass


def test_A1_emit_row_reads_the_row_id_as_python_does() -> None:
    """emit_row reads ``row.id`` at the slot's offset it remembers for Row's class: a row of
    another class (slotted, a dict, a subclass whose id became a property after it was read)
    gives the id Python's ``row.id`` gives, and an empty slot raises as it does."""
    recs = fastformat.Records(_plain)
    slotted, plain = _SlottedRow(), _DictRow()
    slotted.id = ACK.id
    plain.id = DELIVER.id  # type: ignore[attr-defined]
    later_class = type("Later", (_SlottedRow,), {"__slots__": ()})
    later = later_class()
    later.id = ENQUEUE.id
    for row in (PUBLISH_QUEUE, slotted, plain, later, PUBLISH_QUEUE, later):
        recs.emit_row(row, "/", ())
    later_class.id = property(lambda self: ACK.id)  # type: ignore[attr-defined]
    recs.emit_row(later, "/", ())
    with pytest.raises(AttributeError):
        recs.emit_row(_SlottedRow(), "/", ())
    assert [item[1] for item in fastformat.unpack(recs.take())] == [
        PUBLISH_QUEUE.id, ACK.id, DELIVER.id, ENQUEUE.id, PUBLISH_QUEUE.id, ENQUEUE.id, ACK.id]


def test_A1_a_log_in_process_mode_takes_values_in_c_and_sheds_them_once_closed(tmp_path: Path) -> None:
    audit = AuditLog(str(tmp_path / "audit"))
    assert audit._records is not None, "process mode packs in C"
    emit_values = values_emitter(audit)
    assert emit_values == audit._records.emit_values  # no Python frame a record
    emit_values(PUBLISH_QUEUE, "/", "q", "q", "m-1", 16, "guest", "peer")
    assert audit.pending == 1
    audit.close()
    dropped = audit.dropped
    emit_values(PUBLISH_QUEUE, "/", "q", "q", "m-2", 16, "guest", "peer")
    assert audit.dropped == dropped + 1
