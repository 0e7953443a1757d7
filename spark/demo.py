"""A plausible audit log written with the real ``AuditLog``, for the report demo and the
benchmarks (``scripts/bench_spark.py``).  Each message walks the funnel the broker emits:
publish → route → enqueue → deliver → ack | nack → requeue → deliver … | retry | discard;
the records carry the fields the gateway's own carry (a publish its connection's peer; a
delivery or ack only its queue, as the broker writes them).  A few jobs go through the default
exchange straight to a queue; the failed logins are a password-guessing burst from one host
and a few strays.
"""

from __future__ import annotations

import random

from gateway.audit import AuditLog

__all__ = ["write_demo_log"]

_TOPICS = {"orders": ["billing", "shipping", "audit"], "clicks": ["analytics"], "alerts": ["pager", "mail"]}
_USERS = ["svc-orders", "svc-web", "svc-monitor", "batch"]
_JOBS = "jobs"  # the queue "batch" sends to through the default exchange
_GUESSER = "198.51.100.23"


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
        peers = {user: f"10.0.0.{i + 2}:5{rnd.randint(1000, 9999)}" for i, user in enumerate(_USERS)}
        for user, peer in peers.items():
            emit("connection_open", user=user, peer=peer)
        # One host tries passwords for "admin" about once a second (every 50th message at the
        # default rate), from a third of the way in.
        guesses = range(messages // 3, messages, 50)[: max(3, messages // 800)]
        for i in range(messages):
            now[0] += rnd.expovariate(rate)
            t0 = now[0]
            if i in guesses:
                emit("auth_failure", user="admin", peer=f"{_GUESSER}:{rnd.randint(30000, 60000)}",
                     reason="bad password")
            msg = f"msg-{i:012x}"
            size = int(rnd.lognormvariate(6, 1))
            if rnd.random() < 0.05:  # a job straight to its queue: no topic, no route record
                emit("publish", queue=_JOBS, msg_id=msg, user="batch", peer=peers["batch"], size=size,
                     routing_key=_JOBS)
                emit("enqueue", queue=_JOBS, msg_id=msg, size=size)
                emit("deliver", queue=_JOBS, msg_id=msg, attempt=1, size=size)
                emit("ack", queue=_JOBS, msg_id=msg, latency_ms=rnd.lognormvariate(2, 0.5))
                continue
            topic = rnd.choice(list(_TOPICS))
            user = _USERS[list(_TOPICS).index(topic)] if rnd.random() < 0.9 else "batch"
            key = f"{topic}.eu"
            if topic == "clicks" and rnd.random() < 0.02:
                # A page path in the key: fine on RabbitMQ, past CMQ's 64 bytes (L4). The
                # compatible profile lets it through and reports it (PF4).
                key = "clicks.eu." + "/".join(rnd.choice(["shop", "cart", "item", "search"]) for _ in range(14))
                emit("limit_exceeded", topic=topic, user=user, peer=peers[user], rule="L4", value=len(key),
                     limit=64, object=f"exchange:{topic}",
                     reason=f"PRECONDITION_FAILED - routing key is {len(key)} bytes, more than 64 (CMQ limit L4)")
            emit("publish", topic=topic, msg_id=msg, user=user, peer=peers[user], size=size, routing_key=key)
            if size > 20000:
                emit("discard", topic=topic, msg_id=msg, reason="too_large", size=size)
                continue
            subs = [s for s in _TOPICS[topic] if rnd.random() < 0.9]
            if not subs:
                emit("discard", topic=topic, msg_id=msg, reason="no_match")
                continue
            for sub in subs:  # route: one record per subscription that took the message
                emit("route", topic=topic, subscription=sub, queue=f"{topic}-{sub}", msg_id=msg)
            for sub in subs:
                queue = f"{topic}-{sub}"
                emit("enqueue", topic=topic, subscription=sub, queue=queue, msg_id=msg, size=size)
                attempt = 0
                while True:
                    attempt += 1
                    emit("deliver", queue=queue, msg_id=msg, attempt=attempt, size=size)
                    r = rnd.random()
                    if r < 0.85:
                        lat = rnd.lognormvariate(3, 0.8) * attempt
                        emit("ack", queue=queue, msg_id=msg, latency_ms=lat + (now[0] - t0) * 1000)
                        if rnd.random() < 0.01:
                            emit("stale_ack", queue=queue, msg_id=msg)
                        break
                    if r < 0.93 and attempt < 4:
                        emit("requeue", queue=queue, msg_id=msg)  # a nack with requeue, as the broker writes it
                        continue
                    if attempt < 4:
                        policy = "BACKOFF_RETRY" if sub in ("pager", "analytics") else "EXPONENTIAL_DECAY_RETRY"
                        emit("retry", topic=topic, subscription=sub, msg_id=msg, attempt=attempt,
                             policy=policy, next_at=now[0] + 2**attempt)
                        continue
                    emit("discard", topic=topic, subscription=sub, queue=queue, msg_id=msg,
                         reason="retries_exhausted")
                    break
            if rnd.random() < 0.0005:  # now and then a mistyped password from somewhere
                emit("auth_failure", user=rnd.choice(["root", "guest", "svc-web"]),
                     peer=f"203.0.113.{rnd.randint(1, 254)}:4{rnd.randint(1000, 9999)}", reason="bad password")
    finally:
        audit.close()
    return emitted
