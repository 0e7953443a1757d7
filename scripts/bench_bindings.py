"""One big SUBSCRIBE and many binding keys: what they cost, and whether others wait (SPEC SE5).

    .venv/bin/python scripts/bench_bindings.py [--filters 500,1000,2000,4000,10000] [--keys 4000]
                                               [--timeout 120] [--profile compatible] [--persistent]
                                               [--cprofile FILE]

Starts a fresh ``cmq-gateway serve`` (AMQP and MQTT on free ports, new data dir) and measures:

* MQTT: for each count N, one client sends one SUBSCRIBE of N filters (``bench/N/i/+``, QoS 1)
  and waits for its SUBACK; the time from the write to the SUBACK; then one UNSUBSCRIBE of
  the same N filters, to its UNSUBACK. Meanwhile a second client
  sends a PINGREQ every 10 ms: the longest PINGRESP wait is how long the gateway held everyone
  else (SE5: no single request holds the event loop for more than a few ms per unit of work).
* AMQP: one queue bound to one topic exchange with K binding keys (``k.i.*``), one
  ``queue.bind`` at a time (pika, blocking); the mean cost of the first and of the last 100.

``--cprofile FILE`` runs the gateway under cProfile and writes its profile there on exit.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def start_gateway(data_dir: str, profile: str, cprofile: str | None) -> tuple[subprocess.Popen[str], int, int]:
    run = [sys.executable, *(["-m", "cProfile", "-o", cprofile] if cprofile else []), "-m", "gateway", "serve"]
    proc = subprocess.Popen([*run, "--host", "127.0.0.1", "--port", "0", "--management-port", "off",
                             "--metrics-port", "off", "--mqtt-port", "0", "--cmq-api-port", "off",
                             "--profile", profile, "--data-dir", data_dir],
                            cwd=ROOT, stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None
    amqp = 0
    for line in proc.stderr:
        if m := re.search(r"listening on 127\.0\.0\.1:(\d+)", line):
            amqp = int(m.group(1))
        if m := re.search(r"MQTT on 127\.0\.0\.1:(\d+)", line):
            threading.Thread(target=proc.stderr.read, daemon=True).start()
            return proc, amqp, int(m.group(1))
    raise RuntimeError("the gateway did not start its MQTT listener")


# -- MQTT 3.1.1, by hand: the bench measures the gateway, not a client library ------------------

def _remaining(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n % 128, n // 128
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _string(s: str) -> bytes:
    raw = s.encode()
    return struct.pack("!H", len(raw)) + raw


def connect_packet(client_id: str, keepalive: int = 600, clean: bool = True) -> bytes:
    # user name and password: guest/guest, as a fresh gateway has; clean session or not
    body = (_string("MQTT") + bytes([4, 0xC2 if clean else 0xC0]) + struct.pack("!H", keepalive) + _string(client_id)
            + _string("guest") + _string("guest"))
    return b"\x10" + _remaining(len(body)) + body


def subscribe_packet(pid: int, filters: list[str], qos: int = 1) -> bytes:
    body = struct.pack("!H", pid) + b"".join(_string(f) + bytes([qos]) for f in filters)
    return b"\x82" + _remaining(len(body)) + body


def unsubscribe_packet(pid: int, filters: list[str]) -> bytes:
    body = struct.pack("!H", pid) + b"".join(_string(f) for f in filters)
    return b"\xa2" + _remaining(len(body)) + body


def read_packet(sock: socket.socket) -> tuple[int, bytes]:
    def exactly(n: int) -> bytes:
        buf = b""
        while len(buf) < n:
            chunk = sock.recv(n - len(buf))
            if not chunk:
                raise ConnectionError("the gateway closed the connection")
            buf += chunk
        return buf

    first = exactly(1)[0]
    length, shift = 0, 0
    while True:
        b = exactly(1)[0]
        length |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            break
    return first, exactly(length)


def mqtt_client(port: int, client_id: str, timeout: float, clean: bool = True) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    sock.sendall(connect_packet(client_id, clean=clean))
    kind, body = read_packet(sock)
    if kind >> 4 != 2 or body[1] != 0:
        raise RuntimeError(f"CONNACK refused: {body!r}")
    return sock


class Pinger(threading.Thread):
    """A second client's PINGREQ every 10 ms; the longest wait for its PINGRESP."""

    def __init__(self, port: int, timeout: float) -> None:
        super().__init__(daemon=True)
        self.sock = mqtt_client(port, f"bench-pinger-{os.getpid()}", timeout)
        self.stop = threading.Event()
        self.worst = 0.0
        self.pings = 0

    def run(self) -> None:
        while not self.stop.is_set():
            t0 = time.perf_counter()
            try:
                self.sock.sendall(b"\xc0\x00")
                kind, _ = read_packet(self.sock)
            except OSError:
                return
            assert kind >> 4 == 13
            self.worst = max(self.worst, time.perf_counter() - t0)
            self.pings += 1
            time.sleep(0.01)


def bench_subscribe(port: int, n: int, timeout: float, persistent: bool) -> tuple[float | None, float | None, float, int, int]:
    """(SUBACK seconds or None on timeout, then UNSUBACK seconds for the same filters, worst
    PINGRESP wait over both, pings, granted codes)."""
    filters = [f"bench/{n}/{i}/+" for i in range(n)]
    sock = mqtt_client(port, f"bench-sub-{n}-{os.getpid()}", timeout, clean=not persistent)
    pinger = Pinger(port, timeout)
    pinger.start()
    time.sleep(0.05)
    packet = subscribe_packet(1, filters)
    t0 = time.perf_counter()
    try:
        sock.sendall(packet)
        kind, body = read_packet(sock)
        took: float | None = time.perf_counter() - t0
        assert kind >> 4 == 9, kind
        granted = sum(1 for c in body[2:] if c == 1)
    except TimeoutError:
        took, granted = None, 0
    untook: float | None = None
    if took is not None:
        t0 = time.perf_counter()
        try:
            sock.sendall(unsubscribe_packet(2, filters))
            kind, body = read_packet(sock)
            untook = time.perf_counter() - t0
            assert kind >> 4 == 11, kind
        except TimeoutError:
            pass
    pinger.stop.set()
    pinger.join(timeout)
    for s in (sock, pinger.sock):
        s.close()
    return took, untook, pinger.worst, pinger.pings, granted


def bench_bind(amqp_port: int, keys: int) -> list[float]:
    import pika

    conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", amqp_port, blocked_connection_timeout=600,
                                                             heartbeat=0))
    ch = conn.channel()
    ch.exchange_declare("bench-bindings", "topic", durable=True)
    ch.queue_declare("bench-bindings-q", durable=True)
    times = []
    for i in range(keys):
        t0 = time.perf_counter()
        ch.queue_bind("bench-bindings-q", "bench-bindings", f"k.{i}.*")
        times.append(time.perf_counter() - t0)
    ch.queue_delete("bench-bindings-q")
    conn.close()
    return times


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--filters", default="500,1000,2000,4000,10000")
    ap.add_argument("--keys", type=int, default=4000)
    ap.add_argument("--timeout", type=float, default=120.0, help="per SUBSCRIBE, seconds")
    ap.add_argument("--profile", default="compatible", choices=["compatible", "cmq"])
    ap.add_argument("--persistent", action="store_true",
                    help="the subscriber's session persistent (clean session 0): durable queue and bindings")
    ap.add_argument("--cprofile", default=None, help="run the gateway under cProfile, writing FILE")
    args = ap.parse_args()
    data_dir = tempfile.mkdtemp(prefix="bench-bindings-")
    proc, amqp_port, mqtt_port = start_gateway(data_dir, args.profile, args.cprofile)
    try:
        session = "persistent" if args.persistent else "clean"
        print(f"MQTT: one SUBSCRIBE of N filters (QoS 1), {session} session, {args.profile} profile")
        print(f"{'N':>7} {'SUBACK s':>9} {'granted':>8} {'UNSUBACK s':>11} {'worst ping s':>13} {'pings':>6}")
        for n in (int(x) for x in args.filters.split(",") if x):
            took, untook, worst, pings, granted = bench_subscribe(mqtt_port, n, args.timeout, args.persistent)
            shown, unshown = (f"{t:.3f}" if t is not None else f">{int(args.timeout)}" for t in (took, untook))
            print(f"{n:>7} {shown:>9} {granted:>8} {unshown:>11} {worst:13.3f} {pings:>6}", flush=True)
            if took is None or untook is None:
                break  # the gateway is still busy with it: the next would measure that too
        if args.keys:
            times = bench_bind(amqp_port, args.keys)
            head, tail = times[:100], times[-100:]
            print(f"AMQP: {args.keys} binding keys on one queue: first 100 {1000 * sum(head) / len(head):.2f} ms "
                  f"each, last 100 {1000 * sum(tail) / len(tail):.2f} ms each, total {sum(times):.2f} s")
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            print("the gateway did not stop within 60 s of SIGTERM; killed", flush=True)
            proc.kill()
            proc.wait()
        shutil.rmtree(data_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
