"""semantics.store.keys: escaped key components are round-trip, injective and prefix-safe for
any names (issue 11, item 1: ``orders`` vs ``orders/archive``, vhost ``a`` + ``b/c`` vs vhost
``a/b`` + ``c``)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from semantics.store.keys import escape, key_prefix, make_key, parse_key, unescape

# Names as AMQP allows them (any text; biased towards the characters the encoding handles).
names = st.text(alphabet=st.one_of(st.sampled_from("/%2F5a"), st.characters(blacklist_categories=("Cs",))),
                max_size=12)
tuples = st.lists(names, min_size=0, max_size=5).map(tuple)
kinds = st.sampled_from(["x", "q", "b", "m", "t", "s"])


@given(kinds, tuples)
def test_key_round_trips(kind: str, parts: tuple[str, ...]) -> None:
    assert parse_key(make_key(kind, *parts)) == (kind, parts)


@given(kinds, tuples, kinds, tuples)
def test_distinct_name_tuples_never_share_a_key(k1: str, a: tuple[str, ...], k2: str, b: tuple[str, ...]) -> None:
    if (k1, a) != (k2, b):
        assert make_key(k1, *a) != make_key(k2, *b)


@given(kinds, tuples, tuples)
def test_a_prefix_matches_exactly_the_keys_under_its_components(kind: str, prefix: tuple[str, ...],
                                                                 parts: tuple[str, ...]) -> None:
    """key_prefix(kind, *p) matches make_key(kind, *parts) iff parts extends p by at least one
    component: one queue's scan never reaches another queue's (or the queue's own) key."""
    matches = make_key(kind, *parts).startswith(key_prefix(kind, *prefix))
    assert matches == (len(parts) > len(prefix) and parts[:len(prefix)] == prefix)


@given(kinds, st.lists(names, min_size=1, max_size=4).map(tuple), tuples)
def test_a_prefix_extended_by_a_longer_name_does_not_match(kind: str, head: tuple[str, ...],
                                                           rest: tuple[str, ...]) -> None:
    """The same property on the shapes that broke: the prefix of ``(v, q)`` against every
    ``(v, q + suffix, ...)`` with a non-empty suffix."""
    for suffix in ("/", "/archive", "%", "%2F", "x"):
        longer = (*head[:-1], head[-1] + suffix)
        assert not make_key(kind, *longer, *rest).startswith(key_prefix(kind, *head))


def test_the_cases_of_issue_11() -> None:
    assert make_key("q", "a", "b/c") != make_key("q", "a/b", "c")
    assert not make_key("m", "/", "orders/archive", "msg-1").startswith(key_prefix("m", "/", "orders"))
    assert make_key("m", "/", "orders", "msg-1") == "m/%2F/orders/msg-1"
    assert make_key("q", "100%", "a/b") == "q/100%25/a%2Fb"


@given(names)
def test_escape_leaves_no_separator_and_unescape_inverts_it(name: str) -> None:
    assert "/" not in escape(name)
    assert unescape(escape(name)) == name


@pytest.mark.parametrize("bad", ["a/b", "%", "%2", "%41", "%2f", "a%"])
def test_unescape_refuses_what_escape_cannot_produce(bad: str) -> None:
    with pytest.raises(ValueError):
        unescape(bad)


@pytest.mark.parametrize("kind", ["", "m/x", "%"])
def test_a_kind_is_one_plain_component(kind: str) -> None:
    with pytest.raises(ValueError):
        make_key(kind, "a")
