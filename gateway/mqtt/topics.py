"""MQTT topic names and filters as CMQ routing keys on ``amq.topic`` (SPEC MQ2).

As RabbitMQ's MQTT plugin: the level separator ``/`` becomes ``.`` and a ``.`` inside a level
becomes ``/`` (so the mapping is its own inverse), ``+`` becomes ``*`` and ``#`` stays ``#``.
"""

from __future__ import annotations

__all__ = ["filter_to_binding", "matches", "matches_levels", "routing_key_to_topic", "topic_to_routing_key",
           "valid_filter", "valid_topic"]

_SWAP = str.maketrans({"/": ".", ".": "/"})


def topic_to_routing_key(topic: str) -> str:
    return topic.translate(_SWAP)


def routing_key_to_topic(routing_key: str) -> str:
    return routing_key.translate(_SWAP)


def filter_to_binding(topic_filter: str) -> str:
    return ".".join("*" if level == "+" else level.replace(".", "/")
                    for level in topic_filter.split("/"))


def valid_topic(topic: str) -> bool:
    """A topic name to publish to: not empty, no wildcard (MQTT-3.3.2-2)."""
    return bool(topic) and "+" not in topic and "#" not in topic


def valid_filter(topic_filter: str) -> bool:
    """``#`` only as the whole last level, ``+`` only as a whole level (MQTT-4.7.1)."""
    if not topic_filter:
        return False
    levels = topic_filter.split("/")
    for i, level in enumerate(levels):
        if "#" in level and (level != "#" or i != len(levels) - 1):
            return False
        if "+" in level and level != "+":
            return False
    return True


_last: tuple[str, list[str]] = ("", [""])  # the topic matched last, split (one tuple: swapped whole)


def matches(topic_filter: str, topic: str) -> bool:
    """MQTT matching (4.7), with MQTT-4.7.2-1: a filter that starts with a wildcard does
    not match a topic name that starts with ``$``. Many filters are matched against one topic
    in a row (a long topic against every session's, a delivery against a session's): the
    topic is split once for them."""
    global _last
    last = _last
    if last[0] is not topic:
        last = _last = (topic, topic.split("/"))
    return matches_levels(topic_filter, last[1])


def matches_levels(topic_filter: str, t: list[str]) -> bool:
    """``matches`` for a topic already split into its levels ``t``: many filters against
    one topic split once. A filter whose first level is neither a wildcard nor the topic's
    is refused before it is split."""
    end = topic_filter.find("/")
    first = topic_filter if end < 0 else topic_filter[:end]
    if first != "+" and first != "#":
        if first != t[0]:
            return False
    elif t[0].startswith("$"):
        return False
    f = topic_filter.split("/")
    for i, level in enumerate(f):
        if level == "#":
            return True
        if i >= len(t):
            return False
        if level != "+" and level != t[i]:
            return False
    return len(f) == len(t)
