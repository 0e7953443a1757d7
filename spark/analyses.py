"""Ready analyses of the audit log (A4), each a function of the ``cmq-audit`` DataFrame that
returns a DataFrame (small, aggregated: fit for ``toPandas()`` and a plot).

Records name their message by ``msg_id`` and their queue by ``queue``; events emitted on the
queue side (deliver, ack, nack, ...) may lack ``topic``/``subscription``, which are then taken
from the message's ``enqueue`` record for that queue.

Every analysis counts client actions only (A6): records with ``origin = "recovery"`` (what a
gateway's start-up restored: its queues, bindings, standing limit breaches) are left out.  A
delivery with ``auto_ack: true`` (a no-ack consumer, basic.get with no_ack, MQTT QoS 0) settled
its message as it was sent, and no ack record follows: the funnel counts it as acked.
"""

from __future__ import annotations

from datetime import UTC, datetime

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from gateway.audit.record import ADMIN_EVENTS

__all__ = [
    "ADMIN_EVENTS",
    "DEFAULT_EXCHANGE",
    "DISCARD_REASONS",
    "admin_changes",
    "auth_failures",
    "busiest_publishers",
    "client_actions",
    "events_over_time",
    "funnel",
    "latency_percentiles",
    "limits_exceeded",
    "refused_operation",
    "retries_by_policy",
    "stale_and_redeliveries",
    "time_span",
]

# The "topic" of a message published to AMQP's default exchange "" (its records have none).
DEFAULT_EXCHANGE = "(default exchange)"
DISCARD_REASONS = ("no_match", "retries_exhausted", "expired", "rejected", "too_large", "max_length")



def client_actions(df: DataFrame) -> DataFrame:
    """``df`` without the records a gateway's start-up wrote for what it restored (A6).  A
    DataFrame without the ``origin`` column (``columns`` option) is returned as it is."""
    if "origin" not in df.columns:
        return df
    return df.where(F.col("origin").isNull() | (F.col("origin") != "recovery"))


def _with_subscription(df: DataFrame) -> DataFrame:
    """Fill ``topic``/``subscription`` of queue-side records from the ``enqueue`` record.

    A ``dead_letter`` record names where the message went (the DLX as ``topic``, or CMQ's
    dead-letter queue as ``subscription``); here it takes the place it was dead-lettered from,
    so that the funnel counts it on the subscription that gave it up."""
    enq = (
        df.where(F.col("event") == "enqueue")
        .select("msg_id", "queue", F.col("topic").alias("_t"), F.col("subscription").alias("_s"))
        .dropDuplicates(["msg_id", "queue"])
    )
    dead = F.col("event") == "dead_letter"
    return (
        df.join(enq, ["msg_id", "queue"], "left")
        .withColumns({
            "topic": F.when(dead, F.col("_t")).otherwise(F.coalesce("topic", "_t")),
            "subscription": F.when(dead, F.col("_s")).otherwise(F.coalesce("subscription", "_s")),
        })
        .drop("_t", "_s")
    )


def _by_source(df: DataFrame) -> DataFrame:
    """Every message record with the topic and subscription it travelled by: as
    ``_with_subscription``, and a message published to the default exchange (no topic: AMQP's
    ``""`` exchange sends it straight to the queue named by its routing key) is on
    ``(DEFAULT_EXCHANGE, <queue>)``."""
    d = _with_subscription(df)
    direct = F.col("topic").isNull() & F.col("queue").isNotNull()
    return d.withColumns({  # both from the columns as they were
        "topic": F.when(direct, F.lit(DEFAULT_EXCHANGE)).otherwise(F.col("topic")),
        "subscription": F.when(direct, F.col("queue")).otherwise(F.col("subscription")),
    })


def funnel(df: DataFrame) -> DataFrame:
    """Per topic and subscription: published → routed → delivered → acked, or discarded (by
    reason).  Counts are distinct messages; ``acked`` includes auto-ack deliveries.  ``published`` is the topic's total, repeated on
    each of its subscriptions; for the default exchange (topic ``DEFAULT_EXCHANGE``, the queue
    as subscription) it is the messages published to that queue.  ``routed`` counts a message
    that a subscription took (``route``) or that reached the queue (``enqueue``).  Discards
    before routing (no_match, too_large) are on the row whose subscription is NULL."""
    df = client_actions(df)
    d = _by_source(df.where(F.col("topic").isNotNull() | F.col("queue").isNotNull()))
    ev = F.col("event")
    auto = F.coalesce(F.col("auto_ack"), F.lit(False)) if "auto_ack" in df.columns else F.lit(False)
    pub = d.where(ev == "publish")
    topic_published = (
        pub.where(F.col("topic") != DEFAULT_EXCHANGE).groupBy("topic")
        .agg(F.count_distinct("msg_id").alias("_topic_published"))
    )
    queue_published = (
        pub.where(F.col("topic") == DEFAULT_EXCHANGE).groupBy("topic", "subscription")
        .agg(F.count_distinct("msg_id").alias("_queue_published"))
    )
    stages = {
        "routed": ev.isin("route", "enqueue"),
        "delivered": ev == "deliver",
        "acked": (ev == "ack") | ((ev == "deliver") & auto),
        "dead_lettered": ev == "dead_letter",
        "discarded": ev == "discard",
        **{f"discarded_{r}": (ev == "discard") & F.coalesce(F.col("reason") == r, F.lit(False))
           for r in DISCARD_REASONS},
    }
    counts = list(stages)
    # Distinct messages per stage, as two plain aggregations (per message, then per
    # subscription) rather than one count_distinct per stage, which Spark runs as an Expand
    # of every row once per stage.
    per_msg = (
        d.where(ev.isin("route", "enqueue", "deliver", "ack", "discard", "dead_letter") & F.col("msg_id").isNotNull())
        .groupBy("topic", "subscription", "msg_id")
        .agg(*[F.max(cond.cast("int")).alias(name) for name, cond in stages.items()])
    )
    per_sub = per_msg.groupBy("topic", "subscription").agg(*[F.sum(c).cast("long").alias(c) for c in counts])
    # A queue that was published to and never reached (nothing else recorded) still has its row.
    rows = per_sub.join(queue_published, ["topic", "subscription"], "full").join(topic_published, "topic", "left")
    return (
        rows.where(F.col("topic").isNotNull())
        .select("topic", "subscription",
                F.coalesce("_queue_published", "_topic_published", F.lit(0)).alias("published"),
                *[F.coalesce(c, F.lit(0)).alias(c) for c in counts])
        .orderBy("topic", F.col("subscription").asc_nulls_first())
    )


def retries_by_policy(df: DataFrame) -> DataFrame:
    """Retry records per policy and attempt number, with the distinct messages retried."""
    df = client_actions(df)
    return (
        df.where(F.col("event") == "retry")
        .groupBy(F.coalesce("policy", F.lit("unknown")).alias("policy"), "attempt")
        .agg(F.count("*").alias("retries"), F.count_distinct("msg_id").alias("messages"))
        .orderBy("policy", "attempt")
    )


def latency_percentiles(df: DataFrame, by: str = "topic") -> DataFrame:
    """End-to-end latency (publish → ack) percentiles in ms, per ``by`` and overall (``by``
    NULL, the first row; messages of the default exchange are under ``DEFAULT_EXCHANGE``).
    ``latency_ms`` of the ack record is used when the broker wrote it, else the difference of
    the ack and publish timestamps."""
    df = client_actions(df)
    pub = df.where(F.col("event") == "publish").groupBy("msg_id").agg(F.min("ts").alias("pub_ts"))
    filled = _by_source(df.where(F.col("event").isin("enqueue", "ack")))
    acks = filled.where(F.col("event") == "ack").join(pub, "msg_id", "left")
    lat = F.coalesce(
        F.col("latency_ms"),
        (F.col("ts").cast("double") - F.col("pub_ts").cast("double")) * 1000.0,
    )
    acks = acks.withColumn("lat", lat).where(F.col("lat").isNotNull())
    pct = F.percentile_approx("lat", [0.5, 0.9, 0.99, 0.999], 10000)
    return (
        acks.rollup(by)
        .agg(F.count("*").alias("acks"), pct.alias("p"), F.max("lat").alias("max_ms"))
        .select(by, "acks", F.col("p")[0].alias("p50_ms"), F.col("p")[1].alias("p90_ms"),
                F.col("p")[2].alias("p99_ms"), F.col("p")[3].alias("p999_ms"), "max_ms")
        .orderBy(F.col(by).asc_nulls_first())
    )


def stale_and_redeliveries(df: DataFrame) -> DataFrame:
    """Per queue: deliveries, redeliveries (attempt > 1), requeues, visibility expiries and
    stale acks (an ack whose receipt was no longer the latest, M12)."""
    df = client_actions(df)
    ev = F.col("event")
    return (
        df.where(F.col("queue").isNotNull() & ev.isin("deliver", "requeue", "visibility_expire", "stale_ack"))
        .groupBy("queue")
        .agg(
            F.count(F.when(ev == "deliver", 1)).alias("deliveries"),
            F.count(F.when((ev == "deliver") & (F.col("attempt") > 1), 1)).alias("redeliveries"),
            F.count(F.when(ev == "requeue", 1)).alias("requeues"),
            F.count(F.when(ev == "visibility_expire", 1)).alias("visibility_expiries"),
            F.count(F.when(ev == "stale_ack", 1)).alias("stale_acks"),
        )
        .orderBy(F.desc("redeliveries"), "queue")
    )


def _host(peer: Column) -> Column:
    # "10.0.0.2:51234" → "10.0.0.2"; "[::1]:5000" → "[::1]"
    return F.regexp_extract(peer, r"^(\[[^\]]*\]|[^:]*)", 1)


def refused_operation() -> Column:
    """True on an ``auth_failure`` that refused an operation of a logged-in user (its tags or
    permissions), false on a refused login (credentials, a vhost it may not open), as each
    API words them (spark/SCHEMA.md): AMQP's operations say ``protocol: "amqp"`` (its logins
    say no protocol), MQTT's start ``publish``/``subscribe``, the management API's
    ``not_authorised:``, the CMQ API's ``access to``."""
    protocol, reason = F.col("protocol"), F.coalesce(F.col("reason"), F.lit(""))
    return F.coalesce(
        (protocol == "amqp")
        | ((protocol == "mqtt") & reason.rlike(r"^(publish|subscribe) "))
        | ((protocol == "http") & reason.startswith("not_authorised: "))
        | ((protocol == "cmq-api") & reason.startswith("access to ")),
        F.lit(False))


def auth_failures(df: DataFrame) -> DataFrame:
    """Refusals by ``kind`` (``login``: a failed login; ``operation``: an operation the
    logged-in user's tags or permissions refused), user and client host, with first and last
    time seen."""
    df = client_actions(df)
    kind = F.when(refused_operation(), F.lit("operation")).otherwise(F.lit("login"))
    return (
        df.where(F.col("event") == "auth_failure")
        .groupBy(kind.alias("kind"), F.coalesce("user", F.lit("?")).alias("user"), _host(F.col("peer")).alias("host"))
        .agg(F.count("*").alias("failures"), F.min("ts").alias("first"), F.max("ts").alias("last"))
        .orderBy("kind", F.desc("failures"), "user", "host")
    )


def admin_changes(df: DataFrame) -> DataFrame:
    """Administrative changes over the management API (users, vhosts, permissions,
    policies; gateway.management.admin_audit): one row per event, changed object and
    acting user, with how often and first and last time seen."""
    df = client_actions(df)
    return (
        df.where(F.col("event").isin(*ADMIN_EVENTS))
        .groupBy("event", "vhost", "object", F.coalesce("user", F.lit("?")).alias("user"))
        .agg(F.count("*").alias("changes"), F.min("ts").alias("first"), F.max("ts").alias("last"))
        .orderBy("first", "event", "object")
    )


def busiest_publishers(df: DataFrame, top: int = 20) -> DataFrame:
    """Publishers (user and host) by messages published, with bytes and peak messages/s."""
    df = client_actions(df)
    pub = df.where(F.col("event") == "publish").withColumn("host", _host(F.col("peer")))
    per_sec = pub.groupBy("user", "host", F.date_trunc("second", "ts").alias("s")).count()
    peak = per_sec.groupBy("user", "host").agg(F.max("count").alias("peak_per_s"))
    return (
        pub.groupBy("user", "host")
        .agg(F.count("*").alias("messages"), F.sum("size").alias("bytes"),
             F.count_distinct("topic").alias("topics"))
        .join(peak, ["user", "host"], "left")
        .orderBy(F.desc("messages"), "user")
        .limit(top)
    )


def events_over_time(df: DataFrame, seconds: int = 60) -> DataFrame:
    """Record counts per time bucket of ``seconds`` (``t``, its start) and event (the
    report's timeline)."""
    df = client_actions(df)
    bucket = F.window("ts", f"{seconds} seconds").start.alias("t")
    return df.groupBy(bucket, "event").count().orderBy("t", "event")


def time_span(df: DataFrame) -> tuple[datetime | None, datetime | None]:
    """The first and last ``ts`` as naive UTC datetimes (None, None without records)."""
    # As microseconds: a collected timestamp would be in the Python process's local zone.
    row = df.agg(F.min(F.unix_micros("ts")).alias("first"), F.max(F.unix_micros("ts")).alias("last")).first()

    def utc(us: int | None) -> datetime | None:
        return None if us is None else datetime.fromtimestamp(us / 1e6, UTC).replace(tzinfo=None)
    return (utc(row["first"]), utc(row["last"])) if row is not None else (None, None)


def limits_exceeded(df: DataFrame) -> DataFrame:
    """The migration report from the audit log (PF4): per vhost, CMQ rule, object and user,
    how often the compatible profile let a breach of a CMQ limit through, the worst value
    and CMQ's limit, first and last seen. Empty under the cmq profile, which refuses them."""
    df = client_actions(df)
    return (
        df.where(F.col("event") == "limit_exceeded")
        .groupBy("vhost", "rule", "object", "user")
        .agg(F.count("*").alias("breaches"), F.max("value").alias("worst_value"), F.max("limit").alias("limit"),
             F.min("ts").alias("first"), F.max("ts").alias("last"))
        .orderBy("rule", "vhost", "object", "user")
    )
