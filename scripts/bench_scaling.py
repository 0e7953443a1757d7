"""Issue 28, aim 3: 1, 2 and 3 gateways on a three-node NATS JetStream cluster (R3 streams),
with the CPU each process spends per message.

    .venv/bin/python scripts/bench_scaling.py [--gateways 1,2,3] [--scenarios 1,2] [--duration 5] [--repeat 3]

Starts three nats-server nodes (routes between them, JetStream on, free loopback ports) and as
many gateways as the largest count asked, all kept running for the whole benchmark. Each round
runs every scenario on 1, then 2, then 3 of them (interleaved, so the machine's load falls on
all alike), with the same load generator: ``--producers`` and ``--consumers`` connections
(3 and 3 by default, so that three gateways all have clients) dealt over the gateways in use
(`perf --uri A --uri B ...`: connection k on gateway k mod N, producers first).

For each run, the CPU time (utime + stime from /proc/<pid>/stat, the process and its children,
e.g. a gateway's audit writer) of every gateway and every nats-server is read before and after
and divided by the run's messages: received for scenario 1, confirmed for scenario 2. Gateways
not in use that run still count (presence heartbeats, metadata watch): their share is small
and it is what a cluster's idle gateways cost. Each nats-server is labelled by what it leads
for the run's queue: ``S`` the queue's stream, ``C`` its consumer (read from /jsz during the
run). Before the rounds, an idle window measures each process's background CPU (ms per s).

Prints one Markdown table per scenario (medians) and, with ``--json FILE``, every run's figures.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from gateway.perf.runner import run  # noqa: E402
from gateway.perf.scenarios import TITLES, scenario_config  # noqa: E402
from tests.support.gateway_procs import GatewayProcess  # noqa: E402
from tests.support.natsd import NatsCluster, NatsServer  # noqa: E402

_TICK = os.sysconf("SC_CLK_TCK")


def _tree(pid: int) -> list[int]:
    """The process and its descendants (Linux /proc)."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        with contextlib.suppress(OSError):
            for task in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{task}/children") as f:
                    todo += [int(c) for c in f.read().split()]
    return out


def cpu_seconds(pid: int, tree: bool = True) -> float:
    """CPU seconds of the process and (``tree``) its descendants: each live one's utime +
    stime, and cutime + cstime, the CPU of the children it has waited for. A gateway's audit
    writer starts compactions that end within a run: a figure of live processes alone loses
    their CPU when they end, so a gateway could seem to use less CPU over a run than it did."""
    total = 0
    for p in _tree(pid) if tree else [pid]:
        with contextlib.suppress(OSError), open(f"/proc/{p}/stat") as f:
            # The command name may hold spaces: fields are counted after its closing ')'.
            fields = f.read().rsplit(")", 1)[1].split()
            total += sum(int(x) for x in fields[11:15 if tree else 13])
    return total / _TICK


@dataclass
class Leaders:
    """Which nats-server leads the run's queue stream and its consumer, polled from /jsz."""

    servers: list[NatsServer]
    stream: str | None = None
    consumer: str | None = None
    stop: threading.Event = field(default_factory=threading.Event)

    def poll(self) -> None:
        while not self.stop.is_set() and (self.stream is None or self.consumer is None):
            for s in self.servers:
                with contextlib.suppress(Exception):
                    for acct in s.jsz("?accounts=true&streams=true&consumers=true").get("account_details", []):
                        for st in acct.get("stream_detail", []):
                            if st["name"].startswith("CMQQ_perf-"):
                                self.stream = (st.get("cluster") or {}).get("leader") or self.stream
                                for c in st.get("consumer_detail") or []:
                                    self.consumer = (c.get("cluster") or {}).get("leader") or self.consumer
            self.stop.wait(0.3)

    def label(self, name: str) -> str:
        return name + "".join(t for t, who in (("S", self.stream), ("C", self.consumer)) if who == name)


def _config(scenario: int, uris: list[str], args: argparse.Namespace) -> Any:
    # A long drain: CPU is divided by the messages that came through, so they all should.
    return replace(scenario_config(scenario, ",".join(uris), args.duration), producers=args.producers,
                   consumers=args.consumers, drain_timeout=30.0, progress=False)


def one_run(scenario: int, gws: list[GatewayProcess], used: int, nats: NatsCluster,
            args: argparse.Namespace) -> dict[str, Any]:
    procs = {g.name: g.proc.pid for g in gws if g.proc is not None}
    procs |= {s.name: s.proc.pid for s in nats.servers if s.proc is not None}
    leaders = Leaders(nats.servers)
    poller = threading.Thread(target=leaders.poll, daemon=True)
    mains = {g.name: g.proc.pid for g in gws if g.proc is not None}
    before = {name: cpu_seconds(pid) for name, pid in procs.items()}
    main0 = {name: cpu_seconds(pid, tree=False) for name, pid in mains.items()}
    poller.start()
    result = run(_config(scenario, [g.url for g in gws[:used]], args), None)
    after = {name: cpu_seconds(pid) for name, pid in procs.items()}
    main1 = {name: cpu_seconds(pid, tree=False) for name, pid in mains.items()}
    leaders.stop.set()
    poller.join()
    messages = result["received"] if scenario == 1 else result["confirmed"]
    rate = result["rates"]["received" if scenario == 1 else "confirmed"]
    workers = result["generator"]["workers"]
    window_msgs = rate * args.duration
    return {
        "scenario": scenario, "gateways": used, "messages": messages, "rate": rate,
        "sent": result["sent"], "received": result["received"], "confirmed": result["confirmed"],
        "errors": result["errors"],
        "cpu_s": {name: after[name] - before[name] for name in procs},
        "us_per_msg": {name: 1e6 * (after[name] - before[name]) / messages if messages else None
                       for name in procs},
        # A gateway's main process alone (its event loop holds the GIL: at most a core each).
        "main_us_per_msg": {name: 1e6 * (main1[name] - main0[name]) / messages if messages else None
                            for name in mains},
        "stream_leader": leaders.stream, "consumer_leader": leaders.consumer,
        "labels": {s.name: leaders.label(s.name) for s in nats.servers},
        # The generator reports its workers' CPU over the window only: per window message.
        "generator_us_per_msg": (1e6 * sum(w["cpu_percent"] for w in workers) / 100 * args.duration / window_msgs
                                 if window_msgs else None),
        "host_busy_percent": result["generator"]["host_cpu_busy_percent"],
    }


def _start(gw: GatewayProcess, tries: int = 3) -> None:
    """On a loaded machine a gateway's first NATS connect can time out (it exits 1): again."""
    for left in range(tries - 1, -1, -1):
        try:
            gw.start()
            return
        except RuntimeError as e:
            if left == 0:
                raise
            print(f"{gw.name} did not start ({str(e).strip().splitlines()[-1]}): again", file=sys.stderr)


def idle(gws: list[GatewayProcess], nats: NatsCluster, seconds: float) -> dict[str, float]:
    """Each process's background CPU, ms per s, with no client connected."""
    procs = {g.name: g.proc.pid for g in gws if g.proc is not None}
    procs |= {s.name: s.proc.pid for s in nats.servers if s.proc is not None}
    before = {name: cpu_seconds(pid) for name, pid in procs.items()}
    time.sleep(seconds)
    return {name: 1000 * (cpu_seconds(pid) - before[name]) / seconds for name, pid in procs.items()}


def _med(values: list[float | None]) -> float | None:
    got = [v for v in values if v is not None]
    return statistics.median(got) if got else None


def _fmt(v: float | None, digits: int = 0) -> str:
    return "-" if v is None else f"{v:,.{digits}f}"


def table(scenario: int, runs: list[dict[str, Any]], gw_names: list[str], nats_names: list[str]) -> str:
    """One row per gateway count: medians over the rounds. A nats-server's cell carries the
    roles it had in each round (leaders move between runs: the queue is new each time)."""
    unit = "received" if scenario == 1 else "confirmed"
    lines = [f"| gateways | {unit} msg/s | " + " | ".join(f"{g} µs/msg" for g in gw_names)
             + " | gateways µs/msg (main processes) | " + " | ".join(f"{n} µs/msg" for n in nats_names)
             + " | NATS µs/msg | stream leader µs/msg | generator µs/msg | host busy % | received / sent |",
             "|---:|" + "---:|" * (len(gw_names) + len(nats_names) + 7)]
    for used in sorted({r["gateways"] for r in runs}):
        rs = [r for r in runs if r["gateways"] == used and r["scenario"] == scenario]
        gw = [_med([r["us_per_msg"][g] for r in rs]) for g in gw_names]
        gw_sum = _med([sum(r["us_per_msg"][g] or 0 for g in gw_names) for r in rs])
        gw_main = _med([sum(r["main_us_per_msg"][g] or 0 for g in gw_names) for r in rs])
        nats_cells = []
        for n in nats_names:
            roles = "/".join(r["labels"][n][len(n):] or "-" for r in rs)
            nats_cells.append(f"{_fmt(_med([r['us_per_msg'][n] for r in rs]))} ({roles})")
        nats_sum = _med([sum(r["us_per_msg"][n] or 0 for n in nats_names) for r in rs])
        leader = _med([r["us_per_msg"].get(r["stream_leader"]) if r["stream_leader"] else None for r in rs])
        lines.append(f"| {used} | {_fmt(_med([r['rate'] for r in rs]))} | "
                     + " | ".join(_fmt(v) for v in gw) + f" | {_fmt(gw_sum)} ({_fmt(gw_main)}) | " + " | ".join(nats_cells)
                     + f" | {_fmt(nats_sum)} | {_fmt(leader)} | {_fmt(_med([r['generator_us_per_msg'] for r in rs]))}"
                     f" | {_fmt(_med([r['host_busy_percent'] for r in rs]))}"
                     f" | {_fmt(_med([r['received'] / r['sent'] if r['sent'] else None for r in rs]), 2)} |")
    return "\n".join(lines)


def _inputs(runs: list[dict[str, Any]], scenario: int, used: int) -> dict[str, float]:
    """The model's inputs, medians of one scenario and gateway count: µs of CPU per message
    of all gateways (g), of their main processes (g_main), of all nats-servers (n), of the
    server leading the queue's stream (l), of the generator, and the rate."""
    rs = [r for r in runs if r["scenario"] == scenario and r["gateways"] == used]
    med = statistics.median
    return {
        "g": med([sum(v or 0 for v in r["us_per_msg"].values() if v is not None) - _nats(r) for r in rs]),
        "g_main": med([sum(v or 0 for v in r["main_us_per_msg"].values()) for r in rs]),
        "n": med([_nats(r) for r in rs]),
        "l": med([r["us_per_msg"][r["stream_leader"]] or 0 for r in rs if r["stream_leader"]] or [0]),
        "gen": med([r["generator_us_per_msg"] or 0 for r in rs]),
        "rate": med([r["rate"] for r in rs]),
    }


def _nats(r: dict[str, Any]) -> float:
    return sum(v or 0 for k, v in r["us_per_msg"].items() if k in r["labels"])


def model(runs: list[dict[str, Any]], scenario: int, cores: int) -> str:
    """Predicted against measured for 2 and 3 gateways (inputs of the 1-gateway runs: the
    same CPU per message whatever the count, so on one machine the same rate), then 10 and
    100 gateways on 3 and 5 nats-servers of ``cores`` cores each (inputs of the largest count)."""
    counts = sorted({r["gateways"] for r in runs if r["scenario"] == scenario})
    base = _inputs(runs, scenario, counts[0])
    out = ["| gateways | g µs/msg, predicted / measured | n µs/msg, predicted / measured | "
           "msg/s, predicted / measured |", "|---:|---:|---:|---:|"]
    for used in counts:
        got = _inputs(runs, scenario, used)
        # One machine: the CPU the run got is shared by all; the same cost a message, the same rate.
        out.append(f"| {used} | {base['g']:.0f} / {got['g']:.0f} | {base['n']:.0f} / {got['n']:.0f} | "
                   f"{base['rate']:,.0f} / {got['rate']:,.0f} |")
    top = _inputs(runs, scenario, counts[-1])
    # g and g_main are summed over the gateways a message passes: G gateways have G x cores
    # for g, and G main processes of at most a core each (the GIL) for g_main.
    per_gw = 1e6 * min(cores / top["g"], 1 / top["g_main"])
    out += ["", f"inputs ({counts[-1]} gateways): g {top['g']:.0f}, g_main {top['g_main']:.0f}, n {top['n']:.0f}, "
            f"l {top['l']:.0f} µs/msg; {cores} cores a machine",
            "| gateways | NATS servers | gateways' ceiling msg/s | NATS ceiling msg/s | one queue's ceiling msg/s | saturates first |",
            "|---:|---:|---:|---:|---:|---|"]
    for gws in (10, 100):
        for servers in (3, 5):
            t_gw = gws * per_gw
            t_nats = servers * cores * 1e6 / top["n"]
            t_q = 1e6 / top["l"] if top["l"] else float("inf")
            first = "NATS" if t_nats < t_gw else "gateways"
            out.append(f"| {gws} | {servers} | {t_gw:,.0f} | {t_nats:,.0f} | {t_q:,.0f} | {first} |")
    out.append("gateways that saturate the NATS servers: " + ", ".join(
        f"{servers} servers: {servers * cores * 1e6 / top['n'] / per_gw:.1f}" for servers in (3, 5))
        + f" (one gateway's ceiling {per_gw:,.0f} msg/s)")
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gateways", default="1,2,3", help="gateway counts to measure, comma-separated")
    ap.add_argument("--scenarios", default="1,2", help="perf scenarios: 1 (transient) and/or 2 (persistent, confirms)")
    ap.add_argument("--nats", type=int, default=3, help="nats-server nodes (3: R3 streams)")
    ap.add_argument("--duration", type=float, default=5.0)
    ap.add_argument("--repeat", type=int, default=3, help="rounds; each runs every scenario on every count")
    ap.add_argument("--producers", type=int, default=3)
    ap.add_argument("--consumers", type=int, default=3)
    ap.add_argument("--idle", type=float, default=5.0, help="seconds of the idle measurement (0: none)")
    ap.add_argument("--json", type=Path, help="write every run's figures here")
    ap.add_argument("--cores", type=int, default=2, help="cores a machine in the model of many gateways")
    ap.add_argument("--model-from", type=Path, help="measure nothing: print the model from a --json file")
    args = ap.parse_args()
    if args.model_from:
        saved = json.loads(args.model_from.read_text())["runs"]
        for scenario in sorted({r["scenario"] for r in saved}):
            print(f"\nscenario {scenario}, the model\n{model(saved, scenario, args.cores)}")
        return
    counts = [int(x) for x in args.gateways.split(",")]
    scenarios = [int(x) for x in args.scenarios.split(",")]
    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="bench-scaling-", ignore_cleanup_errors=True) as tmp, \
            NatsCluster(Path(tmp) / "nats", args.nats) as nats:
        gws = [GatewayProcess(tmp, f"gw{i + 1}", nats.store_url, management=False) for i in range(max(counts))]
        try:
            for g in gws:
                _start(g)
            quiet = idle(gws, nats, args.idle) if args.idle else {}
            load = [os.getloadavg()]
            for rep in range(args.repeat):
                for scenario in scenarios:
                    for used in counts:
                        print(f"== round {rep + 1}, scenario {scenario}, {used} gateway(s)", file=sys.stderr, flush=True)
                        r = one_run(scenario, gws, used, nats, args)
                        r["round"] = rep + 1
                        runs.append(r)
                        if args.json:  # after each run, so that a run cut short keeps what it measured
                            args.json.write_text(json.dumps({"idle_ms_per_s": quiet, "load": load, "runs": runs}))
                        print(f"   {r['rate']:,.0f} msg/s, " + ", ".join(
                            f"{k} {v:,.0f}" for k, v in r["us_per_msg"].items() if v is not None) + " µs/msg"
                            + (f"; errors {r['errors']}" if r["errors"] else ""), file=sys.stderr, flush=True)
            load.append(os.getloadavg())
        finally:
            for g in gws:
                g.stop()
    gw_names = [g.name for g in gws]
    nats_names = [s.name for s in nats.servers]
    print(f"\n{args.nats} nats-server nodes (R{min(3, args.nats)} streams), {args.producers} producers and "
          f"{args.consumers} consumers dealt over the gateways in use, {args.duration:g} s runs, medians of "
          f"{args.repeat}; load average {load[0][0]:.2f} before, {load[-1][0]:.2f} after "
          f"(1-min; 5-min {load[0][1]:.2f} / {load[-1][1]:.2f})")
    if quiet:
        print("idle CPU, ms per s: " + ", ".join(f"{k} {v:.1f}" for k, v in quiet.items()))
    for scenario in scenarios:
        print(f"\nscenario {scenario}: {TITLES[scenario]}; S = led the queue's stream, C = its consumer, per round")
        print(table(scenario, runs, gw_names, nats_names))
        print(f"\nthe model\n{model(runs, scenario, args.cores)}")
    if args.json:
        args.json.write_text(json.dumps({"idle_ms_per_s": quiet, "load": load, "runs": runs}, indent=1))


if __name__ == "__main__":
    main()
