"""Instructions a message of three JetStream-only steps, without a gateway, nats-server or reads
(issue 28): a fixed harness for cuts too small for callgrind_jetstream.py's consume half, which
moves by +-10 % with how many reads go through nats-py's read-loop task.

* ``take``: ``Pulls._take`` of N pulled deliveries of scenario 1's kind (first deliveries, a
  lone Nats-Msg-Id, transient 16 B records of one queue) into a leased CmqQueue;
* ``acks``: ``Pulls._send_replies`` of N ``+ACK`` replies (the commands made, not written);
* ``writes``: ``Publisher._next_batch`` of N queued writes (their HPUB commands, not written);
* ``pubacks``: ``Publisher._replied_plains`` of N stored PubAcks read together.

Each is run once to warm the caches, then counted as the difference between a process that
runs it a second time and one that does not (``valgrind --tool=callgrind``, PYTHONHASHSEED=0:
the same count every time). ``--pure`` measures with the compiled parts of those steps off
(the Python loop bodies); ``--code`` measures another checkout.

    .venv/bin/python scripts/callgrind_jetstream_parts.py --code /tmp/before --code .
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# What each measured process runs (argv: step, N, "measure" or "warm", "pure" or "c").
STEP = r'''
import asyncio, collections, gc, sys
from types import SimpleNamespace
from gateway.server import GC_THRESHOLDS
from gateway.broker import persistence as P
from gateway.jetstream import publisher as pm, pulls as pulls_mod
from gateway.jetstream.head import MSG_ID
from gateway.jetstream.pulls import Pulls
from gateway.jetstream.queues import QueueStream
from gateway.jetstream.wire import Delivery
from gateway.protocol.properties import Properties
from semantics.queue import CmqQueue
from semantics.queue_attrs import QueueAttributes

step, n, measure, pure = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "measure", sys.argv[4] == "pure"
NOW = 1_700_000_000.0
gc.set_threshold(*GC_THRESHOLDS)  # the gateway's (gateway.server): collections as often a message
if pure:  # the Python loop bodies (each is None where the checkout has no such C part)
    for mod, name in ((pulls_mod, "compiled_take_plains"), (pulls_mod, "_ack_pubs"), (pm, "_stored_run")):
        if hasattr(mod, name):
            setattr(mod, name, None)
props = Properties.build(delivery_mode=1).raw
pulls_mod.answer_receives = lambda s, status: None


def deliveries(first):
    return [Delivery("QS_q.q", f"$JS.ACK.QS_q.C.1.{k}.{k}.1700000000000000000.{first + n - k}",
                     P.encode_message("/", "q", f"m{k}", NOW, "", "q", props, b"x" * 16), {MSG_ID: f"m{k}"})
            for k in range(first, first + n)]


cmq = CmqQueue("q", QueueAttributes(visibility_timeout=30, msg_retention_seconds=3600), leased=True)
q = SimpleNamespace(cmq=cmq, vhost="/", deleted=False, remote_ready=0)
s = QueueStream.__new__(QueueStream)
s.q, s.held_back, s.leases, s.delays, s.fetched, s.last_delivery = q, [], {}, {}, {}, 0
s.last_own, s.own_taken = None, True  # nothing published here (direct delivery's FIFO rule)
p = Pulls.__new__(Pulls)
p.clock = SimpleNamespace(now=lambda: NOW)
p.taking = set()
p.broker = SimpleNamespace(vhosts={"/": None}, after_queue_change=lambda vh, q: None)
p._return_surplus = lambda s: None
p.want = lambda s: None
sent = []
p._send = lambda nc, commands: sent.append(commands)
p.link = SimpleNamespace(nc=None)
loop = asyncio.new_event_loop()
pb = pm.Publisher.__new__(pm.Publisher)
pb._loop = loop
pb._outbox, pb._sent, pb._again, pb._told_unknown = collections.deque(), {}, set(), False
settled = []
pb.settles = (lambda lsn, refused, done: None, settled.append)
if step == "take":
    p._take(s, deliveries(1))  # warm
    batch = deliveries(n + 1)
else:
    batch = deliveries(1)
for first in (1, n + 1):
    if step == "acks":
        replies = [(m.reply, b"+ACK") for m in batch]
    elif step == "writes":
        pb.prefix = "_INBOX.abcdefghijklmnopqrstuv"
        pb._writes = {k: ("QS_q.q", batch[k - first].data, {MSG_ID: f"m{k}"}, int, None, pb.settles[0])
                      for k in range(first, first + n)}
        pb._outbox, pb._sent = collections.deque(range(first, first + n)), {}
    elif step == "pubacks":
        pb._writes = {k: ("S", b"p", {}, int, None, pb.settles[0]) for k in range(first, first + n)}
        pb._sent = dict.fromkeys(range(first, first + n), 1.0)
        replies = [(b"_INBOX.abcdefghijklmnopqrstuv.%d" % k, b'{"stream":"QS_q", "seq":%d}' % k)
                   for k in range(first, first + n)]
    if first > 1 and not measure:
        break
    if step == "take":
        if first > 1:
            p._take(s, batch)
    elif step == "acks":
        p._replies = replies
        p._send_replies()
    elif step == "writes":
        while pb._outbox:
            pb._next_batch()
    else:
        pb._replied_plains(replies)
'''


def instructions(code: str, step: str, n: int, measure: bool, pure: bool) -> int:
    with tempfile.TemporaryDirectory(prefix="callgrind-parts-") as tmp:
        out = os.path.join(tmp, "callgrind.out")
        env = {**os.environ, "PYTHONHASHSEED": "0", "PYTHONPATH": os.path.abspath(code)}
        env.pop("CMQ_GATEWAY_PURE_PYTHON", None)
        r = subprocess.run(["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", sys.executable, "-P",
                            "-c", STEP, step, str(n), "measure" if measure else "warm", "pure" if pure else "c"],
                           cwd=code, env=env, capture_output=True, text=True, check=True)
        m = re.search(r"Collected : (\d+)", r.stderr)
        if m is None:
            raise RuntimeError(r.stderr[-2000:])
        return int(m.group(1))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--code", action="append", help="a checkout to measure (repeatable; default .)")
    ap.add_argument("--count", type=int, default=2000, help="messages a step (default 2000)")
    ap.add_argument("--steps", default="take,acks,writes,pubacks")
    ap.add_argument("--pure", action="store_true", help="also each checkout with the steps' C parts off")
    args = ap.parse_args()
    for code in args.code or [str(ROOT)]:
        for pure in ((False, True) if args.pure else (False,)):
            for step in args.steps.split(","):
                a = instructions(code, step, args.count, True, pure)
                b = instructions(code, step, args.count, False, pure)
                print(f"{code}{' (C parts off)' if pure else ''}: {step} {(a - b) / args.count:,.0f} instructions a message",
                      flush=True)


if __name__ == "__main__":
    main()
