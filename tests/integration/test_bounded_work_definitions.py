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
