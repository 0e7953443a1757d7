"""SE5 against the real `cmq-gateway serve` process: one SUBSCRIBE of 10,000 filters (paho)
gets its SUBACK while another client's round trips keep being answered, an UNSUBSCRIBE of
them all too, and a SIGTERM sent while big SUBSCRIBEs are being handled stops the gateway
(issue 26: 10,000 filters were never answered, every other client stalled and SIGTERM went
unanswered)."""

from __future__ import annotations

import signal
import threading
import uuid
from pathlib import Path
from typing import Any

import paho.mqtt.client as paho
from paho.mqtt.enums import CallbackAPIVersion, MQTTProtocolVersion

from gateway.mqtt import codec as P
from tests.integration.mqtt_client import RawClient
from tests.integration.test_process import serve

FILTERS = 10_000
WAIT = 120  # seconds: how long a reply may take before the test calls it lost (not a speed)
PROBES = ("many/0/c", f"many/{FILTERS - 1}/c")  # the first and the last filter take these


def _client(port: int, name: str) -> paho.Client:
    c = paho.Client(CallbackAPIVersion.VERSION2, client_id=f"{name}-{uuid.uuid4().hex[:8]}",
                    protocol=MQTTProtocolVersion.MQTTv5)
    c.username_pw_set("guest", "guest")
    c.connect("127.0.0.1", port, keepalive=600)
    return c


class Canary(threading.Thread):
    """Another client: QoS 1 publishes, one after the other, to PROBES in turn (the first and
    the last of the big client's filters), payload its sequence number. Each PUBACK is a
    round trip the gateway answered, counted in ``replies``; ``sent`` is the probe topic of
    each sequence number."""

    def __init__(self, port: int) -> None:
        super().__init__(daemon=True)
        self.stop = threading.Event()
        self.c = _client(port, "canary")
        self.c.loop_start()
        self.sent: list[str] = []
        self.replies = 0
        self.error: str | None = None

    def run(self) -> None:
        while not self.stop.is_set():
            topic = PROBES[len(self.sent) % 2]
            info = self.c.publish(topic, str(len(self.sent)).encode(), qos=1)
            self.sent.append(topic)
            info.wait_for_publish(WAIT)
            if not info.is_published():
                self.error = "a canary PUBLISH was not acknowledged"
                return
            self.replies += 1

    def close(self) -> None:
        self.stop.set()
        self.join(WAIT)
        self.c.loop_stop()
        self.c.disconnect()


def _wait_for(condition: Any) -> None:
    done = threading.Event()
    for _ in range(WAIT * 100):
        if condition():
            return
        done.wait(0.01)
    raise AssertionError("the condition never held")


def test_SE5_a_10000_filter_subscribe_is_answered_while_another_client_keeps_going(tmp_path: Path) -> None:
    """Proved by order, not by time: the big client gets canary messages on its first filter
    before its SUBACK (routed between two slices of its SUBSCRIBE: handled in one go, the
    SUBACK would leave in the same turn as the first bind); and during its UNSUBSCRIBE a
    canary message on the last filter reaches it while an earlier one on the first filter,
    already unbound, does not."""
    with serve(tmp_path / "data") as (proc, _):
        port = proc.mqtt_port  # type: ignore[attr-defined]
        big = _client(port, "big")
        log: list[tuple[str, int]] = []  # what the big client got, in the order it came
        acks: dict[str, list[Any]] = {}
        answered = {"suback": threading.Event(), "unsuback": threading.Event()}

        def on_subscribe(_c: Any, _u: Any, _mid: int, codes: list[Any], _p: Any) -> None:
            log.append(("suback", len(canary.sent)))
            acks["suback"] = codes
            answered["suback"].set()

        def on_unsubscribe(_c: Any, _u: Any, _mid: int, codes: list[Any], _p: Any) -> None:
            log.append(("unsuback", len(canary.sent)))
            acks["unsuback"] = codes
            answered["unsuback"].set()

        big.on_subscribe, big.on_unsubscribe = on_subscribe, on_unsubscribe
        big.on_message = lambda _c, _u, m: log.append((m.topic, int(m.payload)))
        big.loop_start()
        canary = Canary(port)
        canary.start()
        _wait_for(lambda: canary.replies >= 1)

        filters = [f"many/{i}/+" for i in range(FILTERS)]
        big.subscribe([(f, 1) for f in filters])
        assert answered["suback"].wait(WAIT), "no SUBACK"
        assert [c.value for c in acks["suback"]] == [1] * FILTERS  # every filter granted QoS 1, in order
        kinds = [k for k, _ in log]
        before_suback = log[:kinds.index("suback")]
        assert sum(1 for topic, _ in before_suback if topic == PROBES[0]) >= 2, before_suback
        _wait_for(lambda: any(topic == PROBES[1] for topic, _ in log))  # the last filter routes too
        first_after_suback = len(canary.sent)
        big.unsubscribe(filters)
        assert answered["unsuback"].wait(WAIT), "no UNSUBACK"
        assert [c.value for c in acks["unsuback"]] == [0] * FILTERS
        # Nothing bound is left: what the canary sends from now is not routed to the big
        # client, which sees that once a marker sent after it has come.
        marker = threading.Event()
        answered["suback"].clear()
        big.subscribe("marker/after", qos=1)
        assert answered["suback"].wait(WAIT)
        stopped = len(canary.sent)
        big.on_message = lambda _c, _u, m: (log.append((m.topic, int(m.payload))), marker.set())
        canary.c.publish("marker/after", b"-1", qos=1)
        assert marker.wait(WAIT)
        got = {seq for topic, seq in log if topic in PROBES}
        assert not any(seq in got for seq in range(stopped, len(canary.sent)) if canary.sent[seq] in PROBES)
        # Between the first filter unbound and the last: a message on the first not routed,
        # a later one on the last routed.
        interleaved = [(j, k) for j in range(first_after_suback, stopped) if canary.sent[j] == PROBES[0]
                       and j not in got for k in range(j + 1, stopped) if canary.sent[k] == PROBES[1] and k in got]
        assert interleaved, (first_after_suback, stopped, sorted(got)[-20:])

        assert canary.error is None
        canary.close()
        big.loop_stop()
        big.disconnect()


def _subscribes(client: RawClient, name: str, packets: int, sent: list[int]) -> None:
    """``packets`` SUBSCRIBEs of FILTERS new filters each, back to back (the writes block
    while the gateway is busy with the earlier ones and reads no more)."""
    try:
        for n in range(packets):
            client.send(P.Subscribe(n + 1, [(f"{name}/{n}/{i}/+", 1) for i in range(FILTERS)]))
            sent.append(n)
    except OSError:
        pass  # the gateway went away, as asked


def test_SE5_sigterm_while_big_subscribes_are_handled_stops_the_gateway(tmp_path: Path) -> None:
    with serve(tmp_path / "data") as (proc, _):
        port = proc.mqtt_port  # type: ignore[attr-defined]
        clients = []
        for k in range(2):
            c = RawClient(port, 4)
            c.connect(f"flood-{k}")
            clients.append(c)
        sent: list[list[int]] = [[], []]
        writers = [threading.Thread(target=_subscribes, args=(c, f"flood{k}", 5, sent[k]), daemon=True)
                   for k, c in enumerate(clients)]
        for w in writers:
            w.start()
        first = clients[0].recv(timeout=WAIT)
        assert isinstance(first, P.SubAck) and first.reason_codes == [1] * FILTERS
        # The gateway is in the middle of the rest: four more SUBSCRIBEs of this client wait.
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=WAIT) == 0
        answered = 1
        try:
            while isinstance(clients[0].recv(timeout=WAIT), P.SubAck):
                answered += 1
        except OSError:
            pass  # reset: the gateway closed with our SUBSCRIBEs unread
        assert answered < 5, "the SIGTERM came after the work it should have interrupted"
        for w in writers:
            w.join(WAIT)
        for c in clients:
            c.sock.close()

