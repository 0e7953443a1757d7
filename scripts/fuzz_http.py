"""HTTP admission fuzzing (SE5): slow, huge, idle and garbage sessions against the three HTTP
ports of one real gateway (CMQ API, management API, /metrics), with a canary client whose
latency must hold.

One ``python -m gateway serve`` subprocess. A canary thread makes round trips the whole time:
an AMQP publish then get of the same message (pika; a fresh login every 20) and a management
GET /api/overview (urllib); its latencies are kept per phase. Phase 1 (``--seconds``): the canary alone. Phase 2
(as long): ``--concurrency`` fuzz sessions at once, each a new socket to one of the three ports,
of a random kind:

* idle: connects and says nothing;
* slow-headers: a request line, then one header byte every 0.2-2 s;
* slow-body: complete headers announcing a large body, then one body byte every 0.2-2 s;
* huge-headers: 100-400 KB of headers sent at once;
* keepalive-idle: one well-formed request, then silence on the kept-alive socket;
* garbage: random bytes (sometimes a random request line, a bad Content-Length, chunked
  encoding that never ends, a NUL), then silence;
* unread: well-formed requests pipelined for ever, no answer read (closed once the answers
  have waited a whole http_idle_timeout unread).

A session ends when the gateway closes its socket or at ``--cap`` seconds (then counted "held
at cap": the policy should have closed it). Reported: sessions by kind, how each ended (by the
gateway and after how long, with which status), the most sockets held at once, HTTP 500
answers (must be 0), the canary's p50/p99 in both phases, tracebacks in the gateway's log, and
whether the gateway and every port still answer at the end.

``--requests N`` then sends N well-formed requests with hostile contents while the canary
runs (scripts/fuzz_requests.py: management JSON bodies and query strings, CMQ API actions),
counted by status; ``--nats URL`` (or ``jetstream``) runs the gateway on the JetStream store.

Last, the after phase (fuzz_requests.after_phase; ``--no-after`` skips it): what the fuzz left
behind must break nothing later. Every management list and view, the CMQ API's lists and each
listed object's attributes, and an AMQP passive declare of every listed queue and exchange
answer; the gateway stopped, then killed (-9), comes back each time on the same data dir or
store with no traceback, ERROR or damaged record in its log and the same durable definitions;
the export is imported whole by a fresh gateway (a fresh nats-server on JetStream) and
exported back equal. fuzz_sessions.py and fuzz_mqtt.py end with the same phase.

    .venv/bin/python scripts/fuzz_http.py --seconds 60 --concurrency 200 [--seed N] [--nofile 1024]
    # issue 26 item 2: 1,100 silent sockets on the CMQ API of a gateway limited to 1,024 descriptors
    .venv/bin/python scripts/fuzz_http.py --nofile 1024 --concurrency 1100 --kinds idle --ports "CMQ API"
    # then 3,000 requests with hostile contents (management bodies and queries, CMQ actions), on JetStream
    .venv/bin/python scripts/fuzz_http.py --seconds 30 --requests 3000 --nats jetstream
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import resource
import statistics
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any

import pika

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from fuzz_requests import Requests, add_after_argument, after_phase, fuzz_requests, write_config  # noqa: E402
from serve_process import NATS_HELP, Served, nats_store  # noqa: E402

PORTS = ("CMQ API", "management API", "metrics")
PATHS = {"CMQ API": "/v2/index.php?Action=ListQueue", "management API": "/api/overview", "metrics": "/metrics"}
AUTH = "Basic Z3Vlc3Q6Z3Vlc3Q="  # guest:guest
KINDS = ("idle", "slow-headers", "slow-body", "huge-headers", "keepalive-idle", "garbage", "unread")


HTTP_PORT = {"CMQ API": "cmq_api_port", "management API": "management_port", "metrics": "metrics_port"}


def start_gateway(work: Path, config: Path, nofile: int | None, store: str | None) -> Served:
    """The gateway with its three HTTP ports (``http_port`` reads them), under ``nofile``."""
    prefix: tuple[str, ...] = ()
    if nofile:
        prefix = ("prlimit", f"--nofile={nofile}:{resource.getrlimit(resource.RLIMIT_NOFILE)[1]}", "--")
    return Served(work / "data", work / "gateway.log", store=store, config=config, prefix=prefix,
                  management_port=0, metrics_port=0, cmq_api_port=0)


def http_port(gw: Served, name: str) -> int:
    return gw.ports[HTTP_PORT[name]]


# -- the canary ----------------------------------------------------------------------------


class Canary(threading.Thread):
    """AMQP publish+get round trips and management GETs, one after the other, timed."""

    def __init__(self, gw: Served) -> None:
        super().__init__(daemon=True)
        self.gw = gw
        self.phase = "alone"
        self.latency: dict[str, dict[str, list[float]]] = {}
        self.failures: Counter[str] = Counter()
        self.stopping = threading.Event()

    def _keep(self, what: str, seconds: float) -> None:
        self.latency.setdefault(self.phase, {}).setdefault(what, []).append(seconds)

    def run(self) -> None:
        conn = None
        url = f"http://127.0.0.1:{http_port(self.gw, 'management API')}/api/overview"
        n = 0
        while not self.stopping.is_set():
            try:
                if conn is not None and n % 20 == 0:  # a fresh login now and then: descriptors
                    conn.close()
                    conn = None
                if conn is None:
                    t0 = time.perf_counter()
                    conn = pika.BlockingConnection(pika.ConnectionParameters(
                        "127.0.0.1", self.gw.port, socket_timeout=10, blocked_connection_timeout=10))
                    ch = conn.channel()
                    queue = ch.queue_declare("", exclusive=True).method.queue
                    self._keep("amqp login", time.perf_counter() - t0)
                n += 1
                body = b"canary %d" % n
                t0 = time.perf_counter()
                ch.basic_publish("", queue, body)
                while True:
                    method, _, got = ch.basic_get(queue, auto_ack=True)
                    if method is not None:
                        break
                assert got == body, (got, body)
                self._keep("amqp", time.perf_counter() - t0)
                t0 = time.perf_counter()
                req = urllib.request.Request(url, headers={"Authorization": AUTH})
                with urllib.request.urlopen(req, timeout=10) as r:
                    r.read()
                    assert r.status == 200
                self._keep("management", time.perf_counter() - t0)
            except Exception as e:  # noqa: BLE001 - counted, the canary goes on
                self.failures[f"{self.phase}: {type(e).__name__}: {str(e)[:80]}"] += 1
                if conn is not None:
                    try:
                        conn.close()
                    except Exception:  # noqa: BLE001
                        pass
                conn = None
                time.sleep(0.2)
            time.sleep(0.02)
        if conn is not None:
            conn.close()


# -- the fuzz sessions -----------------------------------------------------------------------


class Stats:
    def __init__(self) -> None:
        self.sessions: Counter[str] = Counter()
        self.ended: Counter[str] = Counter()  # kind/how
        self.durations: dict[str, list[float]] = {}
        self.status: Counter[str] = Counter()
        self.open = 0
        self.most_open = 0
        self.connect_failed: Counter[str] = Counter()


def _request(path: str, host: str = "x") -> bytes:
    return f"GET {path} HTTP/1.1\r\nHost: {host}\r\nAuthorization: {AUTH}\r\n\r\n".encode()


def _garbage(rng: random.Random) -> bytes:
    choice = rng.randrange(6)
    if choice == 0:
        return rng.randbytes(rng.randint(1, 4096))
    if choice == 1:
        return (rng.choice(["GET", "POST", "PUT", "XYZ", "G\x00T"]) + " /" + "a" * rng.randint(0, 9000)
                + " HTTP/1." + rng.choice("019") + "\r\n\r\n").encode(errors="replace")
    if choice == 2:
        return b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: " + rng.choice(
            [b"-1", b"99999999999999999999", b"abc", b"1, 2", b""]) + b"\r\n\r\n"
    if choice == 3:
        return b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n" + b"ffff\r\n" + b"a" * 100
    if choice == 4:
        return b"GET / HTTP/1.1\r\n" + b"X: " + b"\x00\xff" * rng.randint(1, 100) + b"\r\n\r\n"
    return b"\r\n" * rng.randint(1, 10000)


async def session(kind: str, name: str, port: int, rng: random.Random, cap: float, st: Stats) -> None:
    st.sessions[kind] += 1
    t0 = time.monotonic()
    try:
        # An unread session's reader stops taking the answers past twice its limit (asyncio
        # pauses the socket), so both kernels' buffers and then the gateway's fill.
        limit = {"limit": 2048} if kind == "unread" else {}
        reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port, **limit), 10)
    except (OSError, TimeoutError) as e:
        st.connect_failed[type(e).__name__] += 1
        return
    st.open += 1
    st.most_open = max(st.most_open, st.open)
    answer = b""
    how = "held at cap"

    async def drip(data: bytes, low: float, high: float) -> None:
        for i in range(len(data)):
            writer.write(data[i:i + 1])
            await writer.drain()
            await asyncio.sleep(rng.uniform(low, high))

    async def act() -> None:
        if kind == "slow-headers":
            writer.write(b"GET " + PATHS[name].encode() + b" HTTP/1.1\r\n")
            await drip(b"X-Slow: " + b"s" * 10_000, 0.2, 2.0)
        elif kind == "slow-body":
            writer.write(b"POST " + PATHS[name].split("?")[0].encode() + b" HTTP/1.1\r\nHost: x\r\n"
                         b"Content-Type: application/x-www-form-urlencoded\r\nContent-Length: 100000\r\n"
                         b"Authorization: " + AUTH.encode() + b"\r\n\r\n")
            await drip(b"a" * 100_000, 0.2, 2.0)
        elif kind == "huge-headers":
            writer.write(b"GET / HTTP/1.1\r\n" + b"X-Huge: " + b"h" * rng.randint(100_000, 400_000) + b"\r\n\r\n")
            await writer.drain()
        elif kind == "keepalive-idle":
            writer.write(_request(PATHS[name]))
            await writer.drain()
        elif kind == "garbage":
            writer.write(_garbage(rng))
            await writer.drain()
        elif kind == "unread":  # requests pipelined for ever, no answer read: the write fails once closed
            while True:
                writer.write(_request(PATHS[name]) * 100)
                await writer.drain()
        await asyncio.sleep(cap)

    async def read() -> None:
        nonlocal answer
        if kind == "unread":
            await asyncio.sleep(cap + 1)
            return
        while True:
            data = await reader.read(65536)
            if not data:
                return
            if len(answer) < 4096:
                answer += data

    acting = asyncio.ensure_future(act())
    reading = asyncio.ensure_future(read())
    try:
        done, _ = await asyncio.wait([acting, reading], timeout=cap, return_when=asyncio.FIRST_COMPLETED)
        if reading in done:
            how = "closed by the gateway"
        elif acting in done and acting.exception() is not None:
            how = "closed by the gateway"  # a write failed: reset
            try:
                await asyncio.wait_for(reading, 1)
            except (TimeoutError, OSError):
                pass
    finally:
        for task in (acting, reading):
            task.cancel()
        await asyncio.gather(acting, reading, return_exceptions=True)
        writer.close()
        st.open -= 1
    elapsed = time.monotonic() - t0
    st.ended[f"{kind}: {how}"] += 1
    st.durations.setdefault(kind, []).append(elapsed)
    for line in answer.split(b"\r\n"):
        if line.startswith(b"HTTP/1."):
            st.status[f"{kind}: {line[9:12].decode(errors='replace')}"] += 1
            if line[9:12] == b"500":
                st.status["HTTP 500 (a defect)"] += 1


async def fuzz(gw: Served, seconds: float, concurrency: int, cap: float, seed: int,
               kinds: tuple[str, ...] = KINDS, ports: tuple[str, ...] = PORTS) -> Stats:
    st = Stats()
    rng = random.Random(seed)
    end = time.monotonic() + seconds
    running: set[asyncio.Task[None]] = set()
    i = 0
    while time.monotonic() < end:
        while len(running) < concurrency and time.monotonic() < end:
            name = rng.choice(ports)
            task = asyncio.ensure_future(session(rng.choice(kinds), name, http_port(gw, name),
                                                 random.Random(seed * 1_000_003 + i), cap, st))
            i += 1
            running.add(task)
            task.add_done_callback(running.discard)
            await asyncio.sleep(0.002)
        await asyncio.sleep(0.05)
    if running:
        await asyncio.gather(*running, return_exceptions=True)
    return st


def _pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _still_serving(gw: Served) -> dict[str, int | str]:
    out: dict[str, int | str] = {}
    for name in PORTS:
        req = urllib.request.Request(f"http://127.0.0.1:{http_port(gw, name)}{PATHS[name]}", headers={"Authorization": AUTH})
        try:
            with urllib.request.urlopen(req, timeout=10) as r:
                out[name] = r.status
        except urllib.error.HTTPError as e:
            out[name] = e.code
        except OSError as e:
            out[name] = f"{type(e).__name__}: {e}"
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=60, help="each phase (canary alone, canary and fuzz)")
    ap.add_argument("--concurrency", type=int, default=200, help="fuzz sessions open at once")
    ap.add_argument("--cap", type=float, default=40, help="a session the gateway has not closed by then is 'held'")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--kinds", default=",".join(KINDS), help="the kinds of session, comma-separated")
    ap.add_argument("--ports", default=",".join(PORTS), help="the ports fuzzed, comma-separated")
    ap.add_argument("--nofile", type=int, default=None, help="the gateway's RLIMIT_NOFILE (soft)")
    ap.add_argument("--limits", default="{}", help='JSON merged into the config\'s limits, e.g. \'{"max_connections": 100}\'')
    ap.add_argument("--requests", type=int, default=0,
                    help="then this many well-formed requests with hostile contents (scripts/fuzz_requests.py)")
    ap.add_argument("--nats", default=None, help=NATS_HELP)
    add_after_argument(ap)
    ap.add_argument("--keep-definitions", default=None,
                    help="write the export taken after the fuzz (the after phase's) to this file")
    args = ap.parse_args()
    # A kill -9 leaves the audit writer child and a stop the compaction child finishing in
    # the data dir (A5, by design): their files may still come as the directory goes.
    with tempfile.TemporaryDirectory(prefix="fuzz-http-", ignore_cleanup_errors=True) as tmp, \
            nats_store(args.nats) as store:
        config = write_config(Path(tmp) / "gateway.yaml", json.loads(args.limits))
        gw = start_gateway(Path(tmp), config, args.nofile, store)
        requests = Requests()
        try:
            canary = Canary(gw)
            canary.start()
            time.sleep(args.seconds)
            canary.phase = "fuzzed"
            t0 = time.monotonic()
            st = asyncio.run(fuzz(gw, args.seconds, args.concurrency, args.cap, args.seed,
                                  tuple(args.kinds.split(",")), tuple(args.ports.split(","))))
            fuzz_seconds = time.monotonic() - t0
            if args.requests:
                requests = fuzz_requests(f"http://127.0.0.1:{http_port(gw, 'management API')}",
                                         f"http://127.0.0.1:{http_port(gw, 'CMQ API')}", args.requests, args.seed)
            canary.stopping.set()
            canary.join(30)
            serving = _still_serving(gw)
            alive = gw.proc.poll() is None
            after_problems: list[str] = []
            after: dict[str, Any] = {}
            if args.after and alive:
                gw, after = after_phase(gw, config, after_problems,
                                        Path(args.keep_definitions) if args.keep_definitions else None)
        finally:
            gw.stop()
        log = gw.log.read_text(errors="replace")
    report: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "args": vars(args),
        "store": store or "embedded",
        "fuzz_seconds": round(fuzz_seconds, 1),
        "sessions": sum(st.sessions.values()),
        "sessions_by_kind": dict(st.sessions),
        "ended": dict(sorted(st.ended.items())),
        "seconds_to_close_median_max": {k: [round(statistics.median(v), 2), round(max(v), 2)]
                                        for k, v in sorted(st.durations.items())},
        "answers": dict(sorted(st.status.items())),
        "most_held_at_once": st.most_open,
        "connect_failed": dict(st.connect_failed),
        "canary_ms": {phase: {what: {"n": len(v), "p50": round(1000 * _pct(v, 0.5), 2),
                                     "p99": round(1000 * _pct(v, 0.99), 2)}
                              for what, v in kinds.items()}
                      for phase, kinds in canary.latency.items()},
        "canary_failures": dict(canary.failures),
        "gateway_alive": alive,
        "still_serving": serving,
        "fuzzed_requests": requests.report(),
        "after": {**after, "problems": len(after_problems), "first_problems": after_problems[:20]},
        "tracebacks_in_log": log.count("Traceback"),
        "errors_in_log": sum(" ERROR " in line or "INTERNAL_ERROR" in line for line in log.splitlines()),
        "first_traceback": log[log.find("Traceback") - 300:log.find("Traceback") + 2500] if "Traceback" in log else "",
    }
    print(json.dumps(report, indent=2))
    bad = (not alive or report["tracebacks_in_log"] or st.status["HTTP 500 (a defect)"] or requests.server_errors
           or after_problems
           or any(not isinstance(v, int) or v >= 500 for v in serving.values()))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
