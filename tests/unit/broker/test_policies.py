"""RabbitMQ policies on CMQ queues and exchanges (M7): matching, priority, RabbitMQ's
resolution with queue arguments, at declare time and on change, across a restart."""

from __future__ import annotations

import base64
import hashlib

import pytest

from gateway.auth import check_password, hashing_algorithm
from gateway.broker import Broker
from gateway.broker.policies import Policy, PolicyError, choose, queue_arguments
from gateway.protocol.properties import Properties
from semantics.clock import ManualClock


def _declare(vh, name: str, **args):
    return vh.declare_queue(None, name, passive=False, durable=True, exclusive=False, auto_delete=False,
                            arguments=args or None)


def test_M7_pattern_is_searched_apply_to_and_highest_priority_wins() -> None:
    low = Policy("/", "low", r"^orders\.", "queues", 1, {"max-length": 10})
    high = Policy("/", "high", r"orders", "all", 5, {"max-length": 3})
    ex_only = Policy("/", "ae", r".", "exchanges", 9, {"alternate-exchange": "spill"})
    policies = [low, high, ex_only]
    assert choose(policies, "queue", "orders.eu") is high
    assert choose(policies, "queue", "my-orders") is high  # searched, not anchored (re:run)
    assert choose(policies, "queue", "billing") is None
    assert choose(policies, "exchange", "orders") is ex_only
    tie = Policy("/", "a-first", r"orders", "queues", 5, {"max-length": 7})
    assert choose([*policies, tie], "queue", "orders.eu") is tie  # a tie: first by name
    quorum = Policy("/", "qq", r".", "quorum_queues", 0, {"delivery-limit": 2})
    assert choose([quorum], "queue", "a", {"x-queue-type": "quorum"}) is quorum
    assert choose([quorum], "queue", "a", {}) is None


def test_M7_resolution_lower_limit_wins_and_the_argument_wins_otherwise() -> None:
    p = Policy("/", "p", ".", "queues", 0, {"message-ttl": 500, "max-length": 100, "expires": 60000,
                                             "dead-letter-exchange": "dlx", "overflow": "reject-publish"})
    got = queue_arguments({"x-message-ttl": 2000, "x-max-length": 5, "x-dead-letter-exchange": "mine"}, p)
    assert got == {"x-message-ttl": 500, "x-max-length": 5, "x-expires": 60000,
                   "x-dead-letter-exchange": "mine", "x-overflow": "reject-publish"}
    assert queue_arguments({"x-message-ttl": 1}, None) == {"x-message-ttl": 1}


def test_M7_bad_policies_are_refused_and_unknown_keys_are_listed() -> None:
    for raw in ({"pattern": "(", "definition": {"max-length": 1}},
                {"pattern": ".", "definition": {"max-length": -1}},
                {"pattern": ".", "definition": {"expires": 0}},
                {"pattern": ".", "definition": {"overflow": "spill"}},
                {"pattern": ".", "definition": {}},
                {"pattern": ".", "apply-to": "topics", "definition": {"max-length": 1}},
                {"definition": {"max-length": 1}}):
        with pytest.raises(PolicyError):
            Policy.from_json({"name": "p", **raw})
    p = Policy.from_json({"name": "ha", "vhost": "v", "pattern": ".", "priority": "3",
                          "definition": {"ha-mode": "all", "queue-mode": "lazy", "max-length": 1, "x-what": 1}})
    assert p.priority == 3
    assert [k for k, _ in p.not_applied()] == ["ha-mode", "queue-mode", "x-what"]
    assert "mirror" in dict(p.not_applied())["ha-mode"]


async def test_M7_policy_applies_to_existing_and_later_queues_and_changes_at_once(tmp_path) -> None:
    clock = ManualClock()
    b = await Broker.open(str(tmp_path), clock=clock)
    vh = b.vhost("/")
    early = _declare(vh, "capped.early")
    vh.set_policy(Policy("/", "cap", r"^capped\.", "queues", 0, {"max-length": 2}))
    late = _declare(vh, "capped.late", **{"x-max-length": 1})
    other = _declare(vh, "free")
    assert (early.policy.name, early.attrs.max_length) == ("cap", 2)
    assert (late.policy.name, late.attrs.max_length) == ("cap", 1)  # the lower value wins
    assert other.policy is None and other.attrs.max_length is None
    for i in range(4):
        vh.publish("", "capped.early", Properties.build(delivery_mode=2), b"m%d" % i)
    assert early.message_count == 2  # drop-head, as RabbitMQ
    assert early.arguments == {}  # declared arguments are kept apart (redeclare, export)
    _declare(vh, "capped.early")  # an equivalent redeclare: the policy does not make it differ
    await b.close()

    b2 = await Broker.open(str(tmp_path), clock=clock)
    vh2 = b2.vhosts["/"]
    assert vh2.policies["cap"].definition == {"max-length": 2}
    assert vh2.queues["capped.early"].attrs.max_length == 2
    vh2.delete_policy("cap")
    assert vh2.queues["capped.early"].policy is None and vh2.queues["capped.early"].attrs.max_length is None
    assert vh2.queues["capped.late"].attrs.max_length == 1
    await b2.close()


async def test_M7_alternate_exchange_policy_argument_wins(broker: Broker) -> None:
    vh = broker.vhost("/")
    for name, args in (("src", None), ("own", {"alternate-exchange": "mine"}), ("spill", None)):
        vh.declare_exchange(name, "direct", passive=False, durable=True, auto_delete=False, internal=False,
                            arguments=args)
    vh.set_policy(Policy("/", "ae", r"^(src|own)$", "exchanges", 0, {"alternate-exchange": "spill"}))
    assert (vh.exchanges["src"].alternate, vh.exchanges["own"].alternate) == ("spill", "mine")
    _declare(vh, "lost")
    vh.bind(None, "spill", ("q", "lost"), "", None)
    out = vh.publish("src", "nobody", Properties.build(), b"x")
    assert out.routed and vh.queues["lost"].message_count == 1


def test_W2_rabbitmq_sha512_and_md5_hashes_log_in() -> None:
    salt = b"\x01\x02\x03\x04"
    for digest, algorithm in ((hashlib.sha512, "rabbit_password_hashing_sha512"),
                              (hashlib.md5, "rabbit_password_hashing_md5"),
                              (hashlib.sha256, "rabbit_password_hashing_sha256")):
        h = base64.b64encode(salt + digest(salt + b"s3cret").digest()).decode()
        assert check_password("s3cret", h) and not check_password("other", h)
        assert hashing_algorithm(h) == algorithm
    assert hashing_algorithm("") is None and not check_password("", "")


async def test_M7_policies_with_slashes_in_names_survive_a_restart_apart(tmp_path) -> None:
    """Keyed by the escaped store codec: vhost 'a/b' + policy 'c' and vhost 'a' + policy 'b/c'
    are two records (issue 11.1's collision, for policies)."""
    clock = ManualClock()
    b = await Broker.open(str(tmp_path), clock=clock)
    b.vhost("a/b").set_policy(Policy("a/b", "c", ".", "queues", 0, {"max-length": 1}))
    b.vhost("a").set_policy(Policy("a", "b/c", ".", "queues", 0, {"max-length": 2}))
    await b.close()
    b2 = await Broker.open(str(tmp_path), clock=clock)
    assert b2.vhosts["a/b"].policies["c"].definition == {"max-length": 1}
    assert b2.vhosts["a"].policies["b/c"].definition == {"max-length": 2}
    await b2.close()
