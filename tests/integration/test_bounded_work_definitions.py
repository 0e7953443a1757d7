"""SE5 on the management API: a definitions import of thousands of objects is handled
IMPORT_PER_TURN objects an event-loop turn, so the AMQP clients are served in between."""

from __future__ import annotations

import json
import threading
import urllib.request
from pathlib import Path
from typing import Any

import pika

from tests.integration.test_process import serve

WAIT = 120  # seconds: how long a reply may take before the test calls it lost (not a speed)


def test_SE5_a_definitions_import_of_4000_bindings_lets_a_publisher_in_between(tmp_path: Path) -> None:
    """POST /api/definitions with 4,000 bindings of one queue (k.0 first, k.3999 last) while an
    AMQP client publishes to k.0 and k.3999 in turn: a message on k.0 reaches the queue while
    a later one on k.3999 is not routed yet, so the publisher was served in the middle of the
    import (handled in one go, no publish could fall between the two binds)."""
    keys = 4000
    with serve(tmp_path / "data") as (proc, amqp_port):
        conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", amqp_port))
        ch = conn.channel()
        ch.exchange_declare("imp", "topic", durable=True)
        ch.queue_declare("imp-q", durable=True)
        body = json.dumps({"bindings": [{"source": "imp", "vhost": "/", "destination": "imp-q",
                                         "destination_type": "queue", "routing_key": f"k.{i}", "arguments": {}}
                                        for i in range(keys)]}).encode()
        request = urllib.request.Request(f"http://127.0.0.1:{proc.operator['management API']}/api/definitions",
                                         data=body, method="POST",
                                         headers={"Content-Type": "application/json",
                                                  "Authorization": "Basic Z3Vlc3Q6Z3Vlc3Q="})  # guest:guest
        report: dict[str, Any] = {}
        importer = threading.Thread(target=lambda: report.update(json.load(urllib.request.urlopen(request, timeout=WAIT))),
                                    daemon=True)
        importer.start()
        sent: list[str] = []
        while importer.is_alive() or not sent:
            key = ("k.0", f"k.{keys - 1}")[len(sent) % 2]
            ch.basic_publish("imp", key, str(len(sent)).encode())
            sent.append(key)
            conn.process_data_events(0)  # a round trip's worth of reading
        importer.join(WAIT)
        assert report["imported"]["bindings"] == keys, report
        got = set()
        while (m := ch.basic_get("imp-q", auto_ack=True))[0] is not None:
            got.add(int(m[2]))
        interleaved = [(j, k) for j in sorted(got) if sent[j] == "k.0"
                       for k in range(j + 1, len(sent)) if sent[k] != "k.0" and k not in got]
        assert interleaved, (len(sent), sorted(got)[:10])
        conn.close()


def test_SE5_a_definitions_export_of_4000_queues_lets_a_client_in_between(tmp_path: Path) -> None:
    """GET /api/definitions of 4,000 bound queues while an AMQP client declares a queue
    late-j and then binds the last queue with key late.j, j = 0, 1, ...: the export lists a
    key late.j without its queue late-j, so the client was served between the export's
    listing of the queues and of the bindings (in one go, both or neither)."""
    queues = 4000
    with serve(tmp_path / "data") as (proc, amqp_port):
        conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", amqp_port))
        ch = conn.channel()
        for x in range(10):  # 400 queues an exchange: a topic has at most 500 subscriptions (L5)
            ch.exchange_declare(f"exp-{x}", "topic", durable=True)
        for i in range(queues):
            ch.queue_declare(f"q-{i}", durable=True)
            ch.queue_bind(f"q-{i}", f"exp-{i * 10 // queues}", f"q.{i}")
        request = urllib.request.Request(f"http://127.0.0.1:{proc.operator['management API']}/api/definitions",
                                         headers={"Authorization": "Basic Z3Vlc3Q6Z3Vlc3Q="})  # guest:guest
        export: dict[str, Any] = {}
        exporter = threading.Thread(target=lambda: export.update(json.load(urllib.request.urlopen(request,
                                                                                                   timeout=WAIT))),
                                    daemon=True)
        exporter.start()
        j = 0
        while exporter.is_alive():
            ch.queue_declare(f"late-{j}", durable=True)
            ch.queue_bind(f"q-{queues - 1}", "exp-9", f"late.{j}")
            j += 1
        exporter.join(WAIT)
        listed = {q["name"] for q in export["queues"]}
        assert {f"q-{i}" for i in range(queues)} <= listed
        keys = {b["routing_key"] for b in export["bindings"] if b["destination"] == f"q-{queues - 1}"}
        assert f"q.{queues - 1}" in keys
        between = [k for k in range(j) if f"late.{k}" in keys and f"late-{k}" not in listed]
        assert between, (j, sorted(keys)[:5])
        conn.close()
