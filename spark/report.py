"""``cmq-audit report``: the ready analyses as one HTML page with PNG plots (A4).

Each step is one Spark job whose (small) result comes back with ``toPandas()`` and is drawn
with matplotlib's Agg backend; progress goes to stderr, one line per step, with its time.
"""

from __future__ import annotations

import html
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from spark import analyses

if TYPE_CHECKING:
    import pandas as pd
    from pyspark.sql import DataFrame, SparkSession

__all__ = ["write_report"]


@dataclass
class _Section:
    title: str
    note: str
    png: str | None
    table: pd.DataFrame


def _plot_timeline(p: pd.DataFrame, path: str) -> bool:
    import matplotlib.pyplot as plt

    if p.empty:
        return False
    wide = p.pivot_table(index="t", columns="event", values="count", aggfunc="sum", fill_value=0)
    top = wide.sum().sort_values(ascending=False).index[:8]
    wide = wide[top]
    fig, ax = plt.subplots(figsize=(11, 4))
    ax.stackplot(wide.index, wide.T.values, labels=list(top), alpha=0.85)
    ax.set_ylabel("records per minute")
    ax.legend(loc="upper left", ncol=4, fontsize=8, frameon=False)
    ax.grid(alpha=0.3)
    fig.autofmt_xdate()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def _plot_funnel(p: pd.DataFrame, path: str) -> bool:
    import matplotlib.pyplot as plt

    rows = p[p["subscription"].notna()]
    if rows.empty:
        return False
    labels = [f"{t} → {s}" for t, s in zip(rows["topic"], rows["subscription"], strict=True)]
    stages = ["published", "routed", "delivered", "acked", "discarded"]
    colors = ["#9aa5b1", "#5b8def", "#f2a541", "#3bb273", "#e15554"]
    fig, ax = plt.subplots(figsize=(11, 0.45 * len(rows) + 1.5))
    h = 0.8 / len(stages)
    for i, (stage, color) in enumerate(zip(stages, colors, strict=True)):
        ax.barh([y + i * h for y in range(len(rows))], rows[stage], height=h, label=stage, color=color)
    ax.set_yticks([y + 0.4 - h / 2 for y in range(len(rows))], labels)
    ax.invert_yaxis()
    ax.set_xlabel("messages")
    ax.legend(ncol=5, fontsize=8, frameon=False, loc="lower right")
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def _plot_bars(p: pd.DataFrame, label: Callable[[Any], str], value: str, xlabel: str, path: str,
               color: str = "#5b8def") -> bool:
    import matplotlib.pyplot as plt

    if p.empty:
        return False
    p = p.head(20)
    fig, ax = plt.subplots(figsize=(11, 0.35 * len(p) + 1.2))
    ax.barh([label(r) for r in p.itertuples()], p[value], color=color)
    ax.invert_yaxis()
    ax.set_xlabel(xlabel)
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def _plot_retries(p: pd.DataFrame, path: str) -> bool:
    import matplotlib.pyplot as plt

    if p.empty:
        return False
    wide = p.pivot_table(index="attempt", columns="policy", values="retries", fill_value=0)
    ax = wide.plot.bar(figsize=(11, 4), rot=0, color=["#f2a541", "#5b8def", "#9aa5b1"][: len(wide.columns)])
    ax.set_ylabel("retries")
    ax.grid(axis="y", alpha=0.3)
    ax.figure.tight_layout()
    ax.figure.savefig(path, dpi=110)
    plt.close(ax.figure)
    return True


def _plot_latency(p: pd.DataFrame, by: str, path: str) -> bool:
    import matplotlib.pyplot as plt

    if p.empty:
        return False
    labels = [str(x) if x is not None and x == x else "all" for x in p[by]]
    cols = ["p50_ms", "p90_ms", "p99_ms", "p999_ms"]
    ax = p.assign(**{by: labels}).set_index(by)[cols].plot.barh(
        figsize=(11, 0.6 * len(p) + 1.5), logx=True, color=["#3bb273", "#5b8def", "#f2a541", "#e15554"])
    ax.invert_yaxis()
    ax.set_xlabel("end-to-end latency, ms (log scale)")
    ax.grid(axis="x", alpha=0.3)
    ax.figure.tight_layout()
    ax.figure.savefig(path, dpi=110)
    plt.close(ax.figure)
    return True


def _load(spark: SparkSession, audit_dir: str, start: str | None, end: str | None) -> DataFrame:
    from spark.source import register

    register(spark)
    reader = spark.read.format("cmq-audit")
    if start:
        reader = reader.option("from", start)
    if end:
        reader = reader.option("to", end)
    return reader.load(audit_dir)


def write_report(spark: SparkSession, audit_dir: str, out_dir: str, *, start: str | None = None,
                 end: str | None = None, progress: Callable[[str], None] | None = None) -> str:
    """Write ``out_dir/index.html`` and its PNGs; returns the HTML path."""
    import matplotlib

    matplotlib.use("Agg")
    os.makedirs(out_dir, exist_ok=True)
    say = progress or (lambda msg: print(msg, file=sys.stderr, flush=True))
    df = _load(spark, audit_dir, start, end).cache()  # every step reads the same records
    skipped = spark.read.format("cmq-audit").option("output", "skipped").load(audit_dir)

    steps: list[tuple[str, str, Callable[[], DataFrame], Callable[[pd.DataFrame, str], bool]]] = [
        ("Records over time", "Audit records per minute, by event (the eight most frequent).",
         lambda: analyses.events_over_time(df), _plot_timeline),
        ("Delivery funnel", "Per topic and subscription: distinct messages published, routed, "
         "delivered, acked and discarded (rows without a subscription: discarded before routing).",
         lambda: analyses.funnel(df), _plot_funnel),
        ("Retries by policy", "Retry records per attempt number and retry policy.",
         lambda: analyses.retries_by_policy(df), _plot_retries),
        ("End-to-end latency", "Publish → ack, percentiles per topic (the first row is all topics).",
         lambda: analyses.latency_percentiles(df), lambda p, f: _plot_latency(p, "topic", f)),
        ("Redeliveries and stale acks", "Per queue: redeliveries, requeues, visibility expiries, stale acks.",
         lambda: analyses.stale_and_redeliveries(df),
         lambda p, f: _plot_bars(p, lambda r: r.queue, "redeliveries", "redeliveries", f, "#f2a541")),
        ("Authentication failures", "Failed logins by user and client host.",
         lambda: analyses.auth_failures(df),
         lambda p, f: _plot_bars(p, lambda r: f"{r.user} @ {r.host}", "failures", "failures", f, "#e15554")),
        ("Busiest publishers", "Messages published per user and host, with bytes and the peak second.",
         lambda: analyses.busiest_publishers(df),
         lambda p, f: _plot_bars(p, lambda r: f"{r.user} @ {r.host or '?'}", "messages", "messages", f)),
        ("Migration report: CMQ limits exceeded", "Breaches of a CMQ limit the compatible profile let "
         "through (PF4), per rule, object and user: what the cmq profile would refuse.",
         lambda: analyses.limits_exceeded(df),
         lambda p, f: _plot_bars(p, lambda r: f"{r.rule} {r.object} ({r.user or '?'})", "breaches", "breaches",
                                 f, "#8e6bbf")),
    ]
    sections: list[_Section] = []
    total = len(steps) + 1
    t_all = time.monotonic()
    for i, (title, note, compute, plot) in enumerate(steps, 1):
        t0 = time.monotonic()
        say(f"[{i}/{total}] {title} …")
        pdf = compute().toPandas()
        png = f"{i:02d}.png"
        drawn = plot(pdf, os.path.join(out_dir, png))
        sections.append(_Section(title, note, png if drawn else None, pdf))
        say(f"[{i}/{total}] {title}: {len(pdf)} rows in {time.monotonic() - t0:.1f}s")
    say(f"[{total}/{total}] counting records and skipped lines …")
    records = df.count()
    n_skipped = skipped.count()
    df.unpersist()
    path = os.path.join(out_dir, "index.html")
    with open(path, "w", encoding="utf-8") as f:
        f.write(_html(audit_dir, start, end, records, n_skipped, sections))
    say(f"report written to {path} in {time.monotonic() - t_all:.1f}s")
    return path


def _html(audit_dir: str, start: str | None, end: str | None, records: int, skipped: int,
          sections: list[_Section]) -> str:
    span = f"{start or 'the beginning'} → {end or 'now'}"
    parts = [
        "<!doctype html><meta charset='utf-8'><title>CMQ gateway audit report</title>",
        "<style>body{font:14px system-ui,sans-serif;max-width:1200px;margin:2em auto;color:#222}"
        "img{max-width:100%}table{border-collapse:collapse;font-size:12px}"
        "td,th{border:1px solid #ddd;padding:2px 6px;text-align:right}th{background:#f4f4f4}"
        "details{margin:.5em 0 2em}.warn{color:#b00}</style>",
        "<h1>CMQ gateway audit report</h1>",
        f"<p>{html.escape(audit_dir)} — {html.escape(span)} — <b>{records:,}</b> records",
        f"; <span class='{'warn' if skipped else ''}'>{skipped:,} torn or unreadable line(s) skipped</span></p>",
    ]
    for s in sections:
        parts.append(f"<h2>{html.escape(s.title)}</h2><p>{html.escape(s.note)}</p>")
        if s.png:
            parts.append(f"<img src='{s.png}' alt='{html.escape(s.title)}'>")
        else:
            parts.append("<p><i>No records of this kind in the range.</i></p>")
        if not s.table.empty:
            parts.append("<details><summary>table</summary>")
            table = s.table.head(200).copy()
            # An absent value is an empty cell: na_rep covers NaN, and pandas 2 writes a None
            # in a text column as "None" (pandas 3 as na_rep).
            text = table.select_dtypes(include="object").columns
            table[text] = table[text].where(table[text].notna(), "")
            parts.append(table.to_html(index=False, na_rep="", float_format=lambda x: f"{x:,.1f}"))
            parts.append("</details>")
    return "\n".join(parts)
