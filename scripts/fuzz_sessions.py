"""Protocol fuzzing: random AMQP sessions against one real gateway; never 541, never a crash.

Each session opens a socket to one ``python -m gateway serve`` subprocess and sends a random
sequence of frames built with pamqp: the handshake (mostly right, sometimes with random
start-ok / tune-ok / open values or a wrong protocol header), then methods of every class
with random arguments (names from a small pool, so declares, binds, publishes and consumes
meet each other; random field tables, mostly ``x-`` arguments with values of random types),
content headers and bodies in and out of order, heartbeats, and broken frames: truncated,
oversized, with a bad frame end, an unknown type, a flipped byte, random bytes. Between
frames it reads what the gateway answers and counts every connection.close and
channel.close by reply code.

A session fails if the gateway answers 541 (INTERNAL_ERROR: never the answer to what a client
sent), if after the session a well-behaved pika client cannot connect, declare, publish and
consume, or if the gateway process died. The gateway's stderr is scanned for tracebacks too.

    .venv/bin/python scripts/fuzz_sessions.py --sessions 12000 [--seed N] [--nats nats://HOST:PORT | jetstream]
    .venv/bin/python scripts/fuzz_sessions.py --replay SEED   # one session, frames printed

Session i uses the seed ``SEED + i``; a failing session's frames (hex, with what each is) are
written to ``--keep`` (default ./fuzz-sessions-failed) with the gateway's log.
"""

from __future__ import annotations

import argparse
import datetime
import decimal
import json
import logging
import os
import random
import shutil
import socket
import struct
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import pika
from pamqp import base, body, commands, constants, frame, header, heartbeat

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from fuzz_requests import add_after_argument, after_phase, print_after, write_config  # noqa: E402
from serve_process import NATS_HELP, Served, nats_store  # noqa: E402

Frame = tuple[str, bytes]  # what it is, the bytes sent

METHODS = sorted((cls for group in vars(commands).values() if isinstance(group, type)
                  for cls in vars(group).values()
                  if isinstance(cls, type) and issubclass(cls, base.Frame) and cls is not base.Frame),
                 key=lambda c: c.index)
# Methods a client sends: what the gateway's semantics are made of; picked far more often
# than the rest (the server's own methods, which end the connection with 540 or 503).
CLIENT_METHODS = [c for c in METHODS if c.name.split(".")[0] in ("Exchange", "Queue", "Basic", "Tx", "Confirm",
                                                                    "Channel")
                  and not c.name.endswith("Ok") and c.name not in ("Basic.Deliver", "Basic.Return",
                                                                   "Basic.GetEmpty")]
NAMES = ["fz.q", "fz.q2", "fz.x", "fz.topic", "", "amq.direct", "amq.fanout", "amq.topic", "amq.headers",
         "amq.match", "amq.rabbitmq.reply-to", "amq.gen-x", "fz.dlx", "a.b.c", "#", "*.b", "fz.q/%2F"]
KINDS = ["direct", "fanout", "topic", "headers", "x-delayed-message", "", "cmq-topic", "nonsense"]
ARGS = ["x-message-ttl", "x-expires", "x-max-length", "x-max-length-bytes", "x-overflow",
        "x-dead-letter-exchange", "x-dead-letter-routing-key", "x-queue-type", "x-max-priority",
        "x-single-active-consumer", "x-delivery-limit", "x-queue-mode", "x-cmq-visibility-timeout",
        "x-cmq-msg-retention-seconds", "x-cmq-max-msg-size", "x-cmq-max-msg-heap-num",
        "x-cmq-rewind-seconds", "x-cmq-polling-wait-seconds", "x-cmq-dead-letter-queue",
        "x-cmq-max-receive-count", "x-cmq-max-time-to-live", "x-cmq-receive-metadata", "x-match",
        "x-priority", "x-cancel-on-ha-failover", "x-stream-offset", "alternate-exchange", "x-delay",
        "x-cmq-delay-seconds", "x-cmq-tags", "x-cmq-rewind-to", "x-cmq-retry-policy", "x-consumer-timeout"]


class Fuzzer:
    def __init__(self, rng: random.Random) -> None:
        self.rng = rng

    # -- values -----------------------------------------------------------------------------

    def value(self, depth: int = 0) -> object:
        r = self.rng
        choices = [
            lambda: r.choice((0, 1, -1, 2**31 - 1, -(2**31), 2**63 - 1, -(2**63), r.randint(-1000, 100_000))),
            lambda: r.choice((True, False)),
            lambda: self.shortstr(),
            lambda: r.choice((0.0, -1.5, 1e300, float("inf"), float("nan"), r.random() * 1e6)),
            lambda: None,
            lambda: decimal.Decimal(r.choice(("1.5", "-3", "0.001", "12345"))),
            lambda: datetime.datetime.fromtimestamp(r.randint(0, 2**32), tz=datetime.UTC),
            lambda: bytearray(r.randbytes(r.randint(0, 20))),
        ]
        if depth < 3:
            choices += [lambda: self.table(depth + 1), lambda: [self.value(depth + 1) for _ in range(r.randint(0, 4))]]
        return r.choice(choices)()

    def table(self, depth: int = 0) -> dict[str, object]:
        r = self.rng
        keys = [r.choice(ARGS) if r.random() < 0.8 else self.shortstr() for _ in range(r.randint(0, 4))]
        return {k: self.value(depth) for k in keys}

    def shortstr(self) -> str:
        r = self.rng
        x = r.random()
        if x < 0.6:
            return r.choice(NAMES)
        if x < 0.75:
            return r.choice(KINDS)
        if x < 0.85:
            return "".join(r.choice("ab.#*/%\0é\u2603 ") for _ in range(r.randint(0, 40)))
        s = "z" * r.randint(0, 255)
        return s

    def of_type(self, kind: str) -> object:
        r = self.rng
        if kind == "bit":
            return r.random() < 0.3
        if kind == "octet":
            return r.choice((0, 1, 2, 255, r.randint(0, 255)))
        if kind == "short":
            return r.choice((0, 1, 2, 60, 65535, r.randint(0, 65535)))
        if kind == "long":
            return r.choice((0, 1, 4095, 4096, 131072, 2**32 - 1, r.randint(0, 2**32 - 1)))
        if kind == "longlong":
            return r.choice((0, 1, 2, r.randint(0, 100), 2**63 - 1, -1))
        if kind == "shortstr":
            return self.shortstr()
        if kind == "longstr":
            return r.choice(("", "\0guest\0guest", "\0guest\0wrong", "x" * r.randint(0, 300), self.shortstr()))
        if kind == "table":
            return self.table()
        if kind == "timestamp":
            return datetime.datetime.fromtimestamp(r.randint(0, 2**31), tz=datetime.UTC)
        raise ValueError(kind)

    # -- frames -----------------------------------------------------------------------------

    def channel(self) -> int:
        r = self.rng
        x = r.random()
        return 1 if x < 0.9 else 2 if x < 0.95 else r.choice((0, 3, r.randint(0, 65535)))

    def method(self, cls: type[base.Frame], channel: int, **fixed: object) -> Frame:
        unchecked = type(cls.__name__, (cls,), {"validate": lambda self: None})
        m: base.Frame = object.__new__(unchecked)
        for slot in cls.__slots__:
            setattr(m, slot, fixed[slot] if slot in fixed else self.of_type(cls.amqp_type(slot)))
        try:
            data = frame.marshal(m, channel)
        except (TypeError, ValueError, OverflowError, struct.error):
            # A value the encoder cannot write (say a longlong of -1): the defaults instead.
            data = frame.marshal(cls(), channel)
        return f"{cls.name}@{channel} {dict(fixed) if fixed else ''}".strip(), data

    def properties(self) -> commands.Basic.Properties:
        r = self.rng
        props = commands.Basic.Properties()
        for slot in props.__slots__:
            if r.random() < 0.15:
                setattr(props, slot, self.of_type(props.amqp_type(slot)))
        if r.random() < 0.5:
            props.delivery_mode = r.choice((1, 2, 0, 3, 255))
        return props

    def content(self, channel: int) -> list[Frame]:
        """A publish and its content, or pieces of it, in or out of order."""
        r = self.rng
        size = r.choice((0, 1, 10, 1000, 5000, 200_000, r.randint(0, 300)))
        announced = size if r.random() < 0.8 else r.choice((0, size + 1, max(size - 1, 0), 2**63 - 1, 2**40))
        props = self.properties()
        try:
            hdr = frame.marshal(header.ContentHeader(0, announced, props), channel)
        except (TypeError, ValueError, OverflowError, struct.error):
            hdr = frame.marshal(header.ContentHeader(0, announced, commands.Basic.Properties()), channel)
        if r.random() < 0.1:  # another class id, or weight
            hdr = hdr[:7] + struct.pack(">H", r.choice((10, 20, 50, 0, 999))) + hdr[9:]
        payload = r.randbytes(size)
        bodies = [frame.marshal(body.ContentBody(payload[i:i + 4096]), channel) for i in range(0, size, 4096)]
        if size > 0 and r.random() < 0.05:  # one body frame larger than frame_max
            bodies = [frame.marshal(body.ContentBody(payload + b"x" * 140_000), channel)]
        publish = self.method(commands.Basic.Publish, channel, exchange=r.choice(NAMES), routing_key=r.choice(NAMES),
                              mandatory=r.random() < 0.3, immediate=r.random() < 0.05)
        parts: list[Frame] = [publish, (f"header size={announced}@{channel}", hdr)]
        parts += [(f"body {len(b) - 8}@{channel}", b) for b in bodies]
        x = r.random()
        if x < 0.15:
            r.shuffle(parts)
        elif x < 0.3:
            del parts[r.randrange(len(parts))]
        elif x < 0.35 and bodies:
            parts.insert(2, parts[2])  # a body twice
        return parts

    def broken(self) -> Frame:
        r = self.rng
        good = self.method(r.choice(CLIENT_METHODS), self.channel())[1]
        kind = r.choice(("truncated", "bad-end", "oversized", "type", "flip", "random", "heartbeat",
                         "method-id", "short-payload", "trailing"))
        if kind == "truncated":
            return kind, good[:r.randrange(1, len(good))]
        if kind == "bad-end":
            return kind, good[:-1] + bytes([r.choice([b for b in range(256) if b != constants.FRAME_END])])
        if kind == "oversized":
            size = r.choice((131_073, 2**31, 2**32 - 1, 1_000_000))
            return kind, struct.pack(">BHI", 1, 1, size) + r.randbytes(r.randint(0, 64))
        if kind == "type":
            return kind, bytes([r.choice((0, 4, 5, 9, 65, 255))]) + good[1:]
        if kind == "flip":
            i = r.randrange(7, len(good) - 1)
            return kind, good[:i] + bytes([good[i] ^ (1 << r.randrange(8))]) + good[i + 1:]
        if kind == "random":
            return kind, r.randbytes(r.randint(1, 200))
        if kind == "heartbeat":
            return kind, struct.pack(">BHI", 8, r.choice((0, 1, 7)), r.choice((0, 0, 4))) + b"\0" * 0 + b"\xce"
        if kind == "method-id":
            ids = struct.pack(">HH", r.choice((10, 20, 40, 50, 60, 85, 90, 999)), r.randint(0, 200))
            payload = ids + r.randbytes(r.randint(0, 30))
            return kind, struct.pack(">BHI", 1, 1, len(payload)) + payload + b"\xce"
        payload = good[7:-1]
        if kind == "short-payload":
            payload = payload[:r.randint(4, max(4, len(payload) - 1))]
        else:
            payload += r.randbytes(r.randint(1, 20))
        return kind, good[:3] + struct.pack(">I", len(payload)) + payload + b"\xce"

    def session(self) -> list[Frame]:
        r = self.rng
        frames: list[Frame] = []
        if r.random() < 0.05:
            frames.append(("bad protocol header", r.choice((b"AMQP\x00\x00\x09\x00", b"AMQP\x01\x01\x00\x09",
                                                             b"HTTP/1.1", b"AMQP", r.randbytes(8)))))
        else:
            frames.append(("protocol header", frame.marshal(header.ProtocolHeader(), 0)))
        good = r.random() < 0.9
        props = {"capabilities": {"publisher_confirms": True, "consumer_cancel_notify": True}}
        if good:
            frames.append(self.method(commands.Connection.StartOk, 0, client_properties=props, mechanism="PLAIN",
                                      response="\0guest\0guest", locale="en_US"))
        else:
            frames.append(self.method(commands.Connection.StartOk, 0))
        if r.random() < 0.9:
            frames.append(self.method(commands.Connection.TuneOk, 0, channel_max=2047, frame_max=131072,
                                      heartbeat=0))
        else:
            frames.append(self.method(commands.Connection.TuneOk, 0))
        if r.random() < 0.9:
            frames.append(self.method(commands.Connection.Open, 0, virtual_host="/", capabilities="", insist=False))
        else:
            frames.append(self.method(commands.Connection.Open, 0))
        if r.random() < 0.85:
            frames.append(self.method(commands.Channel.Open, 1, out_of_band=""))
        if r.random() < 0.5:
            frames.append(self.method(commands.Channel.Open, 2, out_of_band=""))
        if r.random() < 0.3:
            frames.append(self.method(commands.Confirm.Select, 1, nowait=False))
        # Half the sessions break no frame, so that they reach deep into the broker.
        dirty = r.random() < 0.5
        for _ in range(r.randint(1, 40)):
            x = r.random() if dirty else r.random() * 0.83
            if x < 0.55:
                frames.append(self.method(r.choice(CLIENT_METHODS), self.channel()))
            elif x < 0.6:
                frames.append(self.method(r.choice(METHODS), self.channel()))
            elif x < 0.8:
                frames += self.content(self.channel())
            elif x < 0.83:
                frames.append(("heartbeat", frame.marshal(heartbeat.Heartbeat(), 0)))
            else:
                frames.append(self.broken())
        if r.random() < 0.5:
            frames.append(self.method(commands.Connection.Close, 0, reply_code=200, reply_text="bye", class_id=0,
                                      method_id=0))
        return frames


class Outcome:
    def __init__(self) -> None:
        self.closes: Counter[str] = Counter()  # "connection 501", "channel 406"
        self.internal = 0
        self.closed_channels: list[int] = []  # channel.close from the gateway, not yet answered
        self.deliveries: list[tuple[int, int]] = []  # (channel, delivery tag) not yet answered


def read_frames(buf: bytearray, outcome: Outcome) -> None:
    """Parse complete frames off ``buf``, counting closes."""
    while len(buf) >= 8:
        if buf[:4] == b"AMQP":  # the gateway's own protocol header: it refuses ours
            outcome.closes["protocol header"] += 1
            del buf[:8]
            continue
        size = struct.unpack_from(">I", buf, 3)[0]
        if len(buf) < size + 8:
            return
        try:
            _, channel, value = frame.unmarshal(bytes(buf[:size + 8]))
        except Exception as e:  # the gateway sent something pamqp cannot read: worth a look
            outcome.closes[f"unreadable frame {e.__class__.__name__}"] += 1
            channel, value = 0, None
        del buf[:size + 8]
        if isinstance(value, commands.Channel.Close):
            outcome.closed_channels.append(channel)
        elif isinstance(value, (commands.Basic.Deliver, commands.Basic.GetOk)):
            outcome.deliveries.append((channel, value.delivery_tag or 0))
        if isinstance(value, (commands.Connection.Close, commands.Channel.Close)):
            scope = "connection" if isinstance(value, commands.Connection.Close) else "channel"
            outcome.closes[f"{scope} {value.reply_code}"] += 1
            if value.reply_code == 541 or "INTERNAL_ERROR" in (value.reply_text or ""):
                outcome.internal += 1


def reactions(rng: random.Random, outcome: Outcome) -> list[bytes]:
    """What a client does about what the gateway sent: close-ok for a channel.close (and,
    mostly, the channel opened again), and an ack, nack or reject for some deliveries."""
    out = []
    for channel in outcome.closed_channels:
        out.append(frame.marshal(commands.Channel.CloseOk(), channel))
        if rng.random() < 0.8:
            out.append(frame.marshal(commands.Channel.Open(), channel))
    outcome.closed_channels.clear()
    for channel, tag in outcome.deliveries:
        x = rng.random()
        if x < 0.4:
            out.append(frame.marshal(commands.Basic.Ack(tag, multiple=rng.random() < 0.2), channel))
        elif x < 0.5:
            out.append(frame.marshal(commands.Basic.Nack(tag, multiple=rng.random() < 0.2,
                                                         requeue=rng.random() < 0.5), channel))
        elif x < 0.6:
            out.append(frame.marshal(commands.Basic.Reject(tag, requeue=rng.random() < 0.5), channel))
    outcome.deliveries.clear()
    return out


def run_session(port: int, frames: list[Frame], timeout: float, rng: random.Random) -> Outcome:
    outcome = Outcome()
    buf = bytearray()
    sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    try:
        sock.setblocking(False)
        closed = False

        def drain(wait: float) -> None:
            nonlocal closed
            deadline = time.monotonic() + wait
            while not closed:
                try:
                    chunk = sock.recv(65536)
                except BlockingIOError:
                    if time.monotonic() >= deadline:
                        return
                    time.sleep(0.002)
                    continue
                except OSError:
                    chunk = b""
                if not chunk:
                    closed = True
                    break
                buf.extend(chunk)
                read_frames(buf, outcome)

        for _, data in frames:
            sock.settimeout(timeout)
            try:
                sock.sendall(data + b"".join(reactions(rng, outcome)))
            except OSError:
                break
            sock.setblocking(False)
            drain(0)
            if closed:
                break
        drain(0.3)  # what the last frames caused
    finally:
        sock.close()
    read_frames(buf, outcome)
    return outcome


def well_behaved(port: int, n: int) -> None:
    """pika connects, declares, publishes and consumes; raises otherwise."""
    params = pika.ConnectionParameters("127.0.0.1", port, credentials=pika.PlainCredentials("guest", "guest"),
                                       socket_timeout=15, blocked_connection_timeout=15, connection_attempts=1)
    conn = pika.BlockingConnection(params)
    try:
        ch = conn.channel()
        ch.confirm_delivery()
        queue = ch.queue_declare("", exclusive=True).method.queue
        token = f"check-{n}".encode()
        ch.basic_publish("", queue, token, pika.BasicProperties(delivery_mode=2))
        for method, _props, got in ch.consume(queue, inactivity_timeout=15):
            if method is None:
                raise AssertionError("the check message never came")
            ch.basic_ack(method.delivery_tag)
            if got != token:
                raise AssertionError(f"the check consumed {got!r}, not {token!r}")
            break
        ch.cancel()
    finally:
        conn.close()


def log_since(log: Path, at: int) -> tuple[str, int, list[str]]:
    """What the gateway wrote to ``log`` since offset ``at``, the new offset, and the last line of
    each traceback in it (the exception that ended it), for the fuzzers' checks."""
    with open(log, errors="replace") as f:
        f.seek(at)
        new = f.read()
        at = f.tell()
    ends = [line for line in new.splitlines() if line and not line.startswith((" ", "Traceback"))
            and ":" in line and line.split(":")[0].replace(".", "").isidentifier()] if "Traceback" in new else []
    return new, at, ends


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sessions", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--replay", type=int, default=None, metavar="SEED", help="one session, its frames printed")
    ap.add_argument("--timeout", type=float, default=10.0, help="socket timeout (hang protection)")
    ap.add_argument("--keep", default="fuzz-sessions-failed", help="where a failing session's frames go")
    ap.add_argument("--progress", type=int, default=500, help="print a line every N sessions")
    ap.add_argument("--nats", default=None, help=NATS_HELP)
    add_after_argument(ap)
    args = ap.parse_args()
    with nats_store(args.nats) as store:
        return fuzz(args, store)


def fuzz(args: argparse.Namespace, store: str | None) -> int:
    logging.getLogger("pika").setLevel(logging.CRITICAL)
    logging.getLogger("pamqp").setLevel(logging.CRITICAL)  # "Truncating key ..." of long table keys
    seed = args.seed if args.seed is not None else random.randrange(2**32)
    work = Path(tempfile.mkdtemp(prefix="fuzz-sessions-"))
    config = write_config(work / "gateway.yaml")
    gw = Served(work / "data", work / "gateway.log", store=store, config=config, management_port=0, cmq_api_port=0)
    after: dict[str, object] = {}
    after_problems: list[str] = []
    closes: Counter[str] = Counter()
    internal = failures = 0
    log_at = 0  # how much of the gateway's log the sessions before this one account for
    tracebacks: Counter[str] = Counter()  # by the exception that ends each
    sessions = [args.replay] if args.replay is not None else [seed + i for i in range(args.sessions)]
    print(f"fuzz_sessions: seed {seed}, {len(sessions)} sessions, gateway on port {gw.port}, "
          f"store {store or 'embedded'}", flush=True)
    t0 = time.monotonic()
    done = 0
    try:
        for i, s in enumerate(sessions):
            rng = random.Random(s)
            frames = Fuzzer(rng).session()
            if args.replay is not None:
                for what, data in frames:
                    print(f"  {what}: {data.hex()}")
            outcome = run_session(gw.port, frames, args.timeout, rng)
            closes.update(outcome.closes)
            internal += outcome.internal
            problem = "541 INTERNAL_ERROR" if outcome.internal else ""
            if gw.proc.poll() is not None:
                problem = f"the gateway died (exit {gw.proc.returncode})"
            else:
                try:
                    well_behaved(gw.port, i)
                except Exception as e:
                    problem = problem or f"the well-behaved client failed: {e!r}"
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
                    {"seed": s, "problem": problem, "closes": dict(outcome.closes), "log": new[-20000:],
                     "frames": [[what, data.hex()] for what, data in frames]}, indent=1))
                print(f"session {i} (seed {s}): {problem}; frames in {keep}/session-{s}.json", flush=True)
                if gw.proc.poll() is not None:
                    break
            if args.progress and done % args.progress == 0:
                print(f"  {done} sessions, {time.monotonic() - t0:.0f} s, {failures} failed", flush=True)
        if args.after and gw.proc.poll() is None and args.replay is None:
            gw, after = after_phase(gw, config, after_problems)
    finally:
        crashed = int(gw.proc.poll() is not None)  # before the SIGTERM of the end
        gw.stop()
    if failures:
        keep = Path(args.keep)
        keep.mkdir(parents=True, exist_ok=True)
        shutil.copy(gw.log, keep / "gateway.log")
    shutil.rmtree(work, ignore_errors=True)
    print(f"sessions {done}, seconds {time.monotonic() - t0:.0f}")
    print("closes by code: " + ", ".join(f"{k}: {v}" for k, v in sorted(closes.items())))
    for end, n in tracebacks.most_common():
        print(f"traceback x{n}: {end}")
    if args.after:
        print_after(after, after_problems)
    print(f"541: {internal}, failed sessions: {failures}, tracebacks in the gateway log: {sum(tracebacks.values())}, "
          f"crashes: {crashed}")
    return 1 if internal or failures or crashed or after_problems else 0


if __name__ == "__main__":
    sys.exit(main())
