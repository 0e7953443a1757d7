"""kill -9 trials of CMQ's HTTP API: no message whose SendMessage was answered is lost (M14,
CA2; issue 26 "Test and measure").

Each trial starts a real ``python -m gateway serve`` (the embedded store on a new data dir, or
``--store nats://...`` with ``--nats``) with its CMQ API on a free port, creates a queue, and
runs senders (SendMessage and BatchSendMessage, unique bodies) and receivers (ReceiveMessage /
BatchReceiveMessage, then DeleteMessage / BatchDeleteMessage) in threads. At a random moment
it kills the gateway with SIGKILL, starts it again on the same data dir, drains the queue
(receive and delete) and checks:

* every body whose send was answered ``code 0`` ("confirmed") comes back in the drain, unless
  a receiver had its delete answered ``code 0`` before the crash (a deleted message may come
  back or not: the crash may precede the delete's write) - a confirmed body neither deleted
  nor back is LOST;
* nothing comes back that was never sent (``phantoms``). A body that comes back twice is
  counted (``duplicates``): a received, not deleted message comes back after its visibility
  timeout, as CMQ's at-least-once delivery allows, so the drain receives with a short one.

The client is Tencent's CMQ SDK (``cmq`` package) when installed, else the repository's
tests/integration/cmq_client.py. Once the restarted gateway has stopped, the audit log (its
``DATA_DIR/audit``) must hold a ``publish`` and an ``enqueue`` record of every msgId a send
was answered with (A5; ``audit_missing`` counts those without). ``log_errors`` counts the
tracebacks and ERROR lines in the gateway's log (its files are kept, not failed on). Exit 1 if
anything was lost, a phantom appeared or a record is missing.

    .venv/bin/python scripts/crash_trials_cmqapi.py --trials 10 --seconds 6 [--nats nats://127.0.0.1:PORT | --nats jetstream]
"""

from __future__ import annotations

import argparse
import random
import shutil
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.integration.cmq_client import CmqClient  # noqa: E402

sys.path.insert(0, str(ROOT / "scripts"))
from crash_trials import read_audit  # noqa: E402
from serve_process import NATS_HELP, Served, log_errors, nats_store  # noqa: E402

KEY_ID, SECRET = "AKIDcrash0000000000000000000000000000", "crash-secret-0123456789abcdef0123"


class Gateway(Served):
    """A gateway with its CMQ API on a free port, its log appended to by each start."""

    def __init__(self, data_dir: Path, log: Path, config: Path, store: str | None) -> None:
        super().__init__(data_dir, log, store=store, config=config, append=True, cmq_api_port=0)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.ports['cmq_api_port']}"


class Client:
    """send(bodies) / receive(n) -> [(body, handle)] / delete(handles), over the SDK or ours.
    A call that raises (the gateway died) is unanswered: neither confirmed nor deleted."""

    def __init__(self, endpoint: str, queue: str) -> None:
        self.queue = queue
        self.ours = CmqClient(endpoint, KEY_ID, SECRET)
        try:
            from cmq.account import Account

            self.sdk_queue = Account(endpoint, KEY_ID, SECRET, debug=False).get_queue(queue)
        except ImportError:
            self.sdk_queue = None

    def send(self, bodies: list[str]) -> list[str] | None:
        """The msgIds of the bodies sent (None: not code 0)."""
        if self.sdk_queue is not None:
            from cmq.queue import Message

            if len(bodies) == 1:
                return [self.sdk_queue.send_message(Message(bodies[0])).msgId]
            return [m.msgId for m in self.sdk_queue.batch_send_message([Message(b) for b in bodies])]
        if len(bodies) == 1:
            answer = self.ours.call("SendMessage", queueName=self.queue, msgBody=bodies[0])
            return [answer["msgId"]] if answer["code"] == 0 else None
        answer = self.ours.call("BatchSendMessage", queueName=self.queue, msgBody=bodies)
        return [m["msgId"] for m in answer["msgList"]] if answer["code"] == 0 else None

    def receive(self, n: int, wait: int = 1) -> list[tuple[str, str]]:
        answer = self.ours.call("BatchReceiveMessage", queueName=self.queue, numOfMsg=n, pollingWaitSeconds=wait)
        if answer["code"] != 0:
            return []
        return [(m["msgBody"], m["receiptHandle"]) for m in answer["msgInfoList"]]

    def delete(self, handles: list[str]) -> bool:
        if self.sdk_queue is not None:
            self.sdk_queue.batch_delete_message(handles)
            return True
        return self.ours.call("BatchDeleteMessage", queueName=self.queue, receiptHandle=handles)["code"] == 0


@dataclass
class Ledger:
    lock: threading.Lock = field(default_factory=threading.Lock)
    sent: set[str] = field(default_factory=set)  # every body a send carried
    confirmed: set[str] = field(default_factory=set)  # answered code 0
    ids: set[str] = field(default_factory=set)  # the msgIds of the confirmed sends (A5)
    deleted: set[str] = field(default_factory=set)  # its delete answered code 0


def sender(endpoint: str, queue: str, name: str, ledger: Ledger, stop: threading.Event, rng: random.Random) -> None:
    client = Client(endpoint, queue)
    n = 0
    while not stop.is_set():
        bodies = [f"{name}-{n + i}" for i in range(rng.choice((1, 1, 4, 16)))]
        n += len(bodies)
        with ledger.lock:
            ledger.sent.update(bodies)
        try:
            ids = client.send(bodies)
        except Exception:  # noqa: BLE001 - the gateway died under the call: unanswered
            return
        if ids is not None:
            with ledger.lock:
                ledger.confirmed.update(bodies)
                ledger.ids.update(ids)


def receiver(endpoint: str, queue: str, ledger: Ledger, stop: threading.Event, rng: random.Random) -> None:
    client = Client(endpoint, queue)
    while not stop.is_set():
        try:
            got = client.receive(rng.choice((1, 8, 16)))
            if got and client.delete([h for _, h in got]):
                with ledger.lock:
                    ledger.deleted.update(b for b, _ in got)
        except Exception:  # noqa: BLE001
            return


def drain(endpoint: str, queue: str) -> list[str]:
    client = Client(endpoint, queue)
    out: list[str] = []
    empty = 0
    while empty < 2:  # two empty long polls in a row: nothing left (visibility 1 s below)
        got = client.receive(16, wait=2)
        if not got:
            empty += 1
            continue
        empty = 0
        out.extend(b for b, _ in got)
        client.delete([h for _, h in got])
    return out


def run_trial(trial: int, work: Path, args: argparse.Namespace, rng: random.Random) -> dict[str, int]:
    data = work / f"data-{trial}"
    config = work / "gateway.yaml"
    queue = f"crash{trial}x{rng.randrange(10**6)}"
    gw = Gateway(data, work / f"gw-{trial}.log", config, args.store)
    Client(gw.endpoint, queue).ours.call("CreateQueue", queueName=queue, visibilityTimeout=2)
    ledger = Ledger()
    stop = threading.Event()
    threads = [threading.Thread(target=sender, args=(gw.endpoint, queue, f"t{trial}s{i}", ledger, stop,
                                                     random.Random(rng.random())), daemon=True)
               for i in range(args.senders)]
    threads += [threading.Thread(target=receiver, args=(gw.endpoint, queue, ledger, stop,
                                                        random.Random(rng.random())), daemon=True)
                for _ in range(args.receivers)]
    for t in threads:
        t.start()
    time.sleep(rng.uniform(args.seconds / 3, args.seconds))
    gw.kill9()
    stop.set()
    for t in threads:
        t.join(timeout=60)
    gw = Gateway(data, work / f"gw-{trial}.log", config, args.store)
    try:
        back = drain(gw.endpoint, queue)
    finally:
        gw.stop()
    seen = set(back)
    lost = ledger.confirmed - ledger.deleted - seen
    # A5: every answered send has its publish and enqueue records, the gateway stopped (a
    # kill -9 loses no record of a message a client saw confirmed).
    published, enqueued, _rebuilt = read_audit(data / "audit")
    missing = sorted(i for i in ledger.ids if i not in published or (queue, i) not in enqueued)
    result = {"confirmed": len(ledger.confirmed), "deleted": len(ledger.deleted), "back": len(back),
              "lost": len(lost), "duplicates": len(back) - len(seen), "phantoms": len(seen - ledger.sent),
              "audit_checked": len(ledger.ids), "audit_missing": len(missing),
              "log_errors": log_errors(work / f"gw-{trial}.log")}
    if lost or result["phantoms"] or missing or result["log_errors"]:
        keep = Path(args.keep) / f"trial-{trial}"
        keep.mkdir(parents=True, exist_ok=True)
        (keep / "lost.txt").write_text("\n".join(sorted(lost)))
        (keep / "audit_missing.txt").write_text("\n".join(missing))
        shutil.copytree(data / "audit", keep / "audit", dirs_exist_ok=True)
        shutil.copy(work / f"gw-{trial}.log", keep / "gateway.log")
    elif args.store is None:
        shutil.rmtree(data, ignore_errors=True)
    return result


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trials", type=int, default=10)
    ap.add_argument("--seconds", type=float, default=6.0, help="load before the kill: a random 1/3 to all of it")
    ap.add_argument("--senders", type=int, default=3)
    ap.add_argument("--receivers", type=int, default=2)
    ap.add_argument("--nats", default=None, help=NATS_HELP)
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--keep", default="crash-trials-cmqapi-failed")
    args = ap.parse_args()
    seed = args.seed if args.seed is not None else random.randrange(2**32)
    rng = random.Random(seed)
    total: dict[str, int] = {}
    with tempfile.TemporaryDirectory(prefix="crash-cmqapi-") as tmp, nats_store(args.nats) as store:
        args.store = store
        work = Path(tmp)
        (work / "gateway.yaml").write_text(yaml.safe_dump({
            "users": [{"name": "guest", "password": "guest", "tags": ["administrator"],
                       "cmq_keys": [{"secret_id": KEY_ID, "secret_key": SECRET}]}],
            "permissions": [{"user": "guest", "vhost": "/", "configure": ".*", "write": ".*", "read": ".*"}]}))
        for trial in range(args.trials):
            result = run_trial(trial, work, args, rng)
            print(f"trial {trial}: {result}", flush=True)
            for k, v in result.items():
                total[k] = total.get(k, 0) + v
    print(f"{args.trials} trials ({args.store or 'embedded'}, seed {seed}): {total}")
    return 1 if total.get("lost") or total.get("phantoms") or total.get("audit_missing") else 0


if __name__ == "__main__":
    sys.exit(main())
