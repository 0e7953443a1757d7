"""Runs one load test: declares the topology, starts the worker processes, prints a progress
line each second, drains, cleans up and returns the result as a dict (the `--json` shape).

Saturation check: each worker is one single-threaded process, so a worker whose CPU time is
near its wall time (>= 90 %) cannot go faster and the generator, not the broker, is the limit.
The host's busy share (from /proc/stat) is reported too: on a machine where the broker and the
generator share few cores, a host near 100 % means the numbers measure the machine.
"""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import os
import secrets
import sys
import time
from multiprocessing.connection import Connection, wait
from typing import Any, TextIO

from pamqp import commands

from gateway.perf.client import AmqpClient, parse_uri
from gateway.perf.config import RunConfig
from gateway.perf.frames import encode_properties, publish_template
from gateway.perf.stats import LatencyHistogram
from gateway.perf.topology import Topology, build_topology, declare, delete
from gateway.perf.worker import Snapshot, WorkerSpec, worker_main

__all__ = ["SATURATION_PERCENT", "deal", "run", "run_async_topology", "uris"]

SATURATION_PERCENT = 90.0
_READY_TIMEOUT_S = 60.0


def _host_cpu() -> tuple[int, int] | None:
    """(busy, total) jiffies of the whole host, or None off Linux."""
    try:
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
    except OSError:
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    return sum(fields) - idle, sum(fields)


def uris(uri: str) -> list[str]:
    """The URIs of a (possibly comma-separated) ``--uri``: gateways of one cluster."""
    return [u.strip() for u in uri.split(",") if u.strip()]


def deal(n_uris: int, producers: int, consumers: int) -> tuple[list[int], list[int]]:
    """Which URI each producer and each consumer connection uses: one round-robin deal over
    all connections, producers first, so each role is spread over the gateways and, with one
    producer and one consumer on two gateways, every message crosses from one to the other."""
    return ([i % n_uris for i in range(producers)],
            [(producers + i) % n_uris for i in range(consumers)])


async def run_async_topology(uri: str, topo: Topology, create: bool) -> None:
    """Declare on every URI, so that each gateway knows the queues before its consumers ask
    (a cluster's metadata watch may lag the declare by a moment); delete on every URI too,
    where only the first must succeed: on a cluster the others may already have seen it go."""
    for k, one in enumerate(uris(uri)):
        try:
            client = await AmqpClient.connect(parse_uri(one))
            try:
                await client.open_channel(1)
                await (declare if create else delete)(client, topo)
            finally:
                await client.close()
        except Exception:
            if create or k == 0:
                raise


def _split(items: list[Any], parts: int) -> list[list[Any]]:
    return [items[i::parts] for i in range(parts) if items[i::parts]]


def _specs(cfg: RunConfig, topo: Topology) -> list[WorkerSpec]:
    cpus = os.cpu_count() or 1
    specs: list[WorkerSpec] = []
    # Each producer connection cycles through all routes, starting at a different one.
    routes = topo.routes
    producer_routes = [routes[i % len(routes) :] + routes[: i % len(routes)] for i in range(cfg.producers)]
    # Queues are dealt round-robin to consumer connections; with more consumers than queues,
    # several compete on one queue.
    n_cons = cfg.consumers
    consumer_queues = (
        [
            [q for j, q in enumerate(topo.queues) if j % n_cons == i] or [topo.queues[i % len(topo.queues)]]
            for i in range(n_cons)
        ]
        if n_cons
        else []
    )
    addresses = uris(cfg.uri)
    prod_at, cons_at = deal(len(addresses), cfg.producers, n_cons)
    common = dict(
        size=cfg.size,
        persistent=cfg.persistent,
        confirm=cfg.confirm,
        rate=cfg.rate,
        prefetch=cfg.prefetch,
        multi_ack=cfg.multi_ack,
        sndbuf=cfg.sndbuf,
    )
    pp = cfg.producer_processes or min(cfg.producers, cpus)
    producer_uris = [addresses[k] for k in prod_at]
    for chunk, at in zip(_split(producer_routes, pp), _split(producer_uris, pp), strict=True) if cfg.producers else []:
        specs.append(WorkerSpec(worker_id=len(specs), role="producer", uris=at, routes=chunk,
                                **common))  # type: ignore[arg-type]
    cp = cfg.consumer_processes or min(n_cons, cpus)
    consumer_uris = [addresses[k] for k in cons_at]
    for chunk, at in zip(_split(consumer_queues, cp), _split(consumer_uris, cp), strict=True) if n_cons else []:
        specs.append(WorkerSpec(worker_id=len(specs), role="consumer", uris=at, queues=chunk,
                                **common))  # type: ignore[arg-type]
    if cfg.slow_ack_ms:
        # Its queue and backlog are made through the first URI (_slow_queue_setup): it reads there.
        common.update(prefetch=1, multi_ack=1)
        specs.append(WorkerSpec(worker_id=len(specs), role="slow", uris=addresses[:1], queues=[[_slow_queue(topo)]],
                                ack_delay=cfg.slow_ack_ms / 1000, **common))  # type: ignore[arg-type]
    return specs


def _slow_queue(topo: Topology) -> str:
    return f"{topo.queues[0].rsplit('-', 1)[0]}-slow"


def _slow_backlog(cfg: RunConfig) -> int:
    """More than the slow consumer can take in the run, its start-up and the drain."""
    return int((cfg.duration + cfg.drain_timeout + _READY_TIMEOUT_S) * 1000 / cfg.slow_ack_ms) + 100


async def _slow_queue_setup(cfg: RunConfig, topo: Topology, create: bool) -> None:
    """Declare the slow consumer's queue with its backlog, or delete it."""
    client = await AmqpClient.connect(parse_uri(uris(cfg.uri)[0]))
    name = _slow_queue(topo)
    try:
        await client.open_channel(1)
        if not create:
            await client.rpc(1, commands.Queue.Delete(queue=name), commands.Queue.DeleteOk)
            return
        await client.rpc(1, commands.Queue.Declare(queue=name), commands.Queue.DeclareOk)
        t = publish_template(1, "", name, cfg.size, encode_properties(delivery_mode=1), client.frame_max)
        message = t.head + time.monotonic_ns().to_bytes(8, "big") + t.tail
        for _ in range(_slow_backlog(cfg) // 1000 + 1):
            await client.writable()
            client.write(message * 1000)
        # Replies come in order: once this one is back, every publish before it was handled.
        await client.rpc(1, commands.Queue.Declare(queue=name, passive=True), commands.Queue.DeclareOk)
    finally:
        await client.close()


class _Run:
    def __init__(self, cfg: RunConfig, specs: list[WorkerSpec], topo: Topology, out: TextIO | None) -> None:
        self.cfg = cfg
        self.specs = specs
        self.topo = topo
        self.out = out
        self.snaps: dict[int, Snapshot] = {s.worker_id: Snapshot() for s in specs}
        self.done: set[int] = set()
        self.errors: list[str] = []
        self.hist = LatencyHistogram()
        self.slow_hist = LatencyHistogram()  # the slow consumer's ack -> next delivery
        self.bases: dict[int, dict[int, int]] = {s.worker_id: {} for s in specs}
        self.per_second: list[dict[str, float]] = []
        self.roles = {s.worker_id: s.role for s in specs}
        # The lag of each second: the latencies of the deliveries that came in that second
        # (producer's stamp -> consumer's read), their median and their largest.
        self.second_counts = list(self.hist.counts)
        self.second_max_us = 0

    def total(self, attr: str, role: str | None = None) -> int:
        """Summed over the workers of ``role``; None: the producers and (fast) consumers."""
        return sum(
            getattr(self.snaps[s.worker_id], attr)
            for s in self.specs
            if s.role == role or (role is None and s.role != "slow")
        )

    def absorb(self, msg: tuple[Any, ...]) -> None:
        kind, wid = msg[0], msg[1]
        if kind == "error":
            self.errors.append(f"worker {wid}: {msg[2]}")
            self.done.add(wid)
            return
        if kind in ("tick", "done"):
            snap: Snapshot = msg[2]
            hist = self.slow_hist if self.roles[wid] == "slow" else self.hist
            hist.merge_cumulative(snap.latency, self.bases[wid])
            hist.max_us = max(hist.max_us, snap.latency_max_us)
            if hist is self.hist:
                self.second_max_us = max(self.second_max_us, snap.recent_max_us)
            self.snaps[wid] = snap
            if kind == "done":
                self.done.add(wid)
                if snap.error:
                    self.errors.append(f"worker {wid}: {snap.error}")

    def pump(self, pipes: dict[int, Connection], timeout: float) -> None:
        for conn in wait([p for w, p in pipes.items() if w not in self.done], timeout):
            assert isinstance(conn, Connection)
            try:
                while conn.poll():
                    self.absorb(conn.recv())
            except EOFError:
                wid = next(w for w, p in pipes.items() if p is conn)
                if wid not in self.done:
                    self.errors.append(f"worker {wid} exited without a result")
                    self.done.add(wid)

    def progress(self, t: float, prev: dict[str, int]) -> dict[str, int]:
        now = {a: self.total(a) for a in ("sent", "confirmed", "received")}
        row: dict[str, float] = {"t": round(t, 1), **{a: now[a] - prev.get(a, 0) for a in now}}
        lag_p50 = self.hist.percentile_since(self.second_counts, 50)
        if lag_p50 is not None:
            # A bucket's midpoint may pass the largest value in it.
            row["lag_p50_s"] = round(min(lag_p50, self.second_max_us) / 1e6, 6)
            row["lag_max_s"] = self.second_max_us / 1e6
        self.second_counts = list(self.hist.counts)
        self.second_max_us = 0
        self.per_second.append(row)
        if self.out is not None:
            p50 = self.hist.percentile(50)
            p99 = self.hist.percentile(99)
            lat = (
                f" p50 {p50 / 1000:.2f} ms p99 {p99 / 1000:.2f} ms"
                if p50 is not None and p99 is not None
                else ""
            )
            print(
                f"time {t:5.1f}s  sent {row['sent']:>8} msg/s  confirmed {row['confirmed']:>8} msg/s  "
                f"received {row['received']:>8} msg/s{lat}",
                file=self.out,
                flush=True,
            )
        return now


def run(cfg: RunConfig, progress_out: TextIO | None = sys.stderr) -> dict[str, Any]:
    """One run; returns the result dict. Never leaves its queues or exchange behind."""
    run_id = secrets.token_hex(4)
    topo = build_topology(cfg.pattern, run_id, cfg.queues, cfg.tag_fanout, cfg.durable_queues)
    specs = _specs(cfg, topo)
    asyncio.run(run_async_topology(cfg.uri, topo, create=True))
    if cfg.slow_ack_ms:
        asyncio.run(_slow_queue_setup(cfg, topo, create=True))
    ctx = mp.get_context("spawn")
    procs: list[Any] = []
    pipes: dict[int, Connection] = {}
    state = _Run(cfg, specs, topo, progress_out if cfg.progress else None)
    try:
        for spec in specs:
            parent, child = ctx.Pipe()
            proc = ctx.Process(target=worker_main, args=(spec, child), daemon=True)
            proc.start()
            child.close()
            procs.append(proc)
            pipes[spec.worker_id] = parent
        ready: set[int] = set()
        deadline = time.monotonic() + _READY_TIMEOUT_S
        while len(ready) < len(specs) and time.monotonic() < deadline and not state.errors:
            for conn in wait(list(pipes.values()), 1.0):
                assert isinstance(conn, Connection)
                try:
                    msg = conn.recv()
                except EOFError:
                    state.errors.append("a worker exited before it was ready")
                    break
                if msg[0] == "ready":
                    ready.add(msg[1])
                else:
                    state.absorb(msg)
        if len(ready) < len(specs):
            raise RuntimeError("workers did not get ready: " + "; ".join(state.errors or ["timeout"]))
        cpu0 = _host_cpu()
        start_ns = time.monotonic_ns() + 50_000_000  # a little ahead so that all start together
        for p in pipes.values():
            p.send(("go", start_ns, int(cfg.duration * 1e9)))
        start = start_ns / 1e9
        next_tick = start + 1.0
        prev: dict[str, int] = {}
        producers = [s.worker_id for s in specs if s.role == "producer"]
        consumers = [s.worker_id for s in specs if s.role == "consumer"]
        slow = [s.worker_id for s in specs if s.role == "slow"]
        # The window, then the producers' confirm tail.
        # After the window: "stop" once to each producer, and the pump waits for its answer (a
        # tick or its result). A "stop" each turn with no wait made this process spin on a core
        # of the machine under test, and the producer read thousands of them, for as long as a
        # broker holding the producer back took to let its last batch through.
        stopped: set[int] = set()
        while time.monotonic() < start + cfg.duration or not all(w in state.done for w in producers):
            if state.errors:
                break
            if time.monotonic() >= start + cfg.duration:
                for w in producers:
                    if w not in state.done and w not in stopped:
                        pipes[w].send(("stop",))
                        stopped.add(w)
            wait_s = next_tick - time.monotonic() if next_tick <= start + cfg.duration + 0.01 else 0.5
            state.pump(pipes, max(0.0, min(wait_s, 0.5)))
            if time.monotonic() >= next_tick and next_tick <= start + cfg.duration + 0.01:
                prev = state.progress(next_tick - start, prev)
                next_tick += 1.0
        cpu1 = _host_cpu()
        # Drain: wait until every expected delivery arrived, or nothing moved for 2 s, or timeout.
        expected = state.total("sent") * topo.deliveries_per_message if cfg.consumers else 0
        drain_end = time.monotonic() + cfg.drain_timeout
        last, last_change = -1, time.monotonic()
        while consumers and not state.errors and time.monotonic() < drain_end:
            got = state.total("received")
            if got >= expected:
                break
            if got != last:
                last, last_change = got, time.monotonic()
            elif time.monotonic() - last_change > 2.0:
                break
            state.pump(pipes, 0.2)
        for w in consumers + slow:
            if w not in state.done:
                pipes[w].send(("stop",))
        stop_end = time.monotonic() + 15.0
        while len(state.done) < len(specs) and time.monotonic() < stop_end:
            state.pump(pipes, 0.5)
    finally:
        for proc in procs:
            proc.join(timeout=5.0)
            if proc.is_alive():
                proc.terminate()
                proc.join(timeout=5.0)
        try:
            asyncio.run(run_async_topology(cfg.uri, topo, create=False))
            if cfg.slow_ack_ms:
                asyncio.run(_slow_queue_setup(cfg, topo, create=False))
        except Exception as exc:  # cleanup must not hide the run's own error
            state.errors.append(f"cleanup failed: {exc!r}")
    return _result(cfg, topo, specs, state, cpu0, cpu1)


def _result(
    cfg: RunConfig,
    topo: Topology,
    specs: list[WorkerSpec],
    state: _Run,
    cpu0: tuple[int, int] | None,
    cpu1: tuple[int, int] | None,
) -> dict[str, Any]:
    d = cfg.duration
    workers: list[dict[str, Any]] = [
        {
            "id": s.worker_id,
            "role": s.role,
            "connections": len(s.routes) + len(s.queues),
            "cpu_percent": round(100.0 * state.snaps[s.worker_id].cpu_window / d, 1),
        }
        for s in specs
    ]
    max_cpu = max((float(w["cpu_percent"]) for w in workers), default=0.0)
    host = None
    if cpu0 is not None and cpu1 is not None and cpu1[1] > cpu0[1]:
        host = round(100.0 * (cpu1[0] - cpu0[0]) / (cpu1[1] - cpu0[1]), 1)
    sent_w = state.total("sent_window")
    return {
        "config": cfg.public(),
        "pattern": topo.pattern,
        "deliveries_per_message": topo.deliveries_per_message,
        "duration_s": d,
        "sent": state.total("sent"),
        "confirmed": state.total("confirmed"),
        "nacked": state.total("nacked"),
        "received": state.total("received"),
        "expected_deliveries": state.total("sent") * topo.deliveries_per_message if cfg.consumers else 0,
        "rates": {
            "sent": round(sent_w / d, 1),
            "confirmed": round(state.total("confirmed_window") / d, 1),
            "received": round(state.total("received_window") / d, 1),
        },
        "latency_us": state.hist.summary(),
        "per_second": state.per_second,
        "generator": {
            "workers": workers,
            "max_worker_cpu_percent": max_cpu,
            "saturated": max_cpu >= SATURATION_PERCENT,
            "host_cpu_busy_percent": host,
            "cpu_count": os.cpu_count(),
        },
        "slow": {
            "received": state.total("received_window", "slow"),
            "rate": round(state.total("received_window", "slow") / d, 1),
            "turnaround_us": state.slow_hist.summary(),
        }
        if cfg.slow_ack_ms
        else None,
        "errors": state.errors,
    }
