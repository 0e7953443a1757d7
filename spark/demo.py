"""A plausible audit log written with the real ``AuditLog``, for the report demo and the
benchmarks (``scripts/bench_spark.py``).  Each message walks the funnel the broker emits:
publish → route → enqueue → deliver → ack | nack → requeue → deliver … | retry | discard.
"""

from __future__ import annotations

import random

from gateway.audit import AuditLog

__all__ = ["write_demo_log"]

_TOPICS = {"orders": ["billing", "shipping", "audit"], "clicks": ["analytics"], "alerts": ["pager", "mail"]}
_USERS = ["svc-orders", "svc-web", "svc-monitor", "batch"]


def write_demo_log(directory: str, messages: int, *, start: float = 1_714_550_400.0,
                   rate: float = 50.0, seed: int = 7, rotate_bytes: int = 64 * 1024 * 1024) -> int:
    """Write about ``messages`` message lifecycles starting at ``start`` (Unix s), ``rate``
    publishes per second; returns the number of records emitted."""
    rnd = random.Random(seed)
    now = [start]
    emitted = 0
    audit = AuditLog(directory, rotate_bytes=rotate_bytes, clock=lambda: now[0],
                     max_pending=1 << 30, retention_hours=1e9)

    def emit(event: str, **fields: object) -> None:
        nonlocal emitted
        audit.emit(event, "/", **fields)
        emitted += 1

    try:
        for user in _USERS:
            emit("connection_open", user=user, peer=f"10.0.0.{_USERS.index(user) + 2}:5{rnd.randint(1000, 9999)}")
        for i in range(messages):
            now[0] += rnd.expovariate(rate)
            t0 = now[0]
            topic = rnd.choice(list(_TOPICS))
            user = _USERS[list(_TOPICS).index(topic)] if rnd.random() < 0.9 else "batch"
            msg = f"msg-{i:012x}"
            size = int(rnd.lognormvariate(6, 1))
            emit("publish", topic=topic, msg_id=msg, user=user, size=size, routing_key=f"{topic}.eu")
            if size > 20000:
                emit("discard", topic=topic, msg_id=msg, reason="too_large", size=size)
                continue
            subs = [s for s in _TOPICS[topic] if rnd.random() < 0.9]
            if not subs:
                emit("discard", topic=topic, msg_id=msg, reason="no_match")
                continue
            for sub in subs:  # route: one record per subscription that took the message
                emit("route", topic=topic, subscription=sub, msg_id=msg)
            for sub in subs:
                queue = f"{topic}-{sub}"
                emit("enqueue", topic=topic, subscription=sub, queue=queue, msg_id=msg)
                attempt = 0
                while True:
                    attempt += 1
                    emit("deliver", topic=topic, subscription=sub, queue=queue, msg_id=msg, attempt=attempt)
                    r = rnd.random()
                    if r < 0.85:
                        lat = rnd.lognormvariate(3, 0.8) * attempt
                        emit("ack", topic=topic, subscription=sub, queue=queue, msg_id=msg,
                             latency_ms=lat + (now[0] - t0) * 1000)
                        if rnd.random() < 0.01:
                            emit("stale_ack", queue=queue, msg_id=msg)
                        break
                    if r < 0.93 and attempt < 4:
                        emit("nack", queue=queue, msg_id=msg)
                        emit("requeue", queue=queue, msg_id=msg)
                        continue
                    if attempt < 4:
                        policy = "BACKOFF_RETRY" if sub in ("pager", "analytics") else "EXPONENTIAL_DECAY_RETRY"
                        emit("retry", topic=topic, subscription=sub, msg_id=msg, attempt=attempt,
                             policy=policy, next_at=now[0] + 2**attempt)
                        continue
                    emit("discard", topic=topic, subscription=sub, queue=queue, msg_id=msg,
                         reason="retries_exhausted")
                    break
            if rnd.random() < 0.002:
                emit("auth_failure", user=rnd.choice(["admin", "root", "guest"]),
                     peer=f"203.0.113.{rnd.randint(1, 254)}:4{rnd.randint(1000, 9999)}", reason="bad password")
    finally:
        audit.close()
    return emitted
