"""Several gateways, one audit directory each, read as one log (A4, issue 14): the reader takes
a list, a comma-separated path or a glob, merges the records and tells the gateways apart by
the ``gateway`` column."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from gateway.audit.compact import parquet_path
from gateway.audit.layout import list_files
from gateway.config import AuditSettings
from gateway.server import gateway_in_thread
from spark.schema import AUDIT_SCHEMA
from spark.stream import AuditStreamReader
from tests.spark import real_log as W

pytestmark = pytest.mark.spark


@pytest.fixture(scope="module")
def two_gateways(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    """The audit directories of two gateways that ran side by side, each serving the workload
    of real_log once (so each directory holds exactly W.EVENTS)."""
    parent = tmp_path_factory.mktemp("gateways")
    dirs = str(parent / "gw-a"), str(parent / "gw-b")
    with gateway_in_thread(port=0, hosts=("127.0.0.1",), audit=AuditSettings(dir=dirs[0])) as a, \
            gateway_in_thread(port=0, hosts=("127.0.0.1",), audit=AuditSettings(dir=dirs[1])) as b:
        W.run_workload(a.port, "guest", "guest")
        W.run_workload(b.port, "guest", "guest")
    return dirs


def _events_by_gateway(df) -> dict[str, Counter[str]]:  # type: ignore[no-untyped-def]
    out: dict[str, Counter[str]] = {}
    for r in df.groupBy("gateway", "event").count().collect():
        out.setdefault(r.gateway, Counter())[r.event] = r["count"]
    return out


def test_A4_two_gateways_read_as_a_list_merge_and_stay_apart(spark, two_gateways: tuple[str, str]) -> None:
    a, b = two_gateways
    df = spark.read.format("cmq-audit").load([a, b])
    assert df.schema == AUDIT_SCHEMA
    assert _events_by_gateway(df) == {a: Counter(W.EVENTS), b: Counter(W.EVENTS)}
    # The same file key may exist in both directories: rows stay tied to their own gateway.
    files = {(r.gateway, r.file) for r in df.select("gateway", "file").distinct().collect()}
    assert files == {(d, f.key) for d in (a, b) for f in list_files(d)}


def test_A4_gateways_by_comma_list_and_by_glob(spark, two_gateways: tuple[str, str]) -> None:
    a, b = two_gateways
    total = 2 * sum(W.EVENTS.values())
    assert spark.read.format("cmq-audit").load(f"{a},{b}").count() == total
    assert spark.read.format("cmq-audit").option("path", f"{a}, {b}").load().count() == total
    by_glob = spark.read.format("cmq-audit").load(str(Path(a).parent / "gw-*"))
    assert sorted(r.gateway for r in by_glob.select("gateway").distinct().collect()) == [a, b]
    assert by_glob.count() == total
    # One directory named twice (here once more by the glob) is read once.
    assert spark.read.format("cmq-audit").load([a, a, str(Path(a).parent / "gw-[a]")]).count() == total // 2


def test_A4_gateways_with_pruning_columns_and_skipped_lines(spark, two_gateways: tuple[str, str],
                                                            tmp_path: Path) -> None:
    a, b = two_gateways
    acks = (spark.read.format("cmq-audit").option("event", "ack").option("columns", "gateway,queue")
            .load([a, b]))
    assert acks.columns == ["queue", "gateway"]  # schema order
    got = Counter((r.gateway, r.queue) for r in acks.collect())
    assert got == Counter({(d, q): n for d in (a, b) for q, n in W.ACKS.items()})
    # A torn line in one gateway's log is reported as that gateway's.
    (af,) = list(list_files(b))[-1:]
    with open(af.path, "ab") as f:
        f.write(b'{"v":1,"ts":"20')
    # As in a segment not compacted yet: a compacted one is read from its Parquet file (A7),
    # which was made from the segment before this line was torn onto it.
    Path(parquet_path(af.path)).unlink(missing_ok=True)
    skipped = spark.read.format("cmq-audit").option("output", "skipped").load([a, b]).collect()
    assert [(r.gateway, r.file, r.text) for r in skipped] == [(b, af.key, '{"v":1,"ts":"20')]


def test_A4_a_glob_that_matches_nothing_and_a_stream_over_two_gateways_are_refused(
        spark, two_gateways: tuple[str, str], tmp_path: Path) -> None:
    with pytest.raises(Exception, match="no directory matches"):
        spark.read.format("cmq-audit").load(str(tmp_path / "nothing-*")).count()
    with pytest.raises(ValueError, match="one audit directory"):
        AuditStreamReader({"path": ",".join(two_gateways)}, AUDIT_SCHEMA)


def test_A4_one_report_over_two_gateways(spark, two_gateways: tuple[str, str], tmp_path: Path) -> None:
    """The report (and ``cmq-audit report --audit-dir A,B``) counts both gateways' records."""
    from spark.report import write_report

    write_report(spark, ",".join(two_gateways), str(tmp_path), progress=lambda _msg: None)
    got = json.loads((tmp_path / "report.json").read_text())
    assert got["records"] == 2 * sum(W.EVENTS.values())
    events: Counter[str] = Counter()
    for row in got["sections"]["timeline"]["rows"]:
        events[row["event"]] += row["count"]
    assert events == Counter({e: 2 * n for e, n in W.EVENTS.items()})
