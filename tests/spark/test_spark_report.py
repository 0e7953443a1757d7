"""The report's numbers on a real gateway's log and on the demo log, and its page as a browser
shows it (A4, issue 12 item 6)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tempfile
from collections import Counter
from pathlib import Path

import pytest

from gateway.config import AuditSettings
from gateway.server import gateway_in_thread
from spark import analyses
from spark.demo import write_demo_log
from spark.report import write_report
from tests.spark import real_log as W

pytestmark = pytest.mark.spark

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def real_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The audit directory of a gateway (stopped again) that served the workload of real_log."""
    audit_dir = str(tmp_path_factory.mktemp("real-audit"))
    with gateway_in_thread(port=0, hosts=("127.0.0.1",), audit=AuditSettings(dir=audit_dir)) as gw:
        W.run_workload(gw.port, "guest", "guest")
    return audit_dir


@pytest.fixture(scope="module")
def real_report(spark, real_dir: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("real-report")
    write_report(spark, real_dir, str(out), progress=lambda _msg: None)
    return out


def _numbers(out: Path) -> dict:
    return json.loads((out / "report.json").read_text())


def test_A4_analyses_count_what_was_sent_to_a_real_gateway(spark, real_dir: str) -> None:
    df = spark.read.format("cmq-audit").load(real_dir).cache()
    funnel = {(r.topic, r.subscription): tuple(r[c] for c in W.FUNNEL_COLUMNS)
              for r in analyses.funnel(df).collect()}
    assert funnel == W.FUNNEL  # the default exchange's 150 messages are counted on their queue
    stale = {r.queue: (r.deliveries, r.redeliveries, r.requeues, r.visibility_expiries, r.stale_acks)
             for r in analyses.stale_and_redeliveries(df).collect()}
    assert stale == W.REDELIVERIES
    lat = {r.topic: r.acks for r in analyses.latency_percentiles(df).collect()}
    assert lat == W.LATENCY_ACKS  # one row per topic and one total: no two rows named alike
    assert [(r.user, r.host, r.failures) for r in analyses.auth_failures(df).collect()] == [
        ("guest", "127.0.0.1", 1)]
    assert [(r.user, r.host, r.messages, r.bytes) for r in analyses.busiest_publishers(df).collect()] == [
        ("guest", "127.0.0.1", W.PUBLISHED, W.BYTES)]
    assert analyses.retries_by_policy(df).count() == 0
    timeline = Counter()
    for r in analyses.events_over_time(df, 1).collect():
        timeline[r.event] += r["count"]
    assert dict(timeline) == W.EVENTS
    df.unpersist()


def test_A4_report_json_holds_the_real_logs_numbers(real_report: Path, real_dir: str) -> None:
    got = _numbers(real_report)
    assert (got["records"], got["skipped_lines"], got["audit_dir"]) == (sum(W.EVENTS.values()), 0, real_dir)
    s = got["sections"]
    events = Counter()
    for row in s["timeline"]["rows"]:
        events[row["event"]] += row["count"]
    assert dict(events) == W.EVENTS
    # A few seconds of log: buckets of a second, not one bucket of a minute (or an empty plot).
    assert got["timeline_seconds"] == 1
    funnel = {(r["topic"], r["subscription"]): tuple(r[c] for c in W.FUNNEL_COLUMNS) for r in s["funnel"]["rows"]}
    assert funnel == W.FUNNEL
    assert s["funnel"]["summary"] == (
        f"{W.PUBLISHED} messages published: {W.EU + W.US + W.UNROUTED} to topic events; "
        f"{W.WORK} through the default exchange to 1 queue. Discarded before routing: {W.UNROUTED} no_match.")
    assert {r["topic"]: r["acks"] for r in s["latency"]["rows"]} == W.LATENCY_ACKS
    assert s["latency"]["summary"].startswith(f"{sum(W.ACKS.values())} acks: p50 ")
    assert s["redeliveries"]["summary"] == (
        f"{sum(W.DELIVERIES.values())} deliveries on 3 queues: {W.NACKED} redeliveries, {W.NACKED} requeues, "
        "all on queue work; no visibility expiries or stale acks.")
    assert s["auth_failures"]["summary"] == "1 failed login (guest from 127.0.0.1: 1); no refused operations."
    assert s["publishers"]["summary"].startswith(
        f"{W.PUBLISHED} messages published, all by guest @ 127.0.0.1 ({W.BYTES:,} bytes")


def test_A4_no_data_is_said_in_words_not_drawn(real_report: Path) -> None:
    """The real log has no retries: the section says so and has no image; one queue with
    redeliveries, one failed login and one publisher are sentences, not one-bar plots."""
    s = _numbers(real_report)["sections"]
    assert (s["retries"]["png"], s["retries"]["summary"]) == (None, "No retries in this range.")
    assert [k for k, v in s.items() if v["png"]] == ["timeline", "funnel", "latency"]
    page = (real_report / "index.html").read_text()
    assert "No retries in this range." in page
    assert "<img" not in page.split("id='retries'")[1].split("<h2")[0]


def test_A4_an_empty_range_is_words_only(spark, real_dir: str, tmp_path: Path) -> None:
    write_report(spark, real_dir, str(tmp_path), start="2001-01-01T00:00:00Z", end="2001-01-02T00:00:00Z",
                 progress=lambda _msg: None)
    got = _numbers(tmp_path)
    assert got["records"] == 0
    assert {k: v["png"] for k, v in got["sections"].items()} == dict.fromkeys(got["sections"])
    assert got["sections"]["timeline"]["summary"] == "No records in this range."
    assert not list(tmp_path.glob("*.png"))


def _chromium() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        pytest.fail("the page test needs Chromium: apt-get install -y chromium (scripts/test.sh does)")
    return found


def _browse(html: Path, *mode: str) -> subprocess.CompletedProcess[str]:
    with tempfile.TemporaryDirectory() as profile:
        return subprocess.run(
            [_chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
             "--disable-component-update", "--disable-sync", "--no-first-run", f"--user-data-dir={profile}",
             *mode, html.as_uri()],
            capture_output=True, text=True, timeout=180, check=True)


def _pixels(png: Path) -> object:
    import matplotlib.image as mpimg

    return (mpimg.imread(png)[:, :, :3] * 255).round().astype(int)


def _count_color(pixels: object, rgb: tuple[int, int, int], tol: int = 6) -> int:
    import numpy as np

    return int((np.abs(pixels - np.array(rgb)).max(axis=2) <= tol).sum())  # type: ignore[operator]


def test_A4_report_page_shows_in_headless_chromium(real_report: Path, tmp_path: Path) -> None:
    page = real_report / "index.html"
    dom = _browse(page, "--dump-dom").stdout
    assert "CMQ gateway audit report" in dom
    srcs = re.findall(r"<img src=\"([^\"]+)\"", dom)
    assert srcs == [v["png"] for v in _numbers(real_report)["sections"].values() if v["png"]]
    for src in srcs:
        data = (real_report / src).read_bytes()
        assert data.startswith(PNG_MAGIC) and len(data) > 10_000, src
    # The funnel's "routed" blue is drawn nowhere but in the images: on the screenshot, it
    # shows that the browser loaded and painted them.
    shot = tmp_path / "page.png"
    _browse(page, f"--screenshot={shot}", "--window-size=1280,4000", "--hide-scrollbars")
    pixels = _pixels(shot)
    assert _count_color(pixels, (0x5B, 0x8D, 0xEF)) > 2000
    assert _count_color(pixels, (255, 255, 255)) < pixels.shape[0] * pixels.shape[1]  # type: ignore[attr-defined]


def test_A4_demo_report_auth_failures_and_publishers(spark, tmp_path: Path) -> None:
    """On the demo log: the password-guessing host stands out, publishers have their hosts,
    and the numbers are those of the log's own lines."""
    audit_dir, out = tmp_path / "audit", tmp_path / "report"
    write_demo_log(str(audit_dir), 2400)
    lines = [json.loads(line) for p in sorted(audit_dir.rglob("*.jsonl")) for line in p.read_text().splitlines()]
    write_report(spark, str(audit_dir), str(out), progress=lambda _msg: None)
    got = _numbers(out)
    s = got["sections"]
    assert got["records"] == len(lines)
    failures = Counter(r["user"] for r in lines if r["event"] == "auth_failure")
    guessed = sum(1 for r in lines if r["event"] == "auth_failure" and r["peer"].startswith("198.51.100.23:"))
    assert guessed == failures["admin"] >= 3
    assert s["auth_failures"]["summary"].startswith(
        f"{sum(failures.values())} failed logins (admin from 198.51.100.23: {guessed}")
    assert s["auth_failures"]["png"] is not None
    pubs = Counter((r["user"], r["peer"].rsplit(":", 1)[0]) for r in lines if r["event"] == "publish")
    assert {(r["user"], r["host"]): r["messages"] for r in s["publishers"]["rows"]} == dict(pubs)
    published = Counter(r.get("topic") or analyses.DEFAULT_EXCHANGE for r in lines if r["event"] == "publish")
    funnel_published: dict[str, int] = Counter()
    for r in s["funnel"]["rows"]:
        if r["topic"] == analyses.DEFAULT_EXCHANGE:
            funnel_published[r["topic"]] += r["published"]
        else:
            funnel_published[r["topic"]] = r["published"]
    assert dict(funnel_published) == dict(published)
    # The demo has something everywhere; the administrative changes are a sentence and a table.
    assert {k for k, v in s.items() if v["png"] is None} == {"admin_changes"}
    for v in s.values():
        if v["png"] is not None:
            assert os.path.getsize(out / v["png"]) > 10_000


# -- issue 27: auto-ack, recovery records, wide funnels, long tables ----------------------------


def test_A6_auto_ack_deliveries_count_as_acked_and_recovery_records_are_left_out(spark, tmp_path: Path) -> None:
    """A no-ack consumer and basic.get with no_ack: their deliveries say ``auto_ack: true`` and
    the funnel counts them acked.  Records a start-up wrote for what it restored (origin
    recovery) count in no analysis and are named apart in the report."""
    import pika

    from gateway.audit import AuditLog
    from spark import read_audit

    audit_dir = str(tmp_path / "audit")
    with gateway_in_thread(port=0, hosts=("127.0.0.1",), audit=AuditSettings(dir=audit_dir)) as gw:
        conn = pika.BlockingConnection(pika.URLParameters(f"amqp://guest:guest@127.0.0.1:{gw.port}/%2F"))
        ch = conn.channel()
        ch.queue_declare("auto")
        ch.confirm_delivery()
        for i in range(5):
            ch.basic_publish("", "auto", f"m{i}".encode())
        got = [ch.basic_get("auto", auto_ack=True)[2] for _ in range(2)]
        for _method, _props, body in ch.consume("auto", auto_ack=True, inactivity_timeout=30):
            assert body is not None, "no delivery for 30 s"
            got.append(body)
            if len(got) == 5:
                break
        ch.cancel()
        conn.close()
    assert sorted(got) == [f"m{i}".encode() for i in range(5)]
    # As a restarted gateway writes them (A6): marked, not client actions.
    extra = AuditLog(audit_dir, process=False)
    extra.emit("queue_declare", "/", queue="auto", origin="recovery")
    extra.emit("limit_exceeded", "/", rule="L2", value=9, limit=8, object="queue:auto", origin="recovery")
    extra.close()
    df = read_audit(spark, audit_dir)
    delivers = df.where("event = 'deliver'").select("auto_ack").collect()
    assert [r.auto_ack for r in delivers] == [True] * 5
    assert df.where("event = 'ack'").count() == 0
    funnel = {(r.topic, r.subscription): (r.published, r.routed, r.delivered, r.acked)
              for r in analyses.funnel(df).collect()}
    assert funnel == {(analyses.DEFAULT_EXCHANGE, "auto"): (5, 5, 5, 5)}
    assert analyses.limits_exceeded(df).count() == 0
    timeline = Counter()
    for r in analyses.events_over_time(df, 1).collect():
        timeline[r.event] += r["count"]
    assert timeline["queue_declare"] == 1 and "limit_exceeded" not in timeline  # the client's declare only
    out = tmp_path / "report"
    write_report(spark, audit_dir, str(out), progress=lambda _msg: None)
    got_json = _numbers(out)
    assert got_json["records_from_recovery"] == 2
    assert got_json["records"] == df.count()
    assert "2 of them written by a gateway's start-up" in (out / "index.html").read_text()


def _wide_log(directory: str) -> int:
    """One busy topic (1,500 messages through 2 subscriptions) beside one of 3 messages, over
    six hours: a funnel whose counts span three orders of magnitude, a timeline of many rows."""
    from gateway.audit import AuditLog

    now = [1_714_550_400.0]
    audit = AuditLog(directory, clock=lambda: now[0], process=False)
    n = 0
    for i in range(1500):
        now[0] += 14.4
        audit.emit("publish", "/", topic="orders", msg_id=f"o{i}", size=10, user="u", peer="10.0.0.1:1")
        for sub in ("eu", "all"):
            audit.emit("route", "/", topic="orders", subscription=sub, queue=f"q-{sub}", msg_id=f"o{i}")
            audit.emit("enqueue", "/", topic="orders", subscription=sub, queue=f"q-{sub}", msg_id=f"o{i}", size=10)
            audit.emit("deliver", "/", queue=f"q-{sub}", msg_id=f"o{i}", attempt=1, size=10)
            if i % 500 or sub == "eu":
                audit.emit("ack", "/", queue=f"q-{sub}", msg_id=f"o{i}", latency_ms=3.0)
        n += 9 - (0 if i % 500 else 1)
    for i in range(3):
        audit.emit("publish", "/", topic="audit", msg_id=f"a{i}", size=1, user="u", peer="10.0.0.2:1")
        audit.emit("discard", "/", topic="audit", msg_id=f"a{i}", reason="no_match")
        n += 2
    audit.close()
    return n


def test_A4_wide_funnel_on_a_log_scale_with_every_label_apart_and_tables_bounded(spark, tmp_path: Path) -> None:
    """Issue 27 item 7: a funnel of 1,500 beside 3 is drawn on a log scale with no two numbers
    over each other; the timeline's long table shows its first rows and sums the rest; the
    page as headless Chromium (Playwright) shows it."""
    from playwright.sync_api import sync_playwright

    from spark import read_audit
    from spark.report import _MAX_TABLE_ROWS, _funnel

    audit_dir, out = tmp_path / "audit", tmp_path / "report"
    records = _wide_log(str(audit_dir))
    pdf = analyses.funnel(read_audit(spark, str(audit_dir))).toPandas()
    fig, words = _funnel(pdf)
    assert fig is not None and "log scale: the counts range from 3 to 1,500" in words
    ax = fig.axes[0]
    assert ax.get_xscale() == "log"
    fig.canvas.draw()
    boxes = [t.get_window_extent() for t in ax.texts if t.get_text()]
    assert len(boxes) == sum(1 for b in ax.patches if b.get_width() > 0)  # every bar numbered
    overlapping = [(i, j) for i in range(len(boxes)) for j in range(i + 1, len(boxes)) if boxes[i].overlaps(boxes[j])]
    assert overlapping == []

    write_report(spark, str(audit_dir), str(out), progress=lambda _msg: None)
    got = _numbers(out)
    assert got["records"] == records
    timeline_rows = got["sections"]["timeline"]["rows"]
    assert len(timeline_rows) > _MAX_TABLE_ROWS + 10  # report.json has them all
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=["--no-sandbox"])
        page = browser.new_page()
        page.goto((out / "index.html").as_uri())
        for details in page.query_selector_all("details"):
            details.evaluate("d => d.open = true")
        rows = page.eval_on_selector_all(
            "#timeline ~ details >> nth=0 >> tbody tr", "trs => trs.map(tr => tr.innerText)")
        images = page.eval_on_selector_all("img", "imgs => imgs.map(i => [i.getAttribute('src'), i.naturalWidth])")
        words = page.inner_text("body")
        browser.close()
    assert len(rows) == _MAX_TABLE_ROWS + 1
    assert f"{len(timeline_rows) - _MAX_TABLE_ROWS:,} more rows" in rows[-1]
    shown = sum(r["count"] for r in timeline_rows[_MAX_TABLE_ROWS:])
    assert f"{shown:,}" in rows[-1]
    assert all(width > 500 for _src, width in images) and any(src.endswith("funnel.png") for src, _ in images)
    assert "Drawn on a log scale" in words
