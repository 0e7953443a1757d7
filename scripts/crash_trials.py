"""kill -9 trials: no confirmed message is lost (M14).

Each trial starts a real ``python -m gateway serve`` on a new data dir, runs publishers with
publisher confirms (persistent messages with unique ids into durable queues: through the
default exchange, a durable fanout exchange to three queues and a durable topic exchange to
two) and consumers that ack (and sometimes requeue) in parallel on some of those queues, so
that writes, acks and requeues race with the crash. At a random moment it kills the gateway
with SIGKILL, starts it again on the same data dir, drains every queue and checks, copy by
copy (a fanout message is one copy per queue):

* every confirmed copy is back, unless a consumer had acked it before the crash (an acked
  copy may be back or not: the crash may have come before the ack was written);
* nothing comes back twice from one queue (``duplicates``) and nothing comes back that was
  never published (``phantoms``);
* the audit trail (A5): once the restarted gateway has stopped, every message copy the store
  held after the restart (what the drain got) and every copy a consumer got before the
  crash has its ``publish`` and ``enqueue`` records in the audit log (the gateway's default
  ``DATA_DIR/audit``). Consumers and the drain ask for receive metadata (PF5) to learn each
  copy's CMQ ID (``x-cmq-msg-id``), which the records carry. A copy without them is
  ``audit missing``, counted by kind: held by the store, consumed and confirmed, consumed
  and never confirmed (a delivery hands its records to the audit writer process before its
  frames go out, so a kill -9 of the gateway takes none of these either; a machine's crash
  may, which this script does not cause).

With ``--plain-publishers N``, N more publishers send without confirms (persistent and
transient messages): the copies consumers get from them are never confirmed, the case the
delivery's audit hand-off is for.

A confirmed copy neither acked nor back is LOST; the script exits 1 if anything was lost or
duplicated or a phantom appeared, or a copy of any of the three kinds has no audit records. With ``--disk-full-trials`` some trials put the data dir
on a small tmpfs (root only) that a filler file takes almost all of, with ``disk_free_limit``
set below what is left, so the store hits ENOSPC while the publishers run; the filler is
removed before the restart (the operator made room).

    .venv/bin/python scripts/crash_trials.py --trials 40 --seconds 10 [--disk-full-trials 1]

A failing trial keeps its data dir, the gateway's two stderr logs and its ledger (every id
published, confirmed, acked; ``ledger.json``) under ``--keep`` (default ./crash-trials-failed).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiormq
from pamqp.commands import Basic

ROOT = Path(__file__).resolve().parents[1]
LISTENING = re.compile(r"listening on 127\.0\.0\.1:(\d+)")

# (exchange, type, [(queue, binding key)]); "" is the default exchange (queue names as keys).
TOPOLOGY = [
    ("", "direct", [("ct.direct.0", ""), ("ct.direct.1", "")]),
    ("ct.fanout", "fanout", [("ct.fan.0", ""), ("ct.fan.1", ""), ("ct.fan.2", "")]),
    ("ct.topic", "topic", [("ct.topic.a", "a.#"), ("ct.topic.all", "#")]),
]
QUEUES = [q for _, _, binds in TOPOLOGY for q, _ in binds]
# (exchange, routing key, the queues it reaches)
ROUTES = [
    ("", "ct.direct.0", frozenset({"ct.direct.0"})),
    ("", "ct.direct.1", frozenset({"ct.direct.1"})),
    ("ct.fanout", "", frozenset({"ct.fan.0", "ct.fan.1", "ct.fan.2"})),
    ("ct.topic", "a.k", frozenset({"ct.topic.a", "ct.topic.all"})),
    ("ct.topic", "b.k", frozenset({"ct.topic.all"})),
]
# Queues that have consumers acking while the publishers run.
CONSUMED = ["ct.direct.1", "ct.fan.2", "ct.topic.all"]


@dataclass
class Ledger:
    """What the clients saw before the crash."""

    published: set[str] = field(default_factory=set)  # basic.publish sent (confirm or not)
    confirmed: dict[str, frozenset[str]] = field(default_factory=dict)  # id -> queues it was routed to
    nacked: int = 0
    acked: set[tuple[str, str]] = field(default_factory=set)  # (queue, id) whose basic.ack was sent
    delivered: int = 0
    requeued: int = 0
    free_at_kill: int = 0  # bytes free on the data dir's file system when it was killed
    consumed: set[tuple[str, str, str]] = field(default_factory=set)  # (queue, CMQ ID, id) delivered


@dataclass
class Result:
    trial: int
    variant: str
    killed_after: float
    published: int
    confirmed: int
    confirmed_copies: int
    nacked: int
    acked: int
    recovered: int
    lost: int
    duplicates: int
    phantoms: int
    unconfirmed_back: int
    free_at_kill: int
    audit_checked: int = 0  # copies whose records were looked up
    audit_missing_stored: int = 0  # held by the store after the restart, no publish/enqueue
    audit_missing_confirmed: int = 0  # consumed before the crash and confirmed, no records
    audit_missing_unconfirmed: int = 0  # consumed before the crash, never confirmed, no records
    audit_unconfirmed: int = 0  # copies consumed before the crash, never confirmed, not back: checked
    audit_rebuilt: int = 0  # records written again at the restart (origin "rebuilt")

    @property
    def ok(self) -> bool:
        return not (self.lost or self.duplicates or self.phantoms or self.audit_missing_stored
                    or self.audit_missing_confirmed or self.audit_missing_unconfirmed)


class Gateway:
    """A ``python -m gateway serve`` subprocess whose stderr goes to a file."""

    def __init__(self, data_dir: Path, log: Path, config: Path | None = None) -> None:
        cmd = [sys.executable, "-m", "gateway", "serve", "--host", "127.0.0.1", "--port", "0",
               "--management-port", "off", "--metrics-port", "off", "--cmq-api-port", "off",
               "--mqtt-port", "off", "--data-dir", str(data_dir)]
        if config is not None:
            cmd += ["--config", str(config)]
        self.data_dir = data_dir
        self.port = int(self.launch(cmd, log).group(1))

    def launch(self, cmd: list[str], log: Path, ready: re.Pattern[str] = LISTENING, *, append: bool = False,
               header: str = "") -> re.Match[str]:
        """Start ``cmd`` with its stderr in ``log`` (appended to by a restart, after ``header``:
        only that start's lines are read) and wait until they match ``ready``."""
        self.log = log
        with open(log, "a" if append else "w") as err:
            err.write(header)
            err.flush()
            start = err.tell()
            self.proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=err)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if m := ready.search(log.read_bytes()[start:].decode(errors="replace")):
                return m
            if self.proc.poll() is not None:
                break
            time.sleep(0.05)
        self.proc.kill()
        self.proc.wait()
        raise RuntimeError(f"the gateway did not start (see {log}):\n{log.read_text(errors='replace')[-2000:]}")

    @property
    def url(self) -> str:
        return f"amqp://guest:guest@127.0.0.1:{self.port}/%2F"

    def kill9(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=60)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


async def declare(url: str) -> None:
    conn = await aiormq.connect(url)
    ch = await conn.channel()
    for exchange, kind, binds in TOPOLOGY:
        if exchange:
            await ch.exchange_declare(exchange, exchange_type=kind, durable=True)
        for queue, key in binds:
            await ch.queue_declare(queue, durable=True)
            if exchange:
                await ch.queue_bind(queue, exchange, routing_key=key)
    await conn.close()


def body_for(mid: str, rng: random.Random) -> bytes:
    # Mostly small; now and then larger than one frame (several body frames per message).
    size = rng.choice((0, 16, 200, 1000, 3000)) if rng.random() < 0.97 else rng.randint(140_000, 300_000)
    return mid.encode() + b"|" + b"x" * size


async def publisher(url: str, name: str, ledger: Ledger, rng: random.Random, window: int,
                    plain: bool = False) -> None:
    """``plain``: no confirms, persistent and transient messages at about 500 a second: what
    its consumers get is never confirmed, so only the delivery's hand-off keeps its records."""
    conn = await aiormq.connect(url)
    ch = await conn.channel(publisher_confirms=not plain)
    slots = asyncio.Semaphore(window)
    pending: set[asyncio.Task[None]] = set()

    async def one(mid: str, exchange: str, key: str, body: bytes, dests: frozenset[str]) -> None:
        try:
            mode = rng.choice((1, 2)) if plain else 2
            confirm = await ch.basic_publish(body, exchange=exchange, routing_key=key,
                                             properties=Basic.Properties(delivery_mode=mode, message_id=mid))
            # Only a basic.ack read from the socket counts: the gateway sent it before it died.
            if isinstance(confirm, Basic.Ack):
                ledger.confirmed[mid] = dests
            elif isinstance(confirm, Basic.Nack):
                ledger.nacked += 1
        except Exception:
            pass  # the crash: no confirm, so nothing is owed
        finally:
            slots.release()

    seq = 0
    try:
        while not ch.is_closed:
            await slots.acquire()
            exchange, key, dests = rng.choice(ROUTES)
            mid = f"{name}-{seq}"
            seq += 1
            ledger.published.add(mid)
            task = asyncio.ensure_future(one(mid, exchange, key, body_for(mid, rng), dests))
            pending.add(task)
            task.add_done_callback(pending.discard)
            if plain:
                await asyncio.sleep(0.002)
    finally:
        for task in list(pending):
            task.cancel()


async def consumer(url: str, queue: str, ledger: Ledger, rng: random.Random) -> None:
    conn = await aiormq.connect(url)
    ch = await conn.channel()
    await ch.basic_qos(prefetch_count=rng.choice((1, 10, 100)))

    async def on_message(message: aiormq.abc.DeliveredMessage) -> None:
        ledger.delivered += 1
        mid = message.header.properties.message_id
        tag = message.delivery_tag
        assert tag is not None and mid is not None
        ledger.consumed.add((queue, cmq_id(message), mid))
        r = rng.random()
        if r < 0.9:
            # Recorded before it is sent: from here on the copy may or may not come back.
            ledger.acked.add((queue, mid))
            await ch.basic_ack(tag)
        elif r < 0.95:
            ledger.requeued += 1
            await ch.basic_nack(tag, requeue=True)
        # else: held unacked; it must come back after the restart

    await ch.basic_consume(queue, on_message, arguments=METADATA)
    await conn.closing


async def load(gw: Gateway, ledger: Ledger, rng: random.Random, seconds: float, publishers: int,
               window: int, trial: int, full_below: int | None = None, plain_publishers: int = 0) -> float:
    """Publish and consume until a random moment in (0.2, 1] x seconds, then kill -9; with
    ``full_below``, not before the data dir's file system has fewer bytes free than that (a
    disk-full trial on a loaded machine may not have filled it by then), for at most 20 x
    ``seconds``."""
    await declare(gw.url)
    tasks = [asyncio.ensure_future(publisher(gw.url, f"t{trial}p{i}", ledger, random.Random(rng.random()), window))
             for i in range(publishers)]
    tasks += [asyncio.ensure_future(publisher(gw.url, f"t{trial}n{i}", ledger, random.Random(rng.random()), window,
                                              plain=True)) for i in range(plain_publishers)]
    tasks += [asyncio.ensure_future(consumer(gw.url, q, ledger, random.Random(rng.random()))) for q in CONSUMED]
    t0 = time.monotonic()
    await asyncio.sleep(rng.uniform(0.2, 1.0) * seconds)
    while full_below is not None and time.monotonic() - t0 < 20 * seconds:
        st = os.statvfs(gw.data_dir)
        if st.f_bavail * st.f_frsize < full_below:
            break
        await asyncio.sleep(0.05)
    for t in tasks:  # a task that failed early (say, the connection refused) must not pass unseen
        if t.done() and t.exception() is not None:
            raise RuntimeError(f"a client failed before the kill: {t.exception()!r}")
    gw.kill9()
    st = os.statvfs(gw.data_dir)
    ledger.free_at_kill = st.f_bavail * st.f_frsize
    killed_after = time.monotonic() - t0
    await asyncio.sleep(0.5)  # let the clients read what the gateway sent before it died
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    return killed_after


# PF5: each delivery carries its CMQ ID (x-cmq-msg-id), the msg_id of its audit records.
METADATA = {"x-cmq-receive-metadata": True}


def cmq_id(message: aiormq.abc.DeliveredMessage) -> str:
    headers = message.header.properties.headers or {}
    got = headers.get("x-cmq-msg-id")
    return got.decode() if isinstance(got, bytes) else str(got)


async def drain(url: str, stored: set[tuple[str, str]] | None = None) -> dict[str, Counter[str]]:
    """Every message of every queue, received with no_ack (so they are gone afterwards);
    ``stored`` gets each one's (queue, CMQ ID)."""
    conn = await aiormq.connect(url)
    ch = await conn.channel()
    found: dict[str, Counter[str]] = {}
    loop = asyncio.get_running_loop()
    for queue in QUEUES:
        got: Counter[str] = Counter()
        last = loop.time()

        async def on_message(message: aiormq.abc.DeliveredMessage, got: Counter[str] = got,
                             queue: str = queue) -> None:
            nonlocal last
            got[message.body.split(b"|", 1)[0].decode()] += 1
            if stored is not None:
                stored.add((queue, cmq_id(message)))
            last = loop.time()

        try:
            ok = await ch.basic_consume(queue, on_message, no_ack=True, arguments=METADATA)
        except aiormq.exceptions.ChannelNotFoundEntity:
            # The kill came before the queue's declaration was written (declare-ok does not
            # wait for the disk): no copy in it was confirmed, since a confirm waits for an
            # LSN after the declaration's. Nothing comes back from it.
            found[queue] = got
            ch = await conn.channel()
            continue
        while True:
            await asyncio.sleep(0.2)
            declared = await ch.queue_declare(queue, passive=True)
            assert declared is not None
            if declared.message_count == 0 and loop.time() - last > 0.5:
                break
        assert ok.consumer_tag is not None
        await ch.basic_cancel(ok.consumer_tag)
        found[queue] = got
    await conn.close()
    return found


def check(ledger: Ledger, found: dict[str, Counter[str]]) -> tuple[int, int, int, int, int, list[tuple[str, str]]]:
    """recovered, lost, duplicates, phantoms, unconfirmed copies back; and the lost (queue, id)."""
    recovered = duplicates = phantoms = unconfirmed_back = 0
    lost: list[tuple[str, str]] = []
    for got in found.values():
        for mid, n in got.items():
            duplicates += n - 1
            if mid not in ledger.published:
                phantoms += 1
            elif mid not in ledger.confirmed:
                unconfirmed_back += 1
    for mid, dests in ledger.confirmed.items():
        for queue in dests:
            if found[queue][mid]:
                recovered += 1
            elif (queue, mid) not in ledger.acked:
                lost.append((queue, mid))
    return recovered, len(lost), duplicates, phantoms, unconfirmed_back, lost


def read_audit(directory: Path) -> tuple[set[str], set[tuple[str, str]], int]:
    """The msg_ids with a publish record, the (queue, msg_id) with an enqueue record, and how
    many records say origin "rebuilt" (every whole line of every segment)."""
    published: set[str] = set()
    enqueued: set[tuple[str, str]] = set()
    rebuilt = 0
    for r in publish_and_enqueue_records(directory):
        rebuilt += r.get("origin") == "rebuilt"
        if r["event"] == "publish":
            published.add(r["msg_id"])
        else:
            enqueued.add((r["queue"], r["msg_id"]))
    return published, enqueued, rebuilt


def publish_and_enqueue_records(directory: Path) -> Iterator[dict[str, Any]]:
    """Every whole `publish` and `enqueue` record of every segment, closed or open (the other
    trial scripts count theirs from these too)."""
    for path in sorted(directory.glob("dt=*/hour=*/*.jsonl")) + sorted(directory.glob("dt=*/hour=*/.*.open")):
        for line in path.read_bytes().split(b"\n"):
            if b'"event":"publish"' not in line and b'"event":"enqueue"' not in line:
                continue
            try:
                yield json.loads(line)
            except ValueError:
                continue  # a torn last line (A3)


def check_audit(result: Result, ledger: Ledger, stored: set[tuple[str, str]], audit_dir: Path
                ) -> list[tuple[str, str, str]]:
    """A5: the records of every copy the store held or a consumer got; the missing ones."""
    published, enqueued, result.audit_rebuilt = read_audit(audit_dir)
    missing: list[tuple[str, str, str]] = []

    def has(queue: str, gid: str) -> bool:
        return gid in published and (queue, gid) in enqueued

    for queue, gid in stored:
        result.audit_checked += 1
        if not has(queue, gid):
            result.audit_missing_stored += 1
            missing.append(("stored", queue, gid))
    for queue, gid, mid in ledger.consumed:
        if (queue, gid) in stored:
            continue
        result.audit_checked += 1
        result.audit_unconfirmed += mid not in ledger.confirmed
        if not has(queue, gid):
            if mid in ledger.confirmed:
                result.audit_missing_confirmed += 1
                missing.append(("confirmed", queue, gid))
            else:
                result.audit_missing_unconfirmed += 1
                missing.append(("unconfirmed", queue, gid))
    return missing


def run_trial(trial: int, data_dir: Path, work: Path, args: argparse.Namespace, rng: random.Random,
              variant: str, config: Path | None = None, before_restart=None) -> tuple[Result, list[tuple[str, str]]]:
    ledger = Ledger()
    gw = Gateway(data_dir, work / "gateway-1.log", config)
    try:
        killed_after = asyncio.run(load(gw, ledger, rng, args.seconds, args.publishers, args.window, trial,
                                        (1 << 20) if variant == "disk-full" else None, args.plain_publishers))
    finally:
        gw.stop()
    if before_restart is not None:
        before_restart()
    gw = Gateway(data_dir, work / "gateway-2.log", config)
    stored: set[tuple[str, str]] = set()
    try:
        found = asyncio.run(drain(gw.url, stored))
        recovered, n_lost, duplicates, phantoms, unconfirmed_back, lost = check(ledger, found)
        if lost:
            # A copy restored Inactive would show only after its visibility timeout (Q1, 30 s
            # by default): look once more before calling it lost.
            time.sleep(35)
            again = asyncio.run(drain(gw.url, stored))
            for queue, got in again.items():
                found[queue].update(got)
            recovered, n_lost, duplicates, phantoms, unconfirmed_back, lost = check(ledger, found)
    finally:
        gw.stop()
    result = Result(trial, variant, round(killed_after, 2), len(ledger.published), len(ledger.confirmed),
                    sum(len(d) for d in ledger.confirmed.values()), ledger.nacked, len(ledger.acked),
                    recovered, n_lost, duplicates, phantoms, unconfirmed_back, ledger.free_at_kill)
    missing = check_audit(result, ledger, stored, data_dir / "audit")  # the gateway has stopped
    if not result.ok:
        (work / "ledger.json").write_text(json.dumps({
            "result": result.__dict__, "lost": lost[:10_000], "published": sorted(ledger.published),
            "confirmed": {m: sorted(d) for m, d in ledger.confirmed.items()}, "acked": sorted(ledger.acked),
            "found": {q: dict(c) for q, c in found.items()}, "audit_missing": missing[:10_000]}))
    return result, lost


def disk_full_trial(trial: int, work: Path, args: argparse.Namespace, rng: random.Random) -> tuple[Result, list]:
    sys.path.insert(0, str(ROOT))
    from tests.small_disk import FILLER, free  # the tests' real small file system

    mount = work / "disk"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={args.disk_mb}m", "tmpfs", str(mount)], check=True)
    try:
        data_dir = mount / "data"
        data_dir.mkdir()
        # Leave a few MB for the store once the gateway is up; the alarm would block the
        # publishers at 50 MB free (its default), so it is set below what is left.
        with open(mount / FILLER, "wb") as f:
            f.write(b"\0" * ((args.disk_mb - args.disk_room_mb) << 20))
        config = work / "gateway.yaml"
        config.write_text("limits: {disk_free_limit: 100000}\n")
        return run_trial(trial, data_dir, work, args, rng, "disk-full", config, lambda: free(mount))
    finally:
        # Keep the data of a failing trial before the tmpfs goes.
        if (work / "ledger.json").exists():
            shutil.copytree(mount / "data", work / "data", ignore=shutil.ignore_patterns(FILLER))
        subprocess.run(["umount", "-l", str(mount)], check=False)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trials", type=int, default=10, help="kill -9 trials on a normal disk")
    ap.add_argument("--seconds", type=float, default=10.0, help="the longest run before the kill")
    ap.add_argument("--publishers", type=int, default=4)
    ap.add_argument("--plain-publishers", type=int, default=0,
                    help="publishers without confirms (persistent and transient, ~500 msg/s each)")
    ap.add_argument("--window", type=int, default=64, help="unconfirmed publishes per publisher")
    ap.add_argument("--disk-full-trials", type=int, default=0, help="trials on a filling tmpfs (root)")
    ap.add_argument("--disk-mb", type=int, default=64, help="the tmpfs's size")
    ap.add_argument("--disk-room-mb", type=int, default=12, help="what the filler leaves free")
    ap.add_argument("--keep-all", action="store_true", help="keep every trial's files (in /tmp)")
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--keep", default="crash-trials-failed", help="where a failing trial's files go")
    args = ap.parse_args()
    # aiormq logs every connection the kill breaks, with a traceback: expected here.
    logging.getLogger("aiormq").setLevel(logging.CRITICAL)
    seed = args.seed if args.seed is not None else random.randrange(2**32)
    print(f"crash_trials: seed {seed}, {args.trials} trials x {args.seconds} s"
          f" + {args.disk_full_trials} disk-full", flush=True)
    rng = random.Random(seed)
    results: list[Result] = []
    plan = ["normal"] * args.trials + ["disk-full"] * args.disk_full_trials
    for trial, variant in enumerate(plan, 1):
        work = Path(tempfile.mkdtemp(prefix=f"crash-trial-{trial}-"))
        trial_rng = random.Random(rng.random())
        if variant == "normal":
            result, lost = run_trial(trial, work / "data", work, args, trial_rng, variant)
        else:
            result, lost = disk_full_trial(trial, work, args, trial_rng)
        results.append(result)
        r = result
        print(f"trial {trial} ({variant}): killed after {r.killed_after} s; published {r.published}, "
              f"confirmed {r.confirmed} ({r.confirmed_copies} queue copies), nacked {r.nacked}, "
              f"acked {r.acked}, recovered {r.recovered}, lost {r.lost}, duplicates {r.duplicates}, "
              f"phantoms {r.phantoms}, unconfirmed back {r.unconfirmed_back}; audit: {r.audit_checked} "
              f"copies checked ({r.audit_unconfirmed} consumed and never confirmed), "
              f"missing {r.audit_missing_stored} stored / {r.audit_missing_confirmed} "
              f"confirmed / {r.audit_missing_unconfirmed} unconfirmed consumed, {r.audit_rebuilt} rebuilt"
              + (f"; {r.free_at_kill} bytes free at the kill" if variant == "disk-full" else ""), flush=True)
        if r.ok:
            if args.keep_all:
                print(f"  files kept in {work}", flush=True)
            else:
                shutil.rmtree(work, ignore_errors=True)
        else:
            keep = Path(args.keep) / f"trial-{trial}"
            keep.parent.mkdir(parents=True, exist_ok=True)
            shutil.move(str(work), keep)
            print(f"  FAILED: first lost copies {lost[:5]}; files kept in {keep}", flush=True)
    total = {k: sum(getattr(r, k) for r in results) for k in
             ("published", "confirmed", "confirmed_copies", "nacked", "acked", "recovered", "lost",
              "duplicates", "phantoms", "unconfirmed_back", "audit_checked", "audit_unconfirmed", "audit_missing_stored",
              "audit_missing_confirmed", "audit_missing_unconfirmed", "audit_rebuilt")}
    print(f"total: {len(results)} trials, " + ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in total.items()))
    return 0 if all(r.ok for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
