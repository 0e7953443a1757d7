"""T1, T4, L3, L4: tag and routing-key matching, checked against simple references."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from semantics.errors import LimitError
from semantics.matching import (
    KeyTrie,
    TagIndex,
    split_key,
    validate_binding_keys,
    validate_key,
    validate_tags,
)

# -- references: deliberately naive -------------------------------------------------------


def ref_tag_match(sub_tags: set[str], msg_tags: set[str]) -> bool:
    """T1 by the rule summary: untagged subscription takes all, else a non-empty intersection."""
    if not sub_tags or "" in sub_tags:
        return True
    return bool(sub_tags & msg_tags)


def ref_key_regex(binding_key: str) -> re.Pattern[str]:
    """T4 as a regex over the key written as ``.w1.w2...`` (so ``""`` has no words)."""
    parts = []
    for word in split_key(binding_key):
        if word == "*":
            parts.append(r"\.[^.]+")
        elif word == "#":
            parts.append(r"(?:\.[^.]*)*")
        else:
            parts.append(re.escape("." + word))
    return re.compile("".join(parts))


def ref_key_match(binding_key: str, routing_key: str) -> bool:
    dotted = "".join("." + w for w in split_key(routing_key))
    return ref_key_regex(binding_key).fullmatch(dotted) is not None


# -- validators ---------------------------------------------------------------------------


def test_L3_at_most_5_tags_of_16_characters() -> None:
    assert validate_tags(["a", "b", "c", "d", "e"]) == ("a", "b", "c", "d", "e")
    assert validate_tags(["x" * 16]) == ("x" * 16,)
    assert validate_tags(["ü" * 16]) == ("ü" * 16,)  # characters, not bytes
    assert validate_tags(["a", "a", "b"]) == ("a", "b")
    with pytest.raises(LimitError) as info:
        validate_tags(["a", "b", "c", "d", "e", "f"])
    assert (info.value.rule, info.value.value, info.value.limit) == ("L3", 6, 5)
    with pytest.raises(LimitError) as info:
        validate_tags(["x" * 17], what="subscription 'a'")
    assert info.value.rule == "L3"
    assert "subscription 'a' filter tag" in str(info.value)
    assert "is 17 characters, more than 16" in str(info.value)


def test_L4_keys_at_most_64_bytes_and_15_dots() -> None:
    assert validate_key("a" * 64) == "a" * 64
    assert validate_key(".".join("a" * 16)) == ".".join("a" * 16)
    with pytest.raises(LimitError) as info:
        validate_key("a" * 65)
    assert (info.value.rule, info.value.limit) == ("L4", 64)
    assert "65 bytes, more than 64" in str(info.value)
    with pytest.raises(LimitError) as info:
        validate_key("é" * 33)  # 66 bytes in 33 characters
    assert info.value.rule == "L4"
    with pytest.raises(LimitError) as info:
        validate_key(".".join("a" * 17))
    assert (info.value.rule, info.value.limit) == ("L4", 15)
    assert "16 dots, more than 15" in str(info.value)


def test_L4_at_most_5_binding_keys() -> None:
    assert len(validate_binding_keys(["a", "b", "c", "d", "e"])) == 5
    with pytest.raises(LimitError) as info:
        validate_binding_keys(["a", "b", "c", "d", "e", "f"])
    assert (info.value.rule, info.value.value) == ("L4", 6)
    with pytest.raises(LimitError):
        validate_binding_keys(["a" * 65])


# -- tags ---------------------------------------------------------------------------------


def test_T1_tag_rule_summary() -> None:
    index: TagIndex[str] = TagIndex()
    index.add("A", ["apple"])
    index.add("B", [])
    assert set(index.match([])) == {"B"}             # tagged sub, untagged message: no
    assert set(index.match(["x"])) == {"B"}          # untagged sub: everything
    assert set(index.match(["apple", "x"])) == {"A", "B"}
    index.add("C", ["imac", "xiaomi", "m1", "m2"])   # N:M: one pair of tags is enough
    assert set(index.match([f"t{i}" for i in range(9)] + ["m2"])) == {"B", "C"}


def test_T1_remove_and_replace() -> None:
    index: TagIndex[str] = TagIndex()
    index.add("A", ["apple"])
    index.add("A", ["pear"])
    assert index.match(["apple"]) == ()
    assert index.match(["pear"]) == ("A",)
    index.remove("A")
    assert index.match(["pear"]) == ()
    assert len(index) == 0


def test_T1_empty_tag_filter_takes_everything() -> None:
    """M2: binding key "" is "no tag"; with other keys the union takes everything."""
    index: TagIndex[str] = TagIndex()
    index.add("A", ["", "apple"])
    assert index.match([]) == ("A",)
    assert index.match(["pear"]) == ("A",)


TAGS = st.sampled_from(["a", "b", "c", "d", "e", "f", ""])


@settings(max_examples=200)
@given(st.dictionaries(st.integers(0, 30), st.lists(TAGS, max_size=5), max_size=20),
       st.lists(st.lists(TAGS.filter(bool), max_size=5), min_size=1, max_size=5))
def test_T1_tag_index_equals_set_intersection(subs: dict[int, list[str]], messages: list[list[str]]) -> None:
    index: TagIndex[int] = TagIndex()
    for sub, tags in subs.items():
        index.add(sub, tags)
    for tags in messages:
        got = index.match(tags)
        assert len(got) == len(set(got))
        assert set(got) == {s for s, t in subs.items() if ref_tag_match(set(t), set(tags))}


# -- routing keys -------------------------------------------------------------------------


@pytest.mark.parametrize(("binding", "routing", "expected"), [
    ("1.*.0", "1.x.0", True),
    ("1.*.0", "1.any character.0", True),
    ("1.*.0", "1.0", False),
    ("1.*.0", "1..0", False),           # "*" is one non-empty word
    ("1.*.0", "1.x.y.0", False),
    ("1.#.0", "1.2.3.4.4.2.2.0", True),
    ("1.#.0", "1.0", True),
    ("1.#.0", "1.0.1", False),
    ("#", "", True),
    ("#", "a.b.c", True),
    ("*", "", False),
    ("", "", True),
    ("", "a", False),
    ("a.#", "a", True),
    ("#.a.#", "x.a", True),
    ("#.#", "x.y", True),
    ("a.#.#.b", "a.b", True),
    ("a.b", "a.b.c", False),
])
def test_T4_examples(binding: str, routing: str, expected: bool) -> None:
    trie: KeyTrie[str] = KeyTrie()
    trie.add("S", [binding])
    assert (trie.match(routing) == ("S",)) is expected
    assert ref_key_match(binding, routing) is expected


def test_T4_remove_prunes_and_keeps_shared_branches() -> None:
    trie: KeyTrie[str] = KeyTrie()
    trie.add("A", ["a.b.c", "a.#"])
    trie.add("B", ["a.b.c"])
    trie.remove("A")
    assert trie.match("a.b.c") == ("B",)
    assert trie.match("a.x") == ()
    trie.remove("B")
    assert trie._root.edges == {}
    assert len(trie) == 0


def test_T4_a_subscription_with_several_keys_matches_once() -> None:
    trie: KeyTrie[str] = KeyTrie()
    trie.add("A", ["#", "a.*", "a.b", "*.b", "#.#"])
    assert trie.match("a.b") == ("A",)


WORDS = st.sampled_from(["a", "b", "c", "", "*", "#"])
KEY_WORDS = st.sampled_from(["a", "b", "c", "", "*", "#"])  # literal wildcards in a routing key


def _key(words: list[str]) -> str:
    return ".".join(words)


@settings(max_examples=150)
@given(st.lists(st.lists(st.lists(WORDS, max_size=5).map(_key), min_size=1, max_size=5), max_size=8),
       st.lists(st.lists(KEY_WORDS, max_size=6).map(_key), min_size=1, max_size=6))
def test_T4_trie_equals_regex_reference(subs: list[list[str]], routing_keys: list[str]) -> None:
    trie: KeyTrie[int] = KeyTrie()
    for i, keys in enumerate(subs):
        trie.add(i, keys)
    for rk in routing_keys:
        got = trie.match(rk)
        assert len(got) == len(set(got))
        assert set(got) == {i for i, keys in enumerate(subs) if any(ref_key_match(k, rk) for k in keys)}


@settings(max_examples=100)
@given(st.lists(st.lists(WORDS, max_size=4).map(_key), min_size=1, max_size=5),
       st.lists(st.lists(KEY_WORDS, max_size=5).map(_key), min_size=1, max_size=5))
def test_T4_add_then_remove_leaves_the_trie_as_before(keys: list[str], routing_keys: list[str]) -> None:
    trie: KeyTrie[str] = KeyTrie()
    trie.add("keep", ["a.#"])
    before = [trie.match(rk) for rk in routing_keys]
    trie.add("tmp", keys)
    trie.remove("tmp")
    assert [trie.match(rk) for rk in routing_keys] == before
    assert "tmp" not in trie
