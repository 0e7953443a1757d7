"""_wire.c's take_plains and ack_pubs against their Python references (issue 28: CPU a message).

take_plains takes a run of pulled deliveries of the common case into the local model in one
call (gateway.jetstream.plain_takes.take_plains is the reference): on random runs of
deliveries, common or not (redeliveries, other headers, reply subjects C declines, records cut
short, names or properties not cached yet, IDs leased already (Q3) or refused otherwise), it
must stop where the reference stops, lease, restore and count the same, and raise what it
raises. ``Pulls._take`` must leave the model as it does without C. ack_pubs must make
wire.pubs' commands, or decline.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.broker import persistence as P
from gateway.broker.message import Message, init_message, new_message
from gateway.jetstream import pulls as pulls_mod
from gateway.jetstream import wire
from gateway.jetstream.head import _NAMES, _PROPERTIES, MSG_ID, stored_message
from gateway.jetstream.plain_takes import plain_head, take_plains
from gateway.jetstream.wire import Delivery
from gateway.protocol.properties import Properties
from semantics.errors import CMQError
from tests.unit.jetstream.compiled import compiled, needs_compiled
from tests.unit.jetstream.test_pulls_take_plain import _pulls

_c: Any = getattr(compiled, "take_plains", None)
_c_pubs: Any = getattr(compiled, "ack_pubs", None)
needs_take_plains = needs_compiled("take_plains")
needs_ack_pubs = needs_compiled("ack_pubs")

NOW = 1_700_000_000.0
NAMES = [("/", "q", "", "q"), ("/", "q", "ex", "rk"), ("v", "q2", "logs", ".a")]
PROPS = [Properties.build().raw, Properties.build(delivery_mode=2).raw, Properties.build(content_type="text/plain").raw]
DUP, REFUSED = "dup", "refused"  # restore_plain raises Q3 for the first, another rule for the second


def _reply(delivered: Any, seq: Any, pending: Any, form: int) -> str:
    if form == 0:
        return f"$JS.ACK.S.C.{delivered}.{seq}.{seq}.1700000000000000000.{pending}"
    if form == 1:
        return f"$JS.ACK.dom.hash.S.C.{delivered}.{seq}.{seq}.1700000000000000000.{pending}.tok"
    if form == 2:
        return f"$JS.ACK.S.C.{delivered}.{seq}.{seq}.{pending}"  # 8 tokens: declined
    return f"$JS.ACK.S.C.{delivered}.{seq}.{seq}.17.{pending}é"  # not digits: declined


_number = st.one_of(st.integers(0, 60).map(str), st.sampled_from(["", "+1", "x", "1" * 19, "٣"]))
def _mostly(common: Any, other: Any) -> Any:
    """``common`` seven times in eight: runs of the common case, with the others among them."""
    return st.integers(0, 7).flatmap(lambda k: other if k == 7 else st.just(common))


_delivery = st.fixed_dictionaries({
    "cls": _mostly(Delivery, st.just(SimpleNamespace)),
    "delivered": _mostly(1, st.one_of(st.integers(0, 3), _number)),
    "seq": _mostly(None, st.one_of(st.integers(0, 60), _number)),
    "pending": st.one_of(st.integers(0, 10 ** 17), _number),
    "form": _mostly(0, st.sampled_from([1, 2, 3])),
    "id": st.sampled_from(["a", "b", "c", "d", "e", "f", DUP, REFUSED, " g "]),
    "headers": _mostly("lone", st.sampled_from(["extra", "none", "empty", "other", "bytes"])),
    "names": st.integers(0, len(NAMES) - 1),
    "props": st.integers(0, len(PROPS) - 1),
    "body": st.binary(max_size=20),
    "cut": _mostly(None, st.integers(0, 30)),
})


def _make(d: dict[str, Any], n: int) -> Any:
    vhost, queue, exchange, key = NAMES[d["names"]]
    raw = P.encode_message(vhost, queue, d["id"], NOW - 3, exchange, key, PROPS[d["props"]], d["body"])
    if d["cut"] is not None:
        raw = raw[:d["cut"]]
    headers: Any = {"lone": {MSG_ID: d["id"]}, "extra": {MSG_ID: d["id"], "Cmq-Expires-At": "1"},
                    "none": None, "empty": {}, "other": {"Other": d["id"]}, "bytes": {MSG_ID: b"a"}}[d["headers"]]
    reply = _reply(d["delivered"], n if d["seq"] is None else d["seq"], d["pending"], d["form"])
    if d["cls"] is Delivery:
        return Delivery("S.q", reply, raw, headers)
    return SimpleNamespace(subject="S.q", reply=reply, data=raw, headers=headers)


def _run(fn: Any, msgs: list[Any], start: int, last_delivery: int, delays: dict[str, Any],
         names: dict[bytes, Any], props: dict[bytes, Any]) -> dict[str, Any]:
    log: list[Any] = []

    def restore_plain(msg: Message, size: int, now: float, msg_id: str, enq: float) -> None:
        log.append((msg.body, id(msg.properties), msg.exchange, msg.routing_key, msg.published_at, msg.tags,
                    msg.msg_id, msg.persistent, size, now, msg_id, enq))
        if msg_id == DUP:
            raise CMQError("Q3", "already in queue", value=msg_id)
        if msg_id == REFUSED:
            raise CMQError("L8", "refused")

    s = SimpleNamespace(last_delivery=last_delivery)
    leases: dict[str, Any] = {}
    delays = dict(delays)
    try:
        out: Any = fn(msgs, start, s, NOW, leases, delays, restore_plain, names, props, new_message, init_message,
                      Message, CMQError, MSG_ID)
    except CMQError as e:
        out = ("raised", e.rule)
    return {"out": out, "last_delivery": s.last_delivery, "leases": [(k, id(v)) for k, v in leases.items()],
            "delays": delays, "log": log}


@needs_take_plains
@settings(max_examples=600, deadline=None)
@given(st.lists(_delivery, max_size=12), st.integers(0, 3), st.integers(0, 40),
       st.dictionaries(st.sampled_from(["a", "b", "x", DUP]), st.just((NOW, True)), max_size=3),
       _mostly(set(range(len(NAMES))), st.sets(st.integers(0, len(NAMES) - 1))),
       _mostly(set(range(len(PROPS))), st.sets(st.integers(0, len(PROPS) - 1))))
def test_take_plains_in_c_as_in_python(ds: list[dict[str, Any]], start: int, last_delivery: int,
                                       delays: dict[str, Any], cached_names: set[int], cached_props: set[int]) -> None:
    msgs = [_make(d, n) for n, d in enumerate(ds)]
    names: dict[bytes, Any] = {}
    for k in cached_names:
        vhost, queue, exchange, key = NAMES[k]
        for properties in PROPS:  # the key holds the properties' length too (bytes 9 to the names' end)
            head = plain_head(P.encode_message(vhost, queue, "a", NOW, exchange, key, properties, b""))
            assert head is not None
            names[head[1]] = NAMES[k]
    props = {PROPS[k]: Properties(PROPS[k]) for k in cached_props}
    c = _run(_c, msgs, start, last_delivery, delays, names, props)
    py = _run(take_plains, msgs, start, last_delivery, delays, names, props)
    assert c == py


def test_a_typical_run_is_taken_whole() -> None:
    """Every delivery of a pull of first deliveries with cached names is the common case."""
    names, props = NAMES[1], PROPS[1]
    head = plain_head(P.encode_message(*names[:2], "x", NOW, *names[2:], props, b""))
    assert head is not None
    msgs = [Delivery("S.q", _reply(1, n, 100 - n, 0), P.encode_message(*names[:2], f"m{n}", NOW, *names[2:], props, b"x"),
                     {MSG_ID: f"m{n}"}) for n in range(1, 6)]
    for fn in (take_plains, *((_c,) if _c is not None else ())):  # the reference alone where C is not there
        got = _run(fn, msgs, 0, 0, {}, {head[1]: names}, {props: Properties(props)})
        assert got["out"] == (5, 95)
        assert got["last_delivery"] == 5
        assert [k for k, _ in got["leases"]] == ["m1", "m2", "m3", "m4", "m5"]


@needs_take_plains
def test_take_leaves_the_model_as_without_c(monkeypatch: pytest.MonkeyPatch) -> None:
    """Pulls._take with take_plains and with the loop body alone: the same messages, leases,
    receive counts and last delivery, for a pull mixing the common case with others."""
    def pull() -> list[Any]:
        out = []
        for n in range(1, 41):
            names = NAMES[n % 3] if n != 17 else ("/", "new", "ex", f"k{n}")  # one not cached yet
            delivered = 2 if n % 7 == 0 else 1
            headers = {MSG_ID: f"m{n}", "Cmq-Expires-At": repr(NOW + 60)} if n % 11 == 0 else {MSG_ID: f"m{n}"}
            raw = P.encode_message(names[0], names[1], f"m{n}", NOW - n, names[2], names[3], PROPS[n % 3], b"b%d" % n)
            out.append(Delivery("S.q", _reply(delivered, n, 40 - n, 0), raw, headers))
        out.append(Delivery("S.q", _reply(1, 41, 0, 0), out[4].data, {MSG_ID: "m5"}))  # m5 again: Q3, the newer lease
        return out

    states = []
    for use_c in (True, False):
        _NAMES.clear()
        _PROPERTIES.clear()
        stored_message(pull()[0].data, "warm")  # some names and properties cached, as after a first pull
        if not use_c:
            monkeypatch.setattr(pulls_mod, "compiled_take_plains", None)
        p, s, _ = _pulls(monkeypatch)
        msgs = pull()
        p._take(s, msgs)
        cmq = s.q.cmq
        states.append((
            sorted((m.msg_id, m.receive_count, m.expires_at, m.state.name, m.payload.body, m.payload.exchange,
                    m.payload.routing_key, m.payload.published_at, m.payload.properties.raw) for m in cmq.messages()),
            [(k, msgs.index(v)) for k, v in s.leases.items()], s.last_delivery, s.q.remote_ready))
    assert states[0] == states[1]
    assert states[0][2] == 41 and states[0][3] == 0
    assert ("m5", 40) in states[0][1]


_subject = st.one_of(st.text(alphabet="$JS.ACKabc0123456789_-", max_size=40), st.text(max_size=8))
_payload = st.one_of(st.sampled_from([b"+ACK", b"-NAK", b"+TERM", b'-NAK {"delay": 10000000000}']), st.binary(max_size=30))


@needs_ack_pubs
@settings(max_examples=800, deadline=None)
@given(st.lists(st.tuples(_subject, _payload), max_size=8))
def test_ack_pubs_in_c_as_wire_pubs(replies: list[tuple[str, bytes]]) -> None:
    got = _c_pubs(replies)
    if all(s.isascii() for s, _ in replies):
        assert got == wire.pubs(replies)
        assert all(type(c[2]) is str and c[4] is None for c in got)
    else:
        assert got is None  # declined: wire.pubs makes them


@needs_ack_pubs
def test_ack_pubs_declines_what_is_not_a_subject_and_payload() -> None:
    assert _c_pubs([("a", "+ACK")]) is None
    assert _c_pubs([(b"a", b"+ACK")]) is None
    assert _c_pubs([("a", b"+ACK", 1)]) is None
    assert _c_pubs([]) == []
    with pytest.raises(TypeError):
        _c_pubs(("a", b"+ACK"))
