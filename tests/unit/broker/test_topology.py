"""Declarations: L5 subscriptions, L2 strict names, headers exchanges (M5), exclusive,
auto-delete and x-expires queues (M7), exchange-to-exchange bindings (M8)."""

from __future__ import annotations

import pytest
from pamqp import commands as C

from tests.unit.broker.helpers import Client, declare, deliveries, small_and_big_behind_fanout


def _close_of(methods):
    [close] = [m for m in methods if isinstance(m, C.Channel.Close)]
    return close.reply_code, close.reply_text


async def test_L5_501st_binding_on_one_exchange_is_refused_and_nothing_changes(broker):
    c = Client(broker)
    c.open_channel()
    c.send(1, C.Exchange.Declare(exchange="fan", exchange_type="fanout"))
    for i in range(500):
        c.send(1, C.Queue.Declare(queue=f"q{i}"), C.Queue.Bind(queue=f"q{i}", exchange="fan"))
    c.send(1, C.Queue.Declare(queue="q500"))
    c.read()
    c.send(1, C.Queue.Bind(queue="q500", exchange="fan"))
    assert _close_of(c.methods()) == (
        406, "PRECONDITION_FAILED - topic 'fan' already has 500 subscriptions (CMQ limit L5)")
    ex = broker.vhosts["/"].exchanges["fan"]
    assert (len(ex.bindings), len(ex.topic.subscriptions)) == (500, 500)
    assert ("q", "q500") not in ex.bindings
    # A further key on an existing pair is no new subscription: still accepted.
    c.open_channel(2)
    assert [type(m).__name__ for m in declare(c, C.Queue.Bind(queue="q7", exchange="fan", routing_key="k"),
                                                 channel=2)] == ["BindOk"]


@pytest.mark.profile("cmq")  # PF2 limits / M11 receive metadata
async def test_L4_sixth_binding_key_of_one_pair_is_refused(broker):
    """M8: each key of one (exchange, queue) pair is a filter of one subscription, at most 5."""
    c = Client(broker)
    c.open_channel()
    c.send(1, C.Exchange.Declare(exchange="tpx", exchange_type="topic"), C.Queue.Declare(queue="tqq"))
    for i in range(5):
        c.send(1, C.Queue.Bind(queue="tqq", exchange="tpx", routing_key=f"k{i}.#"))
    c.read()
    c.send(1, C.Queue.Bind(queue="tqq", exchange="tpx", routing_key="k5.#"))
    code, text = _close_of(c.methods())
    assert code == 406 and text.endswith("(CMQ limit L4)")
    assert broker.vhosts["/"].exchanges["tpx"].bindings[("q", "tqq")].keys == [f"k{i}.#" for i in range(5)]


@pytest.mark.profile("cmq")  # PF2 limits / M11 receive metadata
async def test_L2_strict_names_refuses_names_that_are_not_cmq_names(strict):
    c = Client(strict)
    c.open_channel()
    c.send(1, C.Queue.Declare(queue="orders.eu"))
    assert _close_of(c.methods()) == (
        406, "PRECONDITION_FAILED - queue name 'orders.eu' is not a valid CMQ name (3-64 bytes of "
             "[A-Za-z0-9_-], starting with a letter), so CMQ could not hold it (CMQ limit L2)")
    c.open_channel(2)
    c.send(2, C.Exchange.Declare(exchange="x:1", exchange_type="direct"))
    assert _close_of(c.methods()) == (
        406, "PRECONDITION_FAILED - topic name 'x:1' is not a valid CMQ name (3-64 bytes of "
             "[A-Za-z0-9_-]), so CMQ could not hold it (CMQ limit L2)")
    c.open_channel(3)
    ok = declare(c, C.Queue.Declare(queue="orders_eu"), C.Exchange.Declare(exchange="orders-x"),
                 C.Queue.Declare(queue=""), channel=3)
    assert [type(m).__name__ for m in ok] == ["DeclareOk", "DeclareOk", "DeclareOk"]
    assert ok[2].queue.startswith("amq.gen-")  # server-named queues stay allowed
    assert set(strict.vhosts["/"].queues) == {"orders_eu", ok[2].queue}


async def test_L2_without_strict_names_any_amqp_name_is_kept(broker):
    c = Client(broker)
    c.open_channel()
    [ok] = declare(c, C.Queue.Declare(queue="orders.eu"))
    assert ok.queue == "orders.eu"


async def test_M5_headers_exchange_all_any_and_invalid_x_match(broker):
    c = Client(broker)
    c.open_channel()
    c.send(1, C.Exchange.Declare(exchange="h", exchange_type="headers"),
           C.Queue.Declare(queue="all"), C.Queue.Declare(queue="any"), C.Queue.Declare(queue="xh"),
           C.Queue.Bind(queue="all", exchange="h", arguments={"x-match": "all", "a": 1, "b": "z"}),
           C.Queue.Bind(queue="any", exchange="h", arguments={"x-match": "any", "a": 1, "b": "z"}),
           C.Queue.Bind(queue="xh", exchange="h", arguments={"x-match": "any-with-x", "x-k": "v"}))
    c.read()
    c.publish(1, "h", "", b"ab", headers={"a": 1, "b": "z"})
    c.publish(1, "h", "", b"a", headers={"a": 1})
    c.publish(1, "h", "", b"none", headers={"b": "y"})
    c.publish(1, "h", "", b"x", headers={"x-k": "v"})
    qs = broker.vhosts["/"].queues
    assert (qs["all"].message_count, qs["any"].message_count, qs["xh"].message_count) == (1, 2, 1)
    c.send(1, C.Queue.Bind(queue="all", exchange="h", routing_key="k2", arguments={"x-match": "most"}))
    assert _close_of(c.methods()) == (
        406, "PRECONDITION_FAILED - invalid x-match field value 'most'; expected all, any, all-with-x, "
             "or any-with-x")


async def test_M8_exchange_to_exchange_binding_delivers_once_per_queue(broker):
    """M8: a queue reached twice through exchange bindings gets the message once (RabbitMQ)."""
    c = Client(broker)
    c.open_channel()
    c.send(1, C.Exchange.Declare(exchange="src", exchange_type="fanout"),
           C.Exchange.Declare(exchange="mid", exchange_type="fanout"),
           C.Queue.Declare(queue="sink"),
           C.Exchange.Bind(destination="mid", source="src"),
           C.Queue.Bind(queue="sink", exchange="src"),
           C.Queue.Bind(queue="sink", exchange="mid"))
    c.read()
    c.publish(1, "src", "k", b"once")
    assert broker.vhosts["/"].queues["sink"].message_count == 1
    assert broker.exchange_exchange_bindings is True


async def test_M7_exclusive_queue_is_locked_to_its_connection_and_dropped_with_it(broker):
    a, b = Client(broker), Client(broker)
    a.open_channel()
    b.open_channel()
    declare(a, C.Queue.Declare(queue="mine", exclusive=True))
    b.send(1, C.Basic.Consume(queue="mine"))
    assert _close_of(b.methods())[0] == 405
    b.open_channel(2)
    b.send(2, C.Queue.Declare(queue="mine", exclusive=True))
    code, text = _close_of(b.methods())
    assert code == 405 and text.startswith("RESOURCE_LOCKED - cannot obtain exclusive access to locked "
                                           "queue 'mine' in vhost '/'")
    a.session.on_connection_lost()
    assert "mine" not in broker.vhosts["/"].queues


async def test_M7_auto_delete_queue_goes_with_its_last_consumer(broker):
    c = Client(broker)
    c.open_channel()
    declare(c, C.Queue.Declare(queue="ad", auto_delete=True))
    declare(c, C.Basic.Consume(queue="ad", consumer_tag="one"), C.Basic.Consume(queue="ad", consumer_tag="two"))
    declare(c, C.Basic.Cancel(consumer_tag="one"))
    assert "ad" in broker.vhosts["/"].queues
    assert [type(m).__name__ for m in declare(c, C.Basic.Cancel(consumer_tag="two"))] == ["CancelOk"]
    assert "ad" not in broker.vhosts["/"].queues


async def test_M7_deleting_a_queue_cancels_its_consumers_on_other_channels(broker):
    """consumer_cancel_notify: the server's basic.cancel, as RabbitMQ sends it."""
    a, b = Client(broker), Client(broker)
    a.open_channel()
    b.open_channel()
    declare(a, C.Queue.Declare(queue="gone"), C.Basic.Consume(queue="gone", consumer_tag="ct"))
    declare(b, C.Queue.Delete(queue="gone"))
    [cancel] = a.methods()
    assert isinstance(cancel, C.Basic.Cancel) and cancel.consumer_tag == "ct"
    assert a.session.channels[1].consumers == {}


async def test_M7_x_expires_deletes_an_unused_queue(broker):
    c = Client(broker)
    c.open_channel()
    declare(c, C.Queue.Declare(queue="exp", arguments={"x-expires": 5000}))
    broker.advance_time(4)
    declare(c, C.Queue.Declare(queue="exp", arguments={"x-expires": 5000}))  # a redeclare is a use
    broker.advance_time(4)
    assert "exp" in broker.vhosts["/"].queues
    declare(c, C.Basic.Get(queue="exp"))  # so is a basic.get
    broker.advance_time(4.5)
    assert "exp" in broker.vhosts["/"].queues
    broker.advance_time(0.5)
    assert "exp" not in broker.vhosts["/"].queues


async def test_M7_x_expires_waits_while_the_queue_has_a_consumer(broker):
    c = Client(broker)
    c.open_channel()
    declare(c, C.Queue.Declare(queue="exp", arguments={"x-expires": 1000}),
            C.Basic.Consume(queue="exp", consumer_tag="c"))
    broker.advance_time(60)
    assert "exp" in broker.vhosts["/"].queues
    declare(c, C.Basic.Cancel(consumer_tag="c"))
    broker.advance_time(0.999)
    assert "exp" in broker.vhosts["/"].queues
    broker.advance_time(0.001)
    assert "exp" not in broker.vhosts["/"].queues
    c.publish(1, "", "exp", b"x", mandatory=True)
    [ret] = [d for d, _, _ in deliveries(c.read())]
    assert (ret.reply_code, ret.reply_text) == (312, "NO_ROUTE")


@pytest.mark.profile("cmq")  # PF2 limits / M11 receive metadata
async def test_L6_a_queue_behind_a_topic_refuses_a_body_above_its_max_msg_size(broker):
    """L6: refused before anything is enqueued, in any queue the message reaches."""
    c = small_and_big_behind_fanout(broker)
    c.publish(1, "fan", "", b"x" * 2048)
    c.publish(1, "fan", "", b"x" * 2049)
    assert _close_of(c.methods()) == (
        406, "PRECONDITION_FAILED - message of 2049 bytes is larger than queue 'small' MaxMsgSize 2048 "
             "(CMQ limit L6)")
    qs = broker.vhosts["/"].queues
    assert (qs["small"].message_count, qs["big"].message_count) == (1, 1)
