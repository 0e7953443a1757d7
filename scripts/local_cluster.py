"""A JetStream cluster and gateways on one machine, as docs/CLUSTER.md's recipe: three
nats-server nodes (routes between them, JetStream on, each its own store directory) and two
gateways on them, every listener on a free loopback port, each gateway with its own data
directory. Prints what to connect to, then runs until Ctrl-C (or SIGTERM) and stops it all.

    .venv/bin/python scripts/local_cluster.py                  # 3 NATS nodes, 2 gateways
    .venv/bin/python scripts/local_cluster.py --gateways 3 --dir /tmp/my-cluster
    .venv/bin/python scripts/local_cluster.py --check          # start, one message across, stop

``--check`` publishes a confirmed persistent message through the first gateway, consumes it
through the second, prints the outcome and stops (exit 0 when the message came across).
The machine's own NATS (4222), RabbitMQ (5672) and Mosquitto (1883) are never touched.
"""

from __future__ import annotations

import argparse
import contextlib
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.support.natsd import NatsCluster, free_ports  # noqa: E402

LISTENERS = ("port", "management-port", "metrics-port", "mqtt-port", "cmq-api-port")


def _cmq_gateway() -> list[str]:
    exe = Path(sys.executable).with_name("cmq-gateway")
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "gateway.cli"]


def _wait_port(port: int, proc: subprocess.Popen[bytes], log: Path, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"gateway exited with {proc.returncode}:\n{log.read_text(errors='replace')[-2000:]}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
            return
        time.sleep(0.2)
    raise TimeoutError(f"gateway not listening on {port} after {timeout:.0f} s")


# Ports handed to the gateways started so far: free_ports releases its sockets, and a gateway
# still starting has not bound its own yet, so the next gateway's pick could be the same port
# (seen in CI: gw1's MQTT port given to gw2's management API, and gw2 never came up).
_GIVEN: set[int] = set()


def _ports(count: int) -> list[int]:
    while True:
        got = free_ports(count)
        if _GIVEN.isdisjoint(got):
            _GIVEN.update(got)
            return got


class Gateway:
    def __init__(self, index: int, root: Path, store: str) -> None:
        self.name = f"gw{index}"
        self.data_dir = root / self.name
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.ports = dict(zip(LISTENERS, _ports(len(LISTENERS)), strict=True))
        self.log = root / f"{self.name}.log"
        args = [*_cmq_gateway(), "serve", "--store", store, "--data-dir", str(self.data_dir),
                "--host", "127.0.0.1"]
        for option, port in self.ports.items():
            args += [f"--{option}", str(port)]
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def describe(self) -> str:
        p = self.ports
        return (f"{self.name}: amqp://guest:guest@127.0.0.1:{p['port']}/  "
                f"management http://127.0.0.1:{p['management-port']}/  "
                f"mqtt 127.0.0.1:{p['mqtt-port']}  CMQ API http://127.0.0.1:{p['cmq-api-port']}  "
                f"data {self.data_dir}")


def _connect(gw: Gateway) -> Any:
    import pika

    deadline = time.monotonic() + 60
    while True:
        try:
            return pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", gw.ports["port"]))
        except pika.exceptions.AMQPConnectionError as e:
            if time.monotonic() > deadline:
                raise
            print(f"{gw.name}: {e!r}, again", file=sys.stderr)
            time.sleep(0.5)


def check(a: Gateway, b: Gateway) -> bool:
    """One confirmed message published through ``a``, consumed through ``b``."""
    import pika

    body = f"across {time.time()}".encode()
    pub = _connect(a)
    try:
        ch = pub.channel()
        ch.queue_declare("local-cluster-check", durable=True)
        ch.confirm_delivery()
        ch.basic_publish("", "local-cluster-check", body, pika.BasicProperties(delivery_mode=2))
    finally:
        pub.close()
    con = _connect(b)
    try:
        ch = con.channel()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            with contextlib.suppress(pika.exceptions.ChannelClosedByBroker):
                method, _props, got = ch.basic_get("local-cluster-check")
                if method is not None:
                    ch.basic_ack(method.delivery_tag)
                    if got == body:
                        print(f"check: a message published through {a.name} was consumed through {b.name}")
                        return True
                continue
            ch = con.channel()  # the declare had not reached b yet (404): look again
            time.sleep(0.2)
    finally:
        con.close()
    print("check: the message did not come across", file=sys.stderr)
    return False


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nats", type=int, default=3, help="NATS servers (default 3)")
    parser.add_argument("--gateways", type=int, default=2, help="gateways (default 2)")
    parser.add_argument("--dir", type=Path, default=None, help="where the servers keep their data "
                        "(default: a new temporary directory, removed at the stop)")
    parser.add_argument("--check", action="store_true", help="one message across the gateways, then stop")
    args = parser.parse_args(argv)
    root = args.dir or Path(tempfile.mkdtemp(prefix="cmq-local-cluster-"))
    root.mkdir(parents=True, exist_ok=True)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    gateways: list[Gateway] = []
    ok = True
    with NatsCluster(root / "nats", args.nats) as cluster:
        try:
            print(f"NATS JetStream: {cluster.store_url} ({args.nats} node{'s' if args.nats > 1 else ''})")
            for i in range(1, args.gateways + 1):
                gateways.append(Gateway(i, root, cluster.store_url))
            for gw in gateways:
                _wait_port(gw.ports["port"], gw.proc, gw.log)
                print(gw.describe())
            if args.check:
                ok = check(gateways[0], gateways[-1])
            else:
                print("Ctrl-C stops the gateways and the NATS servers.")
                stop.wait()
        finally:
            for gw in gateways:
                gw.stop()
    if args.dir is None:
        shutil.rmtree(root, ignore_errors=True)
    print("stopped")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
