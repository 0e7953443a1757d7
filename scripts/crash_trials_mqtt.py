"""MQTT kill -9 trials: QoS 2 exactly once and QoS 1 at least once across crashes (MQ4, MQ8).

Each trial starts a real ``python -m gateway serve`` on a new data dir (or on a JetStream store,
``--store``), a persistent publisher (clean session 0, ``--window`` QoS 1 or 2 PUBLISHes in
flight, each payload unique) and a persistent subscriber on ``crash/#`` at the same QoS. While
they run the gateway is killed with SIGKILL ``--kills`` times (twice by default) at random
moments and started again on the same data dir and port; both clients reconnect and resend
as MQTT says a client must: the publisher each unacknowledged PUBLISH again with DUP under its
packet identifier and each unanswered PUBREL again; the subscriber keeps, across connections,
the identifiers it sent PUBREC for and takes a PUBLISH under one of them as a resend (MQTT
4.3.3 method B: answered, not delivered again). After the last restart the publisher stops
taking new messages and finishes what it has in flight; the subscriber reads until it is quiet.

Counted, message by message (a message is *taken* once its PUBACK or PUBREC reached the
publisher: from then on the gateway owes its delivery):

* ``lost``: taken and never delivered to the subscriber;
* ``duplicated``: delivered more than once (QoS 2 must have none; QoS 1 may);
* ``reused``: a PUBLISH of a new message under an identifier the subscriber still held from
  another (the subscriber drops it as a resend: a loss the gateway caused, MQ8);
* ``no DUP``: a resend without DUP (QoS 2: a PUBLISH under a held identifier; QoS 1: a second
  copy of a message), and ``unreleased``: a QoS 2 identifier whose PUBREL never came;
* ``unfinished``: published messages never taken (the publisher could not finish);
* ``audit missing`` (A5, counted: an MQTT client never sees a message's msg_id): how many
  fewer messages have a ``publish`` record on the trial's topics, or an ``enqueue`` record into
  the subscriber's queue, than were taken. More is allowed: a PUBLISH whose store write the
  kill took before its PUBREC is recorded, and its resend is a message of its own.

The script exits 1 if anything was lost, reused, unfinished, sent again without DUP, (QoS 2)
duplicated, or short of audit records.

    .venv/bin/python scripts/crash_trials_mqtt.py --qos 2 --trials 20 --seconds 4
    .venv/bin/python scripts/crash_trials_mqtt.py --qos 1 --trials 10 --store jetstream
    .venv/bin/python scripts/crash_trials_mqtt.py --qos 2 --nats nats://127.0.0.1:4222

``--nats`` is ``--store`` as the other scripts spell it. ``--store jetstream`` starts a one-node nats-server (/usr/sbin/nats-server) for the run; a
``nats://`` URL uses that server (each trial's client ids and topics are its own, and its
sessions are cleaned at the end). A failing trial keeps the gateway's logs and a ledger under
``--keep`` (default ./crash-trials-mqtt-failed).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import socket
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

sys.path.insert(0, str(ROOT / "scripts"))

import crash_trials  # noqa: E402
from serve_process import NATS_HELP, Served, log_errors, nats_store  # noqa: E402

from gateway.mqtt import codec as P  # noqa: E402
from gateway.mqtt.session import queue_name  # noqa: E402
from tests.integration.mqtt_client import AsyncRawClient  # noqa: E402

RECONNECT_PAUSE = 0.05  # seconds between connection attempts while the gateway is down
QUIET = 3.0  # seconds without a delivery after which the subscriber is done


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Gateway(Served):
    """A gateway with MQTT on a fixed port (the clients reconnect to it after each restart) and
    a log that each start appends to."""

    def __init__(self, data_dir: Path, mqtt_port: int, log: Path, store: str | None) -> None:
        super().__init__(data_dir, log, store=store, append=True, mqtt_port=mqtt_port,
                         header=f"--- start {time.strftime('%H:%M:%S')} ---\n")


class Link(AsyncRawClient):
    """One MQTT connection on asyncio streams (the tests' raw client, on the gateway's codec)."""

    @classmethod
    async def open(cls, port: int, client_id: str, level: int, clean: bool) -> tuple[Link, P.ConnAck]:
        props = {} if level < 5 or clean else {"session_expiry": 0xFFFFFFFF}
        link, ack = await asyncio.wait_for(cls.connect(port, client_id, level, clean=clean, **props), 30)
        if ack.reason_code:
            link.writer.close()
            raise ConnectionError(f"CONNECT of {client_id} refused: {ack}")
        return link, ack  # type: ignore[return-value]

    async def recv(self, timeout: float | None = None) -> Any:
        packet = await super().recv(timeout)  # type: ignore[arg-type]
        if packet is None:
            raise ConnectionError("closed by the gateway")
        return packet

    def close(self) -> None:
        try:
            super().close()
        except Exception:  # noqa: BLE001 - already gone
            self.writer.close()


async def connect_until_up(port: int, client_id: str, level: int, stop: asyncio.Event) -> tuple[Link, P.ConnAck] | None:
    """Connect (clean session 0), trying again while the gateway is down."""
    while not stop.is_set():
        try:
            return await Link.open(port, client_id, level, clean=False)
        except (OSError, ConnectionError, TimeoutError, AssertionError):  # AssertionError: closed before CONNACK
            await asyncio.sleep(RECONNECT_PAUSE)
    return None


@dataclass
class Ledger:
    published: set[str] = field(default_factory=set)
    taken: set[str] = field(default_factory=set)  # PUBACK / PUBREC came
    completed: set[str] = field(default_factory=set)  # PUBACK / PUBCOMP came
    received: Counter[str] = field(default_factory=Counter)  # delivered to the subscriber
    sends: Counter[str] = field(default_factory=Counter)  # PUBLISHes of it by the publisher
    plain: Counter[str] = field(default_factory=Counter)  # QoS 1 copies delivered without DUP
    # Every copy the subscriber got: payload -> [(its connection, packet id, DUP)]; and each
    # connection's start, seconds into the trial (the ledger of a failing trial shows them).
    copies: dict[str, list[tuple[int, int, bool]]] = field(default_factory=dict)
    sub_connects: list[float] = field(default_factory=list)
    reused: int = 0
    no_dup: int = 0  # QoS 2 (QoS 1: see no_dup_qos1)
    foreign: int = 0  # payloads of no publisher of this trial
    sessions_lost: int = 0  # a reconnect found no session (session present 0)
    connects: int = 0
    last_rx: float = 0.0

    def no_dup_qos1(self) -> int:
        """QoS 1 copies without DUP beyond the publisher's PUBLISHes of the message: each PUBLISH
        the gateway took (a resend after a crash may be taken again) is a message of its own,
        sent first without DUP; any further copy is the gateway's resend, which must set DUP."""
        return sum(max(0, n - self.sends[m]) for m, n in self.plain.items())


class Publisher:
    """QoS 1 or 2, ``window`` in flight; resends per MQTT 4.4 after every reconnect."""

    def __init__(self, name: str, port: int, qos: int, level: int, window: int, ledger: Ledger) -> None:
        self.name, self.port, self.qos, self.level, self.window = name, port, qos, level, window
        self.ledger = ledger
        self.inflight: dict[int, tuple[str, bool]] = {}  # pid -> (payload, PUBREL sent)
        self.seq = 0
        self.next_pid = 1
        self.stopping = False
        self.stop = asyncio.Event()  # give up (the trial's deadline)

    def _pid(self) -> int:
        while self.next_pid in self.inflight:
            self.next_pid = self.next_pid % 65535 + 1
        pid = self.next_pid
        self.next_pid = pid % 65535 + 1
        return pid

    async def run(self, topics: list[str]) -> None:
        rng = random.Random(self.name)
        first = True
        while not self.stop.is_set():
            got = await connect_until_up(self.port, self.name, self.level, self.stop)
            if got is None:
                return
            link, ack = got
            self.ledger.connects += 1
            if not first and not ack.session_present:
                self.ledger.sessions_lost += 1
            first = False
            try:
                for pid, (payload, released) in sorted(self.inflight.items()):
                    if released:
                        link.send(P.Ack(P.PUBREL, pid))
                    else:
                        self.ledger.sends[payload] += 1
                        link.send(P.Publish(rng.choice(topics), payload.encode(), self.qos, dup=True, packet_id=pid))
                while True:
                    while not self.stopping and len(self.inflight) < self.window:
                        pid = self._pid()
                        payload = f"{self.name}-{self.seq}"
                        self.seq += 1
                        self.ledger.published.add(payload)
                        self.ledger.sends[payload] += 1
                        self.inflight[pid] = (payload, False)
                        link.send(P.Publish(rng.choice(topics), payload.encode(), self.qos, packet_id=pid))
                    if self.stopping and not self.inflight:
                        link.close()
                        return
                    await link.writer.drain()
                    self._handle(link, await link.recv())
            except (OSError, ConnectionError, asyncio.IncompleteReadError):
                link.writer.close()

    def _handle(self, link: Link, p: Any) -> None:
        if not isinstance(p, P.Ack):
            return
        entry = self.inflight.get(p.packet_id)
        if p.kind == P.PUBACK and entry is not None and self.qos == 1:
            del self.inflight[p.packet_id]
            self.ledger.taken.add(entry[0])
            self.ledger.completed.add(entry[0])
        elif p.kind == P.PUBREC:
            if entry is not None:
                self.ledger.taken.add(entry[0])
                self.inflight[p.packet_id] = (entry[0], True)
            link.send(P.Ack(P.PUBREL, p.packet_id))
        elif p.kind == P.PUBCOMP and entry is not None and entry[1]:
            del self.inflight[p.packet_id]
            self.ledger.completed.add(entry[0])


class Subscriber:
    """A persistent subscriber to ``crash/#`` that keeps its QoS 2 state across connections."""

    def __init__(self, name: str, port: int, qos: int, level: int, prefix: str, ledger: Ledger) -> None:
        self.name, self.port, self.qos, self.level, self.prefix = name, port, qos, level, prefix
        self.ledger = ledger
        self.held: dict[int, str] = {}  # QoS 2: PUBREC sent, PUBREL awaited: pid -> payload
        self.stop = asyncio.Event()

    async def run(self, subscribed: asyncio.Event) -> None:
        first = True
        while not self.stop.is_set():
            got = await connect_until_up(self.port, self.name, self.level, self.stop)
            if got is None:
                return
            link, ack = got
            self.ledger.connects += 1
            self.ledger.sub_connects.append(time.monotonic())
            try:
                if first:
                    link.send(P.Subscribe(1, [("crash/#", self.qos)]))
                    suback = await link.recv(30)
                    assert isinstance(suback, P.SubAck) and suback.reason_codes == [self.qos], suback
                    first = False
                    subscribed.set()
                elif not ack.session_present:
                    self.ledger.sessions_lost += 1
                while not self.stop.is_set():
                    await link.writer.drain()
                    try:
                        p = await link.recv(0.5)
                    except TimeoutError:
                        continue
                    self._handle(link, p)
                link.close()
            except (OSError, ConnectionError, asyncio.IncompleteReadError):
                link.writer.close()

    def _handle(self, link: Link, p: Any) -> None:
        ledger = self.ledger
        if isinstance(p, P.Ack) and p.kind == P.PUBREL:
            self.held.pop(p.packet_id, None)
            link.send(P.Ack(P.PUBCOMP, p.packet_id))
            return
        if not isinstance(p, P.Publish):
            return
        ledger.last_rx = time.monotonic()
        payload = p.payload.decode()
        ledger.copies.setdefault(payload, []).append((len(ledger.sub_connects), p.packet_id, p.dup))
        if not payload.startswith(self.prefix):
            ledger.foreign += 1
        if p.qos == 2:
            if p.packet_id in self.held:
                # A resend (method B): answered, not delivered again.
                if self.held[p.packet_id] != payload:
                    ledger.reused += 1
                if not p.dup:
                    ledger.no_dup += 1
            else:
                ledger.received[payload] += 1
                self.held[p.packet_id] = payload
            link.send(P.Ack(P.PUBREC, p.packet_id))
            return
        ledger.received[payload] += 1
        if not p.dup:
            ledger.plain[payload] += 1
        if p.qos == 1:
            link.send(P.Ack(P.PUBACK, p.packet_id))


@dataclass
class Result:
    trial: int
    qos: int
    kills: list[float]
    published: int
    taken: int
    completed: int
    delivered: int
    lost: int
    duplicated: int
    reused: int
    no_dup: int
    unreleased: int
    unfinished: int
    sessions_lost: int
    foreign: int
    # A5, counted (an MQTT client never sees a message's msg_id): the messages with a publish
    # record on the trial's topics and with an enqueue record into the subscriber's queue,
    # and how many fewer of either there are than messages the gateway took.
    audit_published: int = 0
    audit_enqueued: int = 0
    audit_missing: int = 0
    log_errors: int = 0  # tracebacks and ERROR lines in the gateway's log (counted, not failed on)

    def ok(self) -> bool:
        bad = (self.lost or self.reused or self.no_dup or self.unfinished or self.sessions_lost or self.foreign
               or self.audit_missing)
        return not bad and not (self.qos == 2 and (self.duplicated or self.unreleased))


async def forget_sessions(port: int, names: list[str], level: int) -> None:
    """Clean sessions for the trial's client ids: their queues go (a shared JetStream store)."""
    for name in names:
        link, _ = await Link.open(port, name, level, clean=True)
        link.close()


async def trial_load(trial: int, args: argparse.Namespace, rng: random.Random, work: Path, port: int,
                     store: str | None) -> tuple[Ledger, list[float], set[int]]:
    ledger = Ledger()
    prefix = f"{args.run}-t{trial}-"
    pub = Publisher(f"{prefix}pub", port, args.qos, args.level, args.window, ledger)
    sub = Subscriber(f"{prefix}sub", port, args.qos, args.level, prefix, ledger)
    gw = Gateway(work / "data", port, work / "gateway.log", store)
    kills: list[float] = []
    try:
        subscribed = asyncio.Event()
        sub_task = asyncio.ensure_future(sub.run(subscribed))
        await asyncio.wait_for(subscribed.wait(), 60)
        topics = [f"crash/t{trial}/{k}" for k in range(4)]
        pub_task = asyncio.ensure_future(pub.run(topics))
        t0 = time.monotonic()
        for _ in range(args.kills):
            await asyncio.sleep(rng.uniform(0.2, 1.0) * args.seconds)
            gw.kill9()
            kills.append(round(time.monotonic() - t0, 2))
            gw = await asyncio.get_running_loop().run_in_executor(
                None, Gateway, work / "data", port, work / "gateway.log", store)
        await asyncio.sleep(rng.uniform(0.2, 1.0) * args.seconds)
        pub.stopping = True
        deadline = time.monotonic() + args.finish_seconds
        while not pub_task.done() and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        pub.stop.set()
        while time.monotonic() < deadline:
            missing = ledger.taken - set(ledger.received)
            quiet = time.monotonic() - ledger.last_rx > QUIET
            if quiet and (not missing and not sub.held or time.monotonic() - ledger.last_rx > args.settle_seconds):
                break
            await asyncio.sleep(0.2)
        sub.stop.set()
        await asyncio.gather(pub_task, sub_task, return_exceptions=True)
        if store:
            await forget_sessions(port, [pub.name, sub.name], args.level)
    finally:
        gw.stop()
    return ledger, kills, set(sub.held)


def audit_counts(audit_dir: Path, trial: int, queue: str) -> tuple[int, int]:
    """The msg_ids with a publish record on crash/t<trial>/..., and with an enqueue record into
    ``queue`` (every whole line of every segment of the trial's gateway)."""
    published: set[str] = set()
    enqueued: set[str] = set()
    topics = (f"crash.t{trial}.", f"crash/t{trial}/")
    for r in crash_trials.publish_and_enqueue_records(audit_dir):
        if r["event"] == "publish" and str(r.get("routing_key", "")).startswith(topics):
            published.add(r["msg_id"])
        elif r["event"] == "enqueue" and r.get("queue") == queue:
            enqueued.add(r["msg_id"])
    return len(published), len(enqueued)


def run_trial(trial: int, args: argparse.Namespace, rng: random.Random, store: str | None) -> tuple[Result, Path, Ledger]:
    work = Path(tempfile.mkdtemp(prefix=f"crash-mqtt-{trial}-"))
    ledger, kills, held = asyncio.run(trial_load(trial, args, rng, work, free_port(), store))
    delivered = set(ledger.received)
    r = Result(trial, args.qos, kills, len(ledger.published), len(ledger.taken), len(ledger.completed),
               len(delivered), len(ledger.taken - delivered), sum(n - 1 for n in ledger.received.values()),
               ledger.reused, ledger.no_dup if args.qos == 2 else ledger.no_dup_qos1(), len(held), len(ledger.published - ledger.taken),
               ledger.sessions_lost, ledger.foreign)
    r.audit_published, r.audit_enqueued = audit_counts(work / "data" / "audit", trial,
                                                       queue_name("/", f"{args.run}-t{trial}-sub"))
    r.audit_missing = max(0, r.taken - min(r.audit_published, r.audit_enqueued))
    r.log_errors = log_errors(work / "gateway.log")
    return r, work, ledger


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trials", type=int, default=10)
    ap.add_argument("--qos", type=int, choices=(1, 2), default=2)
    ap.add_argument("--level", type=int, choices=(4, 5), default=4, help="MQTT 3.1.1 (4) or 5")
    ap.add_argument("--seconds", type=float, default=4.0, help="the longest run before each kill and after the last")
    ap.add_argument("--kills", type=int, default=2, help="kill -9 per trial")
    ap.add_argument("--window", type=int, default=50, help="the publisher's PUBLISHes in flight")
    ap.add_argument("--finish-seconds", type=float, default=None,
                    help="how long the end may take (default 120; on JetStream 300: a restart there took 17-33 s "
                         "on a loaded machine, and what the killed gateway had pulled comes back after ack_wait)")
    ap.add_argument("--settle-seconds", type=float, default=None,
                    help="how long the subscriber waits for a missing message (default 12; on JetStream 60: what the "
                         "killed gateway had pulled comes back after the consumer's ack_wait, the visibility timeout + 1 s)")
    ap.add_argument("--store", "--nats", default=None, help=NATS_HELP)
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--keep", default="crash-trials-mqtt-failed", help="where a failing trial's files go")
    args = ap.parse_args()
    seed = args.seed if args.seed is not None else random.randrange(2**32)
    args.run = f"r{seed % 100000}"
    if args.settle_seconds is None:
        args.settle_seconds = 60.0 if args.store else 4 * QUIET
    if args.finish_seconds is None:
        args.finish_seconds = 300.0 if args.store else 120.0
    with nats_store(args.store) as store:
        return run(args, seed, store)


def run(args: argparse.Namespace, seed: int, store: str | None) -> int:
    print(f"crash_trials_mqtt: seed {seed}, {args.trials} trials, QoS {args.qos}, MQTT level {args.level}, "
          f"{args.kills} kills a trial, window {args.window}, store {store or 'embedded'}", flush=True)
    rng = random.Random(seed)
    results: list[Result] = []
    for trial in range(1, args.trials + 1):
        r, work, ledger = run_trial(trial, args, random.Random(rng.random()), store)
        results.append(r)
        print(f"trial {trial}: killed at {r.kills} s; published {r.published}, taken {r.taken}, "
              f"completed {r.completed}, delivered {r.delivered}, lost {r.lost}, duplicated {r.duplicated}, "
              f"reused {r.reused}, no DUP {r.no_dup}, unreleased {r.unreleased}, unfinished {r.unfinished}"
              + (f", sessions lost {r.sessions_lost}" if r.sessions_lost else "")
              + (f", foreign {r.foreign}" if r.foreign else "")
              + f"; audit: {r.audit_published} published, {r.audit_enqueued} enqueued, missing {r.audit_missing}"
              + f"; log errors {r.log_errors}", flush=True)
        if r.ok() and not r.log_errors:
            shutil.rmtree(work, ignore_errors=True)
            continue
        (work / "ledger.json").write_text(json.dumps({
            "result": r.__dict__,
            "lost": {m: ledger.sends[m] for m in sorted(ledger.taken - set(ledger.received))[:10_000]},
            "duplicated": {m: [ledger.sends[m], ledger.copies.get(m)] for m, n in ledger.received.items() if n > 1},
            "sub_connects": [round(t - ledger.sub_connects[0], 2) for t in ledger.sub_connects],
            "unfinished": sorted(ledger.published - ledger.taken)[:10_000]}))
        keep = Path(args.keep) / f"trial-{trial}"
        keep.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(str(work), keep)
        print(f"  FAILED: files kept in {keep}", flush=True)
    names = ("published", "taken", "completed", "delivered", "lost", "duplicated", "reused", "no_dup",
             "unreleased", "unfinished", "audit_published", "audit_enqueued", "audit_missing", "log_errors")
    total = {k: sum(getattr(r, k) for r in results) for k in names}
    print(f"total: {len(results)} trials, QoS {args.qos}, store {'jetstream' if store else 'embedded'}, "
          + ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in total.items()), flush=True)
    return 0 if all(r.ok() for r in results) else 1


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
