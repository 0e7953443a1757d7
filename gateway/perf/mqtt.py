"""`cmq-gateway perf mqtt`: MQTT publish -> deliver throughput and latency of one broker, or of
two in the same run as ratios (b / a), for any MQTT 3.1.1 broker (Mosquitto included).

    cmq-gateway perf mqtt --uri-a mqtt://guest:guest@127.0.0.1:1883 \\
        --uri-b mqtt://guest:guest@127.0.0.1:1884 --qos 0,1 --count 20000 --repeat 3

Per QoS level and run: one subscriber (clean session, subscribed at that QoS, acknowledging
each QoS 1/2 delivery at once) and one publisher on one topic. A QoS 1/2 publisher keeps at most
``--window`` PUBLISHes unacknowledged (QoS 2: until PUBCOMP); a QoS 0 one writes as fast as its socket takes them (an
overload test: its latencies are mostly time queued in the broker). The payload carries the
send time, so latency is publish -> delivery at the subscriber; the rate is deliveries over
the time from the first PUBLISH to the last delivery (a broker that drops messages, as
Mosquitto does past its ``max_queued_messages``, shows fewer received, not a lower rate).

Both clients run on one asyncio loop in this process, written straight on the socket (a few
bytes templates, the gateway's MQTT decoder), so the client costs the same whichever broker
it measures. The brokers run a, b, a, b... per QoS level, so a machine getting busier or quieter
hurts both alike; each figure is the median of ``--repeat`` runs. ``--broker-pid-a/-b`` add
each broker's CPU time per message (from /proc, with its child processes: the gateway's audit
writer), which depends far less on what else the machine runs than msg/s does.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import struct
import sys
import time
import uuid
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urlsplit

from gateway.mqtt import codec as P

__all__ = ["Target", "compare_mqtt", "mqtt_from_args", "parse_uri", "run_once", "table"]

DEFAULT_URI = "mqtt://guest:guest@127.0.0.1:1883"
_TS = struct.Struct(">q")


@dataclass(frozen=True)
class Target:
    name: str
    host: str
    port: int
    username: str | None
    password: str | None
    pid: int | None = None  # the broker's process: CPU time per message


def parse_uri(name: str, uri: str, pid: int | None = None) -> Target:
    """``mqtt://user:password@host:port`` (port 1883 when left out)."""
    u = urlsplit(uri)
    if u.scheme != "mqtt" or not u.hostname:
        raise ValueError(f"an mqtt://[user:password@]host[:port] URI, not {uri!r}")
    return Target(name, u.hostname, u.port or 1883, unquote(u.username) if u.username is not None else None,
                  unquote(u.password) if u.password is not None else None, pid)


class _Client:
    """A bare MQTT 3.1.1 client: what the measurement needs and nothing more."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.dec = P.Decoder()
        self.dec.level = 4

    @classmethod
    async def open(cls, t: Target, client_id: str, clean: bool = True) -> _Client:
        reader, writer = await asyncio.open_connection(t.host, t.port)
        c = cls(reader, writer)
        password = t.password.encode() if t.password is not None else None
        writer.write(P.encode(P.Connect(level=4, client_id=client_id, clean_start=clean, username=t.username,
                                        password=password), 4))
        ack = await asyncio.wait_for(c.recv(), 10)
        if not isinstance(ack, P.ConnAck) or ack.reason_code:
            raise ConnectionError(f"{t.name} refused the connection: {ack}")
        return c

    async def recv(self) -> Any:
        while True:
            p = self.dec.next_packet()
            if p is not None:
                return p
            data = await self.reader.read(1 << 16)
            if not data:
                raise ConnectionError("closed by the broker")
            self.dec.feed(data)

    def close(self) -> None:
        if not self.writer.is_closing():
            self.writer.write(P.encode(P.Disconnect(), 4))
            self.writer.close()


def cpu_seconds(pid: int | None) -> float:
    """User + system CPU of ``pid`` and its children (the gateway's audit writer) from /proc;
    0 when unknown."""
    if pid is None:
        return 0.0
    try:
        pids = [pid]
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


async def run_once(t: Target, qos: int, count: int, size: int, window: int, drain_timeout: float = 10.0,
                   persistent: bool = False) -> dict[str, float]:
    """One publisher and one subscriber on a fresh topic: msg/s, p50/p99 latency (ms),
    deliveries received, the broker's CPU per message (us, when its pid is known).
    ``persistent``: the subscriber's session is not clean (the gateway's queue is durable, so a
    QoS 1 PUBACK waits for the store's fsync, MQ4); it is cleaned away afterwards."""
    tag = uuid.uuid4().hex[:10]
    topic = f"perf/{tag}/{qos}"
    sub_id = f"perf-sub-{tag}"
    sub = await _Client.open(t, sub_id, clean=not persistent)
    pub: _Client | None = None
    try:
        sub.writer.write(P.encode(P.Subscribe(1, [(topic, qos)]), 4))
        if not isinstance(await asyncio.wait_for(sub.recv(), 10), P.SubAck):
            raise ConnectionError(f"{t.name} did not answer SUBSCRIBE with SUBACK")
        pub = await _Client.open(t, f"perf-pub-{tag}")
        return await _measure(t, sub, pub, topic, qos, count, size, window, drain_timeout)
    finally:
        sub.close()
        if pub is not None:
            pub.close()
        if persistent:
            (await _Client.open(t, sub_id)).close()  # a clean session ends the persistent one


async def _measure(t: Target, sub: _Client, pub: _Client, topic: str, qos: int, count: int, size: int,
                   window: int, drain_timeout: float) -> dict[str, float]:
    latencies: list[int] = []
    done = asyncio.Event()
    clock = time.perf_counter_ns
    unpack = _TS.unpack_from

    last = [0.0]  # when the last delivery came: the rate is not diluted by the wait for a lost one
    acked = [0, 0.0]  # PUBACKs (PUBCOMPs) and when the last came: a broker acknowledging faster
    # than it delivers builds a backlog (the gateway before its flow control, issue 31)

    async def consume() -> None:
        write = sub.writer.write
        while len(latencies) < count:
            p = await sub.recv()
            if type(p) is P.Publish:
                latencies.append(clock() - unpack(p.payload)[0])
                last[0] = time.perf_counter()
                if p.qos:
                    pid = p.packet_id
                    write(bytes((0x40 if p.qos == 1 else 0x50, 2, pid >> 8, pid & 0xFF)))  # PUBACK / PUBREC
            elif type(p) is P.Ack and p.kind == P.PUBREL:
                pid = p.packet_id
                write(bytes((0x70, 2, pid >> 8, pid & 0xFF)))  # PUBCOMP
        done.set()

    credit = asyncio.Semaphore(window)

    async def acks() -> None:
        write = pub.writer.write
        while True:
            p = await pub.recv()
            if type(p) is P.Ack:
                if p.kind == P.PUBREC:
                    pid = p.packet_id
                    write(bytes((0x62, 2, pid >> 8, pid & 0xFF)))  # PUBREL; the credit comes back with PUBCOMP
                else:
                    acked[0] += 1
                    acked[1] = time.perf_counter()
                    credit.release()

    # The PUBLISH as three parts: fixed header and topic, packet id, timestamp + padding.
    body = max(size, _TS.size)
    t_bytes = topic.encode()
    head = P.fixed_header(0x30 | (qos << 1), 2 + len(t_bytes) + (2 if qos else 0) + body) + \
        len(t_bytes).to_bytes(2, "big") + t_bytes
    pad = b"x" * (body - _TS.size)
    pack = _TS.pack
    consumer = asyncio.create_task(consume())
    acker = asyncio.create_task(acks()) if qos else None
    before = cpu_seconds(t.pid)
    start = time.perf_counter()
    write = pub.writer.write
    for i in range(count):
        if qos:
            await credit.acquire()
            pid = i % 65535 + 1
            write(b"".join((head, bytes((pid >> 8, pid & 0xFF)), pack(clock()), pad)))
        else:
            write(head + pack(clock()) + pad)
        if i % 64 == 0:
            await pub.writer.drain()
    seen = -1
    while not done.is_set() and len(latencies) != seen:  # give up once nothing arrives for a while
        seen = len(latencies)
        try:
            await asyncio.wait_for(done.wait(), timeout=drain_timeout)
        except TimeoutError:
            pass
    elapsed = (last[0] or time.perf_counter()) - start
    cpu = cpu_seconds(t.pid) - before
    consumer.cancel()
    if acker is not None:
        acker.cancel()
    out = _figures(latencies, elapsed, cpu, count, t.pid is not None)
    out["ack_rate"] = acked[0] / (acked[1] - start) if acked[0] else float("nan")
    return out


def run_once_paho(t: Target, qos: int, count: int, size: int, window: int, drain_timeout: float = 10.0,
                  persistent: bool = False) -> dict[str, float]:
    """As :func:`run_once` with paho-mqtt clients (each on its own network thread): the next
    PUBLISH goes from the callback of the last one's PUBACK (PUBCOMP), ``window`` in flight.
    paho's own work per message is far above the lean client's, so at high rates it measures
    the client more than the broker: report it beside the lean client, not instead."""
    import threading

    import paho.mqtt.client as paho
    from paho.mqtt.enums import CallbackAPIVersion, MQTTProtocolVersion

    tag = uuid.uuid4().hex[:10]
    topic = f"perf/{tag}/{qos}"
    latencies: list[int] = []
    clock = time.perf_counter_ns
    unpack = _TS.unpack_from
    done, subscribed = threading.Event(), threading.Event()
    last = [0.0]

    def make(client_id: str, clean: bool) -> Any:
        c = paho.Client(CallbackAPIVersion.VERSION2, client_id=client_id, clean_session=clean,
                        protocol=MQTTProtocolVersion.MQTTv311)
        if t.username is not None:
            c.username_pw_set(t.username, t.password)
        c.max_inflight_messages_set(window)
        return c

    def on_message(client: Any, userdata: Any, msg: Any) -> None:
        latencies.append(clock() - unpack(msg.payload)[0])
        last[0] = time.perf_counter()
        if len(latencies) >= count:
            done.set()

    sub_id = f"perf-sub-{tag}"
    sub = make(sub_id, not persistent)
    sub.on_message = on_message
    sub.on_subscribe = lambda *a: subscribed.set()
    sub.connect(t.host, t.port, keepalive=600)
    sub.loop_start()
    pub = make(f"perf-pub-{tag}", True)
    pad = b"x" * (max(size, _TS.size) - _TS.size)
    sent = [0]
    lock = threading.Lock()

    def publish_next() -> None:
        with lock:
            if sent[0] >= count:
                return
            sent[0] += 1
        pub.publish(topic, _TS.pack(clock()) + pad, qos=qos)

    pub.on_publish = lambda *a: publish_next() if qos else None
    try:
        sub.subscribe(topic, qos)
        if not subscribed.wait(10):
            raise ConnectionError(f"{t.name} did not answer SUBSCRIBE")
        pub.connect(t.host, t.port, keepalive=600)
        pub.loop_start()
        before = cpu_seconds(t.pid)
        start = time.perf_counter()
        if qos:
            for _ in range(min(window, count)):
                publish_next()
        else:
            for _ in range(count):
                publish_next()
        seen = -1
        while not done.is_set() and len(latencies) != seen:
            seen = len(latencies)
            done.wait(drain_timeout)
        elapsed = (last[0] or time.perf_counter()) - start
        cpu = cpu_seconds(t.pid) - before
    finally:
        for c in (pub, sub):
            c.disconnect()
            c.loop_stop()
        if persistent:
            clean = make(sub_id, True)
            clean.connect(t.host, t.port)
            clean.disconnect()
    out = _figures(latencies, elapsed, cpu, count, t.pid is not None)
    out["ack_rate"] = float("nan")  # paho's callbacks: not timed
    return out


def _figures(latencies: list[int], elapsed: float, cpu: float, count: int, cpu_known: bool) -> dict[str, float]:
    lat = sorted(latencies)

    def pct(q: float) -> float:
        return lat[min(len(lat) - 1, int(q * len(lat)))] / 1e6 if lat else float("nan")

    return {"received": len(lat), "rate": len(lat) / elapsed, "p50_ms": pct(0.50), "p99_ms": pct(0.99),
            "cpu_us": cpu / count * 1e6 if cpu_known else float("nan")}


def _median(runs: list[dict[str, float]], key: str) -> float:
    return statistics.median(r[key] for r in runs)


def compare_mqtt(targets: list[Target], qos_levels: list[int], count: int, size: int, window: int,
                 repeat: int, drain_timeout: float = 10.0, progress: Any = None, persistent: bool = False,
                 client: str = "raw") -> dict[str, Any]:
    """Every target per QoS level, alternating, ``repeat`` times: each run's figures and the
    medians."""
    runs: dict[str, dict[str, list[dict[str, float]]]] = {str(q): {t.name: [] for t in targets}
                                                          for q in qos_levels}
    for qos in qos_levels:
        for i in range(repeat):
            for t in targets:
                if client == "paho":
                    r = run_once_paho(t, qos, count, size, window, drain_timeout, persistent)
                else:
                    r = asyncio.run(run_once(t, qos, count, size, window, drain_timeout, persistent))
                runs[str(qos)][t.name].append(r)
                if progress is not None:
                    print(f"QoS {qos} run {i + 1}/{repeat} {t.name}: {r['rate']:,.0f} msg/s, "
                          f"p99 {r['p99_ms']:.1f} ms, {r['received']:.0f}/{count}", file=progress, flush=True)
    medians = {q: {name: {k: _median(rs, k) for k in rs[0]} for name, rs in by.items()} for q, by in runs.items()}
    return {"config": {"brokers": [t.name for t in targets], "qos": qos_levels, "count": count, "size": size,
                       "window": window, "repeat": repeat, "persistent": persistent, "client": client},
            "runs": runs, "medians": medians}


def _fmt(v: float, digits: int) -> str:
    return "-" if v != v else f"{v:,.{digits}f}"  # NaN: not measured


def table(result: dict[str, Any]) -> str:
    """The medians as a Markdown table; with two or three brokers, the ratio of each over the
    first per figure, and with three of the second over the third (msg/s: above 1 is faster;
    latency and CPU: below 1 is better)."""
    cfg = result["config"]
    names: list[str] = cfg["brokers"]
    # Each broker over the first; with a third (a build before a change), the second over it too.
    pairs = [(i, 0) for i in range(1, len(names))] + ([(1, 2)] if len(names) == 3 else [])
    head = "| QoS | figure | " + " | ".join(names) + "".join(f" | {names[i]} / {names[j]}" for i, j in pairs) + " |"
    session = "a persistent" if cfg.get("persistent") else "a clean"
    lines = [f"{cfg['count']} messages of {cfg['size']} bytes, one publisher and one subscriber ({session} "
             f"session), {cfg.get('client', 'raw')} client, QoS 1/2 window {cfg['window']}, median of {cfg['repeat']} run(s) per broker, alternating", "",
             head, "|---|---|" + "---|" * (len(names) + len(pairs))]
    for q, by in result["medians"].items():
        for key, label, digits in (("rate", "msg/s", 0), ("p50_ms", "p50 latency ms", 1),
                                   ("p99_ms", "p99 latency ms", 1), ("cpu_us", "broker CPU us/msg", 1),
                                   ("received", "received", 0), ("ack_rate", "PUBACK/PUBCOMP per s", 0)):
            vals = [by[n].get(key, float("nan")) for n in names]
            if key == "ack_rate" and q == "0":
                continue
            row = f"| {q} | {label} | " + " | ".join(_fmt(v, digits) for v in vals)
            for i, j in pairs:
                a, b = vals[j], vals[i]
                row += f" | {b / a:.2f}x" if a and a == a and b == b and key != "received" else " | "
            lines.append(row + " |")
    return "\n".join(lines)


def _qos_levels(text: str) -> list[int]:
    levels = [int(x) for x in text.split(",") if x.strip()]
    if not levels or any(q not in (0, 1, 2) for q in levels):
        raise argparse.ArgumentTypeError(f"QoS levels 0, 1 and/or 2, comma-separated, not {text!r}")
    return levels


def add_options(p: argparse.ArgumentParser) -> None:
    m = p.add_argument_group("mqtt (brokers are --uri-a and --uri-b, as mqtt://user:password@host:port)")
    m.add_argument("--qos", type=_qos_levels, default="0,1", help="QoS levels to measure, comma-separated")
    m.add_argument("--count", type=int, default=20000, help="messages per run")
    m.add_argument("--window", type=int, default=100, help="QoS 1/2: PUBLISHes in flight, unacknowledged")
    m.add_argument("--persistent-session", action="store_true",
                   help="the subscriber keeps its session (the gateway: a durable queue, PUBACK after fsync)")
    m.add_argument("--uri-c", default=None, help="a third broker (a gateway before a change)")
    m.add_argument("--name-c", default="c")
    m.add_argument("--broker-pid-c", type=int, default=None)
    m.add_argument("--client", choices=("raw", "paho"), default="raw",
                   help="the lean asyncio client of this module, or paho-mqtt")


def mqtt_from_args(args: argparse.Namespace, default_amqp_uri: str) -> int:
    # --uri-a and --name-a default to the AMQP compare's RabbitMQ: here Mosquitto's.
    uri_a = DEFAULT_URI if args.uri_a == default_amqp_uri else args.uri_a
    name_a = "Mosquitto" if args.name_a == "RabbitMQ" and uri_a == DEFAULT_URI else args.name_a
    try:
        targets = [parse_uri(name_a, uri_a, args.broker_pid_a)]
        if args.uri_b:
            targets.append(parse_uri(args.name_b, args.uri_b, args.broker_pid_b))
        if args.uri_c:
            targets.append(parse_uri(args.name_c, args.uri_c, args.broker_pid_c))
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    result = compare_mqtt(targets, args.qos, args.count, args.size, args.window, args.repeat,
                          args.drain_timeout, None if args.quiet else sys.stderr, args.persistent_session,
                          args.client)
    text = table(result)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(text + "\n")
    print(json.dumps(result, indent=2) if args.json else text)
    short = [f"{name} QoS {q}" for q, by in result["medians"].items() for name, r in by.items()
             if r["received"] < args.count]
    for s in short:
        print(f"warning: {s} did not deliver every message", file=sys.stderr)
    return 1 if short else 0
