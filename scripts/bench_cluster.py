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
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from gateway.perf.compare import metrics_of  # noqa: E402
from gateway.perf.runner import run  # noqa: E402
from gateway.perf.scenarios import TITLES, scenario_config  # noqa: E402
from tests.support.gateway_procs import GatewayProcess  # noqa: E402
from tests.support.natsd import NatsCluster  # noqa: E402

RABBITMQ = "amqp://guest:guest@127.0.0.1:5672/%2F"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scenarios", default="1,2")
    ap.add_argument("--duration", type=float, default=5.0)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--baseline", help="a checkout whose JetStream gateways are measured too")
    ap.add_argument("--only", help="measure only the targets whose name contains one of these (comma-separated)")
    args = ap.parse_args()
    scenarios = [int(s) for s in args.scenarios.split(",")]
    with tempfile.TemporaryDirectory(prefix="bench-cluster-") as tmp:
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
                if args.only:
                    keep = args.only.split(",")
                    targets = {k: v for k, v in targets.items() if any(w in k for w in keep)}
                for n in scenarios:
                    _scenario(n, targets, args)
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


def _scenario(n: int, targets: dict[str, str], args: argparse.Namespace) -> None:
    got: dict[str, dict[str, list[float]]] = {name: {} for name in targets}
    units: dict[str, str] = {}
    for rep in range(args.repeat):
        for name, uri in targets.items():
            print(f"== scenario {n}, {name}, run {rep + 1}", file=sys.stderr, flush=True)
            result = run(replace(scenario_config(n, uri, args.duration), progress=False), None)
            for e in result["errors"]:
                print(f"   error: {e}", file=sys.stderr)
            for metric, (unit, value) in metrics_of(n, result).items():
                if value is not None:
                    units[metric] = unit
                    got[name].setdefault(metric, []).append(value)
    print(f"\nscenario {n}: {TITLES[n]} (medians of {args.repeat}, {args.duration:g} s each)")
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
