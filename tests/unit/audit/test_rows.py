"""A1/A2: the broker's per-message records as rows (gateway.audit.rows) are written and counted
exactly as the same records given as keyword fields: same JSON line, same count key, in the
writer thread and in the writer process."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.audit import AuditLog, NullAudit
from gateway.audit.counting import FIELDS_READ, count_key
from gateway.audit.layout import list_files
from gateway.audit.record import FIELD_TYPES, format_line
from gateway.audit.rows import (
    ACK,
    DELIVER,
    ENQUEUE,
    PUBLISH_QUEUE,
    PUBLISH_TOPIC,
    ROUTE,
    ROWS,
    Row,
    values_emitter,
)
from gateway.metrics import Counters

TS = "2026-11-21T10:00:00.000001Z"

_text = st.text(max_size=12)
_VALUE = {
    "string": st.one_of(st.none(), _text),
    "long": st.one_of(st.none(), st.integers(0, 2**40)),
    "int": st.one_of(st.none(), st.integers(0, 200)),
    "double": st.one_of(st.none(), st.floats(allow_nan=False, allow_infinity=False)),
    "array<string>": st.one_of(st.none(), st.lists(_text, max_size=3)),
    "boolean": st.one_of(st.none(), st.booleans()),
}


def _values(row: Row) -> st.SearchStrategy[tuple[Any, ...]]:
    return st.tuples(*(_VALUE[FIELD_TYPES[k]] for k in row.keys))


@st.composite
def _row_and_values(draw: st.DrawFn) -> tuple[Row, tuple[Any, ...]]:
    row = draw(st.sampled_from(ROWS))
    return row, draw(_values(row))


@settings(max_examples=300, deadline=None)
@given(_row_and_values(), _text)
def test_A2_a_row_is_the_line_and_count_of_its_fields(rv: tuple[Row, tuple[Any, ...]], vhost: str) -> None:
    row, values = rv
    fields = row.fields(values)
    assert row.fmt(TS, row.event, vhost, *values) == format_line(TS, row.event, vhost, fields)
    assert row.count_key(vhost, values) == count_key(row.event, vhost, fields)


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(sorted(FIELDS_READ) + ["bind", "nack"]), _text,
       st.dictionaries(st.sampled_from(sorted(FIELD_TYPES)), st.one_of(st.none(), _text, st.integers(0, 9))))
def test_count_key_reads_only_the_fields_it_declares(event: str, vhost: str, fields: dict[str, Any]) -> None:
    """Rows count from FIELDS_READ alone, so count_key must not read anything else."""
    read = {k: v for k, v in fields.items() if k in FIELDS_READ.get(event, ())}
    assert count_key(event, vhost, fields) == count_key(event, vhost, read)


class StepClock:
    """A step per record emitted: only the test's own thread steps it, so the writer thread's
    reads of the time (its rotation check) cannot shift the records' times by how often a
    loaded machine lets it run."""

    def __init__(self) -> None:
        self.t = 1_795_000_000.0

    def __call__(self) -> float:
        if threading.current_thread() is threading.main_thread():
            self.t += 0.000_25
        return self.t


ROWS_SENT: list[tuple[Row, tuple[Any, ...]]] = [
    (PUBLISH_QUEUE, ("q", "q", "msg-1", 16, "guest", "127.0.0.1:1")),
    (ENQUEUE, ("q", "msg-1", 16, None, None)),
    (PUBLISH_TOPIC, ("x", "a.b", "msg-2", ["a"], 5, "guest", "127.0.0.1:1")),
    (ROUTE, ("x", "msg-2", "a.b", "x.q", "q", ["a"], 5)),
    (ENQUEUE, ("q", "msg-2", 5, "x", "x.q")),
    (DELIVER, ("guest", "127.0.0.1:2", "q", "msg-1", 1, 16)),
    (DELIVER, ("guest", "127.0.0.1:2", "q", "msg-2", 2, 5)),
    (ACK, ("guest", "127.0.0.1:2", "q", "msg-1", 1.5)),
]


def _write(directory: Path, as_rows: bool, process: bool, as_values: bool = False) -> list[bytes]:
    clock = StepClock()
    audit = AuditLog(str(directory), clock=clock, process=process)
    if process:  # a test clock keeps the writer in-thread unless told otherwise
        audit._clock = clock  # noqa: SLF001 (the child only formats the times it is given)
    emit_values = values_emitter(audit)
    for row, values in ROWS_SENT * 50:
        if as_values:
            emit_values(row, "/", *values)
        elif as_rows:
            audit.emit_row(row, "/", values)
        else:
            audit.emit(row.event, "/", **row.fields(values))
    audit.close()
    return [line for f in list_files(str(directory)) for line in Path(f.path).read_bytes().splitlines()]


def test_A1_rows_write_the_same_files_as_keyword_records(tmp_path: Path) -> None:
    by_fields = _write(tmp_path / "fields", as_rows=False, process=False)
    assert len(by_fields) == 8 * 50
    assert _write(tmp_path / "rows-thread", as_rows=True, process=False) == by_fields
    assert _write(tmp_path / "rows-process", as_rows=True, process=True) == by_fields
    assert _write(tmp_path / "values-thread", as_rows=False, process=False, as_values=True) == by_fields
    assert _write(tmp_path / "values-process", as_rows=False, process=True, as_values=True) == by_fields
    assert json.loads(by_fields[5])["event"] == "deliver"


def test_D9_the_writer_process_counts_what_the_tee_counts(tmp_path: Path) -> None:
    """/metrics fed by the audit writer process (counts sent back on each flush) equals the
    counting tee in front of a sink that does not count."""

    class Sink:
        def emit(self, event: str, vhost: str, **fields: Any) -> None:
            pass

    tee = Counters(Sink())
    audit = AuditLog(str(tmp_path), process=True)
    fed = Counters(audit, fed=True)
    for row, values in ROWS_SENT * 3:
        audit.emit_row(row, "/", values)
        tee.emit_row(row, "/", values)
    audit.emit("bind", "/", topic="x", queue="q")
    tee.emit("bind", "/", topic="x", queue="q")
    assert audit.flush(10)
    assert dict(fed.raw) == dict(tee.raw)
    assert fed.queue_stat("/", "q", "redeliver") == 3
    assert fed.exchange_stat("/", "x", "publish_out") == 3
    audit.close()


def test_D9_values_reach_the_tee_and_are_counted() -> None:
    """values_emitter(sink) passes ``emit_values(row, vhost, *values)`` as ``emit_row(row,
    vhost, values)`` to a sink without its own: the metrics tee counts them, although it
    forwards what it lacks to its inner sink (whose own emit_values would not count)."""
    by_row, by_values = Counters(NullAudit()), Counters(NullAudit())
    emit_values = values_emitter(by_values)
    for row, values in ROWS_SENT * 3:
        by_row.emit_row(row, "/", values)
        emit_values(row, "/", *values)
    assert dict(by_values.raw) == dict(by_row.raw) and sum(by_row.raw.values()) == len(ROWS_SENT) * 3
