"""Measure the audit writer: emit() cost per call on the caller's thread, and the writer
thread's sustained throughput (records/s formatted and written).

    .venv/bin/python scripts/bench_audit.py [--records 1000000]
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time

from gateway.audit import AuditLog


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--records", type=int, default=1_000_000)
    args = ap.parse_args()
    n = args.records
    root = tempfile.mkdtemp(prefix="bench-audit-")
    try:
        audit = AuditLog(root, max_pending=n + 1)  # nothing shed: measure the full write
        fields = {"topic": "orders", "subscription": "billing", "queue": "orders-billing",
                  "routing_key": "orders.eu", "size": 512, "tags": ["eu", "vip"]}
        t0 = time.perf_counter()
        for i in range(n):
            audit.emit("deliver", "/", msg_id=f"msg-{i:012x}", attempt=1, **fields)
        t_emit = time.perf_counter() - t0
        audit.close()
        t_all = time.perf_counter() - t0
        size = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(root) for f in fs)
        print(f"records              {n:,}")
        print(f"emit() per call      {t_emit / n * 1e6:.2f} µs (writer thread running alongside)")
        print(f"writer throughput    {audit.written / t_all:,.0f} records/s "
              f"({size / t_all / 1e6:.1f} MB/s, {size / n:.0f} B/record)")
        print(f"dropped              {audit.dropped}")

        # emit() alone, writer idle (queue only), the cost the event loop pays per record.
        audit = AuditLog(root, max_pending=n + 1, flush_interval=3600)
        t0 = time.perf_counter()
        for _ in range(min(n, 200_000)):
            audit.emit("deliver", "/", msg_id="m", attempt=1, **fields)
        t_q = (time.perf_counter() - t0) / min(n, 200_000)
        audit.close()
        print(f"emit() queue only    {t_q * 1e6:.2f} µs")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
