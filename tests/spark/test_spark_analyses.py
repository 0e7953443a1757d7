"""The ready analyses on a hand-written scenario with known answers (A4)."""

from __future__ import annotations

import itertools
from datetime import datetime, timedelta
from pathlib import Path

import pytest

from gateway.audit import AuditLog
from spark import analyses
from spark.report import timeline_seconds

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
        # m4: on s1, rejected to the dead-letter exchange "dlx" (the record names the DLX).
        at(6.6, "publish", topic="t", msg_id="m4", user="bob", peer="10.0.0.2:6000", size=40)
        at(6.6, "route", topic="t", subscription="s1", msg_id="m4")
        at(6.6, "enqueue", topic="t", subscription="s1", queue="q1", msg_id="m4")
        at(6.7, "deliver", queue="q1", msg_id="m4", attempt=1)
        at(6.8, "dead_letter", queue="q1", msg_id="m4", topic="dlx", reason="rejected")
        at(7, "auth_failure", user="root", peer="203.0.113.9:4000", reason="bad password")
        at(8, "auth_failure", user="root", peer="203.0.113.9:4001", reason="bad password")

    df = spark.read.format("cmq-audit").load(str(tmp_path)).cache()
    funnel = {(r.subscription): r.asDict() for r in analyses.funnel(df).collect()}
    # m4's dead_letter counts on the subscription that gave it up, not on a ("dlx", "s1") row.
    assert {r.topic for r in analyses.funnel(df).collect()} == {"t"}
    assert set(funnel) == {None, "s1", "s2"}
    s1, s2, pre = funnel["s1"], funnel["s2"], funnel[None]
    assert (s1["published"], s1["routed"], s1["delivered"], s1["acked"], s1["discarded"], s1["dead_lettered"]) == (
        4, 3, 3, 2, 0, 1)
    assert (s2["routed"], s2["delivered"], s2["acked"], s2["discarded_retries_exhausted"]) == (1, 0, 0, 1)
    assert (pre["discarded"], pre["discarded_no_match"]) == (1, 1)

    retries = [(r.policy, r.attempt, r.retries) for r in analyses.retries_by_policy(df).collect()]
    assert retries == [("BACKOFF_RETRY", 1, 1), ("BACKOFF_RETRY", 2, 1)]

    lat = {r.topic: (r.acks, r.max_ms) for r in analyses.latency_percentiles(df).collect()}
    # m1: no latency_ms, so ack ts − publish ts = 200 ms; m3: the broker's 1500 ms.
    assert lat[None][0] == 2 and lat["t"][0] == 2
    assert lat["t"][1] == pytest.approx(1500.0)
    (q1,) = analyses.stale_and_redeliveries(df).collect()
    assert (q1.queue, q1.deliveries, q1.redeliveries, q1.stale_acks) == ("q1", 4, 1, 1)

    (auth,) = analyses.auth_failures(df).collect()
    assert (auth.kind, auth.user, auth.host, auth.failures) == ("login", "root", "203.0.113.9", 2)
    pubs = [(r.user, r.host, r.messages, r.bytes) for r in analyses.busiest_publishers(df).collect()]
    assert pubs == [("alice", "10.0.0.1", 2, 30), ("bob", "10.0.0.2", 2, 70)]
    df.unpersist()


@pytest.mark.parametrize(("seconds", "bucket"), [(0, 1), (6, 1), (90, 1), (91, 2), (400, 5), (3600, 60),
                                                 (86400, 1800), (40 * 86400, 12 * 3600), (200 * 86400, 7 * 86400)])
def test_A4_timeline_bucket_follows_the_span(seconds: float, bucket: int) -> None:
    """A few seconds of log get seconds (one minute bucket drew nothing over a 4-year axis)."""
    first = datetime(2024, 5, 1, 10)
    assert timeline_seconds(first, first + timedelta(seconds=seconds)) == bucket


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
    assert "Migration report: CMQ limits exceeded" in text
    [png] = (tmp_path / "out").glob("*limits*.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and f"src='{png.name}'" in text
    assert "exchange:orders" in text and "queue:big" in text


def test_A1_refused_operations_apart_from_failed_logins_and_admin_changes(spark, tmp_path: Path) -> None:
    """The report's refusals say which are failed logins and which are operations a
    logged-in user was refused, in the shapes each API writes them (spark/SCHEMA.md); the
    administrative changes are their own section."""
    from spark.report import write_report

    ticks = itertools.count()
    with AuditLog(str(tmp_path / "audit"), clock=lambda: T + next(ticks)) as a:  # one record a second, in order
        # Failed logins: AMQP (no protocol), an AMQP vhost refused at open, MQTT's CONNECT,
        # the management API's credentials, a CMQ API key with no access to the vhost.
        a.emit("auth_failure", "/", user="eve", peer="198.51.100.1:1", reason="wrong password: refused")
        a.emit("auth_failure", "v", user="bob", peer="10.0.0.2:2", reason="vhost access refused")
        a.emit("auth_failure", "/", user="eve", peer="198.51.100.1:3", reason="bad user name or password",
               protocol="mqtt")
        a.emit("auth_failure", "/", user="eve", peer="198.51.100.1:4", reason="wrong password (GET /api/queues)",
               protocol="http")
        a.emit("auth_failure", "v", user="bob", peer="10.0.0.2:5", reason="user 'bob' has no access to vhost 'v' "
               "(Action SendMessage)", protocol="cmq-api")
        # Refused operations of logged-in users, one per API.
        a.emit("auth_failure", "/", user="bob", peer="10.0.0.2:6", reason="write: access refused", protocol="amqp")
        a.emit("auth_failure", "/", user="bob", peer="10.0.0.2:7", reason="publish refused: write access",
               protocol="mqtt")
        a.emit("auth_failure", "/", user="bob", peer="10.0.0.2:8", protocol="http",
               reason="not_authorised: Not administrator user (PUT /api/users/x)")
        a.emit("auth_failure", "/", user="bob", peer="10.0.0.2:9", protocol="cmq-api",
               reason="access to 'q' in vhost '/' refused for user 'bob' (Action SendMessage)")
        a.emit("user_created", "", object="user:carol", user="admin", peer="10.0.0.9:1", tags=["management"])
        a.emit("permission_created", "/", object="permission:carol", user="admin", peer="10.0.0.9:1")
        a.emit("permission_created", "/", object="permission:carol", user="admin", peer="10.0.0.9:1")
        a.emit("user_deleted", "", object="user:carol", user="admin", peer="10.0.0.9:2")
    df = spark.read.format("cmq-audit").load(str(tmp_path / "audit")).cache()
    got = {(r.kind, r.user): r.failures for r in analyses.auth_failures(df).collect()}
    assert got == {("login", "eve"): 3, ("login", "bob"): 2, ("operation", "bob"): 4}
    changes = [(r.event, r.vhost, r.object, r.user, r.changes) for r in analyses.admin_changes(df).collect()]
    assert changes == [("user_created", "", "user:carol", "admin", 1), ("permission_created", "/", "permission:carol",
                                                                          "admin", 2),
                       ("user_deleted", "", "user:carol", "admin", 1)]

    write_report(spark, str(tmp_path / "audit"), str(tmp_path / "out"), progress=lambda _: None)
    import json
    sections = json.loads((tmp_path / "out" / "report.json").read_text())["sections"]
    assert sections["auth_failures"]["summary"] == (
        "5 failed logins (eve from 198.51.100.1: 3; bob from 10.0.0.2: 2); "
        "4 refused operations (bob from 10.0.0.2: 4).")
    assert sections["admin_changes"]["summary"] == (
        "4 changes by admin: 2 permission created, 1 user created, 1 user deleted.")
    assert len(sections["admin_changes"]["rows"]) == 3
