"""MQTT fuzzing: random MQTT sessions against one real gateway; never a crash, never an internal
error, and a canary client keeps its latency.

Each session opens a socket to the MQTT port of one ``python -m gateway serve`` subprocess and
sends a random sequence of packets, built byte by byte here: a CONNECT (mostly right, 3.1.1 or
5, with random flags, client ids from a pool of odd ones, wills, user names, and properties),
sometimes garbage or another packet first; then packets of every type (PUBLISH at every QoS
with DUP and RETAIN, the four acknowledgements, SUBSCRIBE with every option bit, UNSUBSCRIBE,
PINGREQ, DISCONNECT, AUTH, a second CONNECT, the server's own CONNACK/SUBACK/UNSUBACK/PINGRESP,
the reserved types 0 and 15) carrying every MQTT 5 property, valid or not for the packet, with
values of the right and the wrong size; and broken packets: wrong fixed-header flags, remaining
lengths that are too long, too short or five bytes, truncated packets, flipped bytes, random
bytes, lengths inside the packet that point past it. Each piece is written whole, or trickled
a few bytes at a time. What the gateway answers is read and counted (DISCONNECT by reason code;
PUBLISHes are acknowledged now and then, PUBRELs completed, as a client would).

A session fails if the gateway answers "internal error" (a DISCONNECT whose reason string says
so), if it logs a traceback, or if the process died. Meanwhile a canary paho-mqtt client
publishes QoS 1 messages to itself: its round trip (PUBLISH to the message coming back) is
measured for ``--canary-seconds`` before the fuzzing and all through it, and the 99th
percentile of both is reported; a canary that loses a message or its connection fails the run.

    .venv/bin/python scripts/fuzz_mqtt.py --sessions 2000 [--seed N] [--nats nats://HOST:PORT | jetstream]
    .venv/bin/python scripts/fuzz_mqtt.py --replay SEED   # one session, its pieces printed

Session i uses the seed ``SEED + i``; a failing session's pieces (hex, with what each is) are
written to ``--keep`` (default ./fuzz-mqtt-failed) with the gateway's log.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import socket
import statistics
import struct
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from pathlib import Path

import paho.mqtt.client as paho
from paho.mqtt.enums import CallbackAPIVersion, MQTTProtocolVersion

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from crash_trials_mqtt import free_port  # noqa: E402
from fuzz_requests import add_after_argument, after_phase, print_after, write_config  # noqa: E402
from fuzz_sessions import log_since  # noqa: E402
from serve_process import NATS_HELP, Served, nats_store  # noqa: E402

from gateway.mqtt import codec as P  # noqa: E402

Piece = tuple[str, bytes]  # what it is, the bytes sent

CLIENT_IDS = ["", "fz", "fz2", "payroll", "|$!=&%~*?'\"()[];", "é", "设备", "a/b", "#", "+", "$SYS", "x" * 300,
              "y" * 2000, "fz\u2603", "amq.gen-x", "mqtt-subscription-fz"]
# Topic names to publish to, then some that are not (wildcards, empty, U+0000).
TOPICS = ["fz/a", "fz/b", "fz/a/b", "fz", "$SYS/x", "a.b", "/", "//", "fz/é", "设备/1", "fz/" + "l" * 300,
          "fz/" + "é" * 200]
BAD_TOPICS = ["#", "+", "fz/+", "fz/#", "", "a\0b"]
FILTERS = ["fz/#", "fz/+", "#", "+/+", "fz/a", "$SYS/#", "fz/#/x", "fz+", "", "$share/g/fz/#", "$share//x",
           "$share/g", "$share/g+/x", "fz/" + "l" * 300, "+/" * 40 + "#", "a.b"]
USERS = [("guest", b"guest"), ("guest", b"wrong"), ("nobody", b"x"), ("/:guest", b"guest"), ("", b""),
         ("nohost:guest", b"guest")]


varint = P._varint  # the codec's: MQTT's variable byte integer


def u16(n: int) -> bytes:
    return struct.pack(">H", n & 0xFFFF)


def mstr(s: str | bytes) -> bytes:
    raw = s.encode("utf-8", "surrogatepass") if isinstance(s, str) else s
    return u16(len(raw)) + raw[:65535]


class Fuzzer:
    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.level = 5
        self.session_level = 5

    # -- values and properties ---------------------------------------------------------------

    def text(self) -> str:
        r = self.rng
        x = r.random()
        if x < 0.75:
            return r.choice(TOPICS)
        if x < 0.8:
            return r.choice(BAD_TOPICS)
        if x < 0.9:
            return "".join(r.choice("ab/+#$.é\u2603 \0") for _ in range(r.randint(0, 20)))
        return "z" * r.choice((0, 255, 256, 1000))

    def prop_value(self, kind: int, anything: bool) -> bytes:
        """A value of the property's type, now and then (``anything``) of another size."""
        r = self.rng
        if anything and r.random() < 0.3:
            return r.randbytes(r.randint(0, 6))  # the wrong size or type
        if kind == 0:  # byte
            return bytes((r.choice((0, 1, 2, 255)),))
        if kind == 1:  # two-byte integer
            return u16(r.choice((0, 1, 2, 16, 17, 100, 65535)))
        if kind == 2:  # four-byte integer
            return struct.pack(">I", r.choice((0, 1, 10, 3600, 0xFFFFFFFF, r.randint(0, 2**32 - 1))))
        if kind == 3:  # variable byte integer
            return varint(r.choice((0, 1, 7, 268_435_455))) if r.random() < 0.9 else b"\xff\xff\xff\xff\x7f"
        if kind == 4:  # UTF-8 string
            return mstr(self.text()) if r.random() < 0.9 else u16(5) + b"\xff\xfe\xed\xa0\x80"
        if kind == 5:  # binary
            return mstr(r.randbytes(r.randint(0, 30)))
        return mstr(self.text()) + mstr(self.text())  # user property

    def properties(self, where: int) -> bytes:
        """A property table for MQTT 5 for a packet of type ``where``: mostly none or some of
        those the packet may carry, else any property (some twice, some unknown ids)."""
        if self.level < 5:
            return b""
        r = self.rng
        parts = []
        allowed = [(i, spec) for i, spec in P.PROPERTIES.items() if spec[0] in P._ALLOWED[where]]
        anything = r.random() < 0.1
        for _ in range(r.choice((0, 0, 0, 1, 1, 2, 3, 6))):
            if anything and r.random() < 0.1:
                ident = r.choice((0x00, 0x04, 0x7F, 0x80, 0xFF))
                parts.append(varint(ident) + r.randbytes(r.randint(0, 4)))
                continue
            ident, (_name, kind) = r.choice(list(P.PROPERTIES.items()) if anything else allowed)
            parts.append(varint(ident) + self.prop_value(kind, anything))
        body = b"".join(parts)
        n = len(body)
        if r.random() < 0.05:
            n = r.choice((n + 1, n + 100, max(0, n - 1)))  # a table length that is wrong
        return varint(n) + body

    # -- packets ------------------------------------------------------------------------------

    def packet(self, kind: int, flags: int, body: bytes) -> bytes:
        r = self.rng
        if r.random() < 0.03:
            flags = r.randint(0, 15)  # reserved flags wrong
        return bytes(((kind << 4) | flags,)) + varint(len(body)) + body

    def connect(self) -> Piece:
        """Mostly a CONNECT that logs in (so that the packets after it reach the session),
        else one fuzzed in every field."""
        r = self.rng
        if r.random() < 0.8:
            self.level = r.choice((4, 5))
            client_id = r.choice(CLIENT_IDS)
            props: dict[str, object] = {}
            if self.level == 5:
                props = r.choice(({}, {"session_expiry": 60}, {"receive_maximum": 2, "maximum_packet_size": 500},
                                  {"topic_alias_maximum": 3, "request_problem_info": 0}))
            will = P.Will(r.choice(TOPICS[:4]), b"will", r.choice((0, 1, 2)), False) if r.random() < 0.2 else None
            packet = P.Connect(level=self.level, client_id=client_id, clean_start=r.random() < 0.6,
                               keep_alive=r.choice((0, 60)), username="guest", password=b"guest", will=will,
                               properties=props)
            return f"CONNECT v{self.level} {client_id[:20]!r}", P.encode(packet, self.level)
        self.level = r.choice((5, 5, 4, 4, 3, 6, 0))
        name = b"MQTT" if self.level >= 4 else b"MQIsdp"
        if r.random() < 0.03:
            name = r.choice((b"MQTX", b"", b"mqtt"))
        user, password = r.choice(USERS)
        flags = 0x80 | 0x40
        clean = r.random() < 0.6
        flags |= 0x02 if clean else 0
        will = r.random() < 0.2
        if will:
            flags |= 0x04 | (r.choice((0, 1, 2, 3)) << 3) | (0x20 if r.random() < 0.3 else 0)
        if r.random() < 0.05:
            flags = r.randint(0, 255)  # reserved bit, password without user...
        client_id = r.choice(CLIENT_IDS) if r.random() < 0.9 else self.text()
        body = mstr(name) + bytes((self.level, flags)) + u16(r.choice((0, 1, 5, 60, 65535)))
        body += self.properties(1) + mstr(client_id)
        if flags & 0x04:
            body += self.properties(P.WILL) + mstr(self.text()) + mstr(r.randbytes(r.randint(0, 50)))
        if flags & 0x80:
            body += mstr(user)
        if flags & 0x40:
            body += mstr(password)
        return f"CONNECT v{self.level} {client_id[:20]!r} {user!r}", self.packet(1, 0, body)

    def publish(self) -> Piece:
        r = self.rng
        qos = r.choice((0, 1, 1, 2, 2)) if r.random() < 0.97 else 3
        dup, retain = r.random() < 0.1, r.random() < 0.15
        topic = self.text()
        pid = r.choice((1, 2, 3, 65535, r.randint(1, 65535))) if r.random() < 0.97 else 0
        body = mstr(topic) + (u16(pid) if qos else b"") + self.properties(3)
        body += r.randbytes(r.choice((0, 1, 10, 100, 3000)))
        return f"PUBLISH q{qos} {topic[:20]!r} pid {pid}", self.packet(3, (8 if dup else 0) | (qos << 1) | retain, body)

    def ack(self) -> Piece:
        r = self.rng
        kind = r.choice((P.PUBACK, P.PUBREC, P.PUBREL, P.PUBCOMP))
        pid = r.choice((1, 2, 3, 65535, r.randint(1, 65535))) if r.random() < 0.97 else 0
        body = u16(pid)
        if self.level >= 5 and r.random() < 0.5:
            body += bytes((r.choice((0, 0x10, 0x80, 0x92, 0xFF)),))
            if r.random() < 0.5:
                body += self.properties(kind)
        return f"ack {kind} pid {pid}", self.packet(kind, 2 if kind == P.PUBREL else 0, body)

    def subscribe(self) -> Piece:
        r = self.rng
        body = u16(r.choice((1, 2, 65535)) if r.random() < 0.97 else 0) + self.properties(8)
        n = r.choice((1, 1, 2, 3, 20)) if r.random() < 0.97 else 0
        for _ in range(n):
            f = r.choice(FILTERS) if r.random() < 0.8 else self.text()
            opts = r.choice((0, 1, 2, 3)) | (r.choice((0, 4)) if r.random() < 0.2 else 0)
            opts |= (r.choice((0, 8)) if r.random() < 0.2 else 0) | (r.randint(0, 3) << 4 if r.random() < 0.2 else 0)
            if r.random() < 0.05:
                opts = r.randint(0, 255)  # reserved bits, QoS 3
            body += mstr(f) + bytes((opts,))
        return f"SUBSCRIBE {n} filters", self.packet(8, 2, body)

    def unsubscribe(self) -> Piece:
        r = self.rng
        body = u16(r.choice((1, 2)) if r.random() < 0.97 else 0) + self.properties(10)
        for _ in range(r.choice((1, 1, 2)) if r.random() < 0.97 else 0):
            body += mstr(r.choice(FILTERS))
        return "UNSUBSCRIBE", self.packet(10, 2, body)

    def other(self) -> Piece:
        r = self.rng
        kind = r.choice(("pingreq", "pingreqs", "disconnect", "auth", "connect", "connack", "suback", "unsuback",
                         "pingresp", "reserved"))
        if kind == "pingreq":
            return kind, self.packet(12, 0, b"")
        if kind == "pingreqs":
            n = r.choice((10, 100, 10_000))
            return f"{n} PINGREQs", bytes((0xC0, 0)) * n
        if kind == "disconnect":
            body = b"" if r.random() < 0.5 else bytes((r.choice((0, 4, 0x80, 0x8E)),)) + self.properties(14)
            return kind, self.packet(14, 0, body)
        if kind == "auth":
            return kind, self.packet(15, 0, bytes((r.choice((0, 0x18, 0x19)),)) + self.properties(15))
        if kind == "connect":
            level = self.level
            what, data = self.connect()
            self.level = level  # the session goes on by the first one's rules
            return "second " + what, data
        if kind == "connack":
            return kind, self.packet(2, 0, b"\x00\x00" + self.properties(2))
        if kind in ("suback", "unsuback"):
            return kind, self.packet(9 if kind == "suback" else 11, 0, u16(1) + self.properties(9) + b"\x00")
        if kind == "pingresp":
            return kind, self.packet(13, 0, b"")
        return kind, self.packet(0, 0, r.randbytes(r.randint(0, 5)))

    def broken(self) -> Piece:
        r = self.rng
        what, good = r.choice((self.publish, self.subscribe, self.ack, self.unsubscribe))()
        kind = r.choice(("truncated", "flip", "random", "long-length", "short-length", "five-byte-length",
                         "inner-length", "huge-length"))
        if kind == "truncated":
            return f"{what} truncated", good[:r.randrange(1, len(good))]
        if kind == "flip":
            data = bytearray(good)
            i = r.randrange(len(data))
            data[i] ^= 1 << r.randrange(8)
            return f"{what} byte {i} flipped", bytes(data)
        if kind == "random":
            return kind, r.randbytes(r.randint(1, 200))
        body = good[1 + len(varint(len(good) - 1 - 1)):] if len(good) > 2 else b""
        head = good[:1]
        if kind == "long-length":
            return f"{what} length +10", head + varint(len(body) + 10) + body
        if kind == "short-length":
            return f"{what} length -1", head + varint(max(0, len(body) - 1)) + body
        if kind == "five-byte-length":
            return f"{what} five-byte length", head + b"\xff\xff\xff\xff\x7f" + body
        if kind == "huge-length":
            return f"{what} 256 MB announced", head + varint(268_435_455) + body[:100]
        return f"{what} inner length past the end", head + varint(len(body)) + u16(60000) + body[2:]

    def session(self) -> list[Piece]:
        r = self.rng
        pieces: list[Piece] = []
        if r.random() < 0.05:
            pieces.append(r.choice((self.publish, self.subscribe, self.other, self.broken))())
        pieces.append(self.connect())
        self.session_level = self.level  # what the answers are decoded by
        for _ in range(r.randint(0, 25)):
            x = r.random()
            if x < 0.35:
                pieces.append(self.publish())
            elif x < 0.55:
                pieces.append(self.subscribe())
            elif x < 0.7:
                pieces.append(self.ack())
            elif x < 0.78:
                pieces.append(self.unsubscribe())
            elif x < 0.85:
                pieces.append(("pingreq", bytes((0xC0, 0))))
            elif x < 0.93:
                pieces.append(self.other())
            else:
                pieces.append(self.broken())
        return pieces


class Outcome:
    def __init__(self) -> None:
        self.disconnects: Counter[str] = Counter()
        self.internal = 0
        self.unreadable = ""  # what made a packet the gateway sent unreadable
        self.received = bytearray()  # the first 64 KiB the gateway sent


def run_session(port: int, pieces: list[Piece], level: int, timeout: float, rng: random.Random) -> Outcome:
    """Send the pieces (whole or trickled), reading and answering as a client would."""
    outcome = Outcome()
    decoder = P.Decoder()
    decoder.level = level if level in (4, 5) else 4
    sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    closed = False

    decoded, retried, decoder_level = 0, False, decoder.level

    def drain() -> None:
        nonlocal closed, decoder, decoded, retried
        while not closed:
            try:
                chunk = sock.recv(65536)
            except BlockingIOError:
                return
            except OSError:
                chunk = b""
            if not chunk:
                closed = True
                return
            decoder.feed(chunk)
            outcome.received += chunk[:max(0, 65536 - len(outcome.received))]
            while True:
                try:
                    got = decoder.next_packet()
                except P.MalformedPacket as e:
                    if not decoded and not retried:
                        # The CONNACK is in the format of the CONNECT the gateway read: one
                        # it could not take as MQTT 5 is refused in 3.1.1's (and a packet
                        # sent before the CONNECT may have been a CONNECT of the other level).
                        retried = True
                        decoder = P.Decoder()
                        decoder.level = 9 - decoder_level
                        decoder.feed(bytes(outcome.received))
                        continue
                    outcome.unreadable = str(e)
                    closed = True
                    return
                if got is None:
                    break
                decoded += 1
                if isinstance(got, P.Disconnect):
                    outcome.disconnects[f"0x{got.reason_code:02X}"] += 1
                    if "internal" in str(got.properties.get("reason_string", "")):
                        outcome.internal += 1
                elif isinstance(got, P.ConnAck) and got.reason_code:
                    outcome.disconnects[f"connack 0x{got.reason_code:02X}"] += 1
                elif isinstance(got, P.Publish) and got.qos and rng.random() < 0.7:
                    send(P.encode(P.Ack(P.PUBACK if got.qos == 1 else P.PUBREC, got.packet_id), decoder.level))
                elif isinstance(got, P.Ack) and got.kind == P.PUBREL:
                    send(P.encode(P.Ack(P.PUBCOMP, got.packet_id), decoder.level))

    def send(data: bytes) -> None:
        nonlocal closed
        try:
            sock.setblocking(True)
            sock.settimeout(timeout)
            sock.sendall(data)
        except OSError:
            closed = True
        finally:
            sock.setblocking(False)

    try:
        sock.setblocking(False)
        for _, data in pieces:
            if rng.random() < 0.15 and len(data) < 5000:  # trickled
                i = 0
                while i < len(data) and not closed:
                    n = rng.randint(1, 8)
                    send(data[i:i + n])
                    i += n
                    time.sleep(rng.choice((0, 0, 0.001, 0.003)))
            else:
                send(data)
            drain()
            if closed:
                break
        deadline = time.monotonic() + 0.2
        while not closed and time.monotonic() < deadline:
            drain()
            time.sleep(0.005)
    finally:
        sock.close()
    return outcome


class Canary:
    """A paho-mqtt client publishing QoS 1 to itself; the round trip of each message."""

    def __init__(self, port: int, interval: float = 0.02) -> None:
        self.topic = f"canary/{uuid.uuid4().hex[:8]}"
        self.interval = interval
        self.samples: list[tuple[float, float]] = []  # (sent at, round trip in seconds)
        self.lost = self.disconnects = 0
        self._sent: dict[bytes, float] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        ready = threading.Event()
        c = self.c = paho.Client(CallbackAPIVersion.VERSION2, client_id=f"canary-{uuid.uuid4().hex[:6]}",
                                 protocol=MQTTProtocolVersion.MQTTv311)
        c.username_pw_set("guest", "guest")
        c.on_connect = lambda *_: c.subscribe(self.topic, qos=1)
        c.on_subscribe = lambda *_: ready.set()
        c.on_message = self._got
        c.on_disconnect = lambda *_: self._disconnected()
        c.connect("127.0.0.1", port, keepalive=30)
        c.loop_start()
        if not ready.wait(30):
            raise RuntimeError("the canary could not subscribe")
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _disconnected(self) -> None:
        if not self._stop.is_set():
            self.disconnects += 1

    def _got(self, _c: object, _u: object, m: paho.MQTTMessage) -> None:
        now = time.monotonic()
        with self._lock:
            sent = self._sent.pop(m.payload, None)
        if sent is not None:
            self.samples.append((sent, now - sent))

    def _run(self) -> None:
        n = 0
        while not self._stop.is_set():
            payload = str(n).encode()
            n += 1
            with self._lock:
                self._sent[payload] = time.monotonic()
            self.c.publish(self.topic, payload, qos=1)
            self._stop.wait(self.interval)

    def between(self, start: float, end: float) -> list[float]:
        return [rtt for sent, rtt in self.samples if start <= sent < end]

    def stop(self) -> None:
        """Once: the fuzz stops it before the after phase, and the end of the run again."""
        if self._stop.is_set():
            return
        time.sleep(2)  # the last ones come back
        self._stop.set()
        self._thread.join(5)
        with self._lock:
            self.lost = sum(1 for sent in self._sent.values() if time.monotonic() - sent > 2)
        self.c.disconnect()
        self.c.loop_stop()


def p99(values: list[float]) -> float:
    return statistics.quantiles(values, n=100)[98] * 1000 if len(values) >= 2 else float("nan")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sessions", type=int, default=500)
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--replay", type=int, default=None, metavar="SEED", help="one session, its pieces printed")
    ap.add_argument("--timeout", type=float, default=10.0, help="socket timeout (hang protection)")
    ap.add_argument("--canary-seconds", type=float, default=10.0, help="the canary's baseline, before the fuzzing")
    ap.add_argument("--keep", default="fuzz-mqtt-failed", help="where a failing session's pieces go")
    ap.add_argument("--progress", type=int, default=200, help="print a line every N sessions")
    ap.add_argument("--nats", default=None, help=NATS_HELP)
    add_after_argument(ap)
    args = ap.parse_args()
    with nats_store(args.nats) as store:
        return fuzz(args, store)


def fuzz(args: argparse.Namespace, store: str | None) -> int:
    seed = args.seed if args.seed is not None else random.randrange(2**32)
    work = Path(tempfile.mkdtemp(prefix="fuzz-mqtt-"))
    port = free_port()
    config = write_config(work / "gateway.yaml")
    gw = Served(work / "data", work / "gateway.log", store=store, config=config, mqtt_port=port, management_port=0,
                cmq_api_port=0)
    after: dict[str, object] = {}
    after_problems: list[str] = []
    disconnects: Counter[str] = Counter()
    kinds: Counter[str] = Counter()
    internal = failures = 0
    log_at = 0
    tracebacks: Counter[str] = Counter()
    sessions = [args.replay] if args.replay is not None else [seed + i for i in range(args.sessions)]
    print(f"fuzz_mqtt: seed {seed}, {len(sessions)} sessions, MQTT on port {port}, store {store or 'embedded'}",
          flush=True)
    canary = Canary(port)
    time.sleep(args.canary_seconds)
    t0 = time.monotonic()
    done = 0
    try:
        for i, s in enumerate(sessions):
            rng = random.Random(s)
            fuzzer = Fuzzer(rng)
            pieces = fuzzer.session()
            level = fuzzer.session_level
            for what, _ in pieces:
                kinds[what.split()[0]] += 1
            if args.replay is not None:
                for what, data in pieces:
                    print(f"  {what}: {data[:200].hex()}{'...' if len(data) > 200 else ''}")
            outcome = run_session(port, pieces, level, args.timeout, rng)
            disconnects.update(outcome.disconnects)
            internal += outcome.internal
            problem = "internal error" if outcome.internal else ""
            if outcome.unreadable:
                problem = problem or f"the gateway sent a packet a client cannot read: {outcome.unreadable}"
            if gw.proc.poll() is not None:
                problem = f"the gateway died (exit {gw.proc.returncode})"
            new, log_at, ends = log_since(gw.log, log_at)
            if "Traceback" in new:
                for end in ends:
                    tracebacks[end[:160]] += 1
                problem = problem or f"a traceback in the gateway's log: {ends[-1][:200] if ends else '?'}"
            done += 1
            if problem:
                failures += 1
                keep = Path(args.keep)
                keep.mkdir(parents=True, exist_ok=True)
                (keep / f"session-{s}.json").write_text(json.dumps(
                    {"seed": s, "problem": problem, "disconnects": dict(outcome.disconnects), "log": new[-20000:],
                     "received": outcome.received.hex(),
                     "pieces": [[what, data[:100_000].hex()] for what, data in pieces]}, indent=1))
                print(f"session {i} (seed {s}): {problem}; pieces in {keep}/session-{s}.json", flush=True)
                if gw.proc.poll() is not None:
                    break
            if args.progress and done % args.progress == 0:
                print(f"  {done} sessions, {time.monotonic() - t0:.0f} s, {failures} failed", flush=True)
        t1 = time.monotonic()
        canary.stop()
        if args.after and gw.proc.poll() is None and args.replay is None:
            gw, after = after_phase(gw, config, after_problems)
    finally:
        crashed = int(gw.proc.poll() is not None)
        canary.stop()
        gw.stop()
    if failures:
        keep = Path(args.keep)
        keep.mkdir(parents=True, exist_ok=True)
        shutil.copy(gw.log, keep / "gateway.log")
    shutil.rmtree(work, ignore_errors=True)
    before, during = canary.between(0, t0), canary.between(t0, t1)
    print(f"sessions {done}, seconds {t1 - t0:.0f}")
    print("pieces by kind: " + ", ".join(f"{k}: {v}" for k, v in sorted(kinds.items())))
    print("answers by code: " + ", ".join(f"{k}: {v}" for k, v in sorted(disconnects.items())))
    for end, n in tracebacks.most_common():
        print(f"traceback x{n}: {end}")
    print(f"canary: {len(before)} round trips before, p99 {p99(before):.1f} ms; {len(during)} during the fuzzing, "
          f"p99 {p99(during):.1f} ms; lost {canary.lost}, disconnects {canary.disconnects}")
    if args.after:
        print_after(after, after_problems)
    print(f"internal errors: {internal}, failed sessions: {failures}, "
          f"tracebacks in the gateway log: {sum(tracebacks.values())}, crashes: {crashed}")
    return 1 if internal or failures or crashed or canary.lost or canary.disconnects or after_problems else 0


if __name__ == "__main__":
    sys.exit(main())
