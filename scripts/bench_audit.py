"""Measure the audit writer: emit() cost per call on the caller's thread, and the writer
thread's sustained throughput (records/s formatted and written).

    .venv/bin/python scripts/bench_audit.py [--records 1000000]

With ``handoff``: what the A5 hand-off (``AuditLog.handoff``, called on the event loop before
every write to a client) costs the loop under a flood, this tree against another commit's, in
one run: each round starts a gateway as ``serve`` runs it (audit log on) from each tree in
turn (the order alternating), drives it with ``cmq-gateway perf`` scenario 1, 2 or 8, and
times every hand-off from outside (a wrapper around ``AuditLog.handoff``, the same for both
trees). ``--audit-off`` adds a third side, this tree with no audit log (A5's whole cost).

    .venv/bin/python scripts/bench_audit.py handoff --before HEAD~1 --after HEAD --scenarios 1,2,8 \
        --duration 8 --repeat 3 [--audit-off]
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time

from gateway.audit import AuditLog


def main() -> None:
    if sys.argv[1:2] == ["handoff"]:
        return handoff_main(sys.argv[2:])
    ap = argparse.ArgumentParser()
    ap.add_argument("--records", type=int, default=1_000_000)
    args = ap.parse_args()
    n = args.records
    root = tempfile.mkdtemp(prefix="bench-audit-")
    try:
        audit = AuditLog(root, max_pending=n + 1)  # nothing shed: measure the full write
        fields = {"topic": "orders", "subscription": "billing", "queue": "orders-billing",
                  "routing_key": "orders.eu", "size": 512, "tags": ["eu", "vip"]}
        t0 = time.perf_counter()
        for i in range(n):
            audit.emit("deliver", "/", msg_id=f"msg-{i:012x}", attempt=1, **fields)
        t_emit = time.perf_counter() - t0
        audit.close()
        t_all = time.perf_counter() - t0
        size = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(root) for f in fs)
        print(f"records              {n:,}")
        print(f"emit() per call      {t_emit / n * 1e6:.2f} µs (writer thread running alongside)")
        print(f"writer throughput    {audit.written / t_all:,.0f} records/s "
              f"({size / t_all / 1e6:.1f} MB/s, {size / n:.0f} B/record)")
        print(f"dropped              {audit.dropped}")

        # emit() alone, writer idle (queue only), the cost the event loop pays per record.
        audit = AuditLog(root, max_pending=n + 1, flush_interval=3600)
        t0 = time.perf_counter()
        for _ in range(min(n, 200_000)):
            audit.emit("deliver", "/", msg_id="m", attempt=1, **fields)
        t_q = (time.perf_counter() - t0) / min(n, 200_000)
        audit.close()
        print(f"emit() queue only    {t_q * 1e6:.2f} µs")
    finally:
        shutil.rmtree(root, ignore_errors=True)


# ---- handoff: the A5 hand-off's cost on the event loop, two trees in one run -------------------

# Run by each side's gateway process (python -c, the tree first on PYTHONPATH): time every
# AuditLog.handoff from outside and write the totals to STATS every 0.25 s; AUDIT=off serves
# with no audit log at all.
_LAUNCH = """
import json, os, sys, threading, time
from gateway.audit import writer
stats_path, audit = os.environ["BENCH_STATS"], os.environ["BENCH_AUDIT"]
st = {"calls": 0, "busy": 0, "records": 0, "seconds": 0.0, "cpu": 0.0, "times": [], "cpus": []}
orig = writer.AuditLog.handoff
def handoff(self):
    n = len(self._queue)
    if not n and not getattr(self, "_sending", False):
        st["calls"] += 1
        return orig(self)
    t, c = time.perf_counter(), time.thread_time()
    orig(self)
    dc, dt = time.thread_time() - c, time.perf_counter() - t
    st["calls"] += 1
    st["busy"] += 1
    st["records"] += n
    st["seconds"] += dt
    st["cpu"] += dc
    if len(st["times"]) < 200000:
        st["times"].append(dt)
        st["cpus"].append(dc)
    st["log"] = self
writer.AuditLog.handoff = handoff
if audit == "nopump":
    from gateway.audit import pipe
    pipe.PUMP_AT = 1 << 62
if audit == "off":
    import gateway.server
    gateway.server._open_audit = lambda config, lock=None: writer.NullAudit()
def dump():
    while True:
        time.sleep(0.25)
        log = st.get("log")
        hs = getattr(log, "handoff_stats", None)
        out = {k: v for k, v in st.items() if k != "log"}
        out["pump"] = None if hs is None else {k: getattr(hs, k) for k in hs.__slots__}
        with open(stats_path + ".tmp", "w") as f:
            json.dump(out, f)
        os.replace(stats_path + ".tmp", stats_path)
threading.Thread(target=dump, daemon=True).start()
from gateway.cli import main
sys.argv = ["cmq-gateway", *sys.argv[1:]]
sys.exit(main())
"""


def _tree(ref: str, root: str) -> str:
    """``ref``'s files (git archive), under ``root``."""
    import subprocess

    out = os.path.join(root, "tree-" + ref.replace("/", "_").replace("~", "_"))
    os.makedirs(out)
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    archive = subprocess.run(["git", "-C", here, "archive", ref], check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", out], input=archive, check=True)
    # The compiled frames (not in git), where the tree's source for them is this checkout's:
    # without them both sides would run the pure-Python frames, 1.5x the CPU a message.
    proto = os.path.join(here, "gateway", "protocol")
    with open(os.path.join(proto, "_frames.c"), "rb") as a, open(os.path.join(out, "gateway", "protocol", "_frames.c"), "rb") as b:
        same = a.read() == b.read()
    for name in os.listdir(proto) if same else ():
        if name.endswith(".so"):
            shutil.copy2(os.path.join(proto, name), os.path.join(out, "gateway", "protocol", name))
    return out


def _side(tree: str, audit: str, scenario: int, duration: float, port: int, root: str) -> dict:
    import json
    import subprocess

    from bench_compare import _stop  # scripts/ is this script's folder

    from gateway.perf.scenarios import scenario_config

    data = tempfile.mkdtemp(prefix="data-", dir=root)
    stats = os.path.join(root, "stats.json")
    env = dict(os.environ, PYTHONPATH=tree, BENCH_STATS=stats, BENCH_AUDIT=audit)
    cmd = [sys.executable, "-c", _LAUNCH, "serve", "--host", "127.0.0.1", "--port", str(port), "--data-dir", data,
           "--management-port", "off", "--cmq-api-port", "off", "--mqtt-port", "off", "--metrics-port", "off"]
    gw = subprocess.Popen(cmd, cwd=tree, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    assert gw.stderr is not None
    deadline = time.monotonic() + 60
    while b"listening on" not in gw.stderr.readline():
        if gw.poll() is not None or time.monotonic() > deadline:
            gw.kill()
            raise SystemExit(f"the gateway of {tree} did not start")
    import threading

    threading.Thread(target=gw.stderr.read, daemon=True).start()  # a full pipe would stall it
    cfg = scenario_config(scenario, f"amqp://guest:guest@127.0.0.1:{port}/", duration)
    perf = [sys.executable, "-m", "gateway.cli", "perf", "run", "--json", "--quiet", "--uri", cfg.uri,
            "--duration", str(duration), "--rate", "0", "--size", str(cfg.size), "--confirm", str(cfg.confirm),
            "--queues", str(cfg.queues), "--pattern", cfg.pattern, "--consumers", str(cfg.consumers)]
    if cfg.persistent:
        perf.append("--persistent")
    if cfg.slow_ack_ms:
        perf += ["--slow-ack-ms", str(cfg.slow_ack_ms)]
    load = os.getloadavg()[0]
    res = subprocess.run(perf, capture_output=True, text=True, check=False)
    time.sleep(0.6)  # the stats thread's next dump
    with open(stats) as f:
        got = json.load(f)
    _stop(gw)
    shutil.rmtree(data, ignore_errors=True)
    os.unlink(stats)
    try:
        run = json.loads(res.stdout)
    except ValueError:
        raise SystemExit(f"perf failed: {res.stderr[-2000:]}") from None
    got["perf"] = {"received_per_s": run["rates"]["received"], "confirmed_per_s": run["rates"]["confirmed"],
                   "received": run["received"],
                   "slow_turnaround_us": (run.get("slow") or {}).get("turnaround_us")}
    got["load"] = load
    return got


def _summary(side: dict) -> dict:
    def pct(values: list[float], q: float) -> float:
        return round(values[min(len(values) - 1, int(q * len(values)))] * 1e6, 1) if values else 0.0

    times, cpus = sorted(side.pop("times")), sorted(side.pop("cpus"))
    busy = side["busy"] or 1
    received = side["perf"]["received"] or 1
    # Wall time includes the loop thread's waits (the GIL, the send lock, a full pipe) and, on a
    # loaded machine, its preemptions; CPU (thread_time) is the work the hand-off itself did.
    return {"calls": side["calls"], "busy calls": side["busy"],
            "records/busy call": round(side["records"] / busy, 1),
            "wall us/busy call": round(side["seconds"] / busy * 1e6, 1),
            "wall p50 us": pct(times, 0.5), "wall p99 us": pct(times, 0.99), "wall max us": pct(times, 1.0),
            "cpu us/busy call": round(side["cpu"] / busy * 1e6, 1),
            "cpu p50 us": pct(cpus, 0.5), "cpu p99 us": pct(cpus, 0.99),
            "cpu us/record at call": round(side["cpu"] / max(side["records"], 1) * 1e6, 3),
            "loop wall us in hand-offs/msg": round(side["seconds"] / received * 1e6, 2),
            "loop cpu us in hand-offs/msg": round(side["cpu"] / received * 1e6, 2),
            "received/s": side["perf"]["received_per_s"], "confirmed/s": side["perf"]["confirmed_per_s"],
            "slow p99 us": ((side["perf"]["slow_turnaround_us"] or {}).get("p99")),
            "pump": side["pump"], "load": round(side["load"], 1)}


def handoff_main(argv: list[str]) -> None:
    import json

    ap = argparse.ArgumentParser(prog="bench_audit.py handoff")
    ap.add_argument("--before", required=True, help="the commit to compare with (git archive of it)")
    ap.add_argument("--after", default=None,
                    help="the commit measured (git archive of it; default this tree, other uncommitted work included)")
    ap.add_argument("--scenarios", default="1,2,8")
    ap.add_argument("--duration", type=float, default=8.0)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--port", type=int, default=5697)
    ap.add_argument("--audit-off", action="store_true", help="one more side: the measured tree without an audit log")
    ap.add_argument("--no-pump", action="store_true", help="one more side: the measured tree with its pump never woken")
    ap.add_argument("--json", default=None, help="write every side's summary here too")
    args = ap.parse_args(argv)
    if args.port == 5672:
        raise SystemExit("never 5672 (RabbitMQ is there)")
    root = tempfile.mkdtemp(prefix="bench-handoff-")
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    after = _tree(args.after, root) if args.after else here
    sides = [("before", _tree(args.before, root), "on"), ("after", after, "on")]
    if args.no_pump:
        sides.append(("no pump", after, "nopump"))
    if args.audit_off:
        sides.append(("audit off", after, "off"))
    out: list[dict] = []
    try:
        for scenario in (int(x) for x in args.scenarios.split(",")):
            for r in range(args.repeat):
                order = sides if r % 2 == 0 else sides[::-1]
                for name, tree, audit in order:
                    s = _summary(_side(tree, audit, scenario, args.duration, args.port, root))
                    s.update(side=name, scenario=scenario, round=r)
                    out.append(s)
                    print(json.dumps(s), flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
