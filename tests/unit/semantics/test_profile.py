"""The profiles' limits (SPEC PF1-PF3): CMQ's numbers refuse in cmq, RabbitMQ's in compatible,
and every CMQ behaviour (matching, L5, the queue model) is the same under both."""

from __future__ import annotations

import pytest

from semantics.errors import LimitError
from semantics.matching import key_breach, tags_breach, validate_binding_keys, validate_key, validate_tags
from semantics.profile import CMQ, CMQ_LIMITS, COMPATIBLE, RABBITMQ_LIMITS, profile_named
from semantics.queue import CmqQueue
from semantics.topic import FilterType, Topic, TopicMessage


def test_PF1_profiles_by_name_and_the_default() -> None:
    assert profile_named(None) is COMPATIBLE
    assert profile_named("cmq") is CMQ and profile_named(" Compatible ") is COMPATIBLE
    assert (CMQ.refuse, COMPATIBLE.refuse) == (True, False)
    assert (CMQ.receive_metadata, COMPATIBLE.receive_metadata) == (True, False)
    assert (COMPATIBLE.enforced, COMPATIBLE.reported, CMQ.enforced) == (RABBITMQ_LIMITS, CMQ_LIMITS, CMQ_LIMITS)
    with pytest.raises(ValueError, match="unknown profile 'strict'"):
        profile_named("strict")


def test_PF3_L3_L4_rabbitmq_limits_take_what_cmq_refuses() -> None:
    six = ["a", "b", "c", "d", "e", "f"]
    long_tag = "TestConfirmDeliveryAfterUnroutableMessage"
    assert validate_tags([*six, long_tag], limits=RABBITMQ_LIMITS) == (*six, long_tag)
    assert validate_key(".".join("w" * 40), limits=RABBITMQ_LIMITS) == ".".join("w" * 40)
    assert validate_key("k" * 255, limits=RABBITMQ_LIMITS) == "k" * 255
    assert len(validate_binding_keys([f"k{i}" for i in range(50)], RABBITMQ_LIMITS)) == 50
    with pytest.raises(LimitError, match=r"is 256 bytes, more than 255 \(CMQ limit L4\)"):
        validate_key("k" * 256, limits=RABBITMQ_LIMITS)
    with pytest.raises(LimitError, match="L3"):
        validate_tags(["é" * 128], limits=RABBITMQ_LIMITS)  # 256 bytes in 128 characters


def test_PF4_breaches_carry_the_numbers_compared() -> None:
    """The migration report's value and limit: what was measured, and CMQ's maximum."""
    err = key_breach("k" * 70)
    assert err is not None and (err.rule, err.value, err.limit) == ("L4", 70, 64)
    err = key_breach(".".join("w" * 17))
    assert err is not None and (err.value, err.limit) == (16, 15)
    err = tags_breach(("a", "b", "c", "d", "e", "f"))
    assert err is not None and (err.rule, err.value, err.limit) == ("L3", 6, 5)
    err = tags_breach(("x" * 17,))
    assert err is not None and (err.value, err.limit) == (17, 16)
    assert key_breach("k" * 64) is None and tags_breach(("x" * 16,)) is None


def test_PF3_topic_under_rabbitmq_limits_matches_as_under_cmq() -> None:
    """T4 and L5 are the same under both profiles; only the sizes and counts differ."""
    topic = Topic("top1", FilterType.ROUTING_KEY, limits=RABBITMQ_LIMITS)
    long_key = ".".join(["seg"] * 30)
    topic.subscribe("s1", "e", [f"k{i}.#" for i in range(6)] + ["seg.#"])
    topic.subscribe("s2", "e", ["*.seg"])
    assert [s.name for s in topic.match(routing_key=long_key)] == ["s1"]
    assert [s.name for s in topic.match(routing_key="x.seg")] == ["s2"]
    for i in range(3, 501):
        topic.subscribe(f"s{i}", "e")
    with pytest.raises(LimitError, match="L5"):
        topic.subscribe("s501", "e")


def test_PF3_L6_body_size_refuses_only_under_cmq() -> None:
    strict = Topic("top1", limits=CMQ_LIMITS)
    loose = Topic("top2", limits=RABBITMQ_LIMITS)
    for t in (strict, loose):
        t.subscribe("s", "e")
    big = TopicMessage("msg-1", 0.0, size=70_000)
    with pytest.raises(LimitError, match="L6"):
        strict.publish(big, 0.0, lambda s, m: True)
    assert loose.publish(big, 0.0, lambda s, m: True).matched
    with pytest.raises(LimitError, match="L6"):
        CmqQueue("q").send(b"", 70_000, 0.0)
    assert CmqQueue("q", refuse_size=False).send(b"", 70_000, 0.0).size == 70_000


def test_PF1_topic_takes_another_profiles_limits() -> None:
    topic = Topic("top1", FilterType.ROUTING_KEY)
    with pytest.raises(LimitError, match="L4"):
        topic.match(routing_key="k" * 65)
    topic.set_limits(RABBITMQ_LIMITS)
    assert topic.match(routing_key="k" * 65) == ()
