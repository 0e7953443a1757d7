"""The ready analyses on a hand-written scenario with known answers (A4)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.audit import AuditLog
from spark import analyses

pytestmark = pytest.mark.spark

T = 1_714_557_600.0


def test_A4_funnel_retries_latency_and_auth(spark, tmp_path: Path) -> None:
    now = [T]
    with AuditLog(str(tmp_path), clock=lambda: now[0]) as a:
        def at(dt: float, event: str, **f: object) -> None:
            now[0] = T + dt
            a.emit(event, "/", **f)

        # m1: routed to s1 and s2; s1 acks (queue-side records carry no topic), s2 retries
        # twice (BACKOFF) then gives up.  m2: no subscription takes it.  m3: acked on s1 after
        # a redelivery and a stale ack.
        at(0, "publish", topic="t", msg_id="m1", user="alice", peer="10.0.0.1:5000", size=10)
        at(0, "route", topic="t", subscription="s1", msg_id="m1")
        at(0, "route", topic="t", subscription="s2", msg_id="m1")
        at(0, "enqueue", topic="t", subscription="s1", queue="q1", msg_id="m1")
        at(0.1, "deliver", queue="q1", msg_id="m1", attempt=1)
        at(0.2, "ack", queue="q1", msg_id="m1")
        at(1, "retry", topic="t", subscription="s2", msg_id="m1", attempt=1, policy="BACKOFF_RETRY")
        at(2, "retry", topic="t", subscription="s2", msg_id="m1", attempt=2, policy="BACKOFF_RETRY")
        at(3, "discard", topic="t", subscription="s2", msg_id="m1", reason="retries_exhausted")
        at(4, "publish", topic="t", msg_id="m2", user="alice", peer="10.0.0.1:5001", size=20)
        at(4, "discard", topic="t", msg_id="m2", reason="no_match")
        at(5, "publish", topic="t", msg_id="m3", user="bob", peer="10.0.0.2:6000", size=30)
        at(5, "route", topic="t", subscription="s1", msg_id="m3")
        at(5, "enqueue", topic="t", subscription="s1", queue="q1", msg_id="m3")
        at(5.5, "deliver", queue="q1", msg_id="m3", attempt=1)
        at(6.0, "deliver", queue="q1", msg_id="m3", attempt=2)
        at(6.1, "stale_ack", queue="q1", msg_id="m3")
        at(6.5, "ack", queue="q1", msg_id="m3", latency_ms=1500.0)
        at(7, "auth_failure", user="root", peer="203.0.113.9:4000", reason="bad password")
        at(8, "auth_failure", user="root", peer="203.0.113.9:4001", reason="bad password")

    df = spark.read.format("cmq-audit").load(str(tmp_path)).cache()
    funnel = {(r.subscription): r.asDict() for r in analyses.funnel(df).collect()}
    assert set(funnel) == {None, "s1", "s2"}
    s1, s2, pre = funnel["s1"], funnel["s2"], funnel[None]
    assert (s1["published"], s1["routed"], s1["delivered"], s1["acked"], s1["discarded"]) == (3, 2, 2, 2, 0)
    assert (s2["routed"], s2["delivered"], s2["acked"], s2["discarded_retries_exhausted"]) == (1, 0, 0, 1)
    assert (pre["discarded"], pre["discarded_no_match"]) == (1, 1)

    retries = [(r.policy, r.attempt, r.retries) for r in analyses.retries_by_policy(df).collect()]
    assert retries == [("BACKOFF_RETRY", 1, 1), ("BACKOFF_RETRY", 2, 1)]

    lat = {r.topic: (r.acks, r.max_ms) for r in analyses.latency_percentiles(df).collect()}
    # m1: no latency_ms, so ack ts − publish ts = 200 ms; m3: the broker's 1500 ms.
    assert lat[None][0] == 2 and lat["t"][0] == 2
    assert lat["t"][1] == pytest.approx(1500.0)
    (q1,) = analyses.stale_and_redeliveries(df).collect()
    assert (q1.queue, q1.deliveries, q1.redeliveries, q1.stale_acks) == ("q1", 3, 1, 1)

    (auth,) = analyses.auth_failures(df).collect()
    assert (auth.user, auth.host, auth.failures) == ("root", "203.0.113.9", 2)
    pubs = [(r.user, r.host, r.messages, r.bytes) for r in analyses.busiest_publishers(df).collect()]
    assert pubs == [("alice", "10.0.0.1", 2, 30), ("bob", "10.0.0.2", 1, 30)]
    df.unpersist()


def _limit_records(audit_dir: Path) -> None:
    now = [T]
    with AuditLog(str(audit_dir), clock=lambda: now[0]) as a:
        for dt, value, user in ((0, 70, "alice"), (1, 205, "alice"), (2, 90, "bob")):
            now[0] = T + dt
            a.emit("limit_exceeded", "/", rule="L4", value=value, limit=64, object="exchange:orders", user=user,
                   peer="10.0.0.1:5000", reason="PRECONDITION_FAILED - ... (CMQ limit L4)")
        a.emit("limit_exceeded", "/", rule="L6", value=100_000, limit=65536, object="queue:big", user="bob")
        a.emit("publish", "/", topic="orders", msg_id="m1", size=10)


def test_PF4_limits_exceeded_is_the_migration_report(spark, tmp_path: Path) -> None:
    """PF4: limit_exceeded records (rule, value, limit, object) read as typed columns and
    aggregated per rule, object and user; records without the new fields read as NULL."""
    _limit_records(tmp_path)
    df = spark.read.format("cmq-audit").load(str(tmp_path)).cache()
    rows = [(r.rule, r.object, r.user, r.breaches, r.worst_value, r.limit)
            for r in analyses.limits_exceeded(df).collect()]
    assert rows == [("L4", "exchange:orders", "alice", 2, 205, 64), ("L4", "exchange:orders", "bob", 1, 90, 64),
                    ("L6", "queue:big", "bob", 1, 100_000, 65536)]
    [publish] = df.where("event = 'publish'").select("rule", "value", "limit", "object").collect()
    assert publish.asDict() == {"rule": None, "value": None, "limit": None, "object": None}


def test_PF4_the_report_page_has_the_migration_report(spark, tmp_path: Path) -> None:
    from spark.report import write_report

    _limit_records(tmp_path / "audit")
    page = Path(write_report(spark, str(tmp_path / "audit"), str(tmp_path / "out"), progress=lambda _: None))
    text = page.read_text(encoding="utf-8")
    assert "Migration report: CMQ limits exceeded" in text and "src='08.png'" in text
    assert (tmp_path / "out" / "08.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "exchange:orders" in text and "queue:big" in text
