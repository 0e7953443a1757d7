"""Which subscriptions take a message: tag filtering (T1) and routing-key filtering (T4).

Both matchers cost what the message asks, not what the topic holds: a lookup per message
tag, or a walk of a word trie per routing key, instead of one test per subscription.

Tags (T1, L3). A subscription with no tags takes every message, tagged or not; a tagged
subscription takes a message that carries at least one of its tags (N:M), never an untagged
one. The gateway maps the AMQP binding key ``""`` of a direct exchange to "no tag" (M2); a
subscription whose filters include ``""`` therefore takes everything, as the union of its
bindings would in RabbitMQ.

Routing keys (T4, L4). Keys are words separated by ``.``; ``""`` has no words. In a binding
key ``*`` is exactly one non-empty word and ``#`` zero or more words. The trie is the one
RabbitMQ's topic exchange keeps (``rabbit_db_topic_exchange``): one edge per binding word,
and at match time each node follows the routing word's edge, the ``*`` edge and, for ``#``,
every suffix of the remaining words.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable
from typing import Generic, TypeVar

from semantics.errors import LimitError
from semantics.profile import CMQ_LIMITS, Limits

__all__ = [
    "KeyTrie",
    "TagIndex",
    "binding_keys_breach",
    "binding_keys_count_breach",
    "filter_breach",
    "key_breach",
    "split_key",
    "tag_breach",
    "tags_breach",
    "tags_count_breach",
    "validate_binding_keys",
    "validate_key",
    "validate_tags",
]

S = TypeVar("S", bound=Hashable)


def _shown(value: str, most: int = 64) -> str:
    """A tag or key as a refusal quotes it: whole up to ``most`` characters, else its start."""
    return repr(value) if len(value) <= most else repr(value[:most]) + "..."


def tags_count_breach(count: int, limits: Limits = CMQ_LIMITS, *, what: str = "message") -> LimitError | None:
    """L3: ``count`` distinct tags are more than the limit allows, or None."""
    if limits.max_tags is not None and count > limits.max_tags:
        return LimitError("L3", f"{what} has {count} filter tags, more than {limits.max_tags}",
                          value=count, limit=limits.max_tags)
    return None


def tag_breach(tag: str, limits: Limits = CMQ_LIMITS, *, what: str = "message") -> LimitError | None:
    """L3: the limit one tag breaks (characters, then bytes), or None."""
    chars, size_max = limits.max_tag_chars, limits.max_tag_bytes
    if chars is not None and len(tag) > chars:
        return LimitError("L3", f"{what} filter tag {_shown(tag)} is {len(tag)} characters, more than "
                          f"{chars}", value=len(tag), limit=chars)
    if size_max is not None and len(tag) * 4 > size_max:  # may hold more than size_max bytes
        size = len(tag.encode("utf-8"))
        if size > size_max:
            return LimitError("L3", f"{what} filter tag {_shown(tag)} is {size} bytes, more than "
                              f"{size_max}", value=size, limit=size_max)
    return None


def tags_breach(tags: tuple[str, ...], limits: Limits = CMQ_LIMITS, *, what: str = "message") -> LimitError | None:
    """L3: the first limit distinct ``tags`` break (count, then each tag's length), or None.
    ``value``/``limit`` are the numbers compared (for the migration report, PF4)."""
    err = tags_count_breach(len(tags), limits, what=what)
    if err is not None:
        return err
    for tag in tags:
        err = tag_breach(tag, limits, what=what)
        if err is not None:
            return err
    return None


def validate_tags(tags: Iterable[str], *, what: str = "message", limits: Limits = CMQ_LIMITS) -> tuple[str, ...]:
    """L3: at most 5 distinct tags of at most 16 characters each (CMQ's limits, or the
    profile's); order kept, repeats dropped."""
    out = tuple(dict.fromkeys(tags))
    err = tags_breach(out, limits, what=what)
    if err is not None:
        raise err
    return out


def key_breach(key: str, limits: Limits = CMQ_LIMITS, *, what: str = "routing key") -> LimitError | None:
    """L4: the limit a routing or binding key breaks (bytes, then dots), or None."""
    size = len(key) if key.isascii() else len(key.encode("utf-8"))
    if size > limits.max_key_bytes:
        return LimitError("L4", f"{what} {_shown(key)} is {size} bytes, more than {limits.max_key_bytes}",
                          value=size, limit=limits.max_key_bytes)
    dots_max = limits.max_key_dots
    if dots_max is not None:
        dots = key.count(".")
        if dots > dots_max:
            return LimitError("L4", f"{what} {_shown(key)} has {dots} dots, more than {dots_max}",
                              value=dots, limit=dots_max)
    return None


def validate_key(key: str, *, what: str = "routing key", limits: Limits = CMQ_LIMITS) -> str:
    """L4: a routing or binding key is at most 64 bytes and at most 15 dots (16 words), or
    within the profile's ``limits``."""
    err = key_breach(key, limits, what=what)
    if err is not None:
        raise err
    return key


def binding_keys_count_breach(count: int, limits: Limits = CMQ_LIMITS) -> LimitError | None:
    """L4: ``count`` distinct binding keys of one subscription are more than allowed, or None."""
    most = limits.max_binding_keys
    if most is not None and count > most:
        return LimitError("L4", f"subscription has {count} binding keys, more than {most}",
                          value=count, limit=most)
    return None


def binding_keys_breach(keys: tuple[str, ...], limits: Limits = CMQ_LIMITS) -> LimitError | None:
    """L4: the limit distinct binding ``keys`` of one subscription break, or None."""
    err = binding_keys_count_breach(len(keys), limits)
    if err is not None:
        return err
    for key in keys:
        err = key_breach(key, limits, what="binding key")
        if err is not None:
            return err
    return None


def filter_breach(count: int, value: str, limits: Limits, *, tags: bool, what: str) -> LimitError | None:
    """L3/L4 for one filter added to a subscription that then has ``count`` distinct filters:
    the count first, then the new value, as :func:`tags_breach` and :func:`binding_keys_breach`
    check a whole set. Adding n filters one at a time costs O(n) in all (SE5): the filters
    already held were checked when they were added."""
    if tags:
        return tags_count_breach(count, limits, what=what) or tag_breach(value, limits, what=what)
    return binding_keys_count_breach(count, limits) or key_breach(value, limits, what="binding key")


def validate_binding_keys(keys: Iterable[str], limits: Limits = CMQ_LIMITS) -> tuple[str, ...]:
    """L4: a subscription has at most 5 distinct binding keys, each a valid key."""
    out = tuple(dict.fromkeys(keys))
    err = binding_keys_breach(out, limits)
    if err is not None:
        raise err
    return out


def split_key(key: str) -> list[str]:
    """The words of a key; ``""`` has none (as in RabbitMQ), ``"a..b"`` has an empty middle word."""
    return key.split(".") if key else []


class TagIndex(Generic[S]):
    """T1: tag -> subscriptions, plus the subscriptions that take every message.

    Each tag is indexed on its own, so adding or removing one tag of a subscription costs
    O(1) whatever else it holds (SE5: n tags added one by one cost O(n), not O(n^2))."""

    __slots__ = ("_all", "_by_tag", "_tags")

    def __init__(self) -> None:
        self._all: dict[S, None] = {}          # untagged subscriptions (or with ""), in insertion order
        self._by_tag: dict[str, dict[S, None]] = {}
        self._tags: dict[S, dict[str, None]] = {}

    def __len__(self) -> int:
        return len(self._tags)

    def __contains__(self, sub: object) -> bool:
        return sub in self._tags

    def add(self, sub: S, tags: Iterable[str]) -> None:
        """Index ``sub`` under ``tags`` (replacing what it had). No tags, or ``""``: takes all."""
        self.remove(sub)
        self._tags[sub] = {}
        self._all[sub] = None
        for tag in tags:
            self.add_tag(sub, tag)

    def add_tag(self, sub: S, tag: str) -> None:
        """One more tag of ``sub`` (indexed with none first if it was not)."""
        held = self._tags.get(sub)
        if held is None:
            held = self._tags[sub] = {}
            self._all[sub] = None
        if tag in held:
            return
        held[tag] = None
        if tag:
            self._by_tag.setdefault(tag, {})[sub] = None
            if "" not in held:  # the first real tag: it no longer takes every message
                self._all.pop(sub, None)
        else:
            self._all[sub] = None

    def remove_tag(self, sub: S, tag: str) -> None:
        """``sub`` no longer holds ``tag``; with no tag left (or ``""``) it takes every message."""
        held = self._tags.get(sub)
        if held is None or tag not in held:
            return
        del held[tag]
        if tag:
            holders = self._by_tag.get(tag)
            if holders is not None:
                holders.pop(sub, None)
                if not holders:
                    del self._by_tag[tag]
        if not held or "" in held:
            self._all[sub] = None
        else:
            self._all.pop(sub, None)

    def remove(self, sub: S) -> None:
        tags = self._tags.pop(sub, None)
        if tags is None:
            return
        self._all.pop(sub, None)
        for tag in tags:
            holders = self._by_tag.get(tag)
            if holders is not None:
                holders.pop(sub, None)
                if not holders:
                    del self._by_tag[tag]

    def tags_of(self, sub: S) -> tuple[str, ...]:
        return tuple(self._tags[sub])

    def match(self, tags: Iterable[str]) -> tuple[S, ...]:
        """Every subscription that takes a message with ``tags``: untagged ones first."""
        found = dict(self._all)
        by_tag = self._by_tag
        for tag in tags:
            holders = by_tag.get(tag)
            if holders:
                found.update(holders)
        return tuple(found)


class _Node(Generic[S]):
    __slots__ = ("edges", "subs")

    def __init__(self) -> None:
        self.edges: dict[str, _Node[S]] = {}
        self.subs: dict[S, int] = {}  # subscription -> how many of its keys end here


class KeyTrie(Generic[S]):
    """T4: binding keys with ``*`` and ``#`` in a word trie, as RabbitMQ's topic exchange.

    Adding or removing one key walks that key's words only, whatever else the subscription
    holds (SE5: n keys added one by one cost O(n) words in all)."""

    __slots__ = ("_keys", "_root")

    def __init__(self) -> None:
        self._root: _Node[S] = _Node()
        self._keys: dict[S, dict[str, None]] = {}

    def __len__(self) -> int:
        return len(self._keys)

    def __contains__(self, sub: object) -> bool:
        return sub in self._keys

    def keys_of(self, sub: S) -> tuple[str, ...]:
        return tuple(self._keys[sub])

    def add(self, sub: S, keys: Iterable[str]) -> None:
        """Index ``sub`` under its binding ``keys`` (replacing what it had)."""
        self.remove(sub)
        self._keys[sub] = {}
        for key in keys:
            self.add_key(sub, key)

    def add_key(self, sub: S, key: str) -> None:
        """One more binding key of ``sub``."""
        held = self._keys.setdefault(sub, {})
        if key in held:
            return
        held[key] = None
        node = self._root
        for word in split_key(key):
            node = node.edges.setdefault(word, _Node())
        node.subs[sub] = node.subs.get(sub, 0) + 1

    def remove_key(self, sub: S, key: str) -> None:
        """``sub`` no longer holds ``key`` (it stays indexed, with the keys it has left)."""
        held = self._keys.get(sub)
        if held is None or key not in held:
            return
        del held[key]
        self._unlink(sub, key)

    def remove(self, sub: S) -> None:
        keys = self._keys.pop(sub, None)
        for key in keys or ():
            self._unlink(sub, key)

    def _unlink(self, sub: S, key: str) -> None:
        path = [self._root]
        words = split_key(key)
        for word in words:
            path.append(path[-1].edges[word])
        end = path[-1]
        if end.subs[sub] > 1:
            end.subs[sub] -= 1
        else:
            del end.subs[sub]
        # Prune the branch that no longer leads to any binding.
        for depth in range(len(words), 0, -1):
            node = path[depth]
            if node.subs or node.edges:
                break
            del path[depth - 1].edges[words[depth - 1]]

    def match(self, routing_key: str) -> tuple[S, ...]:
        """Every subscription with a binding key that takes ``routing_key``."""
        words = split_key(routing_key)
        n = len(words)
        found: dict[S, int] = {}
        seen: set[tuple[int, int]] = set()  # (node id, position): "#.#" reaches a node twice
        stack: list[tuple[_Node[S], int]] = [(self._root, 0)]
        while stack:
            node, i = stack.pop()
            mark = (id(node), i)
            if mark in seen:
                continue
            seen.add(mark)
            edges = node.edges
            if i == n:
                found.update(node.subs)
            else:
                word = words[i]
                child = edges.get(word)
                if child is not None:
                    stack.append((child, i + 1))
                if word:  # "*" is one non-empty word
                    child = edges.get("*")
                    if child is not None:
                        stack.append((child, i + 1))
            hash_child = edges.get("#")
            if hash_child is not None:
                # "#" eats zero or more words: continue after it at every later position.
                stack.extend((hash_child, j) for j in range(i, n + 1))
        return tuple(found)
