"""Direct delivery's decisions (gateway.jetstream.direct): ``room`` against deliveries made one
by one as the broker's dispatch makes them (Consumer.has_credit before each), which queues may
take the path (``plain_queue``), and the switch in the config file and on the command line."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.broker.arguments import QueueArgs, parse_queue_args
from gateway.broker.consumers import Consumer
from gateway.broker.queue import BrokerQueue
from gateway.cli import build_parser
from gateway.config import ConfigError, parse_config
from gateway.jetstream.direct import plain_queue, room
from semantics.queue import CmqQueue
from semantics.queue_attrs import QueueAttributes
from tests.unit.broker.test_next_consumer_credit import _channel, _channel_state, _consumer_state


def _queue(durable: bool = False, arguments: dict[str, Any] | None = None) -> BrokerQueue:
    qargs = parse_queue_args(arguments) if arguments else QueueArgs()
    attrs = QueueAttributes(**qargs.attrs)
    return BrokerQueue("/", "q", durable=durable, exclusive_owner=None, auto_delete=False, arguments=arguments or {},
                       qargs=qargs, attrs=attrs, cmq=CmqQueue("q", attrs))


def _deliverable(q: BrokerQueue, wanted: int) -> bool:
    """Whether the consumers take ``wanted`` deliveries, each given to a consumer that
    has_credit() then, as dispatch gives them (a no-ack one settles at once)."""
    for n in range(wanted):
        c = next((c for c in q.consumers if c.has_credit()), None)
        if c is None:
            return False
        if not c.no_ack:
            c.unacked += 1
            c.channel.unacked[1000 + n] = None  # type: ignore[assignment]
    return True


@settings(max_examples=500, deadline=None)
@given(st.lists(_channel_state, min_size=1, max_size=3), st.lists(_consumer_state, min_size=0, max_size=4),
       st.integers(0, 8))
def test_room_is_credit_for_the_active_messages_and_one_more(channels: list[dict[str, Any]],
                                                              consumers: list[dict[str, Any]], active: int) -> None:
    q = _queue()
    chs = [_channel(c) for c in channels]
    for i, state in enumerate(consumers):
        c = Consumer(f"c{i}", chs[state["channel"] % len(chs)], q, no_ack=state["no_ack"], exclusive=False,
                     prefetch=state["prefetch"])
        c.unacked = state["unacked"]
        q.consumers.append(c)
    for i in range(active):
        q.cmq.send(b"x", 1, 0.0, None, f"m{i}")
    assert room(q) == _deliverable(q, active + 1)


@pytest.mark.parametrize(("durable", "arguments", "plain"), [
    (False, {}, True),
    (False, {"x-expires": 60000, "x-cmq-visibility-timeout": 5}, True),
    (True, {}, False),
    (False, {"x-message-ttl": 1000}, False),
    (False, {"x-max-length": 10}, False),
    (False, {"x-dead-letter-exchange": "dlx"}, False),
    (False, {"x-delivery-limit": 3}, False),
    (False, {"x-max-priority": 5}, False),
    (False, {"x-single-active-consumer": True}, False),
    (False, {"x-cmq-delay-seconds": 2}, False),
])
def test_which_queues_keep_direct_messages(durable: bool, arguments: dict[str, Any], plain: bool) -> None:
    assert plain_queue(_queue(durable, arguments)) is plain


def test_the_switch_in_the_config_and_on_the_command_line() -> None:
    assert parse_config({}).direct_delivery is True
    assert parse_config({"cluster": {"direct_delivery": None}}).direct_delivery is True
    assert parse_config({"cluster": {"direct_delivery": False}}).direct_delivery is False
    with pytest.raises(ConfigError):
        parse_config({"cluster": {"direct_delivery": "no"}})
    parser = build_parser()
    assert parser.parse_args(["serve"]).direct_delivery is None  # the config decides
    assert parser.parse_args(["serve", "--no-direct-delivery"]).direct_delivery is False
