"""SE5: tags and binding keys added and removed one at a time (TagIndex.add_tag/remove_tag,
KeyTrie.add_key/remove_key, Topic.add_filter/remove_filter) route exactly as an index built
from the final sets at once (T1, T4), and n filters given one at a time cost O(n) in all,
counted in calls, not seconds."""

from __future__ import annotations

import gc
import sys
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from semantics.matching import KeyTrie, TagIndex
from semantics.profile import CMQ_LIMITS, RABBITMQ_LIMITS
from semantics.retry import NotifyStrategy
from semantics.topic import FilterType, Topic
from tests.unit.semantics.test_matching import KEY_WORDS, WORDS, _key, ref_key_match, ref_tag_match

TAGS = st.sampled_from(["a", "b", "c", "d", "e", ""])
# (add?, subscription, value): a run of single adds and removes.
TAG_OPS = st.lists(st.tuples(st.booleans(), st.integers(0, 6), TAGS), max_size=40)
KEY_OPS = st.lists(st.tuples(st.booleans(), st.integers(0, 6), st.lists(WORDS, max_size=4).map(_key)),
                   max_size=40)


def _apply(ops: list[tuple[bool, int, str]], add: Callable[[int, str], None],
           remove: Callable[[int, str], None]) -> dict[int, list[str]]:
    """Runs the ops; returns what each subscription holds after them (every subscription
    that was ever given a value stays indexed, with what it has left)."""
    held: dict[int, list[str]] = {}
    for adding, sub, value in ops:
        if adding:
            add(sub, value)
            values = held.setdefault(sub, [])
            if value not in values:
                values.append(value)
        else:
            remove(sub, value)
            if value in held.get(sub, ()):
                held[sub].remove(value)
    return held


@settings(max_examples=300)
@given(TAG_OPS, st.lists(st.lists(TAGS.filter(bool), max_size=4), min_size=1, max_size=6))
def test_SE5_T1_tags_added_one_at_a_time_route_as_the_whole_set(ops: list[tuple[bool, int, str]],
                                                                  messages: list[list[str]]) -> None:
    index: TagIndex[int] = TagIndex()
    held = _apply(ops, index.add_tag, index.remove_tag)
    whole: TagIndex[int] = TagIndex()
    for sub, tags in held.items():
        whole.add(sub, tags)
    for sub, tags in held.items():
        assert index.tags_of(sub) == tuple(tags)
    for tags in messages:
        got = index.match(tags)
        assert len(got) == len(set(got))
        assert set(got) == set(whole.match(tags))
        assert set(got) == {s for s, t in held.items() if ref_tag_match(set(t), set(tags))}


@settings(max_examples=300)
@given(KEY_OPS, st.lists(st.lists(KEY_WORDS, max_size=5).map(_key), min_size=1, max_size=6))
def test_SE5_T4_keys_added_one_at_a_time_route_as_the_whole_set(ops: list[tuple[bool, int, str]],
                                                                  routing_keys: list[str]) -> None:
    trie: KeyTrie[int] = KeyTrie()
    held = _apply(ops, trie.add_key, trie.remove_key)
    for sub, keys in held.items():
        assert trie.keys_of(sub) == tuple(keys)
    for rk in routing_keys:
        got = trie.match(rk)
        assert len(got) == len(set(got))
        assert set(got) == {s for s, keys in held.items() if any(ref_key_match(k, rk) for k in keys)}
    for sub in held:  # and removing everything leaves no branch behind
        trie.remove(sub)
    assert trie._root.edges == {} and trie._root.subs == {}


@settings(max_examples=150)
@given(st.sampled_from([FilterType.TAG, FilterType.ROUTING_KEY]), st.data())
def test_SE5_topic_add_and_remove_filter_route_as_a_fresh_subscribe(kind: FilterType, data: Any) -> None:
    values = TAGS if kind is FilterType.TAG else st.lists(WORDS, max_size=3).map(_key)
    ops = data.draw(st.lists(st.tuples(st.booleans(), st.integers(0, 3), values), max_size=30))
    topic = Topic("inc", kind, limits=RABBITMQ_LIMITS)
    for sub in range(4):
        topic.subscribe(f"s{sub}", sub, [], NotifyStrategy.BACKOFF_RETRY)
    held = _apply(ops, lambda s, v: topic.add_filter(f"s{s}", v) and None,
                  lambda s, v: topic.remove_filter(f"s{s}", v) and None)
    fresh = Topic("inc", kind, limits=RABBITMQ_LIMITS)
    for sub in range(4):
        fresh.subscribe(f"s{sub}", sub, held.get(sub, []), NotifyStrategy.BACKOFF_RETRY)
        assert topic.subscription(f"s{sub}").filters == tuple(held.get(sub, []))
    probes = data.draw(st.lists(st.lists(TAGS.filter(bool), max_size=3) if kind is FilterType.TAG
                                else st.lists(KEY_WORDS, max_size=4).map(_key), min_size=1, max_size=5))
    for probe in probes:
        if kind is FilterType.TAG:
            got, want = topic.match(tags=probe), fresh.match(tags=probe)
        else:
            got, want = topic.match(routing_key=probe), fresh.match(routing_key=probe)
        assert {s.endpoint for s in got} == {s.endpoint for s in want}


def test_SE5_topic_add_filter_still_refuses_past_cmq_limits() -> None:
    """L3/L4 under CMQ's limits: the sixth filter and a too long one, checked one by one."""
    for kind, long_value in ((FilterType.TAG, "t" * 17), (FilterType.ROUTING_KEY, "k" * 65)):
        topic = Topic("capped", kind, limits=CMQ_LIMITS)
        topic.subscribe("s", object(), ["f0"], NotifyStrategy.BACKOFF_RETRY)
        for i in range(1, 5):
            topic.add_filter("s", f"f{i}")
        topic.add_filter("s", "f4")  # already held: no change, no refusal
        for value in ("f5", long_value):
            try:
                topic.add_filter("s", value)
            except Exception as e:  # noqa: BLE001 - the rule is checked below
                assert getattr(e, "rule", None) == ("L3" if kind is FilterType.TAG else "L4")
            else:
                raise AssertionError(f"{value!r} was accepted past CMQ's limits")
        assert topic.subscription("s").filters == ("f0", "f1", "f2", "f3", "f4")


def calls(work: Callable[[], object]) -> int:
    """How many Python and C functions ``work`` calls: an operation count that does not
    depend on the machine's speed or load. The collector is off meanwhile: in a whole suite's
    run a collection in the middle runs the finalizers of other tests' garbage, and their
    calls were counted here (21,039 against 28,040 in one CI run)."""
    n = 0
    gc.collect()
    was_enabled = gc.isenabled()
    gc.disable()

    def count(_frame: object, event: str, _arg: object) -> None:
        nonlocal n
        if event == "call" or event == "c_call":
            n += 1

    sys.setprofile(count)
    try:
        work()
    finally:
        sys.setprofile(None)
        if was_enabled:
            gc.enable()
    return n


@pytest.mark.parametrize(("kind", "value"), [(FilterType.ROUTING_KEY, "k.{}.*"), (FilterType.TAG, "t{}")])
def test_SE5_a_thousand_more_filters_cost_what_the_first_thousand_did(kind: FilterType, value: str) -> None:
    """One subscription given 2,000 binding keys (or tags) one at a time: the second thousand
    takes no more calls than the first (with the index rebuilt at each add, as before, it took
    three times as many); removing them one at a time too."""
    topic = Topic("many", kind, limits=RABBITMQ_LIMITS)
    topic.subscribe("s", object(), [], NotifyStrategy.BACKOFF_RETRY)

    def add(lo: int, hi: int) -> None:
        for i in range(lo, hi):
            topic.add_filter("s", value.format(i))

    def remove(lo: int, hi: int) -> None:
        for i in range(lo, hi):
            topic.remove_filter("s", value.format(i))

    first, second = calls(lambda: add(0, 1000)), calls(lambda: add(1000, 2000))
    assert second <= first * 1.1, (first, second)
    assert len(topic.subscription("s").filters) == 2000
    last, rest = calls(lambda: remove(1000, 2000)), calls(lambda: remove(0, 1000))
    assert last <= rest * 1.1 and rest <= last * 1.1, (last, rest)
    assert topic.subscription("s").filters == ()
