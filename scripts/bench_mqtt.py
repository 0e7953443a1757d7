"""MQTT publish -> deliver throughput and latency: the gateway against Mosquitto, same run.

    .venv/bin/python scripts/bench_mqtt.py [--count 20000] [--size 64] [--window 100] [--mosquitto 1883]

Starts a fresh `cmq-gateway serve` (MQTT on a free port, new data dir, fsync on, audit on as
`serve` defaults), then for QoS 0 and QoS 1 runs one subscriber and one publisher (raw MQTT
3.1.1 clients on asyncio, the gateway's own codec, so the client costs the same on both
sides) against the gateway and against the Mosquitto on 127.0.0.1:1883. A QoS 1 publisher
keeps ``--window`` PUBLISHes unacknowledged; the subscriber acknowledges each delivery. The
payload carries the send time: latency is publish -> delivery at the subscriber. Prints one
Markdown table with msg/s, p50/p99 latency, the gateway/Mosquitto ratio and each broker's CPU
time per message (from /proc: the gateway with its audit writer; Mosquitto found by pgrep),
which depends far less on what else the machine is running than msg/s does.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile
import threading
import time

from gateway.mqtt import codec as P

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_TS = struct.Struct(">q")


class Client:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.dec = P.Decoder()
        self.dec.level = 4

    @classmethod
    async def open(cls, port: int, client_id: str) -> Client:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        c = cls(reader, writer)
        c.writer.write(P.encode(P.Connect(level=4, client_id=client_id, username="guest", password=b"guest"), 4))
        ack = await c.recv()
        assert isinstance(ack, P.ConnAck) and ack.reason_code == 0, ack
        return c

    async def recv(self) -> object:
        while True:
            p = self.dec.next_packet()
            if p is not None:
                return p
            data = await self.reader.read(1 << 16)
            if not data:
                raise ConnectionError("closed")
            self.dec.feed(data)

    def close(self) -> None:
        self.writer.write(P.encode(P.Disconnect(), 4))
        self.writer.close()


async def run(port: int, qos: int, count: int, size: int, window: int, tag: str) -> dict[str, float]:
    topic = f"bench/{tag}/{qos}"
    sub = await Client.open(port, f"bench-sub-{tag}-{qos}")
    sub.writer.write(P.encode(P.Subscribe(1, [(topic, qos)]), 4))
    assert isinstance(await sub.recv(), P.SubAck)
    pub = await Client.open(port, f"bench-pub-{tag}-{qos}")
    latencies: list[int] = []
    done = asyncio.Event()
    pad = b"x" * max(0, size - _TS.size)

    async def consume() -> None:
        while len(latencies) < count:
            p = await sub.recv()
            if isinstance(p, P.Publish):
                latencies.append(time.perf_counter_ns() - _TS.unpack_from(p.payload)[0])
                if p.qos:
                    sub.writer.write(P.encode(P.Ack(P.PUBACK, p.packet_id), 4))
        done.set()

    credit = asyncio.Semaphore(window)

    async def acks() -> None:
        while True:
            p = await pub.recv()
            if isinstance(p, P.Ack):
                credit.release()

    consumer = asyncio.create_task(consume())
    acker = asyncio.create_task(acks()) if qos else None
    start = time.perf_counter()
    for i in range(count):
        if qos:
            await credit.acquire()
        pub.writer.write(P.encode(P.Publish(topic, _TS.pack(time.perf_counter_ns()) + pad, qos,
                                            packet_id=i % 65535 + 1 if qos else 0), 4))
        if i % 64 == 0:
            await pub.writer.drain()
    try:
        await asyncio.wait_for(done.wait(), timeout=120)
    except TimeoutError:
        pass
    elapsed = time.perf_counter() - start
    consumer.cancel()
    if acker is not None:
        acker.cancel()
    pub.close()
    sub.close()
    lat = sorted(latencies)
    pct = (lambda q: lat[min(len(lat) - 1, int(q * len(lat)))] / 1e6) if lat else (lambda q: float("nan"))
    return {"received": len(lat), "rate": len(lat) / elapsed, "p50": pct(0.50), "p99": pct(0.99)}


def cpu_seconds(pid: int | None, children: bool) -> float:
    """User + system CPU of ``pid`` (and its children: the audit writer) from /proc; 0 if unknown."""
    if pid is None:
        return 0.0
    try:
        pids = [pid]
        if children:
            with open(f"/proc/{pid}/task/{pid}/children") as f:
                pids += [int(x) for x in f.read().split()]
        total = 0.0
        for p in pids:
            with open(f"/proc/{p}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        return total
    except (OSError, ValueError):
        return 0.0


def mosquitto_pid() -> int | None:
    try:
        return int(subprocess.check_output(["pgrep", "-x", "mosquitto"], text=True).split()[0])
    except (OSError, subprocess.CalledProcessError, IndexError, ValueError):
        return None


def start_gateway(data_dir: str, *extra: str) -> tuple[subprocess.Popen[str], int]:
    proc = subprocess.Popen([sys.executable, "-m", "gateway", "serve", "--host", "127.0.0.1", "--port", "0",
                             "--management-port", "off", "--metrics-port", "off", "--mqtt-port", "0", "--cmq-api-port", "off",
                             "--data-dir", data_dir, *extra], cwd=ROOT, stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None
    for line in proc.stderr:
        if m := re.search(r"MQTT on 127\.0\.0\.1:(\d+)", line):
            threading.Thread(target=proc.stderr.read, daemon=True).start()
            return proc, int(m.group(1))
    raise RuntimeError("the gateway did not start its MQTT listener")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--count", type=int, default=20000)
    ap.add_argument("--size", type=int, default=64)
    ap.add_argument("--window", type=int, default=100)
    ap.add_argument("--mosquitto", type=int, default=1883)
    ap.add_argument("--config", default=None, help="a gateway config file (e.g. audit events to leave out)")
    args = ap.parse_args()
    data_dir = tempfile.mkdtemp(prefix="bench-mqtt-")
    proc, port = start_gateway(data_dir, *(["--config", args.config] if args.config else []))
    rows = []
    mosq = mosquitto_pid()
    try:
        for qos in (0, 1):
            results = {}
            for name, p, pid in (("gateway", port, proc.pid), ("mosquitto", args.mosquitto, mosq)):
                before = cpu_seconds(pid, name == "gateway")
                results[name] = asyncio.run(run(p, qos, args.count, args.size, args.window, f"{os.getpid()}{name}"))
                results[name]["cpu_us"] = (cpu_seconds(pid, name == "gateway") - before) / args.count * 1e6
            g, m = results["gateway"], results["mosquitto"]
            rows.append(f"| QoS {qos} | {g['rate']:,.0f} | {m['rate']:,.0f} | {g['rate'] / m['rate']:.2f}x "
                        f"| {g['p50']:.1f} / {g['p99']:.1f} | {m['p50']:.1f} / {m['p99']:.1f} "
                        f"| {g['cpu_us']:.1f} | {m['cpu_us']:.1f} "
                        f"| {int(g['received'])}/{args.count} | {int(m['received'])}/{args.count} |")
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        shutil.rmtree(data_dir, ignore_errors=True)
    print(f"{args.count} messages of {args.size} bytes, one publisher, one subscriber, QoS 1 window {args.window}")
    print()
    print("| | gateway msg/s | Mosquitto msg/s | ratio | gateway p50 / p99 ms | Mosquitto p50 / p99 ms "
          "| gateway CPU us/msg | Mosquitto CPU us/msg | gateway received | Mosquitto received |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
