"""MQTT topic names and filters as CMQ routing keys on ``amq.topic`` (SPEC MQ2).

As RabbitMQ's MQTT plugin: the level separator ``/`` becomes ``.`` and a ``.`` inside a level
becomes ``/`` (so the mapping is its own inverse), ``+`` becomes ``*`` and ``#`` stays ``#``.
"""

from __future__ import annotations

__all__ = ["filter_to_binding", "matches", "routing_key_to_topic", "topic_to_routing_key",
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


def matches(topic_filter: str, topic: str) -> bool:
    """MQTT matching (4.7), with MQTT-4.7.2-1: a filter that starts with a wildcard does
    not match a topic name that starts with ``$``."""
    if topic.startswith("$") and topic_filter[:1] in ("+", "#"):
        return False
    f, t = topic_filter.split("/"), topic.split("/")
    for i, level in enumerate(f):
        if level == "#":
            return True
        if i >= len(t):
            return False
        if level != "+" and level != t[i]:
            return False
    return len(f) == len(t)
