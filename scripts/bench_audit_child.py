"""The audit writer process's cost per record for scenario 1's rows (publish, enqueue,
deliver, ack of each message): one batch unmarshalled and formatted as gateway.audit.child
does it: rows packed on the loop, unpacked, formatted and counted in C (``compiled``:
``AuditLog._format`` with gateway.audit.fastformat, where it is built; the rows stamped with
the time of packing), with the Python batch path (``batch``: marshal, ``_format`` without
the C module) and record by record (``each``: marshal, ``_format_each``).

    .venv/bin/python scripts/bench_audit_child.py [--messages 5000] [--repeat 5]

Timed with thread_time (CPU of this thread, best of --repeat): steadier than wall time on a
shared machine. For counts that do not depend on the machine's load at all, run one mode
under callgrind and subtract ``--mode none`` (same setup, nothing formatted):

    valgrind --tool=callgrind .venv/bin/python scripts/bench_audit_child.py --mode batch --repeat 1
"""

from __future__ import annotations

import argparse
import gc
import marshal
import shutil
import tempfile
import time
from typing import Any

from gateway.audit import fastformat
from gateway.audit.rows import ACK, DELIVER, ENQUEUE, PUBLISH_QUEUE
from gateway.audit.writer import AuditLog, _plain
from semantics.message_ids import new_msg_id


def scenario_1_items(messages: int) -> list[tuple[float, int, str, tuple[Any, ...]]]:
    """The rows of ``messages`` messages, 20 us apart, as the broker emits them."""
    out: list[tuple[float, int, str, tuple[Any, ...]]] = []
    t = time.time()
    for i in range(messages):
        mid = new_msg_id()
        t += 2e-5
        out += [(t, PUBLISH_QUEUE.id, "/", ("perf-q", "perf-q", mid, 16, "guest", "127.0.0.1:50000")),
                (t + 1e-6, ENQUEUE.id, "/", ("perf-q", mid, 16, None, None)),
                (t + 3e-6, DELIVER.id, "/", ("guest", "127.0.0.1:50001", "perf-q", mid, 1, 16)),
                (t + 9e-6, ACK.id, "/", ("guest", "127.0.0.1:50001", "perf-q", mid, round(1.234567 + i % 100, 3)))]
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--messages", type=int, default=5000)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--mode", choices=("all", "compiled", "batch", "each", "none"), default="all")
    args = ap.parse_args()
    gc.disable()  # as in the writer process (gateway.audit.child)
    items = scenario_1_items(args.messages)
    payload = marshal.dumps(items[1:])
    directory = tempfile.mkdtemp(prefix="bench-audit-child-")
    try:
        log = AuditLog(directory, process=False, _thread=False)
        log._write(*log._format(items[:1], bytearray(), 0, "", "")[:2])  # the file is open, as in a run
        compiled = log._format_rows

        def batch(*a: Any) -> Any:
            log._format_rows = None
            try:
                return log._format(*a)
            finally:
                log._format_rows = compiled

        modes = {"compiled": log._format, "batch": batch, "each": log._format_each}
        load = {name: lambda: marshal.loads(payload) for name in modes}
        if fastformat.Records is not None and fastformat.unpack is not None:
            packer = fastformat.Records(_plain)
            for _, rid, vhost, values in items[1:]:
                packer.add(rid, vhost, values)
            packed, unpack = packer.take(), fastformat.unpack
            load["compiled"] = lambda: unpack(packed)
        if compiled is None:
            del modes["compiled"]  # not built, or CMQ_GATEWAY_PURE_PYTHON=1
        chosen = list(modes) if args.mode == "all" else [] if args.mode == "none" else [args.mode]
        records = len(items) - 1
        for name in chosen:
            best = float("inf")
            for _ in range(args.repeat):
                t0 = time.thread_time()
                log._write(*modes[name](load[name](), bytearray(), 0, "", "")[:2])
                best = min(best, time.thread_time() - t0)
            print(f"{name:8s} {best / records * 1e6:.2f} us a record (unpack, format, count, write; "
                  f"best of {args.repeat})")
        log._close_file()
    finally:
        shutil.rmtree(directory, ignore_errors=True)


if __name__ == "__main__":
    main()
