"""The connector's columnar cache of closed audit files (spark/cache.py, A3, A4): a warm scan
gives exactly the rows of a cold one and of parsing, an entry is only served for the very file
it was made from, and nothing is cached that may still change."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pyarrow as pa
import pytest

import spark.cache
from gateway.audit import AuditLog
from gateway.audit.layout import list_files
from spark.cache import DEFAULT_DIR
from spark.schema import AUDIT_SCHEMA, SKIPPED_SCHEMA, select_columns
from spark.source import AuditReader
from spark.stream import AuditStreamReader

pytestmark = pytest.mark.spark


@pytest.fixture(autouse=True)
def _json_lines_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """The cache holds parsed JSON-lines segments: the writer compacts none to Parquet here
    (a compacted segment is read from its Parquet file, never cached)."""
    from gateway.audit import compact

    monkeypatch.setenv(compact.MODE_ENV, "off")

H10 = 1_714_557_600.0  # 2024-05-01T10:00:00Z
ODD = (b'{"v":1,"ts":"2024-05-01T10:30:00.000001Z","event":"publish","vhost":"/","topic":null,'
       b'"tags":null,"size":null,"unknown":{"a":[1,2]},"also_unknown":"x"}\n'
       b'{"v":1,"ts":"2024-05-01T10:30:00.000002Z","event":"ack","vhost":"","tags":[],"latency_ms":0.5}\n'
       b'{"v":1,"ts":"2024\n'  # garbled
       b'{"v":1,"ts":"2024-05-01T10:30:00.000003Z","event":"publish","vhost":"/","size":"big"}\n'
       b'{"v":1,"e')  # torn last line


def write(root: Path, count: int, **kw: object) -> None:
    now = [H10]
    with AuditLog(str(root), clock=lambda: now[0], **kw) as audit:  # type: ignore[arg-type]
        for i in range(count):
            audit.emit("publish", "/" if i % 3 else "prod", topic="a" if i % 2 else "b",
                       msg_id=f"msg-{i:05d}", size=i, tags=["t1", "t2"], user="u", latency_ms=i / 7)
            now[0] += 1.0


def age(root: Path, seconds: float = 60.0) -> None:
    """Files as a scan finds them a while after the gateway closed them."""
    t = time.time() - seconds
    for af in list_files(str(root)):
        os.utime(af.path, (t, t))


def odd_log(root: Path) -> None:
    """Two closed files, the last with unknown fields, nulls, a garbled line, a wrong-typed
    one and a torn last line."""
    write(root, 40, rotate_bytes=20 * 200)
    last = list(list_files(str(root)))[-1]
    with open(last.path, "ab") as f:
        f.write(ODD)
    age(root)


def entries(cache: Path) -> list[Path]:
    return sorted(p for p in cache.rglob("*.arrow"))


def rows(reader: AuditReader) -> pa.Table:
    batches = [b for p in reader.partitions() for b in reader.read(p)]
    schema = batches[0].schema if batches else None
    return pa.Table.from_batches(batches, schema=schema)


def sorted_rows(df: object) -> list[tuple]:
    return sorted((tuple(r) for r in df.collect()), key=repr)  # type: ignore[attr-defined]


def test_A4_warm_scan_gives_the_rows_of_a_cold_scan_and_of_parsing(spark, tmp_path: Path) -> None:
    log, cache = tmp_path / "log", tmp_path / "cache"
    odd_log(log)

    def scan(mode: str, **options: str) -> object:
        reader = spark.read.format("cmq-audit").option("cache", mode)
        for k, v in options.items():
            reader = reader.option(k, v)
        return reader.load(str(log))

    parsed = sorted_rows(scan("off"))
    assert len(parsed) == 42 and not cache.exists()
    cold = sorted_rows(scan(str(cache)))
    made = entries(cache)
    assert len(made) == len(list(list_files(str(log)))) == 2
    stamps = [p.stat().st_mtime_ns for p in made]
    warm = sorted_rows(scan(str(cache)))
    assert cold == parsed and warm == parsed
    assert [p.stat().st_mtime_ns for p in entries(cache)] == stamps  # served, not rewritten
    odd = [r for r in warm if r[1].minute == 30]
    assert [(r[2], r[4], r[8], r[10], r[15]) for r in sorted(odd, key=lambda r: r[1])] == [
        ("publish", None, None, None, None), ("ack", None, [], None, 0.5)]

    # The skipped lines and a narrowed read come from the entries too, as parsing gives them.
    assert sorted_rows(scan(str(cache), output="skipped")) == sorted_rows(scan("off", output="skipped"))
    assert len(sorted_rows(scan(str(cache), output="skipped"))) == 3
    for options in ({"columns": "ts,event,size,file"}, {"columns": "msg_id", "topic": "a"},
                    {"from": "2024-05-01T10:00:20Z", "to": "2024-05-01T10:30:00.000002Z"}):
        assert sorted_rows(scan(str(cache), **options)) == sorted_rows(scan("off", **options)), options
    assert [p.stat().st_mtime_ns for p in entries(cache)] == stamps


@pytest.mark.parametrize("codec", ["zstd", "lz4", "none"])
def test_A4_warm_read_parses_nothing_and_reads_the_cached_columns_only(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, codec: str) -> None:
    odd_log(tmp_path)
    # The default place: <log>/.cmq-audit-cache.
    cold = rows(AuditReader({"path": str(tmp_path), "cachecodec": codec}, AUDIT_SCHEMA))
    assert len(entries(tmp_path / DEFAULT_DIR)) == 2

    def no_parsing(*args: object, **kw: object) -> None:
        raise AssertionError("parsed JSON although the cache is warm")

    monkeypatch.setattr(spark.cache, "parse_chunks", no_parsing)
    warm = rows(AuditReader({"path": str(tmp_path)}, AUDIT_SCHEMA))
    assert warm.equals(cold) and warm.num_rows == 42
    slim = rows(AuditReader({"path": str(tmp_path)}, select_columns("ts,size")))
    assert slim.schema.names == ["ts", "size"] and slim.equals(cold.select(["ts", "size"]))
    skipped = rows(AuditReader({"path": str(tmp_path), "output": "skipped"}, SKIPPED_SCHEMA))
    assert [t[:9] for t in skipped.column("text").to_pylist()] == ['{"v":1,"t', '{"v":1,"t', '{"v":1,"e']


def test_A4_a_changed_file_is_never_served_from_its_old_entry(tmp_path: Path) -> None:
    write(tmp_path, 30)
    age(tmp_path)
    (af,) = list(list_files(str(tmp_path)))
    first = rows(AuditReader({"path": str(tmp_path)}, AUDIT_SCHEMA))
    (entry,) = entries(tmp_path / DEFAULT_DIR)
    data = Path(af.path).read_bytes()

    # Same size, same inode, other bytes, other mtime: only the mtime tells.
    changed = data.replace(b'"topic":"a"', b'"topic":"z"')
    assert len(changed) == len(data)
    with open(af.path, "r+b") as f:
        f.write(changed)
    t = time.time() - 30
    os.utime(af.path, (t, t))
    second = rows(AuditReader({"path": str(tmp_path)}, AUDIT_SCHEMA))
    assert set(second.column("topic").to_pylist()) == {"b", "z"} != set(first.column("topic").to_pylist())

    # Larger (the range grows with it) and smaller: parsed again, never the old rows.
    Path(af.path).write_bytes(data + data)
    age(tmp_path)
    assert rows(AuditReader({"path": str(tmp_path)}, AUDIT_SCHEMA)).num_rows == 60
    one = data.index(b"\n") + 1
    Path(af.path).write_bytes(data[:one])
    os.utime(af.path, (t, t))  # the old entry's mtime: the size tells
    assert rows(AuditReader({"path": str(tmp_path)}, AUDIT_SCHEMA)).num_rows == 1
    # Entries of ranges past the file's end now are swept; only the one-line file's is left.
    assert [p.name.rsplit(".", 2)[1] for p in entries(tmp_path / DEFAULT_DIR)] == [f"0-{one}"]

    # An entry that cannot be read is ignored and written anew.
    Path(af.path).write_bytes(data)
    age(tmp_path)
    assert rows(AuditReader({"path": str(tmp_path)}, AUDIT_SCHEMA)).equals(first)
    entry = next(p for p in entries(tmp_path / DEFAULT_DIR) if p.name.endswith(f".0-{len(data)}.arrow"))
    entry.write_bytes(entry.read_bytes()[:-100])
    assert rows(AuditReader({"path": str(tmp_path)}, AUDIT_SCHEMA)).equals(first)
    assert rows(AuditReader({"path": str(tmp_path)}, AUDIT_SCHEMA)).equals(first)
    entry.write_bytes(b"not arrow at all")
    assert rows(AuditReader({"path": str(tmp_path)}, AUDIT_SCHEMA)).equals(first)


def test_A4_a_file_modified_just_now_is_not_cached(tmp_path: Path) -> None:
    """Its mtime may not change if it is written again within the clock's granularity."""
    write(tmp_path, 10)
    assert rows(AuditReader({"path": str(tmp_path)}, AUDIT_SCHEMA)).num_rows == 10
    assert entries(tmp_path / DEFAULT_DIR) == []
    age(tmp_path)
    assert rows(AuditReader({"path": str(tmp_path)}, AUDIT_SCHEMA)).num_rows == 10
    assert len(entries(tmp_path / DEFAULT_DIR)) == 1


def test_A4_an_unwritable_cache_falls_back_to_parsing(spark, tmp_path: Path) -> None:
    log = tmp_path / "log"
    odd_log(log)
    expected = sorted_rows(spark.read.format("cmq-audit").option("cache", "off").load(str(log)))
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    for where in (str(blocker), str(blocker / "cache")):
        df = spark.read.format("cmq-audit").option("cache", where).load(str(log))
        assert sorted_rows(df) == expected
    assert blocker.read_text() == "not a directory"
    # A default cache folder that cannot be made: a file is in its place.
    (log / DEFAULT_DIR).write_text("in the way")
    assert sorted_rows(spark.read.format("cmq-audit").load(str(log))) == expected
    assert rows(AuditReader({"path": str(log)}, AUDIT_SCHEMA)).num_rows == 42


def test_A4_the_open_file_is_never_cached(spark, tmp_path: Path) -> None:
    now = [H10 + 1]
    audit = AuditLog(str(tmp_path), clock=lambda: now[0])
    cache = tmp_path / DEFAULT_DIR
    try:
        for i in range(50):
            audit.emit("publish", "/", topic="t", msg_id=f"msg-{i:04d}", size=i)
        assert audit.flush(timeout=30)
        (af,) = list(list_files(str(tmp_path), include_open=True))
        assert af.is_open
        t = time.time() - 60  # old enough to cache, were it closed
        os.utime(af.path, (t, t))
        for _ in range(2):
            live = spark.read.format("cmq-audit").load(str(tmp_path)).select("msg_id", "open_file").collect()
            assert len(live) == 50 and {r.open_file for r in live} == {True}
            assert rows(AuditReader({"path": str(tmp_path)}, AUDIT_SCHEMA)).num_rows == 50
            assert entries(cache) == []
        for i in range(50, 60):
            audit.emit("publish", "/", topic="t", msg_id=f"msg-{i:04d}", size=i)
        assert audit.flush(timeout=30)
        assert spark.read.format("cmq-audit").load(str(tmp_path)).count() == 60
    finally:
        audit.close()
    age(tmp_path)
    closed = spark.read.format("cmq-audit").load(str(tmp_path)).select("msg_id", "open_file").collect()
    assert len(closed) == 60 and {r.open_file for r in closed} == {False}
    assert len(entries(cache)) == 1
    again = spark.read.format("cmq-audit").load(str(tmp_path)).select("msg_id", "open_file").collect()
    assert sorted(again) == sorted(closed)


def test_A4_streams_parse_and_write_no_cache(tmp_path: Path) -> None:
    write(tmp_path, 20)
    age(tmp_path)
    reader = AuditStreamReader({"path": str(tmp_path)}, AUDIT_SCHEMA)
    end = reader.latestOffset(reader.initialOffset(), None)  # type: ignore[arg-type]
    n = sum(b.num_rows for p in reader.partitions(reader.initialOffset(), end) for b in reader.read(p))
    assert n == 20 and not (tmp_path / DEFAULT_DIR).exists()


def test_A4_entries_of_deleted_files_and_stale_temporaries_are_swept(tmp_path: Path) -> None:
    write(tmp_path, 30, rotate_bytes=10 * 200)
    age(tmp_path)
    files = list(list_files(str(tmp_path)))
    assert rows(AuditReader({"path": str(tmp_path)}, AUDIT_SCHEMA)).num_rows == 30
    cache = tmp_path / DEFAULT_DIR
    assert len(entries(cache)) == len(files) > 1
    left = entries(cache)[0].with_name("x.jsonl.0-10.arrow.123-abc.tmp")
    left.write_bytes(b"")
    os.unlink(files[0].path)  # retention
    assert rows(AuditReader({"path": str(tmp_path)}, AUDIT_SCHEMA)).num_rows < 30
    assert len(entries(cache)) == len(files) - 1 and left.exists()  # a fresh temporary may be in use
    t = time.time() - 7200
    os.utime(left, (t, t))
    AuditReader({"path": str(tmp_path)}, AUDIT_SCHEMA).partitions()
    assert not left.exists()


def test_A4_cache_codec_is_checked_when_the_query_is_planned(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="cacheCodec"):
        AuditReader({"path": str(tmp_path), "cachecodec": "gzip2"}, AUDIT_SCHEMA)
