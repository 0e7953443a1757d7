"""Issue 14's measurement: perf scenarios 1 and 2 on four brokers in one run.

    .venv/bin/python scripts/bench_cluster.py [--scenarios 1,2] [--duration 5] [--repeat 3]

The four, measured in turn within each repeat (so the machine's load falls on all alike):
RabbitMQ on 127.0.0.1:5672, the gateway on its embedded store, the gateway on JetStream (one
gateway, a local one-node nats-server started for the run), and two gateways on that same
JetStream with the load generator's connections dealt over both (`perf --uri A,B`: with one
producer and one consumer, every message is published through one gateway and delivered
through the other). Prints medians and each one's ratio to RabbitMQ and to the embedded store.

``--baseline DIR`` (a checkout of other code, e.g. ``git worktree add --detach /tmp/base main``)
adds that code's two JetStream rows, on a nats-server of their own, measured in the same
rotation: a before/after within one run, under the same load.

Scenario ``1n`` is scenario 1 with a no-ack consumer, ``7k3`` scenario 7 at 3,000 msg/s
instead of 1,000 (issue 28's aims). Every scenario also reports
``behind``: at the end of the window, the messages sent and not yet received, in seconds of
the window's deliveries (what the consumer owes, the producer's socket buffers included), and
``queued p50/max``: the queue's depth as the broker counts it, sampled every 0.25 s from a
connection of its own, in seconds of the window's deliveries (how far the deliveries are
behind what the broker took in). ``lag`` is the steady state's figure, measured rather than
inferred from the end: each message carries the producer's clock when its socket took it,
the consumer reads that clock off each delivery, and per second of the window the runner
keeps the median and the largest of the deliveries' ages (gateway.perf.runner); ``lag p50``
and ``lag max`` are the largest of those per-second figures from second STEADY_FROM on (the
seconds before it are the consumer's start). Every run also prints a line of its own (to
stderr): the messages received in the window and in all, ``behind``, the per-second lags and
the load average at its end, so a cap (a count stuck at a round number) shows per run.
In a flood most of that lag is not the broker's: while a broker reads no faster than it
delivers, the producer's kernel send buffer (Linux grows it to ``tcp_wmem``'s maximum, 4 MiB)
and the broker's receive buffer hold megabytes of publishes, ~64,000 of 16 B, that count as
sent. ``--sndbuf 65536`` caps the producers' send buffer, so the lag measures the broker.
For the gateways started here, ``gateway CPU`` and ``NATS
CPU`` are µs of CPU per message received (utime + stime of the gateways and their children,
and of the nats-server, over the run, as scripts/bench_scaling.py reads them): on a shared
machine a steadier figure than the rates.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import secrets
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from gateway.perf import runner  # noqa: E402
from gateway.perf.compare import metrics_of  # noqa: E402
from gateway.perf.runner import run  # noqa: E402
from gateway.perf.scenarios import TITLES, scenario_config  # noqa: E402
from tests.support.gateway_procs import GatewayProcess  # noqa: E402
from tests.support.natsd import NatsCluster  # noqa: E402

sys.path.insert(0, os.path.join(ROOT, "scripts"))
from bench_scaling import cpu_seconds  # noqa: E402

RABBITMQ = "amqp://guest:guest@127.0.0.1:5672/%2F"
STEADY_FROM = 3  # the first per-second row counted as steady state (1-based)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scenarios", default="1,2")
    ap.add_argument("--duration", type=float, default=5.0)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--baseline", help="a checkout whose JetStream gateways are measured too")
    ap.add_argument("--sndbuf", type=int, default=0,
                    help="the producers' kernel send buffer in bytes (0: the system's); see the docstring")
    ap.add_argument("--only", help="measure only the targets whose name contains one of these (comma-separated)")
    args = ap.parse_args()
    scenarios = args.scenarios.split(",")
    # A stopped gateway's audit child may still be finishing its directory when it is removed.
    with tempfile.TemporaryDirectory(prefix="bench-cluster-", ignore_cleanup_errors=True) as tmp:
        root = Path(tmp)
        with contextlib.ExitStack() as stack:
            nats = stack.enter_context(NatsCluster(root / "nats", size=1))
            procs = [GatewayProcess(root, "embedded", management=False),
                     GatewayProcess(root, "js1", nats.store_url, management=False),
                     GatewayProcess(root, "js2", nats.store_url, management=False)]
            if args.baseline:
                base_nats = stack.enter_context(NatsCluster(root / "nats-base", size=1))
                procs += [BaselineGateway(args.baseline, root, f"base{i}", base_nats.store_url, management=False)
                          for i in (1, 2)]
            try:
                for p in procs:
                    p.start()
                embedded, js1, js2 = procs[:3]
                targets = {"RabbitMQ": RABBITMQ, "embedded": embedded.url, "JetStream, 1 gateway": js1.url,
                           "JetStream, 2 gateways": f"{js1.url},{js2.url}"}
                if args.baseline:
                    b1, b2 = procs[3:]
                    targets |= {"baseline JetStream, 1 gateway": b1.url,
                                "baseline JetStream, 2 gateways": f"{b1.url},{b2.url}"}
                nats_pids = [s.proc.pid for s in nats.servers if s.proc is not None]
                gw = {p.name: p.proc.pid for p in procs if p.proc is not None}
                pids = {"embedded": ([gw["embedded"]], []),
                        "JetStream, 1 gateway": ([gw["js1"]], nats_pids),
                        "JetStream, 2 gateways": ([gw["js1"], gw["js2"]], nats_pids)}
                if args.baseline:
                    base_pids = [s.proc.pid for s in base_nats.servers if s.proc is not None]
                    pids |= {"baseline JetStream, 1 gateway": ([gw["base1"]], base_pids),
                             "baseline JetStream, 2 gateways": ([gw["base1"], gw["base2"]], base_pids)}
                if args.only:
                    keep = args.only.split(",")
                    targets = {k: v for k, v in targets.items() if any(w in k for w in keep)}
                for n in scenarios:
                    _scenario(n, targets, args, pids)
            finally:
                for p in procs:
                    p.stop()


class BaselineGateway(GatewayProcess):
    """A gateway of the code in ``code`` (its own package first on the path, not this one)."""

    def __init__(self, code: str, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.code = os.path.abspath(code)

    def command(self) -> list[str]:
        cmd = super().command()
        return ["env", f"PYTHONPATH={self.code}", cmd[0], "-P", *cmd[1:]]


def _config(scenario: str, uri: str, duration: float, sndbuf: int = 0) -> Any:
    if scenario == "1n":
        cfg = replace(scenario_config(1, uri, duration), multi_ack=0)
    elif scenario == "7k3":
        cfg = replace(scenario_config(7, uri, duration), rate=3000.0)
    else:
        cfg = scenario_config(int(scenario), uri, duration)
    return replace(cfg, progress=False, sndbuf=sndbuf)


class _Depth(threading.Thread):
    """The run's queue depth as the broker counts it (a passive declare's message count, from
    a connection of its own), sampled every SAMPLE_S during the window: what the broker
    holds and has not delivered, unlike ``behind``, which counts the producer's socket too."""

    SAMPLE_S = 0.25

    def __init__(self, uri: str, queue: str, duration: float) -> None:
        super().__init__(daemon=True)
        self.uri, self.queue, self.duration = uri.split(",")[-1], queue, duration
        self.samples: list[int] = []

    def run(self) -> None:
        import pika
        end = time.monotonic() + self.duration + 2.0  # the workers' start is a little later
        conn = None
        while time.monotonic() < end:
            try:
                if conn is None or conn.is_closed:
                    conn = pika.BlockingConnection(pika.URLParameters(self.uri))
                ch = conn.channel()
                self.samples.append(ch.queue_declare(self.queue, passive=True).method.message_count)
                ch.close()
            except Exception:  # noqa: BLE001 - not declared yet, or gone: no sample
                pass
            time.sleep(self.SAMPLE_S)
        with contextlib.suppress(Exception):
            if conn is not None:
                conn.close()


def _run(scenario: str, uri: str, duration: float, pids: tuple[list[int], list[int]],
         sndbuf: int = 0) -> tuple[dict[str, Any], list[int], list[float]]:
    """One perf run, with the depth of its (first) queue sampled alongside, and the CPU
    seconds its gateways and its nats-server used (each list of ``pids`` summed)."""
    run_id = secrets.token_hex(4)
    runner.secrets = SimpleNamespace(token_hex=lambda _n: run_id)  # type: ignore[assignment]
    depth = _Depth(uri, f"perf-{run_id}-q0", duration)
    before = [sum(cpu_seconds(p) for p in group) for group in pids]
    depth.start()
    try:
        result = run(_config(scenario, uri, duration, sndbuf), None)
    finally:
        runner.secrets = secrets
    depth.join()
    used = [sum(cpu_seconds(p) for p in group) - b for group, b in zip(pids, before, strict=True)]
    return result, depth.samples, used


def _behind(result: dict[str, Any]) -> float | None:
    """Seconds of deliveries the consumer owes at the end of the window."""
    rows = result["per_second"]
    sent = sum(r["sent"] for r in rows)
    received = sum(r["received"] for r in rows)
    rate = received / len(rows) if rows else 0
    return max(0, sent - received) / rate if rate else None


def _steady_lag(result: dict[str, Any], key: str) -> float | None:
    """The largest per-second lag (``lag_p50_s`` or ``lag_max_s``) from STEADY_FROM on."""
    got = [r[key] for r in result["per_second"][STEADY_FROM - 1:] if key in r]
    return max(got) if got else None


def _per_run(result: dict[str, Any]) -> str:
    rows = result["per_second"]
    lags = " ".join(f"{r.get('lag_p50_s', 0):.2f}/{r.get('lag_max_s', 0):.2f}" for r in rows)
    behind = _behind(result)
    return (f"   received {result['received']:,} (window {sum(r['received'] for r in rows):,}, "
            f"sent {result['sent']:,}), behind {behind if behind is None else round(behind, 2)} s, "
            f"lag p50/max per second (s): {lags}; load {os.getloadavg()[0]:.1f}")


def _scenario(scenario: str, targets: dict[str, str], args: argparse.Namespace,
              pids: dict[str, tuple[list[int], list[int]]]) -> None:
    n = {"1n": 1, "7k3": 7}.get(scenario) or int(scenario)
    got: dict[str, dict[str, list[float]]] = {name: {} for name in targets}
    units: dict[str, str] = {}
    load_before = os.getloadavg()[0]
    for rep in range(args.repeat):
        for name, uri in targets.items():
            print(f"== scenario {scenario}, {name}, run {rep + 1}", file=sys.stderr, flush=True)
            result, depths, used = _run(scenario, uri, args.duration, pids.get(name, ([], [])), args.sndbuf)
            for e in result["errors"]:
                print(f"   error: {e}", file=sys.stderr)
            print(_per_run(result), file=sys.stderr, flush=True)
            rate = result["rates"]["received"]
            held = [d / rate for d in depths] if rate and depths else []
            metrics = metrics_of(n, result) | {
                "behind": ("s", _behind(result)),
                "lag p50": ("s, largest second", _steady_lag(result, "lag_p50_s")),
                "lag max": ("s, largest second", _steady_lag(result, "lag_max_s")),
                "queued p50": ("s of deliveries", statistics.median(held) if held else None),
                "queued max": ("s of deliveries", max(held) if held else None)}
            # All the window's and the drain's messages: what the run's CPU was spent on.
            got_all = result["received"]
            for metric, group, cpu in (("gateway CPU", pids.get(name, ([], []))[0], used[0]),
                                       ("NATS CPU", pids.get(name, ([], []))[1], used[1])):
                if group and got_all:
                    metrics[metric] = ("µs/msg", cpu / got_all * 1e6)
            for metric, (unit, value) in metrics.items():
                if value is not None:
                    units[metric] = unit
                    got[name].setdefault(metric, []).append(value)
    title = {"1n": TITLES[1] + ", no-ack consumer", "7k3": "latency at a fixed 3,000 msg/s"}.get(scenario, TITLES[n])
    print(f"\nscenario {scenario}: {title} (medians of {args.repeat}, {args.duration:g} s each; "
          f"load average {load_before:.1f} before, {os.getloadavg()[0]:.1f} after)")
    print(f"| metric | {' | '.join(targets)} | ratios to RabbitMQ | ratios to embedded |")
    print("|---|" + "---:|" * (len(targets) + 2))
    for metric, unit in units.items():
        med = {name: statistics.median(v) if (v := got[name].get(metric)) else None for name in targets}
        cells = [f"{m:,.1f}" if m is not None else "-" for m in med.values()]
        rabbit, emb = med.get("RabbitMQ"), med.get("embedded")
        to_r = ", ".join(f"{m / rabbit:.2f}" if m and rabbit else "-" for k, m in med.items() if k != "RabbitMQ")
        to_e = ", ".join(f"{m / emb:.2f}" if m and emb else "-" for k, m in med.items() if "JetStream" in k)
        print(f"| {metric} ({unit}) | {' | '.join(cells)} | {to_r} | {to_e} |", flush=True)


if __name__ == "__main__":
    main()
