"""W5 back-pressure between connections: a busy publisher yields loop iterations to the busy
consumers the broker owes deliveries to (gateway.transport.owed_input_waiting, Broker.owed),
never for longer than YIELD_MAX_SECONDS at a time, and the management API shows it as RabbitMQ
shows a credit-flow-held connection: state "flow".

The publisher is a process of its own that writes a burst of publishes at once, then a passive
queue.declare on the same channel: its declare-ok comes once the gateway has handled every
publish before it, so its arrival is the proof that the publisher was not held for good."""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

import requests

from tests.integration.differential import blocking
from tests.integration.test_process import ROOT, serve

# Writes COUNT publishes to QUEUE in one burst, then a passive declare of QUEUE; prints its own
# port first and the declare-ok's message count last.
_PUBLISHER = """
import sys
from pamqp import body, commands, frame, header
from tests.integration.raw_amqp import RawClient
port, queue, count = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
client = RawClient(port, timeout=300)
print(client.sock.getsockname()[1], flush=True)
sys.stdin.readline()
burst = b"".join(
    frame.marshal(commands.Basic.Publish(exchange="", routing_key=queue), 1)
    + frame.marshal(header.ContentHeader(0, 16, commands.Basic.Properties()), 1)
    + frame.marshal(body.ContentBody(b"%016d" % i), 1) for i in range(count))
client.sock.sendall(burst + frame.marshal(commands.Queue.Declare(queue=queue, passive=True), 1))
ok = client.expect(commands.Queue.DeclareOk)
print(ok.message_count, flush=True)
client.close()
"""

# A consumer that is busy and owed, and never lets a delivery out: prefetch 5, no acks, and a
# stream of basic.qos (the same prefetch) so that the kernel holds input for it at nearly every
# look. Its input lets nothing out, so it holds a publisher for an iteration or two at a time,
# never for as long as it talks.
_CHATTER = """
import sys, threading
from pamqp import commands, frame
from tests.integration.raw_amqp import RawClient
port, queue = int(sys.argv[1]), sys.argv[2]
client = RawClient(port, timeout=300)
client.sock.sendall(frame.marshal(commands.Basic.Qos(prefetch_count=5), 1))
client.expect(commands.Basic.QosOk)
client.sock.sendall(frame.marshal(commands.Basic.Consume(queue=queue, consumer_tag="chatter"), 1))
client.expect(commands.Basic.ConsumeOk)
print("consuming", flush=True)

def drain():  # its deliveries and qos-oks, read and dropped: the gateway's writes never back up
    while client.sock.recv(1 << 16):
        pass

threading.Thread(target=drain, daemon=True).start()
qos = frame.marshal(commands.Basic.Qos(prefetch_count=5), 1) * 20
while True:
    client.sock.sendall(qos)
"""


def _publisher(port: int, queue: str, count: int) -> tuple[subprocess.Popen[str], int]:
    proc = subprocess.Popen([sys.executable, "-c", _PUBLISHER, str(port), queue, str(count)], cwd=ROOT,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    return proc, int(proc.stdout.readline())


def _go(proc: subprocess.Popen[str]) -> int:
    """Start the burst; the message count of the declare-ok that follows it."""
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write("go\n")
    proc.stdin.flush()
    line = proc.stdout.readline()
    assert line, "the publisher's connection ended before its declare-ok"
    proc.wait(60)
    return int(line)


def _states(api: int, peer_port: int) -> list[str]:
    r = requests.get(f"http://127.0.0.1:{api}/api/connections", auth=("guest", "guest"), timeout=30)
    r.raise_for_status()
    return [c["state"] for c in r.json() if c["peer_port"] == peer_port]


def test_W5_a_flood_yields_to_its_consumer_shows_flow_and_loses_nothing(tmp_path: Path) -> None:
    count = 60_000
    with serve(tmp_path) as (gw, port):
        api = gw.operator["management API"]
        url = f"amqp://guest:guest@127.0.0.1:{port}/%2F"
        with blocking(url) as conn:
            ch = conn.channel()
            ch.queue_declare("yield-q")
            ch.basic_qos(prefetch_count=1000)
            publisher, peer_port = _publisher(port, "yield-q", count)
            assert _states(api, peer_port) == ["running"]
            seen: set[str] = set()
            done = threading.Event()

            def watch() -> None:
                while not done.is_set():
                    seen.update(_states(api, peer_port))
                    done.wait(0.05)

            watcher = threading.Thread(target=watch, daemon=True)
            watcher.start()
            result: list[int] = []
            go = threading.Thread(target=lambda: result.append(_go(publisher)), daemon=True)
            go.start()
            bodies: list[bytes] = []
            for method, _props, body in ch.consume("yield-q", inactivity_timeout=60):
                assert method is not None, "the consumer got nothing for a minute"
                bodies.append(body)
                ch.basic_ack(method.delivery_tag)
                if len(bodies) == count:
                    break
            ch.cancel()
            go.join(60)
            done.set()
            watcher.join(30)
            assert result, "the publisher never got its declare-ok"
            seen.update(_states(api, peer_port))
            # Every message once, none lost to the holds; and the holds were seen, as "flow".
            assert sorted(bodies) == [b"%016d" % i for i in range(count)]
            assert "flow" in seen, seen
            assert ch.queue_declare("yield-q", passive=True).method.message_count == 0


def test_W5_a_consumer_that_never_drains_holds_a_publisher_for_a_bounded_time(tmp_path: Path) -> None:
    count = 20_000
    with serve(tmp_path) as (gw, port):
        url = f"amqp://guest:guest@127.0.0.1:{port}/%2F"
        with blocking(url) as conn:
            conn.channel().queue_declare("yield-stuck")
        chatter = subprocess.Popen([sys.executable, "-c", _CHATTER, str(port), "yield-stuck"], cwd=ROOT,
                                   stdout=subprocess.PIPE, text=True)
        try:
            assert chatter.stdout is not None and chatter.stdout.readline() == "consuming\n"
            publisher, _ = _publisher(port, "yield-stuck", count)
            # Its 5 unacked deliveries are not counted: the declare-ok says the rest are in.
            assert _go(publisher) == count - 5
        finally:
            chatter.kill()
            chatter.wait(30)
        with blocking(url) as conn:  # the chatter's 5 are back; nothing was lost
            assert conn.channel().queue_declare("yield-stuck", passive=True).method.message_count == count

