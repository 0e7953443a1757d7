"""The console's queue list with many queues, unpaged against paged (issue 29's measure).

    .venv/bin/python scripts/bench_console.py [--queues 10000] [--rounds 5] [--scenario1 10 --pairs 3]

Starts `cmq-gateway serve` (as bench_management.py does), makes --queues queues by a
definitions import, logs in to the console in Debian's Chromium (Playwright,
executable_path) and then, in alternating rounds in the one browser:

- *unpaged*: what a console that reads the whole list pays: GET /api/queues, its JSON
  parsed, and every row drawn with the console's own table() until the frame after;
- *paged*: the same for GET /api/queues?page=1&page_size=100&sort=name, the request the
  Queues view makes;
- *view*: the Queues view itself opened (hash change to its first row drawn).

Meanwhile an AMQP client pings the gateway (a passive queue.declare, one after another):
the slowest ping during each measurement is how long that request held the event loop from
AMQP clients. Prints the median of each, and the whole run's pings as a baseline.

With ``--scenario1 SECONDS``: the load generator's scenario 1 (transient 16 B, one producer,
one consumer, unlimited rate) against the same gateway, --pairs times without the console
(the tab on about:blank) and with it open on the Queues view at its 5 s refresh, alternating.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pika
import requests

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_management import ROOT, start  # noqa: E402

RENDER = """async ({ url, token }) => {
  const { table } = await import('/console/dom.js');
  const t0 = performance.now();
  const r = await fetch(url, { headers: { Authorization: `Basic ${token}` }, cache: 'no-store' });
  const body = await r.json();
  const t1 = performance.now();
  const rows = Array.isArray(body) ? body : body.items;
  const el = table([{ key: 'vhost', label: 'Virtual host' }, { key: 'name', label: 'Name' },
    { key: 'state', label: 'State' }, { key: 'messages_ready', label: 'Ready', num: true },
    { key: 'messages_unacknowledged', label: 'Unacked', num: true }, { key: 'messages', label: 'Total', num: true }],
    rows, { id: 'bench-table' });
  document.body.appendChild(el);
  await new Promise((done) => requestAnimationFrame(() => requestAnimationFrame(done)));
  const t2 = performance.now();
  el.remove();
  return { api: t1 - t0, total: t2 - t0, rows: rows.length };
}"""

VIEW = """async () => {
  location.hash = '#/overview';
  await new Promise((done) => { const w = () => (document.querySelector('#overview') ? done() : requestAnimationFrame(w)); w(); });
  const t0 = performance.now();
  location.hash = '#/queues';
  await new Promise((done) => { const w = () => (document.querySelector('#queues-list tbody td a') ? done() : requestAnimationFrame(w)); w(); });
  return { total: performance.now() - t0, api: cmqConsolePerf.lastApi };
}"""


class Pinger(threading.Thread):
    """Passive queue.declare round trips, timestamped (perf_counter seconds, ms)."""

    def __init__(self, port: int) -> None:
        super().__init__(daemon=True)
        self.port = port
        self.samples: list[tuple[float, float]] = []
        self.stop = threading.Event()

    def run(self) -> None:
        conn = pika.BlockingConnection(pika.URLParameters(f"amqp://guest:guest@127.0.0.1:{self.port}/%2F"))
        ch = conn.channel()
        ch.queue_declare("bench-ping")
        while not self.stop.is_set():
            t0 = time.perf_counter()
            ch.queue_declare("bench-ping", passive=True)
            t1 = time.perf_counter()
            self.samples.append((t1, (t1 - t0) * 1000))
            time.sleep(0.002)
        conn.close()

    def worst(self, since: float, until: float) -> float:
        return max((ms for t, ms in self.samples if since <= t <= until), default=0.0)


def scenario1_pairs(page: object, base: str, port: int, seconds: float, pairs: int) -> dict[str, list[tuple[float, float]]]:
    """Scenario 1 without and with the console's Queues view open, alternating."""
    out: dict[str, list[tuple[float, float]]] = {"without console": [], "with console": []}
    for _ in range(pairs):
        for kind in out:
            if kind == "with console":
                page.goto(base + "/#/queues")  # type: ignore[attr-defined]
                page.wait_for_selector("#queues-list tbody td a")  # type: ignore[attr-defined]
            else:
                page.goto("about:blank")  # type: ignore[attr-defined]
            run = subprocess.run([sys.executable, "-m", "gateway.perf", "run", "--uri",
                                  f"amqp://guest:guest@127.0.0.1:{port}/", "--size", "16", "--pattern", "queue",
                                  "--queues", "1", "--rate", "0", "--duration", str(seconds), "--json", "--quiet"],
                                 cwd=ROOT, capture_output=True, text=True, check=True)
            report = json.loads(run.stdout)
            out[kind].append((report["rates"]["received"], report["latency_us"]["p99"] / 1000))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--queues", type=int, default=10_000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--root", type=Path, default=ROOT)
    ap.add_argument("--scenario1", type=float, default=0.0, metavar="SECONDS",
                    help="also run scenario 1 for this long, without and with the console open")
    ap.add_argument("--pairs", type=int, default=3)
    args = ap.parse_args()
    from playwright.sync_api import sync_playwright

    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    if exe is None:
        raise SystemExit("needs Debian's chromium (apt-get install chromium)")
    data_dir = tempfile.mkdtemp(prefix="bench-console-")
    proc, port, operator = start(data_dir, args.root)
    base = f"http://127.0.0.1:{operator['management']}"
    try:
        defs = {"queues": [{"name": f"bench-{i:05d}", "vhost": "/", "durable": False, "auto_delete": False,
                            "arguments": {}} for i in range(args.queues)]}
        requests.post(f"{base}/api/definitions", json=defs, auth=("guest", "guest"), timeout=600).raise_for_status()
        pinger = Pinger(port)
        pinger.start()
        results: dict[str, list[dict[str, float]]] = {"unpaged": [], "paged": [], "view": []}
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=exe, args=["--no-sandbox", "--disable-gpu"])
            page = browser.new_context(viewport={"width": 1280, "height": 900}).new_page()
            page.goto(base + "/")
            page.fill("#login-user", "guest")
            page.fill("#login-password", "guest")
            page.click("#login-form button[type=submit]")
            page.wait_for_selector("#whoami")
            token = page.evaluate("() => JSON.parse(sessionStorage.getItem('cmq-console-credentials')).token")
            urls = {"unpaged": "/api/queues", "paged": "/api/queues?page=1&page_size=100&sort=name"}
            for _ in range(args.rounds):
                for kind in ("unpaged", "paged", "view"):
                    time.sleep(0.5)
                    t0 = time.perf_counter()
                    got = page.evaluate(VIEW) if kind == "view" else page.evaluate(RENDER, {"url": urls[kind], "token": token})
                    got["amqp_worst"] = pinger.worst(t0, time.perf_counter())
                    results[kind].append(got)
            pinger.stop.set()
            pinger.join(timeout=10)
            if args.scenario1:
                scenario1 = scenario1_pairs(page, base, port, args.scenario1, args.pairs)
            browser.close()
        print(f"{args.queues} queues, {args.rounds} alternating rounds; medians in ms")
        print(f"{'':<10} {'API call':>10} {'to drawn':>10} {'worst AMQP ping':>16}")
        for kind, rows in results.items():
            med = {k: statistics.median(r[k] for r in rows) for k in ("api", "total", "amqp_worst")}
            print(f"{kind:<10} {med['api']:>10.1f} {med['total']:>10.1f} {med['amqp_worst']:>16.1f}")
        pings = [ms for _, ms in pinger.samples]
        print(f"AMQP ping over the run: median {statistics.median(pings):.1f} ms, {len(pings)} pings")
        if args.scenario1:
            print(f"scenario 1, {args.scenario1:g} s x {args.pairs} pairs: received/s, latency p99 ms")
            for kind, runs in scenario1.items():
                print(f"{kind:<16} " + "  ".join(f"{r:,.0f}/s p99 {p:.1f}" for r, p in runs)
                      + f"   median {statistics.median(r for r, _ in runs):,.0f}/s")
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        shutil.rmtree(data_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
