"""gateway.protocol.fastpath: the compiled frames of every message against their Python twins.

The connection takes publishes and acks out of its buffer with ``fast_event`` and writes
deliveries with ``append_deliver``; both are C where the package was built with a compiler
(``_frames.c``) and Python otherwise. Here the two give the same answer for every position of
random streams of good, damaged and cut frames, on channels in every state, and the same
bytes (and the same errors) for deliveries; pamqp is the reference for the bytes.
"""

from __future__ import annotations

import abc
import gc
import os
import random
import struct
import tracemalloc
from typing import Any, NamedTuple

import pytest
from amqp_pipe import content_frames, method_frame
from hypothesis import given, settings
from hypothesis import strategies as st
from pamqp import commands as C
from pamqp import frame

from gateway.protocol import codec, fastpath
from gateway.protocol.channel import Channel, ChannelState
from gateway.protocol.events import Content, Method
from gateway.protocol.properties import _SCANNED, Properties
from semantics.queue import QueueMessage, Receipt
from semantics.queue_attrs import QueueAttributes

_frames: Any = None
if fastpath.COMPILED:
    from gateway.protocol import _frames  # type: ignore[attr-defined,no-redef]

IMPLEMENTATIONS = [pytest.param(fastpath.py_append_deliver, id="python"),
                   pytest.param("compiled", id="compiled")]


def test_the_compiled_frames_are_built() -> None:
    """The suite runs the build the README installs, with a C compiler: the compiled path must
    be what the gateway uses (CMQ_GATEWAY_PURE_PYTHON=1 chooses the Python path on purpose)."""
    if os.environ.get("CMQ_GATEWAY_PURE_PYTHON", "") not in ("", "0"):
        assert not fastpath.COMPILED and fastpath.fast_event is fastpath.py_fast_event
        return
    assert fastpath.COMPILED, "gateway/protocol/_frames.c was not built (pip install -e . needs a C compiler)"
    assert fastpath.fast_event is _frames.fast_event
    assert fastpath.append_deliver is _frames.append_deliver


needs_compiled = pytest.mark.skipif(not fastpath.COMPILED, reason="CMQ_GATEWAY_PURE_PYTHON=1: no compiled twin to compare")

# -- streams of frames ----------------------------------------------------------------------

_HEAD = struct.Struct(">BHI")
PROPS = [b"\x00\x00", Properties.build(delivery_mode=2).raw,
         Properties.build(content_type="text/plain", headers={"a": 1, "b": "x"}, message_id="m-1").raw]
BAD_PROPS = [b"\x80\x00\x05", b"\x80\x00", b"\x10\x00\x07"]  # malformed property lists


def _frame(ftype: int, channel: int, payload: bytes, end: int = 0xCE) -> bytes:
    return _HEAD.pack(ftype, channel, len(payload)) + payload + bytes((end,))


def _short(rng: random.Random) -> bytes:
    kind = rng.random()
    if kind < 0.85:
        return rng.choice([b"", b"amq.topic", b"perf-q", "día".encode(), b"x" * 255])
    if kind < 0.95:
        return bytes(rng.randrange(256) for _ in range(rng.randrange(6)))  # often not UTF-8
    return rng.choice(["é".encode()[:1], b"\xff\xfe"])


def _publish(rng: random.Random, channel: int) -> bytes:
    exchange, key = _short(rng), _short(rng)
    args = struct.pack(">H", rng.choice([0, 0, 7])) + bytes((len(exchange),)) + exchange
    args += bytes((len(key),)) + key + bytes((rng.randrange(4),))
    if rng.random() < 0.05:
        args += b"\x00"  # trailing byte
    out = _frame(1, channel, struct.pack(">HH", 60, 40) + args)
    body = rng.randbytes(rng.choice([0, 0, 1, 16, 300, 5000]))
    props = rng.choice(PROPS if rng.random() < 0.85 else BAD_PROPS)
    declared = len(body) if rng.random() < 0.95 else len(body) + 1
    hchannel = channel if rng.random() < 0.95 else channel + 1
    cls = 60 if rng.random() < 0.97 else 50
    header = struct.pack(">HHQ", cls, 0, declared) + props
    if rng.random() < 0.05:
        header = header[:rng.randrange(14)]  # shorter than a content header can be
    out += _frame(2, hchannel, header)
    if body:
        if rng.random() < 0.1:  # two body frames: the general path's case
            half = len(body) // 2
            out += _frame(3, channel, body[:half]) + _frame(3, channel, body[half:])
        else:
            out += _frame(3, channel, body)
    return out


def _ack(rng: random.Random, channel: int) -> bytes:
    tag = rng.choice([1, 2, 2**40, 2**64 - 1])
    payload = struct.pack(">HHQB", 60, 80, tag, rng.randrange(4))
    if rng.random() < 0.05:
        payload += b"\x00"
    return _frame(1, channel, payload, 0xCE if rng.random() < 0.95 else 0x00)


def _stream(rng: random.Random) -> bytes:
    parts = []
    for _ in range(rng.randrange(1, 6)):
        channel = rng.choice([1, 1, 1, 1, 1, 2, 3, 4, 0])
        what = rng.random()
        if what < 0.5:
            parts.append(_publish(rng, channel))
        elif what < 0.8:
            parts.append(_ack(rng, channel))
        elif what < 0.9:
            parts.append(method_frame(channel, C.Basic.Qos(prefetch_count=5)))
        else:
            parts.append(codec.HEARTBEAT_FRAME)
    data = bytearray(b"".join(parts))
    for _ in range(rng.choice([0, 0, 0, 1, 3])):  # damage
        data[rng.randrange(len(data))] = rng.randrange(256)
    if rng.random() < 0.2:
        del data[rng.randrange(len(data) + 1):]  # cut
    return bytes(data)


def _channels() -> dict[int, Channel]:
    open_, closing, mid_content = Channel(1), Channel(2), Channel(3)
    open_.state = ChannelState.OPEN
    closing.state = ChannelState.CLOSING
    mid_content.state = ChannelState.OPEN
    mid_content.publish = C.Basic.Publish()
    return {1: open_, 2: closing, 3: mid_content}


def _shape(got: tuple[Any, int] | None) -> Any:
    """What an answer says, comparable across the two implementations."""
    if got is None:
        return None
    event, pos = got
    if type(event) is Content:
        m, p = event.method, event.properties
        assert type(m) is C.Basic.Publish and type(p) is Properties and type(event.body) is bytes
        return ("publish", pos, event.channel, m.ticket, m.exchange, m.routing_key, m.mandatory, m.immediate,
                p.raw, p.delivery_mode, p.headers, p.message_id, event.body)
    assert type(event) is Method and type(event.method) is C.Basic.Ack
    return ("ack", pos, event.channel, event.method.delivery_tag, event.method.multiple)


@needs_compiled
@pytest.mark.parametrize("seed", range(40))
def test_fast_event_compiled_equals_python_at_every_position(seed: int) -> None:
    rng = random.Random(seed)
    taken = 0
    for _ in range(25):
        data = _stream(rng)
        channels = _channels()
        frame_max = rng.choice([0, 4096, 131072, 131072, 200])
        max_size = rng.choice([128 * 1024 * 1024, 128 * 1024 * 1024, 100, 0])
        for buf in (data, bytearray(data)):
            for pos in range(len(buf) + 1):
                want = _shape(fastpath.py_fast_event(buf, pos, frame_max, max_size, channels))
                got = _shape(_frames.fast_event(buf, pos, frame_max, max_size, channels))
                assert got == want, (seed, pos, bytes(buf[pos:pos + 40]))
                taken += want is not None
    assert taken >= 10  # the streams hold plenty of plain frames, not only declines


@needs_compiled
def test_fast_event_answers_each_frame_as_the_connection_did() -> None:
    """The plain cases, by value: a publish with and without a body, and an ack."""
    channels = _channels()
    props = Properties.build(delivery_mode=2, headers={"k": "v"})
    publish = method_frame(1, C.Basic.Publish(exchange="ex", routing_key="rk.é", mandatory=True))
    data = publish + content_frames(1, b"hello", C.Basic.Properties(delivery_mode=2, headers={"k": "v"}))
    empty = publish + content_frames(1, b"")
    ack = method_frame(1, C.Basic.Ack(delivery_tag=9, multiple=True))
    for fn in (fastpath.py_fast_event, _frames.fast_event):
        event, pos = fn(data + ack, 0, 131072, 1 << 20, channels)
        assert pos == len(data)
        assert (event.channel, event.method.exchange, event.method.routing_key, event.method.mandatory,
                event.method.immediate, event.body) == (1, "ex", "rk.é", True, False, b"hello")
        assert event.properties.raw == props.raw and event.properties.headers == {"k": "v"}
        assert _shape(fn(empty, 0, 131072, 1 << 20, channels))[-1] == b""
        event, pos = fn(data + ack, len(data), 131072, 1 << 20, channels)
        assert (pos, event.channel, event.method.delivery_tag, event.method.multiple) == (len(data + ack), 1, 9, True)
        assert fn(data[:-1], 0, 131072, 1 << 20, channels) is None  # not all buffered yet
        assert fn(data, 0, 131072, 1 << 20, {}) is None  # no such channel


@needs_compiled
def test_fast_event_keeps_no_references() -> None:
    """Taken and declined frames alike leave nothing behind (a missed Py_DECREF in the C
    would keep every body)."""
    channels = _channels()
    good = method_frame(1, C.Basic.Publish(exchange="", routing_key="q")) + content_frames(1, b"b" * 1000)
    bad_name = bytearray(good)
    bad_name[good.index(b"q")] = 0xFF  # the routing key is not UTF-8: declined after the copies
    ack = method_frame(1, C.Basic.Ack(delivery_tag=3))
    body = bytearray()
    for _ in range(3):  # warm the caches first: the names and the properties' scan
        for data in (good, bytes(bad_name), ack):
            _frames.fast_event(data, 0, 131072, 1 << 20, channels)
        _frames.append_deliver(body, 1, "ctag", 1, False, "", "q", b"\x00\x00", b"b" * 1000, 131072)
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for _ in range(5000):
            for data in (good, bytes(bad_name), ack):
                _frames.fast_event(data, 0, 131072, 1 << 20, channels)
            body.clear()
            _frames.append_deliver(body, 1, "ctag", 1, False, "", "q", b"\x00\x00", b"b" * 1000, 131072)
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert grown < 200_000, f"{grown} bytes held after 5,000 rounds"


# -- deliveries -----------------------------------------------------------------------------

names = st.text(max_size=60).filter(lambda s: len(s.encode("utf-8")) <= 255)
exchanges = st.from_regex(r"\A[a-zA-Z0-9_.:-]{0,60}\Z")


def _impl(which: Any) -> Any:
    if which == "compiled":
        if not fastpath.COMPILED:
            pytest.skip("CMQ_GATEWAY_PURE_PYTHON=1: no compiled twin")
        return _frames.append_deliver
    return which


@pytest.mark.parametrize("which", IMPLEMENTATIONS)
@settings(max_examples=150, deadline=None)
@given(channel=st.integers(1, 65535), consumer_tag=names, delivery_tag=st.integers(0, 2**63 - 1),
       redelivered=st.booleans(), exchange=exchanges, routing_key=names,
       body=st.binary(max_size=3000), frame_max=st.sampled_from([4096, 4104, 131072, 0]),
       headers=st.dictionaries(names, st.text(max_size=10), max_size=3))
def test_append_deliver_matches_pamqp(which: Any, channel: int, consumer_tag: str, delivery_tag: int,
                                      redelivered: bool, exchange: str, routing_key: str, body: bytes,
                                      frame_max: int, headers: dict[str, str]) -> None:
    append = _impl(which)
    props = C.Basic.Properties(headers=headers or None, delivery_mode=2)
    out = bytearray(b"before")
    append(out, channel, consumer_tag, delivery_tag, redelivered, exchange, routing_key, props.marshal(), body,
           frame_max)
    expected = frame.marshal(C.Basic.Deliver(consumer_tag=consumer_tag, delivery_tag=delivery_tag,
                                             redelivered=redelivered, exchange=exchange,
                                             routing_key=routing_key), channel)
    expected += content_frames(channel, body, props, frame_max or 1 << 40)
    assert bytes(out) == b"before" + expected


@pytest.mark.parametrize("which", IMPLEMENTATIONS)
def test_append_deliver_refuses_what_shortstr_refuses(which: Any) -> None:
    append = _impl(which)
    out = bytearray(b"kept")
    with pytest.raises(ValueError, match="short string of 256 bytes"):
        append(out, 1, "t" * 256, 1, False, "", "q", b"\x00\x00", b"x", 131072)
    with pytest.raises(UnicodeEncodeError):
        append(out, 1, "t", 1, False, "", "\ud800", b"\x00\x00", b"x", 131072)
    assert out == b"kept"  # nothing half-written
    append(out, 1, b"bytes-tag", 1, True, b"ex", b"rk", b"\x00\x00", memoryview(b"body"), 131072)
    assert out.startswith(b"kept") and out.endswith(b"\x03\x00\x01\x00\x00\x00\x04body\xce")


# -- the channel's and the events' slots, read and written at their offsets ------------------

class _DictChannel:
    """A channel of another class, its fields in an instance dict (no slots)."""

    def __init__(self, state: ChannelState, publish: Any) -> None:
        self.state = state
        self.publish = publish


class _SubChannel(Channel):
    __slots__ = ()


class _PropertyChannel(Channel):
    """``state`` a property over the slot: the property wins, as for any data descriptor."""

    __slots__ = ()

    @property  # type: ignore[override]
    def state(self) -> Any:
        return ChannelState.CLOSING

    @state.setter
    def state(self, value: Any) -> None:
        pass  # Channel.__init__ sets it


def _channel_of(kind: str, state: ChannelState, publish: Any) -> Any:
    if kind == "dict":
        return _DictChannel(state, publish)
    chan = {"slots": Channel, "subclass": _SubChannel, "property": _PropertyChannel}[kind](1)
    if kind != "property":
        chan.state = state
    chan.publish = publish
    return chan


_PLAIN = (method_frame(1, C.Basic.Publish(exchange="ex", routing_key="rk")) + content_frames(1, b"body"),
          method_frame(1, C.Basic.Ack(delivery_tag=5)))


@needs_compiled
@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["slots", "dict", "subclass", "property"]),
                          st.sampled_from(list(ChannelState)), st.booleans(), st.sampled_from(_PLAIN)),
                min_size=1, max_size=12))
def test_fast_event_reads_a_channel_of_any_class_as_python_does(steps: list[Any]) -> None:
    """W1 (the frames' path is the connection's): the compiled path reads a channel's state and
    publish at the slot's offset it remembers for the channel's class; a channel of another
    class met in between (a dict, a subclass, a property over the slot) is read as Python
    reads it, and so is the remembered class again after it."""
    for kind, state, mid_content, data in steps:
        channels = {1: _channel_of(kind, state, C.Basic.Publish() if mid_content else None)}
        want = _shape(fastpath.py_fast_event(data, 0, 131072, 1 << 20, channels))
        assert _shape(_frames.fast_event(data, 0, 131072, 1 << 20, channels)) == want
        assert (want is not None) == (kind != "property" and state is ChannelState.OPEN and not mid_content)


@needs_compiled
def test_fast_event_sees_a_class_changed_after_it_read_it() -> None:
    """A class whose attributes change after the compiled path remembered its slot's offset
    (a property put over the slot) is read as Python reads it from then on: the remembered
    offset holds only under the class's version tag."""
    changing = type("Changing", (Channel,), {"__slots__": ()})
    chan = changing(1)
    chan.state = ChannelState.OPEN
    channels = {1: chan}
    for data in _PLAIN:
        assert _shape(_frames.fast_event(data, 0, 131072, 1 << 20, channels)) is not None
    changing.state = property(lambda self: ChannelState.CLOSING)  # type: ignore[attr-defined]
    for data in _PLAIN:
        assert fastpath.py_fast_event(data, 0, 131072, 1 << 20, channels) is None
        assert _frames.fast_event(data, 0, 131072, 1 << 20, channels) is None


# -- the last names and property list taken, remembered --------------------------------------

_SAME_LENGTH = ["q-aa", "q-ab", "q-ba", "", "amq.topic"]
_SAME_LENGTH_PROPS = [*PROPS, Properties.build(delivery_mode=1).raw]  # the length of delivery_mode=2's


@needs_compiled
@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(_SAME_LENGTH), st.sampled_from(_SAME_LENGTH), st.sampled_from(_SAME_LENGTH_PROPS),
                          st.booleans()), min_size=1, max_size=15))
def test_fast_event_gives_each_publish_its_own_names_and_properties(steps: list[Any]) -> None:
    """W1: the compiled path remembers the last exchange, routing key and property list it
    took (a publisher repeats them); a publish whose bytes differ, even at the same length, or
    after the shared caches were emptied, gets its own, as the Python path gives it."""
    channels = _channels()
    for exchange, key, props, clear in steps:
        if clear:
            codec._NAMES.clear()
            _SCANNED.clear()
        data = method_frame(1, C.Basic.Publish(exchange=exchange, routing_key=key))
        data += _frame(2, 1, struct.pack(">HHQ", 60, 0, 3) + props) + _frame(3, 1, b"abc")
        want = _shape(fastpath.py_fast_event(data, 0, 131072, 1 << 20, channels))
        assert want is not None and want[4:6] == (exchange, key) and want[8] == props
        assert _shape(_frames.fast_event(data, 0, 131072, 1 << 20, channels)) == want


# -- tuple_of: a tuple class's instance from its items -----------------------------------------

class _Pair(NamedTuple):
    first: Any
    second: Any


class _Plain(tuple):  # type: ignore[type-arg]
    __slots__ = ()


@needs_compiled
@settings(max_examples=200, deadline=None)
@given(st.sampled_from([tuple, _Pair, _Plain]), st.lists(st.one_of(st.none(), st.integers(), st.text(max_size=3),
                                                                     st.lists(st.integers(), max_size=2)),
                                                           min_size=2, max_size=2))
def test_tuple_of_makes_what_tuple_new_makes(cls: type, items: list[Any]) -> None:
    """M12 (the delivery a basic.ack settles is an Unacked made by tuple_of): the compiled
    tuple_of gives what tuple.__new__(cls, items) gives, the same class, the very items,
    tracked by the collector alike."""
    want, got = fastpath.py_tuple_of(cls, *items), _frames.tuple_of(cls, *items)
    assert type(got) is type(want) is cls and got == want
    assert all(g is i for g, i in zip(got, items, strict=True))
    assert gc.is_tracked(got) and gc.is_tracked(want)


@needs_compiled
def test_tuple_of_refuses_a_class_that_is_not_a_tuple() -> None:
    for bad in (list, int, "tuple"):
        with pytest.raises(TypeError):
            fastpath.py_tuple_of(bad, 1)  # type: ignore[type-var]
        with pytest.raises(TypeError):
            _frames.tuple_of(bad, 1)


# -- tuple_new, object_new: tuple.__new__ and object.__new__ without tp_new_wrapper ----------

@needs_compiled
@settings(max_examples=200, deadline=None)
@given(st.sampled_from([tuple, _Pair, _Plain, Receipt]),
       st.one_of(st.tuples(st.none(), st.integers()), st.lists(st.integers(), max_size=3), st.text(max_size=3)))
def test_tuple_new_makes_what_tuple_new_makes(cls: type, items: Any) -> None:
    """M12 (the Receipt a delivery's ack deletes by is made by tuple_new once the broker is
    loaded): the compiled tuple_new gives what tuple.__new__(cls, items) gives for any
    iterable, the same class and the very items, tracked by the collector alike; an exact
    tuple handed to tuple itself comes back as itself, as from tuple.__new__. A NamedTuple
    whose items do not fit its fields is made by both alike (tuple.__new__ does not check)."""
    want, got = fastpath.py_tuple_new(cls, items), _frames.tuple_new(cls, items)
    assert type(got) is type(want) is cls and got == want
    if not isinstance(items, str):  # a str's characters are new objects at each iteration
        assert all(g is i for g, i in zip(got, items, strict=True))
    assert gc.is_tracked(got) == gc.is_tracked(want)
    if cls is tuple and type(items) is tuple:
        assert got is items and want is items


@needs_compiled
def test_tuple_new_refuses_what_tuple_new_refuses() -> None:
    for cls, items in ((list, (1,)), (int, (1,)), ("tuple", (1,)), (tuple, 5), (Receipt, None)):
        with pytest.raises(TypeError):
            fastpath.py_tuple_new(cls, items)
        with pytest.raises(TypeError):
            _frames.tuple_new(cls, items)


class _Slotted:
    __slots__ = ("a", "b")

    def __init__(self, a: int) -> None:
        self.a = a


class _Dicted:
    pass


@needs_compiled
@pytest.mark.parametrize("cls", [QueueMessage, _Slotted, _Dicted, object])
def test_object_new_makes_what_object_new_makes(cls: type) -> None:
    """Q3 (a QueueMessage made by object_new once the broker is loaded): the same class, no
    slot set (reading one raises as on object.__new__'s), a __dict__ where the class has one,
    tracked by the collector alike; the class's __init__ not called."""
    want, got = fastpath.py_object_new(cls), _frames.object_new(cls)
    assert type(got) is type(want) is cls
    assert gc.is_tracked(got) == gc.is_tracked(want)
    assert hasattr(got, "__dict__") == hasattr(want, "__dict__")
    for slot in getattr(cls, "__slots__", ()):
        assert not hasattr(got, slot) and not hasattr(want, slot)


class _Abstract(abc.ABC):
    @abc.abstractmethod
    def f(self) -> None: ...


@needs_compiled
def test_object_new_refuses_what_it_cannot_make_as_object_new_does() -> None:
    """A class with a __new__ of its own (tuple, int, a NamedTuple), an abstract class or no
    class: object_new refuses all (TypeError) rather than make one another way; object.__new__
    refuses them too."""
    for bad in (tuple, int, Receipt, _Abstract, "x"):
        with pytest.raises(TypeError):
            fastpath.py_object_new(bad)
        with pytest.raises(TypeError):
            _frames.object_new(bad)


@needs_compiled
@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from(("a", "b")), min_size=0, max_size=3),
       st.lists(st.one_of(st.none(), st.integers(), st.floats(allow_nan=False), st.text(max_size=3)),
                min_size=3, max_size=3))
def test_slots_new_makes_what_object_new_and_setattr_make(names: list[str], values: list[Any]) -> None:
    """Q3 (a QueueMessage made by slots_new once the broker is loaded): the compiled
    slots_new gives what object.__new__(cls) and a setattr a name give, in order (a name
    twice: its last value), the unnamed slots unset, the very values."""
    names_t = tuple(names)
    vals = values[:len(names_t)]
    want, got = fastpath.py_slots_new(_Slotted, names_t, *vals), _frames.slots_new(_Slotted, names_t, *vals)
    assert type(got) is type(want) is _Slotted
    for slot in ("a", "b"):
        assert hasattr(got, slot) == hasattr(want, slot)
        if hasattr(want, slot):
            assert getattr(got, slot) is getattr(want, slot)
    assert gc.is_tracked(got) == gc.is_tracked(want)


@needs_compiled
def test_slots_new_refuses_what_is_not_a_plain_slot_and_relearns_a_changed_class() -> None:
    """Not a slot (a __dict__ class's attribute, a method), a count that does not match, a
    class with a __new__ of its own: TypeError, nothing made another way (the twin, setattr,
    would take the first). A class changed since (its version tag) is looked up again."""
    for cls, names, vals in ((_Dicted, ("a",), (1,)), (_Slotted, ("__init__",), (1,)), (_Slotted, ("a",), ()),
                             (_Slotted, ["a"], (1,)), (Receipt, ("message",), (1,)), (_Slotted, ("c",), (1,))):
        with pytest.raises(TypeError):
            _frames.slots_new(cls, names, *vals)
    names = ("b", "a")
    first = _frames.slots_new(_Slotted, names, 1, 2)
    _Slotted.extra = 5  # type: ignore[attr-defined]  # a new version tag
    try:
        again = _frames.slots_new(_Slotted, names, 3, 4)
    finally:
        del _Slotted.extra  # type: ignore[attr-defined]
    assert (first.a, first.b, again.a, again.b) == (2, 1, 4, 3)


@settings(max_examples=100, deadline=None)
@given(st.text(min_size=1, max_size=8), st.integers(0, 65536), st.floats(0, 1e9),
       st.one_of(st.none(), st.floats(1e9, 2e9)))
def test_a_message_of_the_model_is_what_its_init_makes(msg_id: str, size: int, now: float,
                                                       expires_at: float | None) -> None:
    """Q3, Q7: a message sent or restored (restore_plain) through the model, made by the
    broker's makers (compiled or not), holds in every slot what QueueMessage.__init__ sets."""
    import gateway.broker.queue  # noqa: F401  (it hands the makers over)
    import semantics.queue as Q

    q = Q.CmqQueue("q", QueueAttributes())
    sent = q.send("p", size, now, None, msg_id, expires_at)
    restored = q.restore_plain("r", size, now, msg_id + "-r", now - 1.0)
    for m, want in ((sent, QueueMessage(msg_id, "p", size, now, sent.seq, expires_at)),
                    (restored, QueueMessage(msg_id + "-r", "r", size, now - 1.0, restored.seq, None))):
        # what the queue changes after making it, set alike on the reference
        for later in ("state", "pos", "deadline", "next_visible_time", "receive_count", "handle"):
            setattr(want, later, getattr(m, later))
        assert type(m) is QueueMessage
        assert [getattr(m, n) for n in QueueMessage.__slots__] == [getattr(want, n) for n in QueueMessage.__slots__]


def test_the_broker_hands_its_makers_to_the_queue_model() -> None:
    """Once the broker is loaded the model makes its QueueMessages and Receipts with
    fastpath's makers (compiled or, pure Python, object.__new__ / tuple.__new__ themselves),
    and a send / receive / delete goes through them as before."""
    import gateway.broker.queue  # noqa: F401  (it hands the makers over)
    import semantics.queue as Q

    assert Q._new_object is fastpath.object_new and Q._new_receipt is fastpath.tuple_new
    assert Q._slots_new is fastpath.slots_new and (fastpath.slots_new is None) == (not fastpath.COMPILED)
    q = Q.CmqQueue("q", QueueAttributes())
    m = q.send("p", 1, 0.0)
    r = q.receive(0.0)
    assert type(m) is QueueMessage and type(r) is Receipt and r.message is m and r.handle == m.handle
    assert q.delete(r, 0.0) and q.receive(0.0) is None


# -- ack_run: a consumer's run of acks ------------------------------------------------------

def _ack_stream(rng: random.Random) -> bytes:
    """Mostly plain acks on channel 1, with multiple=true ones, other channels, other methods,
    damage and cuts among them."""
    parts = []
    for _ in range(rng.randrange(1, 12)):
        what = rng.random()
        channel = 1 if rng.random() < 0.9 else rng.choice([2, 3, 0, 256])
        if what < 0.8:
            tag = rng.choice([0, 1, 7, 2**40, 2**64 - 1])
            bits = 0 if rng.random() < 0.85 else rng.choice([1, 2, 3])
            parts.append(_frame(1, channel, struct.pack(">HHQB", 60, 80, tag, bits)))
        else:
            parts.append(rng.choice([_ack(rng, channel), _publish(rng, channel), codec.HEARTBEAT_FRAME,
                                     method_frame(max(channel, 1), C.Basic.Nack(delivery_tag=3))]))
    data = bytearray(b"".join(parts))
    for _ in range(rng.choice([0, 0, 1, 2])):
        data[rng.randrange(len(data))] = rng.randrange(256)
    if rng.random() < 0.2:
        del data[rng.randrange(len(data) + 1):]
    return bytes(data)


@needs_compiled
@pytest.mark.parametrize("seed", range(30))
def test_ack_run_compiled_equals_python_at_every_position(seed: int) -> None:
    rng = random.Random(seed)
    runs = 0
    for _ in range(20):
        data = _ack_stream(rng)
        frame_max = rng.choice([0, 131072, 12, 13])
        channel = rng.choice([1, 1, 1, 2, 0, 70000])
        limit = rng.choice([32, 32, 1, 3, 0, -1])
        for buf in (data, bytearray(data)):
            for pos in range(len(buf) + 1):
                want = fastpath.py_ack_run(buf, pos, channel, frame_max, limit)
                assert _frames.ack_run(buf, pos, channel, frame_max, limit) == want, (seed, pos)
                runs += want is not None
    assert runs >= 1  # runs were compared, not only declines


@given(st.binary(max_size=200), st.data())
@settings(max_examples=300, deadline=None)
def test_ack_run_is_fast_event_s_plain_acks_in_a_row(data: bytes, draw: Any) -> None:
    """Each tag of a run is the ack fast_event takes at its place (multiple false, on the
    channel), one ACK_FRAME after the other, and the run stops at the first frame that is not
    one (or at the limit): what the transport takes in one call is what it took one by one."""
    tags = draw.draw(st.lists(st.integers(0, 2**64 - 1), max_size=6))
    acks = b"".join(_frame(1, 1, struct.pack(">HHQB", 60, 80, t, draw.draw(st.sampled_from([0, 0, 2, 1]))))
                    for t in tags)
    buf = bytearray(acks + data if draw.draw(st.booleans()) else data + acks)
    pos = draw.draw(st.integers(0, len(buf)))
    limit = draw.draw(st.integers(1, 8))
    channels = _channels()
    for run_of in (fastpath.py_ack_run, fastpath.ack_run):
        got = run_of(buf, pos, 1, 131072, limit) or []
        at = pos
        for tag in got:
            event, nxt = fastpath.py_fast_event(buf, at, 131072, 1 << 20, channels)
            assert type(event.method) is C.Basic.Ack and event.channel == 1
            assert (event.method.delivery_tag, event.method.multiple, nxt) == (tag, False, at + fastpath.ACK_FRAME)
            at = nxt
        if len(got) < limit:
            after = fastpath.py_fast_event(buf, at, 131072, 1 << 20, channels)
            assert after is None or type(after[0]) is not Method or after[0].method.multiple \
                or after[1] != at + fastpath.ACK_FRAME
