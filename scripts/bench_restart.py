"""Scenario 6's restart recovery and memory for the gateway (issue 15, targets 2 and 3).

It starts a gateway (`serve --host 127.0.0.1 --port P --management-port off`, a new data dir,
the audit log and /metrics as `serve` has them by default, /metrics on a free port), reads
its idle RSS, publishes --count persistent messages of --size bytes to a durable queue with
gateway.perf.backlog's publisher (confirms), reads the RSS again (RSS per retained message),
then --restarts times: stops the gateway (SIGTERM, a clean shutdown, timed to the exit), starts
it again on the same data dir and polls a passive queue.declare every 50 ms until message_count reaches
--count (time from the new process's start; the median is reported). Finally it drains the
queue with one consumer (prefetch 1000, an ack per 100) and reads the RSS after the drain
(and 2 s later), compared with the idle RSS.

RabbitMQ on this machine is shared and may not be restarted: with --rabbitmq-node the script
starts a RabbitMQ node of its own instead (`rabbitmq-server` with a new node name, free ports
on 127.0.0.1, no plugins, a temporary data dir), publishes the same backlog to it the same
way and times its restarts the same way (stop with `rabbitmqctl stop`, a clean shutdown,
start, poll until message_count is --count), in the same run; the ratio is then measured.
Without it, RabbitMQ's time is --rabbitmq-seconds (issue 15's figure, 6.7 s for 10^6 x 1 KB).

    .venv/bin/python scripts/bench_restart.py [--count 100000] [--size 1024] [--restarts 3]
                                              [--rabbitmq-node] [--change-before-stop] [--no-drain]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench_compare import PY, ROOT, _stop  # noqa: E402
from pamqp import commands  # noqa: E402

from gateway.perf.backlog import _message_count, _publish, broker_rss  # noqa: E402
from gateway.perf.client import AmqpClient, parse_uri  # noqa: E402


def _start_gateway(port: int, data_dir: str, extra: list[str], timeout: float = 600.0) -> subprocess.Popen[bytes]:
    """bench_compare's start, with room for a recovery: returns at "listening on"."""
    cmd = [PY, "-m", "gateway.cli", "serve", "--host", "127.0.0.1", "--port", str(port), "--data-dir", data_dir,
           "--management-port", "off", "--cmq-api-port", "off", "--mqtt-port", "off", *extra]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    assert proc.stderr is not None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        if b"listening on" in line:
            threading.Thread(target=proc.stderr.read, daemon=True).start()  # never a full pipe
            return proc
        if not line and proc.poll() is not None:
            break
    proc.kill()
    raise SystemExit(f"the gateway did not start: {' '.join(cmd)}")


def _timed_stop(proc: subprocess.Popen[bytes]) -> float:
    """bench_compare's stop (SIGTERM, a clean shutdown); returns the seconds to the exit."""
    t0 = time.monotonic()
    _stop(proc)
    return time.monotonic() - t0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


RABBIT_BIN = "/usr/lib/rabbitmq/bin"  # the scripts themselves: /usr/sbin's wrappers switch user


class PrivateRabbit:
    """A RabbitMQ node of this script's own: its name, ports, cookie and data dir."""

    def __init__(self) -> None:
        self.dir = tempfile.mkdtemp(prefix="bench-restart-rabbit-")
        self.port = _free_port()
        self.node = f"benchrestart{os.getpid()}@localhost"
        with open(os.path.join(self.dir, "enabled_plugins"), "w") as f:
            f.write("[].\n")
        with open(os.path.join(self.dir, "rabbitmq.conf"), "w") as f:
            f.write(f"listeners.tcp.1 = 127.0.0.1:{self.port}\nloopback_users = none\n")
        home = os.path.join(self.dir, "home")
        os.makedirs(home)
        self.env = {**os.environ, "HOME": home, "RABBITMQ_NODENAME": self.node,
                    "RABBITMQ_NODE_PORT": str(self.port), "RABBITMQ_DIST_PORT": str(_free_port()),
                    "RABBITMQ_NODE_IP_ADDRESS": "127.0.0.1",
                    "RABBITMQ_MNESIA_BASE": os.path.join(self.dir, "mnesia"),
                    "RABBITMQ_LOG_BASE": os.path.join(self.dir, "log"),
                    "RABBITMQ_ENABLED_PLUGINS_FILE": os.path.join(self.dir, "enabled_plugins"),
                    "RABBITMQ_CONFIG_FILE": os.path.join(self.dir, "rabbitmq"),
                    "RABBITMQ_PID_FILE": os.path.join(self.dir, "pid")}
        self.proc: subprocess.Popen[bytes] | None = None
        self.uri = f"amqp://guest:guest@127.0.0.1:{self.port}/"

    def start(self) -> None:
        self.proc = subprocess.Popen([os.path.join(RABBIT_BIN, "rabbitmq-server")], env=self.env,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)

    def stop(self) -> None:
        subprocess.run([os.path.join(RABBIT_BIN, "rabbitmqctl"), "-n", self.node, "stop"], env=self.env,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=600, check=False)
        if self.proc is not None:
            try:
                self.proc.wait(timeout=120)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            self.proc = None

    def close(self) -> None:
        if self.proc is not None:
            self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)


def _ready(uri: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            asyncio.run(_message_count(uri, "amq.rabbitmq.reply-to-never-there"))
            return
        except Exception as exc:  # not listening yet, or the queue is absent (it is)
            if "NOT_FOUND" in str(exc) or "404" in str(exc):
                return
        time.sleep(0.1)
    raise SystemExit(f"RabbitMQ at {uri} did not start")


def _rabbit_restarts(args: argparse.Namespace, queue: str) -> list[float]:
    """RabbitMQ's restart times for the same backlog, from its own node."""
    rabbit = PrivateRabbit()
    try:
        rabbit.start()
        _ready(rabbit.uri, 120)
        t0 = time.monotonic()
        asyncio.run(_publish(rabbit.uri, queue, args.count, args.size))
        print(f"RabbitMQ: published {args.count:,} x {args.size} B persistent in {time.monotonic() - t0:.1f} s")
        times = []
        for i in range(args.restarts):
            rabbit.stop()
            t1 = time.monotonic()
            rabbit.start()
            recovered = _wait_count(rabbit.uri, queue, args.count, t1, args.timeout)
            times.append(time.monotonic() - t1)
            print(f"RabbitMQ restart {i + 1}: all {recovered:,} messages back after {times[-1]:.2f} s")
        return times
    finally:
        rabbit.close()


async def _drain(uri: str, queue: str, count: int) -> float:
    """Consume ``count`` messages with acks; returns the seconds it took."""
    client = await AmqpClient.connect(parse_uri(uri))
    done = asyncio.Event()
    got = 0
    t0 = time.monotonic()
    try:
        await client.open_channel(1)
        await client.rpc(1, commands.Basic.Qos(prefetch_count=1000), commands.Basic.QosOk)

        def on_delivery(channel: int, tag: int, latency_ns: int) -> None:
            nonlocal got
            got += 1
            if got % 100 == 0 or got >= count:
                client.send_method(1, commands.Basic.Ack(delivery_tag=tag, multiple=True))
            if got >= count:
                done.set()

        client.on_delivery = on_delivery
        await client.rpc(1, commands.Basic.Consume(queue=queue, consumer_tag="drain"), commands.Basic.ConsumeOk)
        await asyncio.wait_for(done.wait(), 3600)
        return time.monotonic() - t0
    finally:
        await client.close()


def _cpu_seconds(pid: int) -> float:
    """The user + system CPU seconds process ``pid`` has used so far."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _wait_count(uri: str, queue: str, count: int, t1: float, timeout: float) -> int:
    recovered = 0
    while time.monotonic() - t1 < timeout:
        try:
            recovered = asyncio.run(_message_count(uri, queue))
        except Exception:
            recovered = 0
        if recovered >= count:
            break
        time.sleep(0.05)
    return recovered


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--count", type=int, default=100_000)
    ap.add_argument("--size", type=int, default=1024)
    ap.add_argument("--port", type=int, default=0, help="0: a free port (never 5672)")
    ap.add_argument("--restarts", type=int, default=3)
    ap.add_argument("--timeout", type=float, default=600.0)
    ap.add_argument("--rabbitmq-seconds", type=float, default=6.7,
                    help="RabbitMQ's restart time for the same backlog (issue 15: 6.7 s at 10^6 x 1 KB)")
    ap.add_argument("--no-drain", action="store_true")
    ap.add_argument("--change-before-stop", action="store_true",
                    help="publish one persistent message to another durable queue before each stop after a "
                         "restart: the store changed, so the stop writes its checkpoint (a restart that changed "
                         "nothing leaves the one it reopened from)")
    ap.add_argument("--rabbitmq-node", action="store_true",
                    help="measure RabbitMQ's restart in this run, on a node of the script's own")
    args = ap.parse_args()
    port = args.port or _free_port()
    extra = ["--metrics-port", "0"]
    uri = f"amqp://guest:guest@127.0.0.1:{port}/"
    queue = "perf-restart-backlog"
    data_dir = tempfile.mkdtemp(prefix="bench-restart-")
    try:
        gw = _start_gateway(port, data_dir, extra)
        try:
            time.sleep(1.0)
            idle = broker_rss(gw.pid, False) or 0
            t0 = time.monotonic()
            asyncio.run(_publish(uri, queue, args.count, args.size))
            print(f"published {args.count:,} x {args.size} B persistent in {time.monotonic() - t0:.1f} s")
            time.sleep(1.0)
            full = broker_rss(gw.pid, False) or 0
        finally:
            published_stop = _timed_stop(gw)
        print(f"stop after publishing: {published_stop:.2f} s (SIGTERM to exit)")
        stops: list[float] = []
        print(f"idle RSS {idle / 2**20:.1f} MiB; after publishing {full / 2**20:.1f} MiB: "
              f"{(full - idle) / args.count:.0f} B per retained message")
        times = []
        listening = []
        for i in range(args.restarts):
            t1 = time.monotonic()
            gw = _start_gateway(port, data_dir, extra)  # returns at "listening on"
            listening.append(time.monotonic() - t1)
            recovered = _wait_count(uri, queue, args.count, t1, args.timeout)
            times.append(time.monotonic() - t1)
            rss = broker_rss(gw.pid, False) or 0
            print(f"restart {i + 1}: listening after {listening[-1]:.2f} s, all {recovered:,} messages back "
                  f"after {times[-1]:.2f} s; RSS {rss / 2**20:.1f} MiB = {(rss - idle) / args.count:.0f} B "
                  "per message over idle")
            if i < args.restarts - 1 or args.no_drain:
                if args.change_before_stop:
                    asyncio.run(_publish(uri, queue + "-change", 1, args.size))
                stops.append(_timed_stop(gw))
                print(f"stop {i + 1}: {stops[-1]:.2f} s (SIGTERM to exit)")
        med = statistics.median(times)
        print(f"restart median of {len(times)}: {med:.2f} s")
        if stops:
            print(f"stop after a restart, median of {len(stops)} (SIGTERM to exit, {args.count:,} messages "
                  f"retained{', one published first' if args.change_before_stop else ''}): "
                  f"{statistics.median(stops):.2f} s")
        if not args.no_drain:
            try:
                cpu0 = _cpu_seconds(gw.pid)
                secs = asyncio.run(_drain(uri, queue, args.count))
                cpu = _cpu_seconds(gw.pid) - cpu0
                after = broker_rss(gw.pid, False) or 0
                time.sleep(2.0)
                later = broker_rss(gw.pid, False) or 0
                print(f"drained in {secs:.1f} s, gateway CPU {cpu:.1f} s; RSS after drain {after / 2**20:.1f} MiB, 2 s later "
                      f"{later / 2**20:.1f} MiB = {later / idle:.2f}x idle ({idle / 2**20:.1f} MiB)")
            finally:
                _stop(gw)
    finally:
        shutil.rmtree(data_dir, ignore_errors=True)
    # After the gateway is gone, so that neither runs while the other is timed.
    rabbit, where = args.rabbitmq_seconds, "issue 15's figure"
    if args.rabbitmq_node:
        rabbit, where = statistics.median(_rabbit_restarts(args, queue)), "measured now, median"
    print(f"gateway restart median {med:.2f} s; RabbitMQ {rabbit:.2f} s ({where}): {med / rabbit:.2f}x")


if __name__ == "__main__":
    main()
