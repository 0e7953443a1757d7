"""L1, L2: CMQ names and the mapping of AMQP names onto them."""

from __future__ import annotations

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from semantics.errors import LimitError
from semantics.names import (
    cmq_name,
    is_valid_name,
    validate_amqp_name,
    validate_queue_name,
    validate_topic_name,
)


def test_L1_topic_names_are_3_to_64_bytes_of_the_alphabet() -> None:
    assert validate_topic_name("abc") == "abc"
    assert validate_topic_name("a" * 64) == "a" * 64
    assert validate_topic_name("9_-Orders") == "9_-Orders"
    for bad in ("ab", "a" * 65, "or.ders", "ordérs", "with space", ""):
        with pytest.raises(LimitError) as info:
            validate_topic_name(bad)
        assert info.value.rule == "L1"
        assert info.value.reply_code == 406
        assert "(CMQ limit L1)" in str(info.value)


def test_L1_error_text_names_the_fault() -> None:
    with pytest.raises(LimitError, match=r"is 2 bytes, not 3-64"):
        validate_topic_name("ab")
    with pytest.raises(LimitError, match=r"is 65 bytes, not 3-64"):
        validate_topic_name("a" * 65)
    with pytest.raises(LimitError, match=r"outside \[A-Za-z0-9_-\]"):
        validate_topic_name("a.b.c")
    with pytest.raises(LimitError, match="must start with a letter"):
        validate_queue_name("1queue")


def test_L1_queue_names_start_with_a_letter_and_are_case_sensitive() -> None:
    assert validate_queue_name("Q12") == "Q12"
    assert is_valid_name("_abc", "topic") is True
    assert is_valid_name("_abc", "queue") is False
    assert is_valid_name("-abc", "queue") is False
    assert is_valid_name("orders", "queue") and is_valid_name("Orders", "queue")
    assert cmq_name("orders", "queue") != cmq_name("Orders", "queue")


def test_L2_valid_names_map_to_themselves() -> None:
    assert cmq_name("orders") == "orders"
    assert cmq_name("task_queue-1", "queue") == "task_queue-1"


def test_L2_other_names_map_deterministically_with_a_hash_suffix() -> None:
    mapped = cmq_name("amq.gen-JzTY20BRgKO", "queue")
    assert mapped == cmq_name("amq.gen-JzTY20BRgKO", "queue")
    assert mapped.startswith("amq_gen-JzTY20BRgKO-")
    assert len(mapped) == len("amq_gen-JzTY20BRgKO") + 9
    # Names that sanitize alike stay apart.
    assert cmq_name("a.b") != cmq_name("a:b")
    assert cmq_name("a.b")[:3] == cmq_name("a:b")[:3] == "a_b"
    # Too short, empty, not starting with a letter, too long: all become valid.
    assert is_valid_name(cmq_name("x"), "topic")
    assert cmq_name("", "queue").startswith("q-")
    assert cmq_name("1st", "queue").startswith("q1st-")
    long_name = cmq_name("é" * 127, "queue")
    assert len(long_name) == 64 and is_valid_name(long_name, "queue")


def test_L2_amqp_names_are_at_most_255_bytes() -> None:
    assert len(validate_amqp_name("a" * 255)) == 255
    with pytest.raises(LimitError) as info:
        cmq_name("a" * 256)
    assert info.value.rule == "L2"
    assert info.value.value == 256


def test_L2_strict_refuses_a_name_that_is_not_already_valid() -> None:
    assert cmq_name("orders", strict=True) == "orders"
    with pytest.raises(LimitError) as info:
        cmq_name("orders.eu", "queue", strict=True)
    assert info.value.rule == "L2"
    assert info.value.reply_code == 406
    assert info.value.reply_text.startswith("PRECONDITION_FAILED - queue name 'orders.eu'")
    assert info.value.reply_text.endswith("(CMQ limit L2)")


@given(st.text(max_size=85), st.sampled_from(["topic", "queue"]))
def test_L2_every_amqp_name_maps_to_a_valid_cmq_name(name: str, kind: str) -> None:
    assume(len(name.encode()) <= 255)
    mapped = cmq_name(name, kind)  # type: ignore[arg-type]
    assert is_valid_name(mapped, kind)  # type: ignore[arg-type]
    assert mapped == cmq_name(name, kind)  # type: ignore[arg-type]
    assert (mapped == name) == is_valid_name(name, kind)  # type: ignore[arg-type]
