"""A store written before the management API refused what RabbitMQ refuses in a policy (M7,
M16) may hold such a policy: the gateway still starts, keeps it as stored (an export gives it
back) and says so in its log; a client's PUT of the same is refused with RabbitMQ's reason."""

from __future__ import annotations

import logging

import pytest

from gateway.broker import Broker
from gateway.broker.policies import Policy, PolicyError
from gateway.broker.policy_validation import erl
from semantics.clock import ManualClock


async def test_M7_a_stored_policy_rabbitmq_refuses_still_loads_and_is_logged(tmp_path, caplog) -> None:
    clock = ManualClock()
    b = await Broker.open(str(tmp_path), clock=clock)
    old = {"max-length": 2, "max-length-bytes": "NaN", "x-what": 1}
    b.vhost("/").set_policy(Policy("/", "old", "^capped", "queues", 0, old))  # as the gateway stored it before
    await b.close()
    with caplog.at_level(logging.WARNING, logger="gateway.broker.policies"):
        b2 = await Broker.open(str(tmp_path), clock=clock)
    try:
        vh = b2.vhosts["/"]
        assert vh.policies["old"].definition == old
        q = vh.declare_queue(None, "capped.q", passive=False, durable=True, exclusive=False, auto_delete=False,
                             arguments=None)
        assert q.policy is not None and q.attrs.max_length == 2  # its applied keys still apply
    finally:
        await b2.close()
    assert any("'old'" in r.getMessage() and "not a valid maximum length in bytes" in r.getMessage()
               for r in caplog.records), [r.getMessage() for r in caplog.records]
    with pytest.raises(PolicyError, match="is not a valid maximum length in bytes"):
        Policy.checked({"pattern": "^capped", "definition": old}, "/", "old")


def test_M16_values_are_written_as_rabbitmq_writes_them() -> None:
    assert [erl(v) for v in ("NaN", "", 1, 1.5, 1e20, 100.0, True, None, [1, "a"], {"k": 1})] == \
        ['<<"NaN">>', "<<>>", "1", "1.5", "1.0e20", "100.0", "true", "null", '[1,<<"a">>]', '#{<<"k">> => 1}']


async def test_M16_a_stored_queue_with_a_queue_type_rabbitmq_refuses_still_loads(tmp_path) -> None:
    """A store written before x-queue-type was checked may hold a 'Quorum' queue: it loads, as
    it was declared; a client's new declare of the same is refused (406)."""
    from gateway.broker import persistence as P
    from semantics.errors import CMQError

    clock = ManualClock()
    b = await Broker.open(str(tmp_path), clock=clock)
    b.persist(P.queue_key("/", "typo"), P.encode_json({"vhost": "/", "name": "typo", "auto_delete": False,
                                                       "arguments": {"x-queue-type": "Quorum"}}))
    await b.close()
    b2 = await Broker.open(str(tmp_path), clock=clock)
    try:
        assert b2.vhosts["/"].queues["typo"].arguments == {"x-queue-type": "Quorum"}
        with pytest.raises(CMQError, match="unsupported queue type 'Quorum'"):
            b2.vhost("/").declare_queue(None, "typo2", passive=False, durable=True, exclusive=False,
                                        auto_delete=False, arguments={"x-queue-type": "Quorum"})
    finally:
        await b2.close()
