"""Ready analyses of the audit log (A4), each a function of the ``cmq-audit`` DataFrame that
returns a DataFrame (small, aggregated: fit for ``toPandas()`` and a plot).

Records name their message by ``msg_id`` and their queue by ``queue``; events emitted on the
queue side (deliver, ack, nack, ...) may lack ``topic``/``subscription``, which are then taken
from the message's ``enqueue`` record for that queue.
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

__all__ = [
    "DISCARD_REASONS",
    "auth_failures",
    "busiest_publishers",
    "events_over_time",
    "funnel",
    "latency_percentiles",
    "limits_exceeded",
    "retries_by_policy",
    "stale_and_redeliveries",
]

DISCARD_REASONS = ("no_match", "retries_exhausted", "expired", "rejected", "too_large", "max_length")


def _with_subscription(df: DataFrame) -> DataFrame:
    """Fill ``topic``/``subscription`` of queue-side records from the ``enqueue`` record."""
    enq = (
        df.where(F.col("event") == "enqueue")
        .select("msg_id", "queue", F.col("topic").alias("_t"), F.col("subscription").alias("_s"))
        .dropDuplicates(["msg_id", "queue"])
    )
    return (
        df.join(enq, ["msg_id", "queue"], "left")
        .withColumn("topic", F.coalesce("topic", "_t"))
        .withColumn("subscription", F.coalesce("subscription", "_s"))
        .drop("_t", "_s")
    )


def _count_msgs(cond: Column) -> Column:
    return F.count_distinct(F.when(cond, F.col("msg_id")))


def funnel(df: DataFrame) -> DataFrame:
    """Per topic and subscription: published → routed → delivered → acked, or discarded (by
    reason).  Counts are distinct messages; ``published`` is the topic's total, repeated on each
    of its subscriptions; discards before routing (no_match, too_large) are on the row whose
    subscription is NULL."""
    d = _with_subscription(df.where(F.col("topic").isNotNull() | F.col("queue").isNotNull()))
    ev = F.col("event")
    published = d.where(ev == "publish").groupBy("topic").agg(F.count_distinct("msg_id").alias("published"))
    per_sub = d.where(ev.isin("route", "enqueue", "deliver", "ack", "discard", "dead_letter")).groupBy(
        "topic", "subscription"
    ).agg(
        _count_msgs(ev == "route").alias("routed"),
        _count_msgs(ev == "deliver").alias("delivered"),
        _count_msgs(ev == "ack").alias("acked"),
        _count_msgs(ev == "dead_letter").alias("dead_lettered"),
        _count_msgs(ev == "discard").alias("discarded"),
        *[_count_msgs((ev == "discard") & (F.col("reason") == r)).alias(f"discarded_{r}") for r in DISCARD_REASONS],
    )
    return (
        per_sub.join(published, "topic", "left")
        .where(F.col("topic").isNotNull())
        .select("topic", "subscription", F.coalesce("published", F.lit(0)).alias("published"),
                "routed", "delivered", "acked", "dead_lettered", "discarded",
                *[f"discarded_{r}" for r in DISCARD_REASONS])
        .orderBy("topic", F.col("subscription").asc_nulls_first())
    )


def retries_by_policy(df: DataFrame) -> DataFrame:
    """Retry records per policy and attempt number, with the distinct messages retried."""
    return (
        df.where(F.col("event") == "retry")
        .groupBy(F.coalesce("policy", F.lit("unknown")).alias("policy"), "attempt")
        .agg(F.count("*").alias("retries"), F.count_distinct("msg_id").alias("messages"))
        .orderBy("policy", "attempt")
    )


def latency_percentiles(df: DataFrame, by: str = "topic") -> DataFrame:
    """End-to-end latency (publish → ack) percentiles in ms, per ``by`` and overall (``by``
    NULL).  ``latency_ms`` of the ack record is used when the broker wrote it, else the
    difference of the ack and publish timestamps."""
    pub = df.where(F.col("event") == "publish").groupBy("msg_id").agg(F.min("ts").alias("pub_ts"))
    filled = _with_subscription(df.where(F.col("event").isin("enqueue", "ack")))
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


def auth_failures(df: DataFrame) -> DataFrame:
    """Failed logins by user and client host, with first and last time seen."""
    return (
        df.where(F.col("event") == "auth_failure")
        .groupBy(F.coalesce("user", F.lit("?")).alias("user"), _host(F.col("peer")).alias("host"))
        .agg(F.count("*").alias("failures"), F.min("ts").alias("first"), F.max("ts").alias("last"))
        .orderBy(F.desc("failures"), "user", "host")
    )


def busiest_publishers(df: DataFrame, top: int = 20) -> DataFrame:
    """Publishers (user and host) by messages published, with bytes and peak messages/s."""
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


def events_over_time(df: DataFrame, bucket: str = "minute") -> DataFrame:
    """Record counts per time bucket and event (the report's timeline)."""
    return (
        df.groupBy(F.date_trunc(bucket, "ts").alias("t"), "event").count().orderBy("t", "event")
    )


def limits_exceeded(df: DataFrame) -> DataFrame:
    """The migration report from the audit log (PF4): per vhost, CMQ rule, object and user,
    how often the compatible profile let a breach of a CMQ limit through, the worst value
    and CMQ's limit, first and last seen. Empty under the cmq profile, which refuses them."""
    return (
        df.where(F.col("event") == "limit_exceeded")
        .groupBy("vhost", "rule", "object", "user")
        .agg(F.count("*").alias("breaches"), F.max("value").alias("worst_value"), F.max("limit").alias("limit"),
             F.min("ts").alias("first"), F.max("ts").alias("last"))
        .orderBy("rule", "vhost", "object", "user")
    )
