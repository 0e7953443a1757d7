"""SE5 on the broker: one queue given thousands of binding keys one queue.bind at a time
costs O(n) in all (counted in calls, not seconds), and so does taking them away; the bind
record lists the first 64 keys and says how many there are (A1, M8)."""

from __future__ import annotations

from gateway.broker import Broker
from gateway.broker.exchange import BIND_TAGS_LISTED
from tests.unit.broker.conftest import Recorder
from tests.unit.semantics.test_matching_incremental import calls

SOURCE, DEST = "many", ("q", "many-q")
N = 600  # keys in each half compared


def _declare(broker: Broker) -> None:
    vh = broker.vhost("/")
    vh.declare_exchange(SOURCE, "topic", passive=False, durable=True, auto_delete=False, internal=False,
                        arguments=None)
    vh.declare_queue(None, DEST[1], passive=False, durable=True, exclusive=False, auto_delete=False,
                     arguments=None)


def test_SE5_the_second_600_binding_keys_cost_what_the_first_600_did(audited: Broker,
                                                                              audit: Recorder) -> None:
    """Under the compatible profile, where every key past CMQ's 5 is also reported (PF4)."""
    _declare(audited)
    vh = audited.vhost("/")

    def bind(lo: int, hi: int) -> None:
        for i in range(lo, hi):
            vh.bind(None, SOURCE, DEST, f"k.{i}.*", None, user="guest")

    def unbind(lo: int, hi: int) -> None:
        for i in range(lo, hi):
            vh.unbind(None, SOURCE, DEST, f"k.{i}.*", user="guest")

    first, second = calls(lambda: bind(0, N)), calls(lambda: bind(N, 2 * N))
    assert second <= first * 1.1, (first, second)
    ex = vh.exchanges[SOURCE]
    assert ex.bindings[DEST].key_count == 2 * N
    assert ex.topic is not None
    assert [s.endpoint for s in ex.topic.match(routing_key=f"k.{2 * N - 1}.x")] == [DEST]
    assert ex.topic.match(routing_key=f"k.{2 * N}.x") == ()

    binds = audit.of("bind")
    assert len(binds) == 2 * N
    assert binds[9]["tags"] == [f"k.{i}.*" for i in range(10)] and "tags_count" not in binds[9]
    assert binds[-1]["tags"] == [f"k.{i}.*" for i in range(BIND_TAGS_LISTED)]
    assert binds[-1]["tags_count"] == 2 * N
    assert len(audit.of("limit_exceeded")) >= 2 * N - 5  # PF4: each key past CMQ's 5 is reported

    last, rest = calls(lambda: unbind(N, 2 * N)), calls(lambda: unbind(0, N - 1))
    assert last <= rest * 1.1 and rest <= last * 1.1, (last, rest)
    assert [s.endpoint for s in ex.topic.match(routing_key=f"k.{N - 1}.x")] == [DEST]
    assert ex.topic.match(routing_key=f"k.{2 * N - 1}.x") == ()
    vh.unbind(None, SOURCE, DEST, f"k.{N - 1}.*", user="guest")
    assert DEST not in ex.bindings  # the last key took the subscription with it (M8)
