"""``cmq-audit report``: the ready analyses as one HTML page with PNG plots (A4), and the same
numbers in ``report.json`` beside it for scripts and tests.

Each step is one Spark job whose (small) result comes back with ``toPandas()``; it is drawn
with matplotlib's Agg backend only when a picture says more than its sentence: an analysis
with no data, or whose numbers are all zero, says so in words instead of drawing empty axes.
Progress goes to stderr, one line per step, with its time.
"""

from __future__ import annotations

import html
import json
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from spark import analyses

if TYPE_CHECKING:
    import pandas as pd
    from matplotlib.figure import Figure
    from pyspark.sql import DataFrame, SparkSession

__all__ = ["timeline_seconds", "write_report"]

# A rendering is a figure to save, or None; with the sentence that says what it shows.
Rendering = tuple["Figure | None", str]

_BUCKETS = (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 2 * 3600, 3 * 3600, 6 * 3600,
            12 * 3600, 86400, 7 * 86400)
_MAX_BARS = 20  # rows drawn in a bar plot (the table below it has them all)


def timeline_seconds(first: datetime | None, last: datetime | None, buckets: int = 90) -> int:
    """The timeline's bucket: the shortest of 1 s … 1 week that covers the span in at most
    ``buckets`` bars (a minute of log gets seconds, a day gets 15 minutes)."""
    if first is None or last is None:
        return 60
    span = (last - first).total_seconds()
    return next((b for b in _BUCKETS if span / b <= buckets), _BUCKETS[-1])


def _per(seconds: int) -> str:
    for unit, name in ((86400, "day"), (3600, "hour"), (60, "minute"), (1, "second")):
        if seconds % unit == 0:
            n = seconds // unit
            return name if n == 1 else f"{n} {name}s"
    return f"{seconds} s"  # pragma: no cover - every bucket is a whole number of seconds


def _text(x: Any) -> str | None:
    """A table cell as text; None for an absent value (None or NaN)."""
    return None if x is None or x != x else str(x)


def _int(value: object) -> int:
    """A count from a pandas cell: None and NaN (a record without the field) are 0."""
    import pandas

    return 0 if value is None or pandas.isna(value) else int(value)  # type: ignore[call-overload]


def _plural(n: int, word: str) -> str:
    return f"{n:,} {word}" if n == 1 else f"{n:,} {word}s"


def _figure(rows: int, per_row: float = 0.35, extra: float = 1.3) -> tuple[Figure, Any]:
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(11, min(per_row * rows + extra, 14)))
    return fig, ax


def _count(v: float) -> str:
    return f"{int(v):,}" if v else ""


def _grouped_barh(ax: Any, labels: list[str], series: list[tuple[str, Any, str]], xlabel: str,
                  fmt: Callable[[float], str] = _count) -> None:
    """Horizontal bars, one group per label, one bar per series, each bar with its value
    (counts unless ``fmt`` says otherwise)."""
    h = 0.8 / len(series)
    for i, (name, values, color) in enumerate(series):
        bars = ax.barh([y + i * h for y in range(len(labels))], values, height=h, label=name, color=color)
        ax.bar_label(bars, labels=[fmt(v) for v in values], fontsize=7, padding=2)
    ax.set_yticks([y + h * (len(series) - 1) / 2 for y in range(len(labels))], labels)
    ax.invert_yaxis()
    ax.grid(axis="x", alpha=0.3)
    ax.margins(x=0.08)
    ax.set_xlabel(xlabel)
    if fmt is _count:
        _whole_numbers(ax.xaxis)
    _legend_above(ax, len(series))


def _legend_above(ax: Any, columns: int) -> None:
    """The legend over the plot, where it never covers a bar or its number."""
    ax.legend(ncol=columns, fontsize=8, frameon=False, loc="lower left", bbox_to_anchor=(0, 1.0))


def _whole_numbers(axis: Any) -> None:
    from matplotlib.ticker import MaxNLocator

    axis.set_major_locator(MaxNLocator(integer=True))


# -- the sections --------------------------------------------------------------------------


def _timeline(p: pd.DataFrame, seconds: int, span: tuple[datetime | None, datetime | None]) -> Rendering:
    import matplotlib.dates as mdates
    import numpy as np

    if p.empty:
        return None, "No records in this range."
    wide = p.pivot_table(index="t", columns="event", values="count", aggfunc="sum", fill_value=0)
    order = wide.sum().sort_values(ascending=False).index
    # More than eight events: the seven most frequent and the rest together.
    wide = wide[order[:7]].assign(other=wide[order[7:]].sum(axis=1)) if len(order) > 8 else wide[order]
    total = int(p["count"].sum())
    fig, ax = _figure(10, 0.3, 1.0)
    width = seconds / 86400 * 0.9  # matplotlib dates are in days
    x = mdates.date2num(wide.index.to_pydatetime())
    bottom = np.zeros(len(wide))
    for name in wide.columns:
        ax.bar(x, wide[name].to_numpy(), width=width, bottom=bottom, align="edge", label=str(name))
        bottom += wide[name].to_numpy()
    ax.set_xlim(x.min() - seconds / 86400 * 0.5, x.max() + seconds / 86400 * 1.5)
    locator = mdates.AutoDateLocator()
    ax.xaxis.set_major_locator(locator)
    ax.xaxis.set_major_formatter(mdates.ConciseDateFormatter(locator))
    ax.set_ylabel(f"records per {_per(seconds)}")
    ax.set_xlabel("UTC")
    ax.legend(loc="lower left", ncol=4, fontsize=8, frameon=False, bbox_to_anchor=(0, 1.0))
    ax.grid(axis="y", alpha=0.3)
    events = ", ".join(f"{n:,} {e}" for e, n in wide.sum().items())
    first, last = span
    when = f" from {first:%Y-%m-%d %H:%M:%S} to {last:%Y-%m-%d %H:%M:%S} UTC" if first and last else ""
    return fig, f"{_plural(total, 'record')}{when}: {events}."


_FUNNEL_STAGES = (("published", "#9aa5b1"), ("routed", "#5b8def"), ("delivered", "#f2a541"),
                  ("acked", "#3bb273"), ("dead_lettered", "#8e6ccf"), ("discarded", "#e15554"))
_MAX_FUNNEL_ROWS = 30
_LOG_RANGE = 30  # largest / smallest non-zero count from which the funnel is drawn on a log axis
_MAX_TABLE_ROWS = 25  # rows of a section's HTML table; the rest summed in one row (report.json has all)


def _funnel_rows(p: pd.DataFrame) -> list[tuple[str, dict[str, int]]]:
    """The plot's rows: each topic once (published, and discarded before routing), then its
    subscriptions (routed → … → discarded); the default exchange is a topic whose
    subscriptions are its queues.  Topics by messages published, most first."""
    out: list[tuple[str, dict[str, int]]] = []
    subs = p[p["subscription"].notna()]
    published = p.groupby("topic")["published"].max()
    direct = p["topic"] == analyses.DEFAULT_EXCHANGE
    if direct.any():  # its rows' "published" are per queue: the topic's is their sum
        published[analyses.DEFAULT_EXCHANGE] = int(p.loc[direct, "published"].sum())
    for topic in published.sort_values(ascending=False, kind="stable").index:
        pre = p[(p["topic"] == topic) & p["subscription"].isna()]
        out.append((str(topic), {"published": int(published[topic]), "discarded": int(pre["discarded"].sum())}))
        for r in subs[subs["topic"] == topic].itertuples():
            sub = str(r.subscription)
            # A binding's subscription is "<exchange>->q:<queue>" in the log: the exchange once.
            name = f"queue {sub}" if topic == analyses.DEFAULT_EXCHANGE else sub.removeprefix(f"{topic}->")
            out.append((f"→ {name}", {s: int(getattr(r, s)) for s, _ in _FUNNEL_STAGES if s != "published"}))
    return out


def _funnel(p: pd.DataFrame) -> Rendering:
    if p.empty:
        return None, "No messages published or routed in this range."
    topics = p[p["topic"] != analyses.DEFAULT_EXCHANGE].groupby("topic")["published"].max()
    direct = p[p["topic"] == analyses.DEFAULT_EXCHANGE]
    n_direct = int(direct["published"].sum())
    parts = [f"{int(n):,} to topic {t}" for t, n in topics.items()]
    if n_direct:
        parts.append(f"{n_direct:,} through the default exchange to {_plural(len(direct), 'queue')}")
    words = f"{int(topics.sum()) + n_direct:,} messages published: {'; '.join(parts)}."
    pre = p[p["subscription"].isna()]
    reasons = ", ".join(f"{n:,} {r}" for r in analyses.DISCARD_REASONS if (n := int(pre[f"discarded_{r}"].sum())))
    if reasons:
        words += f" Discarded before routing: {reasons}."
    every = _funnel_rows(p)
    rows = every[:_MAX_FUNNEL_ROWS]
    if len(every) > len(rows):
        words += f" The plot shows the first {len(rows)} of {len(every)} rows (the busiest topics); the table has all."
    stages = [(s, c) for s, c in _FUNNEL_STAGES if s != "dead_lettered" or int(p["dead_lettered"].sum())]
    series = [(s, [counts.get(s, 0) for _, counts in rows], c) for s, c in stages]
    values = [v for _, vs, _ in series for v in vs if v > 0]
    # Counts that span orders of magnitude (21,680 published beside 3 discarded) on a linear
    # axis leave the small bars invisible and their numbers piled up at zero: log scale then.
    log = bool(values) and max(values) / min(values) >= _LOG_RANGE
    fig, ax = _figure(len(rows), 0.13 * len(stages), 1.4)
    _grouped_barh(ax, [label for label, _ in rows], series,
                  "messages (distinct)" + (", log scale" if log else ""))
    if log:
        ax.set_xscale("log")
        ax.set_xlim(left=0.8, right=max(values) * 4)  # room for the largest bar's number
        words += f" Drawn on a log scale: the counts range from {min(values):,} to {max(values):,}."
    return fig, words


def _retries(p: pd.DataFrame) -> Rendering:
    import numpy as np

    if p.empty:
        return None, "No retries in this range."
    wide = p.pivot_table(index="attempt", columns="policy", values="retries", aggfunc="sum", fill_value=0)
    colors = ["#f2a541", "#5b8def", "#9aa5b1", "#3bb273"]
    fig, ax = _figure(10, 0.3, 1.0)
    w = 0.8 / len(wide.columns)
    for i, policy in enumerate(wide.columns):
        bars = ax.bar(np.arange(len(wide)) + i * w, wide[policy], width=w, label=str(policy),
                      color=colors[i % len(colors)])
        ax.bar_label(bars, fontsize=7, padding=2)
    ax.set_xticks(np.arange(len(wide)) + w * (len(wide.columns) - 1) / 2, [str(a) for a in wide.index])
    ax.set_xlabel("attempt")
    ax.set_ylabel("retries")
    _whole_numbers(ax.yaxis)
    ax.grid(axis="y", alpha=0.3)
    _legend_above(ax, len(wide.columns))
    first = p[p["attempt"] == p["attempt"].min()]
    return fig, (f"{int(p['retries'].sum()):,} retries; {int(first['messages'].sum()):,} messages retried at "
                 f"least once; up to attempt {int(p['attempt'].max())}.")


def _latency(p: pd.DataFrame, by: str) -> Rendering:
    if p.empty:
        return None, "No acknowledged messages in this range, so no end-to-end latency."
    labels = [_text(x) or "all messages" for x in p[by]]
    cols = ["p50_ms", "p90_ms", "p99_ms", "p999_ms"]
    rows = p.assign(**{by: labels}).head(_MAX_BARS + 1)
    fig, ax = _figure(len(rows), 0.55, 1.4)
    values = rows[cols].to_numpy(dtype=float)
    low, high = values.min(), values.max()
    log = low > 0 and high / low >= 20  # a log axis only where the values span orders of magnitude
    _grouped_barh(ax, list(rows[by]), [(c.removesuffix("_ms"), rows[c].to_numpy(), color) for c, color in
                                       zip(cols, ["#3bb273", "#5b8def", "#f2a541", "#e15554"], strict=True)],
                  "end-to-end latency, publish → ack, ms" + (" (log scale)" if log else ""), fmt=lambda v: f"{v:,.1f}")
    if log:
        ax.set_xscale("log")
    total = p[p[by].isna()].iloc[0] if p[by].isna().any() else p.iloc[0]
    return fig, (f"{int(total['acks']):,} acks: p50 {total['p50_ms']:,.1f} ms, p99 {total['p99_ms']:,.1f} ms, "
                 f"max {total['max_ms']:,.1f} ms over all messages.")


_REDELIVERY_COLUMNS = (("redeliveries", "#f2a541"), ("requeues", "#5b8def"),
                       ("visibility_expiries", "#9aa5b1"), ("stale_acks", "#e15554"))


def _redeliveries(p: pd.DataFrame) -> Rendering:
    if p.empty:
        return None, "No deliveries in this range."
    deliveries = int(p["deliveries"].sum())
    shown = [(c, color) for c, color in _REDELIVERY_COLUMNS if int(p[c].sum())]
    head = f"{deliveries:,} deliveries on {_plural(len(p), 'queue')}"
    if not shown:
        return None, f"{head}: none redelivered, requeued, expired unacked or acked stale."
    rows = p[p[[c for c, _ in shown]].sum(axis=1) > 0].head(_MAX_BARS)
    words = head + ": " + ", ".join(f"{int(p[c].sum()):,} {c.replace('_', ' ')}" for c, _ in shown)
    if len(rows) == 1:
        words += f", all on queue {rows['queue'].iloc[0]}"
    zero = [c.replace("_", " ") for c, _ in _REDELIVERY_COLUMNS if c not in dict(shown)]
    words += f"; no {' or '.join(zero)}." if zero else "."
    if len(rows) == 1:  # one queue: the sentence says it all
        return None, words
    fig, ax = _figure(len(rows), 0.2 * len(shown), 1.4)
    _grouped_barh(ax, [str(q) for q in rows["queue"]], [(c, rows[c].to_numpy(), color) for c, color in shown],
                  "per queue")
    return fig, words


_KIND_WORDS = {"login": ("failed login", "failed logins"), "operation": ("refused operation", "refused operations")}


def _auth_failures(p: pd.DataFrame) -> Rendering:
    """Failed logins and refused operations (of logged-in users) apart: one bar per kind,
    user and host; the sentence counts each kind."""
    if p.empty:
        return None, "No failed logins and no refused operations in this range."
    per = (p.groupby(["kind", "user"]).agg(failures=("failures", "sum"), hosts=("host", "nunique"),
                                           host=("host", "first"))
           .reset_index().sort_values(["failures", "hosts"], ascending=False, kind="stable"))
    labels = [f"{r.user} from {r.host}" if r.hosts == 1 else f"{r.user} from {r.hosts} hosts"
              for r in per.itertuples()]
    said = []
    for kind, (one, many) in _KIND_WORDS.items():
        rows = [(int(r.failures), label) for r, label in zip(per.itertuples(), labels, strict=True) if r.kind == kind]
        total = sum(n for n, _ in rows)
        if not rows:
            said.append(f"no {many}")
            continue
        said.append(f"{total:,} {one if total == 1 else many} ("
                    + "; ".join(f"{label}: {n:,}" for n, label in rows) + ")")
    words = "; ".join(said) + "."
    if len(per) == 1:  # one bar would say no more than the sentence
        return None, words
    rows = per.head(_MAX_BARS)
    fig, ax = _figure(len(rows))
    colors = ["#e15554" if k == "login" else "#f0a202" for k in rows["kind"]]
    names = [f"{label} ({_KIND_WORDS[str(k)][0]})" for label, k in zip(labels[:len(rows)], rows["kind"], strict=True)]
    bars = ax.barh(names, rows["failures"], color=colors)
    ax.bar_label(bars, fontsize=8, padding=2)
    ax.invert_yaxis()
    ax.set_xlabel("failed logins and refused operations per user")
    _whole_numbers(ax.xaxis)
    ax.grid(axis="x", alpha=0.3)
    return fig, words


def _admin_changes(p: pd.DataFrame) -> Rendering:
    """The administrative changes in words only: who changed what is a list, not a picture."""
    if p.empty:
        return None, "No user, vhost, permission or policy was changed over the management API in this range."
    by_event = p.groupby("event")["changes"].sum().sort_values(ascending=False, kind="stable")
    users = sorted({str(u) for u in p["user"]})
    who = ", ".join(users[:5]) + (f" and {len(users) - 5:,} more users" if len(users) > 5 else "")
    return None, (f"{_plural(int(p['changes'].sum()), 'change')} by {who}: "
                  + ", ".join(f"{int(n):,} {str(e).replace('_', ' ')}" for e, n in by_event.items()) + ".")


def _annotated_bars(labels: list[str], values: Any, notes: list[str], xlabel: str, color: str) -> Figure:
    """One horizontal bar per row, largest first, each with its note at the end of the bar."""
    fig, ax = _figure(len(labels))
    bars = ax.barh(labels, values, color=color)
    ax.bar_label(bars, labels=notes, fontsize=8, padding=2)
    ax.invert_yaxis()
    ax.margins(x=0.35)
    ax.set_xlabel(xlabel)
    ax.grid(axis="x", alpha=0.3)
    return fig


def _publishers(p: pd.DataFrame) -> Rendering:
    if p.empty:
        return None, "No messages published in this range."
    labels = [f"{_text(u) or '(no user)'}" + (f" @ {h}" if _text(h) else "") for u, h in zip(p["user"], p["host"], strict=True)]
    rows = p.head(_MAX_BARS)
    details = [f"{_int(b):,} bytes, peak {_int(s):,} in one second"
               for b, s in zip(rows["bytes"], rows["peak_per_s"], strict=True)]
    total = int(p["messages"].sum())
    if len(p) == 1:  # one bar would say no more than the sentence
        return None, f"{_plural(total, 'message')} published, all by {labels[0]} ({details[0]})."
    fig = _annotated_bars(labels[:len(rows)], rows["messages"],
                          [f"{int(m):,} ({d})" for m, d in zip(rows["messages"], details, strict=True)],
                          "messages published", "#5b8def")
    return fig, (f"{total:,} messages from {len(p):,} publishers (user and host); the busiest, {labels[0]}, "
                 f"published {int(rows['messages'].iloc[0]):,} ({details[0]}).")


def _limits(p: pd.DataFrame) -> Rendering:
    if p.empty:
        return None, ("No breach of a CMQ limit in this range: nothing here would be refused by the cmq "
                      "profile (or the gateway ran in it).")
    labels = [f"{r} {o} ({_text(u) or '(no user)'})" for r, o, u in zip(p["rule"], p["object"], p["user"], strict=True)]
    rows = p.head(_MAX_BARS)
    total = int(p["breaches"].sum())
    if len(p) == 1:
        return None, (f"{total:,} breach{'es' if total != 1 else ''} of {p['rule'].iloc[0]}, all by {labels[0]}: worst value "
                      f"{p['worst_value'].iloc[0]}, CMQ's limit {p['limit'].iloc[0]}.")
    fig = _annotated_bars(labels[:len(rows)], rows["breaches"],
                          [f"{int(b):,} (worst {w}, limit {lim})" for b, w, lim in
                           zip(rows["breaches"], rows["worst_value"], rows["limit"], strict=True)],
                          "breaches", "#8e6bbf")
    return fig, (f"{total:,} breaches of CMQ limits in {len(p):,} places (rule, object, user): each is what "
                 f"to fix before moving to CMQ.")


# -- the page ------------------------------------------------------------------------------


@dataclass
class _Section:
    key: str
    title: str
    note: str
    words: str
    png: str | None
    table: pd.DataFrame


def _load(spark: SparkSession, audit_dir: str, start: str | None, end: str | None) -> DataFrame:
    """The records through ``read_audit``: Parquet segments by Spark's own reader, the rest by
    the ``cmq-audit`` source."""
    from spark.read import read_audit

    options = {k: v for k, v in (("from", start), ("to", end)) if v}
    return read_audit(spark, audit_dir, **options)


def write_report(spark: SparkSession, audit_dir: str, out_dir: str, *, start: str | None = None,
                 end: str | None = None, progress: Callable[[str], None] | None = None) -> str:
    """Write ``out_dir/index.html``, its PNGs and ``report.json``; returns the HTML path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from pyspark.sql import functions as F

    os.makedirs(out_dir, exist_ok=True)
    say = progress or (lambda msg: print(msg, file=sys.stderr, flush=True))
    from spark.read import uncompacted

    df = _load(spark, audit_dir, start, end)
    if uncompacted(audit_dir):  # Spark's Parquet reader is cheaper than a cache; the Python source is not
        df = df.cache()  # every step reads the same records
    span = analyses.time_span(analyses.client_actions(df))
    seconds = timeline_seconds(*span)

    steps: list[tuple[str, str, str, Callable[[], DataFrame], Callable[[pd.DataFrame], Rendering]]] = [
        ("timeline", "Records over time", f"Audit records per {_per(seconds)}, by event.",
         lambda: analyses.events_over_time(df, seconds), lambda p: _timeline(p, seconds, span)),
        ("funnel", "Delivery funnel", "Per topic and subscription: distinct messages published, routed, "
         "delivered, acked, dead-lettered and discarded. Messages sent through the default exchange "
         f"are under {analyses.DEFAULT_EXCHANGE}, its queues as subscriptions. In the plot each topic's own "
         "row has its messages published and those discarded before any subscription took them (in the "
         "table: the row without a subscription).",
         lambda: analyses.funnel(df), _funnel),
        ("retries", "Retries by policy", "Retry records per attempt number and retry policy.",
         lambda: analyses.retries_by_policy(df), _retries),
        ("latency", "End-to-end latency", "Publish → ack, percentiles per topic; the first row, "
         "“all messages”, is every topic and the default exchange together.",
         lambda: analyses.latency_percentiles(df), lambda p: _latency(p, "topic")),
        ("redeliveries", "Redeliveries and stale acks",
         "Per queue: redeliveries (delivery attempt > 1), requeues, visibility expiries, stale acks.",
         lambda: analyses.stale_and_redeliveries(df), _redeliveries),
        ("auth_failures", "Authentication failures and refused operations",
         "Failed logins (credentials, a vhost the user may not open) per attempted user, and operations "
         "a logged-in user's tags or permissions refused (AMQP, MQTT, the management and CMQ APIs) per "
         "user, each from how many client hosts (the table has each kind, user and host).",
         lambda: analyses.auth_failures(df), _auth_failures),
        ("admin_changes", "Administrative changes",
         "Users, vhosts, permissions and policies created, changed or deleted over the management API "
         "(and its definitions import): per event, object and acting user, with first and last time.",
         lambda: analyses.admin_changes(df), _admin_changes),
        ("publishers", "Busiest publishers", "Messages published per user and host, with bytes and the peak second.",
         lambda: analyses.busiest_publishers(df), _publishers),
        ("limits", "Migration report: CMQ limits exceeded", "Breaches of a CMQ limit the compatible profile "
         "let through (PF4), per rule, object and user: what the cmq profile would refuse.",
         lambda: analyses.limits_exceeded(df), _limits),
    ]
    sections: list[_Section] = []
    total = len(steps) + 1
    t_all = time.monotonic()
    for i, (key, title, note, compute, render) in enumerate(steps, 1):
        t0 = time.monotonic()
        say(f"[{i}/{total}] {title} …")
        pdf = compute().toPandas()
        fig, words = render(pdf)
        png = None
        if fig is not None:
            png = f"{i:02d}-{key}.png"
            fig.tight_layout()
            fig.savefig(os.path.join(out_dir, png), dpi=110)
            plt.close(fig)
        sections.append(_Section(key, title, note, words, png, pdf))
        say(f"[{i}/{total}] {title}: {len(pdf)} rows in {time.monotonic() - t0:.1f}s")
    say(f"[{total}/{total}] counting records and skipped lines …")
    from spark.read import skipped_lines

    recovery = F.coalesce(F.col("origin") == "recovery", F.lit(False))
    row = df.agg(F.count("*").alias("n"), F.count(F.when(F.col("open_file"), 1)).alias("open"),
                 F.count(F.when(recovery, 1)).alias("recovery")).first()
    records, from_open, from_recovery = (int(row["n"]), int(row["open"]), int(row["recovery"])) if row else (0, 0, 0)
    n_skipped = skipped_lines(spark, audit_dir)
    df.unpersist()
    summary = {"audit_dir": audit_dir, "from": start, "to": end, "records": records,
               "records_from_open_files": from_open, "records_from_recovery": from_recovery,
               "skipped_lines": n_skipped, "timeline_seconds": seconds}
    with open(os.path.join(out_dir, "report.json"), "w", encoding="utf-8") as f:
        json.dump(_json(summary, sections), f, indent=1)
    path = os.path.join(out_dir, "index.html")
    with open(path, "w", encoding="utf-8") as f:
        f.write(_html(summary, sections))
    say(f"report written to {path} in {time.monotonic() - t_all:.1f}s")
    return path


def _json(summary: dict[str, Any], sections: list[_Section]) -> dict[str, Any]:
    """The page's numbers: the summary, and each section's sentence, image and table rows."""
    out = dict(summary)
    out["sections"] = {
        s.key: {"title": s.title, "summary": s.words, "png": s.png,
                # pandas writes NaN/NaT as null and timestamps as ISO-8601 text.
                "rows": json.loads(s.table.to_json(orient="records", date_format="iso", date_unit="us"))}
        for s in sections
    }
    return out


def _cell(x: Any) -> str:
    import pandas

    if x is None or (pandas.api.types.is_scalar(x) and pandas.isna(x)):
        return ""
    return f"{x:,.1f}" if isinstance(x, float) else str(x)


def _bounded(table: pd.DataFrame) -> pd.DataFrame:
    """The table as text, its first ``_MAX_TABLE_ROWS`` rows; past them, one more row that
    says how many rows were left out and sums their counts (integer columns; other cells
    empty).  report.json has every row."""
    import pandas

    head = table.head(_MAX_TABLE_ROWS)
    out = pandas.DataFrame({c: [_cell(x) for x in head[c].tolist()] for c in table.columns}, columns=table.columns)
    if len(table) > _MAX_TABLE_ROWS:
        rest = table.iloc[_MAX_TABLE_ROWS:]
        summary = {c: (f"{int(rest[c].sum()):,}" if pandas.api.types.is_integer_dtype(table[c])
                       and c not in ("attempt", "hour") else "") for c in table.columns}
        summary[table.columns[0]] = f"… {len(rest):,} more rows (their sums; every row is in report.json)"
        out = pandas.concat([out, pandas.DataFrame([summary], columns=table.columns)], ignore_index=True)
    return out


def _html(summary: dict[str, Any], sections: list[_Section]) -> str:
    span = f"{summary['from'] or 'the beginning'} → {summary['to'] or 'now'}"
    skipped, from_open = summary["skipped_lines"], summary["records_from_open_files"]
    live = f" ({from_open:,} from a file the gateway is still writing)" if from_open else ""
    if summary.get("records_from_recovery"):
        live += (f"; {summary['records_from_recovery']:,} of them written by a gateway's start-up for what it "
                 "restored (origin recovery), not counted below")
    parts = [
        "<!doctype html><meta charset='utf-8'><title>CMQ gateway audit report</title>",
        "<style>body{font:14px system-ui,sans-serif;max-width:1200px;margin:2em auto;color:#222}"
        "img{max-width:100%}table{border-collapse:collapse;font-size:12px}"
        "td,th{border:1px solid #ddd;padding:2px 6px;text-align:right}th{background:#f4f4f4}"
        "details{margin:.5em 0 2em}.warn{color:#b00}.words{font-weight:600}</style>",
        "<h1>CMQ gateway audit report</h1>",
        f"<p>{html.escape(summary['audit_dir'])} — {html.escape(span)} — <b>{summary['records']:,}</b> records"
        f"{live}; <span class='{'warn' if skipped else ''}'>{skipped:,} torn or unreadable line(s) skipped</span>"
        " — the numbers are also in <a href='report.json'>report.json</a></p>",
    ]
    for s in sections:
        parts.append(f"<h2 id='{s.key}'>{html.escape(s.title)}</h2><p>{html.escape(s.note)}</p>")
        parts.append(f"<p class='words'>{html.escape(s.words)}</p>")
        if s.png:
            parts.append(f"<img src='{s.png}' alt='{html.escape(s.title)}'>")
        if not s.table.empty:
            parts.append("<details><summary>table</summary>")
            # Every cell as text: an absent value (None, NaN, NaT) empty, a float to 0.1.
            parts.append(_bounded(s.table).to_html(index=False))
            parts.append("</details>")
    return "\n".join(parts)
