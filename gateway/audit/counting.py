"""The count key of one audit record: what the /metrics families and the management API's
message_stats are aggregated from (gateway.metrics.Counters).

The key holds the event, the vhost and only the one or two fields the families need, so the
counts stay a small dict however many records pass: ``("deliver", vhost, queue, redelivered)``,
``("enqueue", vhost, queue, direct)``, ``("ack"|"publish"|"route", vhost, queue|topic)``,
``("discard", vhost, reason)``, ``("retry", vhost, policy, attempt)``, ``("limit_exceeded",
vhost, rule)``, else ``(event, vhost)``; a record a start restored (``origin: "recovery"``, A6)
``("recovery", vhost, event)``, which no family reads.

It lives with the audit log because the audit writer counts the records it writes, off the
event loop (in its process): counting on the loop cost 4 us a message (bench_pipeline).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["FIELDS_READ", "count_key"]

# The fields count_key reads, per event (every other event: none).
FIELDS_READ: dict[str, tuple[str, ...]] = {
    "deliver": ("queue", "attempt"), "enqueue": ("queue", "topic"), "ack": ("queue",),
    "publish": ("topic",), "route": ("topic",), "discard": ("reason",), "retry": ("policy", "attempt"),
    "limit_exceeded": ("rule",),
}


def count_key(event: str, vhost: str, fields: Mapping[str, Any]) -> tuple[Any, ...]:
    if fields.get("origin") == "recovery":
        # A6: what a start restored is no client action: no /metrics family counts it.
        return ("recovery", vhost, event)
    if event == "deliver":
        attempt = fields.get("attempt")
        return (event, vhost, fields.get("queue"), isinstance(attempt, int) and attempt > 1)
    if event == "enqueue":
        return (event, vhost, fields.get("queue") or "", fields.get("topic") is None)
    if event == "ack":
        return (event, vhost, fields.get("queue") or "")
    if event == "publish":
        ex = fields.get("topic")
        return (event, vhost, "" if ex is None else ex)
    if event == "route":
        return (event, vhost, fields.get("topic") or "")
    if event == "discard":
        return (event, vhost, str(fields.get("reason")))
    if event == "limit_exceeded":
        return (event, vhost, str(fields.get("rule")))
    if event == "retry":
        attempt = fields.get("attempt")
        # Never raises: a record the writer cannot count must still be written.
        return (event, vhost, str(fields.get("policy")), int(attempt) if isinstance(attempt, int) else 0)
    return (event, vhost)
