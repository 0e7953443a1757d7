"""kill -9 trials on a cluster of gateways: no confirmed message is lost (CL3).

Starts its own three-node NATS JetStream cluster (Debian's nats-server, free loopback ports,
a temporary directory) and two ``cmq-gateway serve --store nats://...`` processes on it. Each
trial declares new durable queues (a short visibility timeout), runs publishers with confirms
and acking consumers through both gateways, kills one of them with SIGKILL at a random moment,
starts it again (same port; its clients reconnect), lets the load go on, then drains every
queue through both gateways and counts:

* lost: confirmed, never acked by a consumer, and not found by the drain (must be 0);
* phantoms: found but never published (must be 0);
* duplicates: found twice by the final drain (reported; an ack lost with the killed gateway
  legitimately brings a message back once, during the load, not in the drain).

Prints one line per trial and a summary line ``total: N trials, ... lost L ...``; exits 1 if
anything was lost or a phantom appeared.

    .venv/bin/python scripts/cluster_trials.py --trials 20 --seconds 8

``--embedded`` runs the same trials on one gateway with the embedded store (killed and
restarted on its data dir): a check of the script itself against the single-node guarantee.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import random
import shutil
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.support import cluster_load  # noqa: E402
from tests.support.gateway_procs import GatewayGroup  # noqa: E402
from tests.support.natsd import NatsCluster  # noqa: E402


async def trial(n: int, gateways: GatewayGroup, args: argparse.Namespace, rng: random.Random) -> cluster_load.Verdict:
    prefix = f"ct{n}x{uuid.uuid4().hex[:6]}"
    queues = [f"{prefix}-q{i}" for i in range(args.queues)]
    urls = gateways_urls = [g.url for g in gateways]
    await cluster_load.declare(urls[0], queues, args.visibility_timeout)
    for url in urls[1:]:
        await cluster_load.wait_seen(url, queues)
    ledger = cluster_load.Ledger()
    victim = rng.randrange(len(gateways))
    kill_after = rng.uniform(0.2, 0.7) * args.seconds

    async def fault() -> None:
        await asyncio.sleep(kill_after)
        gateways[victim].kill9()
        await asyncio.sleep(rng.uniform(0, 1))
        await asyncio.to_thread(gateways[victim].start)

    await cluster_load.run_load(gateways_urls, gateways_urls, queues, ledger, args.seconds, prefix, fault)
    found = await cluster_load.drain(urls, queues, idle=args.visibility_timeout + 3, ledger=ledger)
    v = cluster_load.verdict(ledger, found)
    print(f"trial {n}: killed {gateways[victim].name} at {kill_after:.1f}s; {v.line()}; "
          f"client errors {len(ledger.errors)}; slowest confirm {ledger.slowest_confirm:.1f}s"
          + (f"; LOST {v.lost_ids}" if v.lost else ""), flush=True)
    return v


async def main_async(args: argparse.Namespace) -> int:
    rng = random.Random(args.seed)
    work = Path(tempfile.mkdtemp(prefix="cluster-trials-"))
    cluster = None
    try:
        if args.embedded:
            store = None
            count = 1
        else:
            cluster = await asyncio.to_thread(NatsCluster(work / "nats", args.nats_servers).start)
            store = cluster.store_url
            count = args.gateways
        gateways = GatewayGroup(work / "gateways", store, count, management=False)
        await asyncio.to_thread(gateways.start)
        totals = dict.fromkeys(("published", "confirmed", "acked", "recovered", "lost", "duplicates",
                                "phantoms"), 0)
        failed = 0
        try:
            for n in range(args.trials):
                v = await trial(n, gateways, args, rng)
                for k in totals:
                    totals[k] += getattr(v, k)
                failed += not v.ok
        finally:
            gateways.stop()
        where = "embedded store, 1 gateway" if args.embedded else \
            f"{args.nats_servers} nats servers, {args.gateways} gateways"
        print(f"total: {args.trials} trials, published {totals['published']}, confirmed {totals['confirmed']}, "
              f"acked {totals['acked']}, recovered {totals['recovered']}, lost {totals['lost']}, "
              f"duplicates {totals['duplicates']}, phantoms {totals['phantoms']}; failed trials {failed} "
              f"({where})", flush=True)
        if failed and args.keep:
            keep = Path(args.keep)
            shutil.copytree(work, keep / work.name, dirs_exist_ok=True,
                            ignore=shutil.ignore_patterns("*.blk", "*.idx"))
            print(f"logs kept in {keep / work.name}", flush=True)
        return 1 if failed else 0
    finally:
        if cluster is not None:
            cluster.stop()
        shutil.rmtree(work, ignore_errors=True)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--trials", type=int, default=20)
    p.add_argument("--seconds", type=float, default=8.0, help="load per trial")
    p.add_argument("--gateways", type=int, default=2)
    p.add_argument("--nats-servers", type=int, default=3)
    p.add_argument("--queues", type=int, default=2)
    p.add_argument("--visibility-timeout", type=int, default=2)
    p.add_argument("--seed", type=int, default=int(time.time()))
    p.add_argument("--embedded", action="store_true", help="one gateway on the embedded store")
    p.add_argument("--keep", default="cluster-trials-failed", help="where a failing run's logs go")
    args = p.parse_args()
    # The clients of a killed gateway log every failed reconnect: the ledger counts them instead.
    for name in ("aio_pika", "aiormq"):
        logging.getLogger(name).setLevel(logging.CRITICAL)
    return asyncio.run(main_async(args))


if __name__ == "__main__":
    sys.exit(main())
