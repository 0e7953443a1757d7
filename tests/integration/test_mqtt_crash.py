"""MQ8: the outgoing half of a persistent MQTT session across kill -9 of the gateway, over real
sockets against a `cmq-gateway serve` subprocess: packet identifiers still pending are never
given to new messages after the restart, resends carry DUP and their old identifier, and an
identifier whose PUBREL was sent comes back as PUBREL, never as a PUBLISH."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

from gateway.mqtt import codec as P
from tests.integration.mqtt_client import RawClient
from tests.integration.test_process import serve


def _kill9(proc: Any) -> None:
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)


def _publish(port: int, client_id: str, payloads: list[bytes], qos: int) -> None:
    """Publish each payload to mq8/<n>; returns once every one is acknowledged."""
    pub = RawClient(port, 4)
    pub.connect(client_id)
    for i, body in enumerate(payloads, 1):
        pub.send(P.Publish(f"mq8/{i % 3}", body, qos, packet_id=i))
    done = 0
    while done < len(payloads):
        p = pub.recv()
        assert isinstance(p, P.Ack), p
        if p.kind == P.PUBREC:
            pub.send(P.Ack(P.PUBREL, p.packet_id))
        else:
            assert p.kind == (P.PUBACK if qos == 1 else P.PUBCOMP) and p.reason_code == 0, p
            done += 1
    pub.close()


def _subscriber(port: int, client_id: str, level: int, qos: int, *, first: bool) -> RawClient:
    c = RawClient(port, level)
    props = {"session_expiry": 3600} if level == 5 else {}
    ack = c.connect(client_id, clean=False, **props)
    assert ack.session_present is (not first)
    if first:
        c.send(P.Subscribe(1, [("mq8/#", qos)]))
        assert c.recv().reason_codes == [qos]
    return c


def _held_then_killed(tmp_path: Path, level: int, qos: int) -> tuple[Path, dict[int, bytes], set[int]]:
    """A persistent subscriber gets six messages and completes none of them; for QoS 2 it
    sends PUBREC for the first two and gets their PUBREL (no PUBCOMP). Then kill -9.
    Returns the data dir, the packet ids of the PUBLISHes still unanswered -> payload, and
    the ids whose PUBREL is pending."""
    data = tmp_path / f"data-{level}-{qos}"
    with serve(data) as (proc, _):
        port = proc.mqtt_port  # type: ignore[attr-defined]
        sub = _subscriber(port, "mq8-sub", level, qos, first=True)
        _publish(port, "mq8-pub", [f"old-{i}".encode() for i in range(6)], qos)
        held: dict[int, bytes] = {}
        while len(held) < 6:
            p = sub.recv()
            assert isinstance(p, P.Publish) and p.qos == qos and not p.dup, p
            held[p.packet_id] = p.payload
        released: set[int] = set()
        if qos == 2:
            for pid in sorted(held)[:2]:
                sub.send(P.Ack(P.PUBREC, pid))
            while len(released) < 2:
                p = sub.recv()
                assert isinstance(p, P.Ack) and p.kind == P.PUBREL, p
                released.add(p.packet_id)
                del held[p.packet_id]
        _kill9(proc)
    return data, held, released


def _MQ8_after_restart(tmp_path: Path, level: int, qos: int) -> None:
    data, held, released = _held_then_killed(tmp_path, level, qos)
    pending = set(held) | released
    with serve(data) as (proc, _):
        port = proc.mqtt_port  # type: ignore[attr-defined]
        # New messages while the subscriber is away: they queue behind the old ones.
        _publish(port, "mq8-pub", [f"new-{i}".encode() for i in range(8)], qos)
        sub = _subscriber(port, "mq8-sub", level, qos, first=False)
        resent: dict[int, bytes] = {}
        rels: set[int] = set()
        fresh: dict[int, bytes] = {}
        while len(resent) < len(held) or len(rels) < len(released) or len(fresh) < 8:
            p = sub.recv()
            assert p is not None, (resent, rels, fresh)
            if isinstance(p, P.Ack):
                # An identifier whose PUBREL was sent comes back as PUBREL only.
                assert p.kind == P.PUBREL and p.packet_id in released, p
                rels.add(p.packet_id)
                continue
            assert isinstance(p, P.Publish) and p.qos == qos, p
            if p.payload.startswith(b"old-"):
                # The resend: DUP, under the identifier it was sent with before the kill.
                assert p.dup, p
                assert held.get(p.packet_id) == p.payload, (p.packet_id, p.payload, held)
                resent[p.packet_id] = p.payload
            else:
                # A new message never takes an identifier the client may still hold.
                assert p.packet_id not in pending, (p.packet_id, pending)
                assert p.packet_id not in fresh, p
                fresh[p.packet_id] = p.payload
        assert rels == released
        assert sorted(fresh.values()) == sorted(f"new-{i}".encode() for i in range(8))
        # The client completes everything: nothing else comes (the released messages are
        # not delivered again as new ones).
        for pid in released:
            sub.send(P.Ack(P.PUBCOMP, pid))
        for pid in [*resent, *fresh]:
            sub.send(P.Ack(P.PUBACK if qos == 1 else P.PUBREC, pid))
        if qos == 2:
            for _ in range(len(resent) + len(fresh)):
                p = sub.recv()
                assert isinstance(p, P.Ack) and p.kind == P.PUBREL, p
                sub.send(P.Ack(P.PUBCOMP, p.packet_id))
        sub.send(P.PingReq())
        assert isinstance(sub.recv(), P.PingResp)
        sub.close()
        # And once more after a clean stop: the session comes back with nothing pending.
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
    with serve(data) as (proc, _):
        port = proc.mqtt_port  # type: ignore[attr-defined]
        sub = _subscriber(port, "mq8-sub", level, qos, first=False)
        sub.send(P.PingReq())
        assert isinstance(sub.recv(), P.PingResp)  # no PUBLISH, no PUBREL before it
        sub.close()


def test_MQ8_qos2_pending_ids_resent_with_dup_pubrel_as_pubrel_and_never_reused(tmp_path: Path) -> None:
    _MQ8_after_restart(tmp_path, 4, 2)


def test_MQ8_qos2_the_same_on_mqtt_5(tmp_path: Path) -> None:
    _MQ8_after_restart(tmp_path, 5, 2)


def test_MQ8_qos1_resends_carry_dup_and_their_id_and_ids_are_not_reused(tmp_path: Path) -> None:
    _MQ8_after_restart(tmp_path, 4, 1)


def _crash_left_record_last(data: Path, client_id: str, pid: int, *, message_lost: bool) -> None:
    """What a kill -9 leaves when a group commit took a QoS 2 PUBLISH's session record (the
    identifier marked routed) but not the message put just after it: the record is the last
    durable write. With ``message_lost`` False, the record was written earlier (the message
    then reached the disk after it)."""
    from gateway.mqtt.session import SessionState, session_key
    from semantics.store import Store

    store = Store.open(str(data))
    try:
        raw = store.get(session_key("/", client_id))
        assert raw is not None
        state = SessionState.from_json(raw)
        state.inbound_qos2.add(pid)
        state.inbound_at[pid] = store.last_lsn + (1 if message_lost else -1)
        store.put(session_key("/", client_id), state.to_json())
        store.sync()
    finally:
        store.close()


def test_MQ4_a_qos2_publish_whose_message_missed_the_disk_is_routed_when_resent(tmp_path: Path) -> None:
    """The incoming half: a resent QoS 2 PUBLISH is taken for a duplicate only if the message
    it duplicates was stored; the record written just before the message names its LSN, and
    a restart whose store ends at that record routes the resend (else the message is lost)."""
    for lost in (True, False):
        data = tmp_path / f"data-{lost}"
        with serve(data) as (proc, _):
            port = proc.mqtt_port  # type: ignore[attr-defined]
            sub = _subscriber(port, "mq4-sub", 4, 2, first=True)
            sub.close()
            pub = RawClient(port, 4)
            pub.connect("mq4-pub", clean=False)
            pub.close()
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=30)
        _crash_left_record_last(data, "mq4-pub", 9, message_lost=lost)
        with serve(data) as (proc, _):
            port = proc.mqtt_port  # type: ignore[attr-defined]
            pub = RawClient(port, 4)
            assert pub.connect("mq4-pub", clean=False).session_present
            pub.send(P.Publish("mq8/x", b"resent", 2, dup=True, packet_id=9))
            assert (lambda r: (r.kind, r.packet_id))(pub.recv()) == (P.PUBREC, 9)
            pub.send(P.Ack(P.PUBREL, 9))
            assert (lambda r: (r.kind, r.packet_id))(pub.recv()) == (P.PUBCOMP, 9)
            pub.send(P.Publish("mq8/x", b"marker", 2, packet_id=10))
            assert pub.recv().kind == P.PUBREC
            pub.close()
            sub = _subscriber(port, "mq4-sub", 4, 2, first=False)
            got = []
            while not got or got[-1] != b"marker":
                p = sub.recv()
                assert isinstance(p, P.Publish), p
                got.append(p.payload)
                sub.send(P.Ack(P.PUBREC, p.packet_id))
            sub.close()
            # Routed once when the message missed the disk; not again when it was stored.
            assert got == ([b"resent", b"marker"] if lost else [b"marker"]), (lost, got)
