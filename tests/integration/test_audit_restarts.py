"""A6: what a start restores is no client action. Six restarts (two of them kill -9) of the real
`cmq-gateway serve` with durable queues, bindings and standing breaches of CMQ limits (PF4):
the audit log's client actions (records without ``origin``) are exactly what the client did,
the restores say ``origin: "recovery"``, and ``GET /api/cmq/limits`` is the same before and
after every restart, the L2 queue ``orders.eu`` included (issue 27)."""

from __future__ import annotations

import signal
from collections import Counter
from pathlib import Path
from typing import Any

import pika
import requests

from tests.integration.test_process import serve
from tests.support.audit_files import records

GUEST = ("guest", "guest")
TAGS = [f"t{i}" for i in range(6)]  # one past CMQ's 5 tags a subscription (L3)


def limits(proc: Any) -> Any:
    url = f"http://127.0.0.1:{proc.operator['management API']}/api/cmq/limits"
    r = requests.get(url, auth=GUEST, timeout=30)
    assert r.status_code == 200
    return r.json()


def client_actions(port: int) -> None:
    conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port, connection_attempts=3))
    ch = conn.channel()
    ch.exchange_declare("ex.eu", "direct", durable=True)  # L2: a dot in an exchange name
    ch.exchange_declare("tagsx", "direct", durable=True)
    ch.queue_declare("orders.eu", durable=True)  # L2: a dot in a queue name
    ch.queue_declare("tagged", durable=True)
    ch.queue_bind("orders.eu", "ex.eu", "eu")
    for tag in TAGS:  # the sixth tag of one subscription breaks L3
        ch.queue_bind("tagged", "tagsx", tag)
    conn.close()


def counted(recs: list[dict[str, Any]], origin: str | None) -> Counter[str]:
    events = ("exchange_declare", "queue_declare", "bind", "limit_exceeded")
    return Counter(r["event"] for r in recs if r["event"] in events and r.get("origin") == origin)


def test_A6_restarts_are_no_client_actions_and_standing_breaches_stay_listed(tmp_path: Path) -> None:
    data = tmp_path / "data"
    with serve(data) as (proc, port):
        client_actions(port)
        before = limits(proc)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
    listed = sorted((e["rule"], e["object"], e["user"], e["count"])
                    for v in before["vhosts"] for rule in v["rules"].values() for e in rule["entries"])
    assert listed == [("L2", "exchange:ex.eu", "guest", 1), ("L2", "queue:orders.eu", "guest", 1),
                      ("L3", "binding:tagsx->q:tagged", "guest", 1)]
    did = counted(records(data / "audit"), None)
    assert did == Counter({"exchange_declare": 2, "queue_declare": 2, "bind": 7, "limit_exceeded": 3}), did
    for restart in range(6):
        with serve(data) as (proc, port):
            assert limits(proc) == before, f"restart {restart + 1}"
            if restart in (2, 4):  # a crash: the report was kept as the breaches were made
                proc.kill()
                proc.wait(timeout=30)
            else:
                proc.send_signal(signal.SIGTERM)
                assert proc.wait(timeout=60) == 0
    recs = records(data / "audit")
    assert counted(recs, None) == did  # six restarts, not one client action more
    restored = counted(recs, "recovery")
    # Each start restored the two queues and seven binding keys (exchanges come back silently);
    # a breach the report already held is not reported again.
    assert restored == Counter({"queue_declare": 12, "bind": 42}), restored
    assert not [r for r in recs if r.get("origin") not in (None, "recovery")]
