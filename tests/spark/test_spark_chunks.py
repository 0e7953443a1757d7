"""The reader parses a byte range a few MiB at a time and hands Spark each chunk's rows before
parsing the next (A3, A4): the same rows and the same skipped lines as parsing it whole."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pytest

import spark.lines
from gateway.audit import AuditLog
from gateway.audit.compact import compact_dir, parquet_path
from gateway.audit.layout import list_files
from spark.lines import chunk_bounds, parse_chunks, parse_lines
from spark.plan import constant
from spark.schema import AUDIT_SCHEMA, SKIPPED_SCHEMA
from spark.source import AuditPushdownReader, AuditReader

pytestmark = pytest.mark.spark

H10 = 1_714_557_600.0  # 2024-05-01T10:00:00Z
ROOT = Path(__file__).resolve().parents[2]


def write(root: Path, count: int) -> None:
    now = [H10]
    with AuditLog(str(root), clock=lambda: now[0]) as audit:
        for i in range(count):
            audit.emit("publish", "/", topic="a" if i % 2 else "b", msg_id=f"msg-{i:05d}", size=i,
                       tags=["t"], user="u")
            now[0] += 0.01


def garbled(root: Path, count: int) -> tuple[Path, bytes]:
    """A real file with a line garbled at a third, a wrong-typed line at two thirds and a torn
    last line, as crashes and bad writes leave them."""
    write(root, count)
    (af,) = list(list_files(str(root)))
    lines = Path(af.path).read_bytes().splitlines(keepends=True)
    a, b = count // 3, 2 * count // 3
    data = (b"".join(lines[:a]) + b'{"v":1,"ts":"2024\n' + b"".join(lines[a:b])
            + b'{"v":1,"ts":"2024-05-01T10:00:00Z","event":"publish","vhost":"/","size":"big"}\n'
            + b"".join(lines[b:]) + b'{"v":1,"e')
    Path(af.path).write_bytes(data)
    return Path(af.path), data


@pytest.mark.parametrize("size", [1, 97, 4096, 50_000, 10**9])
def test_A3_chunks_give_the_rows_and_skipped_lines_of_the_whole(tmp_path: Path, size: int) -> None:
    _, data = garbled(tmp_path, 600)
    whole = parse_lines(data, 1000, closed_end=True)
    parts = list(parse_chunks(data, 1000, closed_end=True, size=size))
    assert (len(parts) == 1) == (size >= len(data))
    joined = pa.concat_tables([p.table for p in parts])
    assert joined.num_rows == 600 and joined.equals(whole.table)
    skipped = [s for p in parts for s in p.skipped]
    assert skipped == whole.skipped and [s.text[:12] for s in skipped] == [
        b'{"v":1,"ts":"2024\n'[:12], b'{"v":1,"ts":"2024-05'[:12], b'{"v":1,"e']
    assert all(data[s.offset - 1000:s.offset - 1000 + s.length] == s.text for s in skipped)


def test_A4_chunk_bounds_cover_every_line_exactly_once() -> None:
    data = b"".join(b"x" * (i % 37) + b"\n" for i in range(2000)) + b"tail"
    for size in (1, 2, 36, 37, 38, 1000, len(data), len(data) + 1):
        spans = list(chunk_bounds(data, size))
        assert spans[0][0] == 0 and spans[-1][1] == len(data)
        assert all(hi == lo2 for (_, hi), (lo2, _) in zip(spans, spans[1:], strict=False))
        assert all(data[hi - 1:hi] == b"\n" for _, hi in spans[:-1])  # cut only after a newline
        assert all(hi - lo >= min(size, len(data) - lo) for lo, hi in spans)  # no tiny chunks
    assert list(chunk_bounds(b"", 10)) == []


def test_A4_reader_streams_a_range_as_many_batches_with_its_layout_columns(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Several chunks per range: every record once, each batch carrying its file's dt, hour,
    file, open_file and gateway, with the row filters applied chunk by chunk."""
    write(tmp_path, 3000)
    (af,) = list(list_files(str(tmp_path)))
    monkeypatch.setattr(spark.lines, "CHUNK", 16 * 1024)
    reader = AuditReader({"path": str(tmp_path), "maxpartitionbytes": str(200 * 1024)}, AUDIT_SCHEMA)
    parts = reader.partitions()
    assert len(parts) == -(-af.size // (200 * 1024)) > 1
    batches = [b for p in parts for b in reader.read(p)]
    assert len(batches) > 2 * len(parts)  # chunks, not one batch per range
    table = pa.Table.from_batches(batches)
    assert table.schema.names == AUDIT_SCHEMA.names
    assert sorted(table.column("msg_id").to_pylist()) == [f"msg-{i:05d}" for i in range(3000)]
    layout = table.select(["dt", "hour", "file", "open_file", "gateway"]).to_pylist()
    assert {tuple(r.values()) for r in layout} == {("2024-05-01", 10, af.key, False, str(tmp_path))}

    filtered = AuditPushdownReader({"path": str(tmp_path), "topic": "a"}, AUDIT_SCHEMA)
    rows = [r for p in filtered.partitions() for b in filtered.read(p) for r in b.to_pylist()]
    assert len(rows) == 1500 and {r["topic"] for r in rows} == {"a"}
    assert {r["file"] for r in rows} == {af.key}


def test_A3_skipped_output_over_chunks_lists_each_bad_line_once(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _, data = garbled(tmp_path, 900)
    monkeypatch.setattr(spark.lines, "CHUNK", 8 * 1024)
    whole = parse_lines(data, 0, closed_end=True)
    assert len(whole.skipped) == 3
    reader = AuditReader({"path": str(tmp_path), "output": "skipped"}, SKIPPED_SCHEMA)
    rows = [r for p in reader.partitions() for b in reader.read(p) for r in b.to_pylist()]
    assert [(r["offset"], r["length"], r["text"].encode()) for r in rows] == [
        (s.offset, s.length, s.text) for s in whole.skipped]


@pytest.mark.parametrize(("value", "type_"), [("dt=2024-05-01/hour=10/a.jsonl", pa.string()),
                                              ("", pa.string()), (13, pa.int32()), (True, pa.bool_()),
                                              (False, pa.bool_())])
@pytest.mark.parametrize("n", [0, 1, 9, 65536])
def test_A4_constant_columns_equal_the_plain_arrow_ones(value: object, type_: pa.DataType, n: int) -> None:
    col = constant(value, type_, n)  # type: ignore[arg-type]
    col.validate(full=True)
    assert col.equals(pa.array([value] * n, type_))


@pytest.mark.parametrize("compacted", [False, True], ids=["json-lines", "parquet"])
def test_A4_reading_a_range_does_not_import_pandas(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                   compacted: bool) -> None:
    """A fresh Python worker reads a range without importing pandas (half a second of CPU per
    worker, paid again on every executor), from a segment's JSON lines and from its compacted
    Parquet file (A7): the writer starts a compactor when it closes a segment, so which of the
    two a read meets depends on timing (CI met the Parquet one, which imported pandas)."""
    monkeypatch.setenv("CMQ_AUDIT_COMPACT", "off")  # no compactor of the writer's racing this test's
    write(tmp_path, 50)
    (af,) = list(list_files(str(tmp_path)))
    if compacted:
        assert compact_dir(str(tmp_path), wait=True) == (1, 50)
    assert os.path.exists(parquet_path(af.path)) == compacted
    code = ("import sys\n"
            "from spark.source import AuditReader\nfrom spark.schema import AUDIT_SCHEMA\n"
            f"r = AuditReader({{'path': {str(tmp_path)!r}}}, AUDIT_SCHEMA)\n"
            "n = sum(b.num_rows for p in r.partitions() for b in r.read(p))\n"
            "print(n, 'pandas' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["50", "False"]
