"""Counters and the Prometheus endpoint (SPEC D9, W5; the operator's window).

Theory of operation
-------------------
Every state change the broker makes is already emitted through ``audit.emit(event, vhost,
**fields)`` (A1), so the counters are counts of those records by event, vhost, queue, topic,
reason, policy and attempt (:class:`Counters`): the broker carries no metrics code. The audit
log counts what it writes, in its writer process, off the event loop; for a sink that does not
count (audit off), a counting tee is placed in front of it instead.
Gauges (ready/unacked per queue, retained per topic, waiting per subscription, connections,
channels) are read from the broker's state when ``/metrics`` is scraped, never cached.

The store's commit latency is measured by timing ``store.sync`` (the group-commit call the
broker's flusher makes on its worker thread). Bytes in and out are the transport's counters
(``bytes_in``/``bytes_out`` on the server).

``attach(gateway_or_broker)`` installs both, idempotently, and returns the :class:`Counters`;
``start_metrics(target, host, port)`` serves ``/metrics`` in Prometheus text format 0.0.4.
"""

from __future__ import annotations

import asyncio
import socket
import ssl
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterable
from typing import Any

from aiohttp import web

from gateway.audit.counting import count_key
from gateway.audit.rows import Row, fields_emitter, row_emitter

__all__ = [
    "COMMIT_BUCKETS",
    "Counters",
    "RateTracker",
    "Target",
    "attach",
    "render",
    "serve_app",
    "start_metrics",
]

# Store commit latency buckets, seconds (fsync on SSDs is ~0.1-10 ms, on HDDs tens of ms).
COMMIT_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


class Counters:
    """What the Prometheus families and the management API's message_stats are read from:
    counts of audit records by ``gateway.audit.counting.count_key``, aggregated into the
    families (``events``, ``queue``, ``exchange``, ``routed``, ``redelivered``, ``discarded``,
    ``retries``) when they are read.

    Two ways to get the counts (``attach`` picks):
    - *fed*: the audit log counts what it writes (``AuditLog.counts``, in its writer process),
      and nothing stands in front of the sink, so the event loop does no metrics work per
      record. ``await sync()`` before a read makes the counts exact up to that moment.
    - *tee*: for a sink that does not count (audit off, a test's sink), this object is placed
      in front of it and counts each record on the way through.
    Only the commit histogram is written from the store's worker thread (under a lock)."""

    def __init__(self, inner: Any, *, fed: bool = False) -> None:
        self.inner = inner
        self.fed = fed
        self.raw: dict[tuple[Any, ...], int] = inner.counts if fed else {}
        self.commit_buckets = [0] * (len(COMMIT_BUCKETS) + 1)
        self.commit_count = 0
        self.commit_sum = 0.0
        self._lock = threading.Lock()
        # (vhost, queue) -> the Prometheus label text of the queue's gauges (render).
        self.label_text: dict[tuple[str, str], str] = {}
        if not fed:
            self.emit = self._fast_emit()  # type: ignore[method-assign]

    async def sync(self) -> None:
        """Fed counters: wait, off the event loop, until every record emitted before this call
        is counted (a few ms: the audit writer's next cycle). Tee counters are always exact."""
        if self.fed:
            await asyncio.get_running_loop().run_in_executor(None, self.inner.flush, 5.0)

    # -- the audit sink (tee mode) -----------------------------------------------------------

    def _fast_emit(self) -> Callable[..., None]:
        """``emit`` as a closure: one dict update per record."""
        raw = self.raw
        get = raw.get
        inner = self.inner
        forward = fields_emitter(inner)

        def emit_fields(event: str, vhost: str, fields: dict[str, Any]) -> None:
            k = count_key(event, vhost, fields)
            raw[k] = get(k, 0) + 1
            forward(event, vhost, fields)

        def emit(event: str, vhost: str, **fields: Any) -> None:
            emit_fields(event, vhost, fields)

        forward_row = row_emitter(inner)

        def emit_row(row: Row, vhost: str, values: tuple[Any, ...]) -> None:
            k = row.count_key(vhost, values)
            raw[k] = get(k, 0) + 1
            forward_row(row, vhost, values)

        def emit_values(row: Row, vhost: str, *values: Any) -> None:
            k = row.count_key(vhost, values)
            raw[k] = get(k, 0) + 1
            forward_row(row, vhost, values)

        self.emit_fields = emit_fields  # type: ignore[method-assign]
        self.emit_row = emit_row  # type: ignore[method-assign]
        # The broker's hot paths' (gateway.audit.rows.values_emitter): without it the tee's
        # records would take values_emitter's fallback, one Python frame more a record.
        self.emit_values = emit_values  # type: ignore[method-assign]
        return emit

    def emit(self, event: str, vhost: str, **fields: Any) -> None:
        """Count, then pass on (tee mode)."""
        self.emit_fields(event, vhost, fields)

    def emit_fields(self, event: str, vhost: str, fields: dict[str, Any]) -> None:
        """``emit`` for a caller that already holds the fields as a dict (passed on as is,
        the caller must not change it afterwards)."""
        self.emit(event, vhost, **fields)

    def emit_row(self, row: Row, vhost: str, values: tuple[Any, ...]) -> None:
        """A per-message record (gateway.audit.rows): counted, then passed on (tee mode)."""
        self.emit_fields(row.event, vhost, row.fields(values))

    def emit_values(self, row: Row, vhost: str, *values: Any) -> None:
        """``emit_row(row, vhost, values)`` with the values as arguments (tee mode)."""
        self.emit_row(row, vhost, values)

    def close(self) -> None:
        close = getattr(self.inner, "close", None)
        if close is not None:
            close()

    def __getattr__(self, name: str) -> Any:  # anything else the writer offers (flush, dropped...)
        if name in ("inner", "raw", "label_text"):
            raise AttributeError(name)
        return getattr(self.inner, name)

    # -- reads: the families, aggregated from the raw counts ---------------------------------

    def _items(self) -> list[tuple[tuple[Any, ...], int]]:
        return list(self.raw.items())

    @property
    def events(self) -> dict[tuple[str, str], int]:
        """(event, vhost) -> records."""
        out: dict[tuple[str, str], int] = defaultdict(int)
        for k, n in self._items():
            out[k[0], k[1]] += n
        return out

    @property
    def queue(self) -> dict[tuple[str, str, str], int]:
        """(vhost, queue, stat) -> count; stat in publish, deliver, redeliver, ack."""
        out: dict[tuple[str, str, str], int] = defaultdict(int)
        for k, n in self._items():
            e = k[0]
            if e == "deliver":
                if k[2] is not None:
                    out[k[1], k[2], "deliver"] += n
                    if k[3]:
                        out[k[1], k[2], "redeliver"] += n
            elif e == "enqueue":
                out[k[1], k[2], "publish"] += n
            elif e == "ack":
                out[k[1], k[2], "ack"] += n
        return out

    @property
    def exchange(self) -> dict[tuple[str, str, str], int]:
        """(vhost, exchange, stat) -> count; stat in publish_in, publish_out."""
        out: dict[tuple[str, str, str], int] = defaultdict(int)
        for k, n in self._items():
            if k[0] == "publish":
                out[k[1], k[2], "publish_in"] += n
            elif k[0] == "route":
                out[k[1], k[2], "publish_out"] += n
        return out

    @property
    def redelivered(self) -> dict[str, int]:
        out: dict[str, int] = defaultdict(int)
        for k, n in self._items():
            if k[0] == "deliver" and k[3]:
                out[k[1]] += n
        return out

    @property
    def routed(self) -> dict[str, int]:
        """Routes plus direct sends (an enqueue without a topic, M10)."""
        out: dict[str, int] = defaultdict(int)
        for k, n in self._items():
            if k[0] == "route" or (k[0] == "enqueue" and k[3]):
                out[k[1]] += n
        return out

    def _by_vhost_and(self, event: str) -> dict[tuple[str, str], int]:
        """(vhost, the one field the count key holds) -> records of ``event``."""
        out: dict[tuple[str, str], int] = defaultdict(int)
        for k, n in self._items():
            if k[0] == event:
                out[k[1], k[2]] += n
        return out

    @property
    def discarded(self) -> dict[tuple[str, str], int]:
        """(vhost, reason) -> discard records."""
        return self._by_vhost_and("discard")

    @property
    def retries(self) -> dict[tuple[str, str, int], int]:
        out: dict[tuple[str, str, int], int] = defaultdict(int)
        for k, n in self._items():
            if k[0] == "retry":
                out[k[1], k[2], k[3]] += n
        return out

    @property
    def limits_exceeded(self) -> dict[tuple[str, str], int]:
        """(vhost, rule) -> breaches of CMQ limits reported in the compatible profile (PF4)."""
        return self._by_vhost_and("limit_exceeded")

    def count(self, event: str, vhost: str | None = None) -> int:
        return sum(n for k, n in self._items() if k[0] == event and (vhost is None or k[1] == vhost))

    def queue_stat(self, vhost: str, queue: str, stat: str) -> int:
        get = self.raw.get
        if stat == "publish":
            return get(("enqueue", vhost, queue, True), 0) + get(("enqueue", vhost, queue, False), 0)
        if stat == "deliver":
            return get(("deliver", vhost, queue, True), 0) + get(("deliver", vhost, queue, False), 0)
        if stat == "redeliver":
            return get(("deliver", vhost, queue, True), 0)
        if stat == "ack":
            return get(("ack", vhost, queue), 0)
        return 0

    def exchange_stat(self, vhost: str, exchange: str, stat: str) -> int:
        if stat == "publish_in":
            return self.raw.get(("publish", vhost, exchange), 0)
        if stat == "publish_out":
            return self.raw.get(("route", vhost, exchange), 0)
        return 0

    # -- store commit latency ----------------------------------------------------------------

    def observe_commit(self, seconds: float) -> None:
        i = 0
        while i < len(COMMIT_BUCKETS) and seconds > COMMIT_BUCKETS[i]:
            i += 1
        with self._lock:
            self.commit_buckets[i] += 1
            self.commit_count += 1
            self.commit_sum += seconds


class RateTracker:
    """Rates as RabbitMQ's management API shows them (``*_details.rate``, per second).

    ``sample(now)`` records every counter's value (the management app samples every 5 s); a
    rate is the change between the oldest kept sample (one at or before the window's start)
    and the newest, divided by the time between them.
    ``now`` is injected (monotonic seconds) so rates are exact in tests."""

    def __init__(self, read: Callable[[], dict[Any, int]], window: float = 5.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._read = read
        self._window = window
        self._clock = clock
        self._samples: list[tuple[float, dict[Any, int]]] = []

    def sample(self, now: float | None = None) -> None:
        now = self._clock() if now is None else now
        self._samples.append((now, dict(self._read())))
        # Keep one sample older than the window as the base of the rate.
        while len(self._samples) > 2 and self._samples[1][0] <= now - self._window:
            self._samples.pop(0)

    def rate(self, key: Any) -> float:
        """Per second between the oldest kept sample and the newest; 0.0 until two exist."""
        if len(self._samples) < 2:
            return 0.0
        (t0, base), (t1, last) = self._samples[0], self._samples[-1]
        if t1 <= t0:
            return 0.0
        return round((last.get(key, 0) - base.get(key, 0)) / (t1 - t0), 1)


class Target:
    """What the management API and the metrics read: a Gateway (connections, users, alarms)
    or a bare Broker. Everything is read from the live objects at request time."""

    def __init__(self, obj: Any) -> None:
        self.gateway = obj if hasattr(obj, "broker") else None
        self.broker = obj.broker if self.gateway is not None else obj

    @property
    def users(self) -> Any:
        config = getattr(self.gateway, "config", None) or getattr(self.broker, "config", None)
        return getattr(config, "users", None)

    @property
    def connections(self) -> list[Any]:
        """AMQP and MQTT connections: the transport's when there is a gateway, else the sessions."""
        if self.gateway is not None:
            return [c for c in list(self.gateway.connections) if getattr(c, "user", None) is not None]
        return list(self.broker.sessions)

    @property
    def sessions(self) -> list[Any]:
        return [s for s in list(self.broker.sessions) if not getattr(s, "closed", False)]

    @property
    def alarm(self) -> str | None:
        """W5: the resource alarm publishers are blocked for, if any."""
        if self.gateway is not None and getattr(self.gateway, "blocked", False):
            return str(getattr(self.gateway, "block_reason", "") or "resource alarm")
        return None

    @property
    def alarm_resources(self) -> list[str]:
        """W5: RabbitMQ's names ("memory", "disk") of the alarms in effect."""
        alarms = getattr(self.gateway, "alarms", None)
        return list(alarms.resources) if alarms is not None else []

    def resources(self) -> dict[str, Any]:
        """W5: what the alarms are decided on, under RabbitMQ's node field names (mem_used is
        the memory the broker holds, gateway/memory.py; mem_rss the process's resident set)."""
        from gateway.alarms import rss_bytes
        gw = self.gateway
        alarms = getattr(gw, "alarms", None)
        limits = getattr(getattr(gw, "config", None), "limits", None)
        if alarms is None or limits is None:
            return {}
        held = alarms.held_bytes(self.broker)
        return {"mem_used": held, "mem_rss": rss_bytes(), "mem_limit": limits.memory_high_watermark,
                "mem_alarm": alarms.memory, "disk_free": alarms.disk_free,
                "disk_free_limit": limits.disk_free_limit, "disk_free_alarm": alarms.disk,
                "store_failed": bool(getattr(self.broker, "read_only", False))}


def attach(obj: Any) -> Counters:
    """The broker's Counters (made once; calling again returns the same one), and the store's
    commits timed. An audit log that counts what it writes feeds them; any other sink gets the
    counting tee installed in front of it."""
    target = Target(obj)
    broker = target.broker
    audit = broker.audit
    if isinstance(audit, Counters):
        return audit
    counters: Counters | None = getattr(broker, "metrics_counters", None)
    if counters is not None:
        return counters
    if isinstance(getattr(audit, "counts", None), dict):
        counters = Counters(audit, fed=True)
    else:
        counters = Counters(audit)
        broker.audit = counters
        if target.gateway is not None and getattr(target.gateway, "audit", None) is audit:
            target.gateway.audit = counters  # the transport emits connection events through it
    broker.metrics_counters = counters
    store = getattr(broker, "store", None)
    sync = getattr(store, "sync", None)
    if sync is not None and not getattr(sync, "_cmq_timed", False):
        def timed_sync() -> int:
            start = time.perf_counter()
            try:
                return int(sync())
            finally:
                counters.observe_commit(time.perf_counter() - start)
        timed_sync._cmq_timed = True  # type: ignore[attr-defined]
        store.sync = timed_sync  # type: ignore[union-attr]
    return counters


# -- Prometheus text format ------------------------------------------------------------------


def _esc(value: object) -> str:
    text = str(value)
    if "\\" in text or "\n" in text or '"' in text:
        return text.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')
    return text


def _labels(labels: dict[str, object]) -> str:
    if not labels:
        return ""
    return "{" + ",".join(f'{k}="{_esc(v)}"' for k, v in labels.items()) + "}"


class _Writer:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def family(self, name: str, kind: str, help_text: str,
               samples: Iterable[tuple[dict[str, object], float]]) -> None:
        head = name + ("_total" if kind == "counter" else "")
        self.block(name, kind, help_text, [f"{head}{_labels(labels)} {_num(value)}" for labels, value in samples])

    def block(self, name: str, kind: str, help_text: str, lines: list[str]) -> None:
        """A family whose sample lines the caller formatted."""
        self.lines.append(f"# HELP {name} {help_text}")
        self.lines.append(f"# TYPE {name} {kind}")
        self.lines.extend(lines)

    def text(self) -> str:
        return "\n".join(self.lines) + "\n"


def _num(value: float) -> str:
    if type(value) is int:
        return str(value)
    if float(value).is_integer():
        return str(int(value))
    return repr(float(value))


def render(obj: Any, counters: Counters) -> str:
    """The whole exposition, read now."""
    target = Target(obj)
    broker = target.broker
    vhosts = sorted(broker.vhosts)
    w = _Writer()
    c = counters
    events, routed, redelivered = c.events, c.routed, c.redelivered  # aggregated once per scrape

    def per_vhost(event: str) -> list[tuple[dict[str, object], float]]:
        return [({"vhost": v}, events.get((event, v), 0)) for v in vhosts]

    w.family("cmq_gateway_published", "counter", "Messages published (basic.publish accepted for routing).",
             per_vhost("publish"))
    w.family("cmq_gateway_routed", "counter", "Messages routed to at least one subscription or queue.",
             [({"vhost": v}, routed.get(v, 0)) for v in vhosts])
    w.family("cmq_gateway_discarded", "counter", "Messages discarded, by reason (no_match, "
             "retries_exhausted, expired, rejected, too_large, max_length).",
             [({"vhost": v, "reason": r}, n) for (v, r), n in sorted(c.discarded.items())])
    w.family("cmq_gateway_delivered", "counter", "Deliveries to consumers and basic.get.", per_vhost("deliver"))
    w.family("cmq_gateway_acked", "counter", "Messages acknowledged (CMQ DeleteMessage).", per_vhost("ack"))
    w.family("cmq_gateway_stale_acks", "counter", "Acks with an outdated receipt handle (Q3).",
             per_vhost("stale_ack"))
    w.family("cmq_gateway_redelivered", "counter", "Deliveries with a receive count above 1.",
             [({"vhost": v}, redelivered.get(v, 0)) for v in vhosts])
    w.family("cmq_gateway_retries", "counter", "Topic delivery retries scheduled, by notify strategy "
             "and attempt number (D5, D6).",
             [({"vhost": v, "policy": p, "attempt": a}, n) for (v, p, a), n in sorted(c.retries.items())])

    w.family("cmq_gateway_limit_exceeded", "counter", "Breaches of a CMQ limit let through and reported "
             "in the compatible profile, by rule (PF4; the cmq profile refuses them).",
             [({"vhost": v, "rule": r}, n) for (v, r), n in sorted(c.limits_exceeded.items())])

    retained: list[tuple[dict[str, object], float]] = []
    waiting: list[tuple[dict[str, object], float]] = []
    # The per-queue gauges are formatted here, from each queue's label text made once (kept
    # from scrape to scrape): with 1,000 queues, formatting labels was most of a scrape.
    label_text = c.label_text
    ready: list[str] = []
    unacked: list[str] = []
    delayed: list[str] = []
    rewindable: list[str] = []
    consumers: list[str] = []
    for v in vhosts:
        vh = broker.vhosts[v]
        for name, ex in sorted(vh.exchanges.items()):
            topic = ex.topic
            if topic is None:
                continue
            retained.append(({"vhost": v, "topic": name}, topic.retained_count))
            for sub in topic.subscriptions:
                waiting.append(({"vhost": v, "topic": name, "subscription": sub.name},
                                topic.waiting(sub.name)))
        for name, q in sorted(vh.queues.items()):
            labels = label_text.get((v, name))
            if labels is None:
                labels = label_text[v, name] = _labels({"vhost": v, "queue": name})
            cmq = q.cmq  # its counts are ints
            ready.append(f"cmq_gateway_queue_messages_ready{labels} {cmq.active}")
            unacked.append(f"cmq_gateway_queue_messages_unacked{labels} {cmq.inactive}")
            delayed.append(f"cmq_gateway_queue_messages_delayed{labels} {cmq.delayed}")
            rewindable.append(f"cmq_gateway_queue_messages_rewindable{labels} {cmq.rewindable}")
            consumers.append(f"cmq_gateway_queue_consumers{labels} {len(q.consumers)}")
    if len(label_text) > 2 * len(ready) + 1024:  # deleted queues' texts, now and then
        label_text.clear()
    w.family("cmq_gateway_topic_retained_messages", "gauge",
             "Messages retained in a topic, waiting for or in retry for some subscription (D9).", retained)
    w.family("cmq_gateway_subscription_waiting_messages", "gauge",
             "Messages waiting for or in retry of delivery to one subscription (D9).", waiting)
    w.block("cmq_gateway_queue_messages_ready", "gauge", "Active messages per queue (Q1).", ready)
    w.block("cmq_gateway_queue_messages_unacked", "gauge", "Inactive (received, not deleted) messages "
            "per queue (Q1).", unacked)
    w.block("cmq_gateway_queue_messages_delayed", "gauge", "Delayed messages per queue (Q4).", delayed)
    w.block("cmq_gateway_queue_messages_rewindable", "gauge", "Rewindable messages per queue (Q6).",
            rewindable)
    w.block("cmq_gateway_queue_consumers", "gauge", "Consumers per queue.", consumers)

    sessions = target.sessions
    w.family("cmq_gateway_connections", "gauge", "Open AMQP and MQTT connections.", [({}, len(target.connections))])
    w.family("cmq_gateway_channels", "gauge", "Open AMQP channels.",
             [({}, sum(len(s.channels) for s in sessions))])
    w.family("cmq_gateway_resource_alarm", "gauge", "1 while publishers are blocked by a memory or "
             "disk alarm (W5).", [({}, 1 if target.alarm else 0)])
    res = target.resources()
    if res:
        for key, metric, text in (
                ("mem_used", "cmq_gateway_memory_held_bytes", "Bytes the broker holds: messages, partial "
                 "bodies and bytes received before login, retained MQTT messages, unsent output, the "
                 "store's map (W5, SE6: compared with memory_high_watermark)."),
                ("mem_rss", "cmq_gateway_memory_rss_bytes", "Resident memory of the process."),
                ("mem_limit", "cmq_gateway_memory_high_watermark_bytes", "The memory alarm's mark (W5)."),
                ("disk_free", "cmq_gateway_disk_free_bytes", "Free bytes of the data directory's file system."),
                ("disk_free_limit", "cmq_gateway_disk_free_limit_bytes", "The disk alarm's limit (W5)."),
                ("store_failed", "cmq_gateway_store_failed", "1 while the store cannot write (it retries).")):
            if res[key] is not None:
                w.family(metric, "gauge", text, [({}, int(res[key]))])
        w.family("cmq_gateway_alarm", "gauge", "1 while the resource's alarm is in effect (W5).",
                 [({"resource": r}, int(res[k])) for r, k in (("memory", "mem_alarm"), ("disk", "disk_free_alarm"))])

    name = "cmq_gateway_store_commit_seconds"
    w.lines.append(f"# HELP {name} Time of one group commit (write + fsync) of the store (M14).")
    w.lines.append(f"# TYPE {name} histogram")
    cumulative = 0
    for bound, n in zip((*COMMIT_BUCKETS, float("inf")), c.commit_buckets, strict=True):
        cumulative += n
        le = "+Inf" if bound == float("inf") else repr(bound)
        w.lines.append(f'{name}_bucket{{le="{le}"}} {cumulative}')
    w.lines.append(f"{name}_sum {_num(c.commit_sum)}")
    w.lines.append(f"{name}_count {c.commit_count}")

    gw = target.gateway
    admission = getattr(gw, "admission", None) if gw is not None else None
    if admission is not None:  # SE5: every listener's gate (gateway/admission.py)
        gates = sorted((n.lower().replace(" ", "_"), g) for n, g in admission.gates.items())  # cmq_api
        w.family("cmq_gateway_listener_connections", "gauge", "Sockets each listener holds (AMQP, AMQPS, "
                 "MQTT, MQTTS, management API, metrics, CMQ API), against limits.max_connections (SE5).",
                 [({"listener": n}, g.count) for n, g in gates])
        w.family("cmq_gateway_listener_refused", "counter", "Sockets closed at accept: the listener's "
                 "max_connections reached, or too few descriptors left (limits.fd_reserve, SE5).",
                 [({"listener": n}, g.refused) for n, g in gates])
    for attr, metric, text in (("bytes_in", "cmq_gateway_received_bytes", "Bytes read from AMQP clients."),
                               ("bytes_out", "cmq_gateway_sent_bytes", "Bytes written to AMQP clients.")):
        value = getattr(gw, attr, None) if gw is not None else None
        if isinstance(value, int):  # needs the server's byte counters (see the module doc)
            w.family(metric, "counter", text, [({}, value)])
    return w.text()


CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def metrics_app(obj: Any) -> web.Application:
    counters = attach(obj)

    async def handle(request: web.Request) -> web.Response:
        await counters.sync()
        return web.Response(body=render(obj, counters).encode(), headers={"Content-Type": CONTENT_TYPE})

    app = web.Application()
    app.router.add_get("/metrics", handle)
    return app


async def start_metrics(obj: Any, host: str = "127.0.0.1", port: int = 15692, *,
                        ssl_context: ssl.SSLContext | None = None,
                        sockets: list[socket.socket] | None = None) -> web.AppRunner:
    """Serve ``/metrics`` for a Gateway or Broker on (host, port), over HTTPS with an
    ``ssl_context`` (SE2); port 0 picks a free one (``runner.addresses[0][1]``). ``sockets``
    (bound and listening) are served instead of (host, port). Stop with
    ``await runner.cleanup()``."""
    return await serve_app(metrics_app(obj), host, port, ssl_context, sockets, obj=obj, name="metrics")


async def serve_app(app: web.Application, host: str, port: int, ssl_context: ssl.SSLContext | None,
                    sockets: list[socket.socket] | None, *, obj: Any = None, name: str = "metrics") -> web.AppRunner:
    """An operator HTTP application served on ``sockets``, or else on (host, port), under the
    admission policy (SE5, gateway/admission.py) of ``obj``'s gateway: its listener ``name``
    counted and limited, silent and trickling sockets closed."""
    from gateway import admission

    gates, policy, handshake_timeout = admission.of(obj)
    own = sockets is None
    socks = admission.bind_http(host, port) if sockets is None else sockets
    try:
        return await admission.serve_http(app, gate=gates.gate(name), policy=policy, sockets=socks,
                                          ssl_context=ssl_context, handshake_timeout=handshake_timeout)
    except BaseException:
        if own:
            for sock in socks:
                sock.close()
        raise
