"""Routing cost per message on a CMQ topic, by number of subscriptions (T1, T4, L5).

    .venv/bin/python scripts/bench_routing.py [--messages 20000]

Columns, all in microseconds per message:
  naive    test every subscription (set intersection for tags, a compiled regex per binding
           key), the cost the indexes avoid;
  index    TagIndex / KeyTrie match, every message with a different tag set or routing key;
  cached   Topic.match with the keys repeating (the topic caches routes per tag set / key);
  publish  Topic.publish with an endpoint that accepts at once (the gateway's hot path,
           including one attempt call per matched subscription), repeating keys.
Rows ``fanout``: every subscription untagged, so each message reaches all of them (naive:
building the list). Elsewhere each subscription has its own tag or binding key (a fifth of the keys use ``#``), so a
message matches a few subscriptions, as in a topic that fans out by customer or region.
"""

from __future__ import annotations

import argparse
import random
import re
import time
from collections.abc import Callable

from semantics.matching import KeyTrie, TagIndex, split_key
from semantics.topic import FilterType, Subscription, Topic, TopicMessage

__all__ = ["main"]

SIZES = (1, 10, 100, 500)


def _per_message_us(fn: Callable[[int], object], n: int) -> float:
    start = time.perf_counter()
    for i in range(n):
        fn(i)
    return (time.perf_counter() - start) / n * 1e6


def _binding_key(i: int) -> str:
    return f"region{i % 10}.#" if i % 5 == 0 else f"region{i % 10}.svc{i}.*"


def _key_regex(binding_key: str) -> re.Pattern[str]:
    parts = []
    for word in split_key(binding_key):
        parts.append({"*": r"\.[^.]+", "#": r"(?:\.[^.]*)*"}.get(word) or re.escape("." + word))
    return re.compile("".join(parts))


def _accept(sub: Subscription, msg: TopicMessage) -> bool:
    return True


def bench_tags(subs: int, n: int, rng: random.Random) -> tuple[float, float, float, float]:
    sub_tags = [{f"tag{i}", f"tag{i + 1}"} for i in range(subs)]
    msgs = [(f"tag{rng.randrange(subs + 1)}", f"tag{rng.randrange(subs + 1)}", f"x{i}") for i in range(n)]
    index: TagIndex[int] = TagIndex()
    topic = Topic("bench-tags")
    for i, tags in enumerate(sub_tags):
        index.add(i, tags)
        topic.subscribe(f"s{i}", None, sorted(tags))

    def naive(i: int) -> object:
        m = set(msgs[i])
        return [s for s, tags in enumerate(sub_tags) if tags & m]

    hot = [m[:2] for m in msgs[:64]]
    messages = [TopicMessage(f"m{i}", 0.0, hot[i % 64]) for i in range(n)]
    return (_per_message_us(naive, n), _per_message_us(lambda i: index.match(msgs[i]), n),
            _per_message_us(lambda i: topic.match(tags=hot[i % 64]), n),
            _per_message_us(lambda i: topic.publish(messages[i], 0.0, _accept), n))


def bench_keys(subs: int, n: int, rng: random.Random) -> tuple[float, float, float, float]:
    keys = [_binding_key(i) for i in range(subs)]
    regexes = [_key_regex(k) for k in keys]
    rks = [f"region{rng.randrange(10)}.svc{rng.randrange(subs)}.e{i}" for i in range(n)]
    trie: KeyTrie[int] = KeyTrie()
    topic = Topic("bench-keys", FilterType.ROUTING_KEY)
    for i, key in enumerate(keys):
        trie.add(i, [key])
        topic.subscribe(f"s{i}", None, [key])

    def naive(i: int) -> object:
        dotted = "".join("." + w for w in split_key(rks[i]))
        return [s for s, rx in enumerate(regexes) if rx.fullmatch(dotted)]

    hot = [rk.rsplit(".", 1)[0] + ".created" for rk in rks[:64]]
    messages = [TopicMessage(f"m{i}", 0.0, (), hot[i % 64]) for i in range(n)]
    return (_per_message_us(naive, n), _per_message_us(lambda i: trie.match(rks[i]), n),
            _per_message_us(lambda i: topic.match(routing_key=hot[i % 64]), n),
            _per_message_us(lambda i: topic.publish(messages[i], 0.0, _accept), n))


def bench_fanout(subs: int, n: int, rng: random.Random) -> tuple[float, float, float, float]:
    """Every subscription untagged (M4 fanout): every message goes to all of them."""
    index: TagIndex[int] = TagIndex()
    topic = Topic("bench-fanout")
    for i in range(subs):
        index.add(i, ())
        topic.subscribe(f"s{i}", None)
    messages = [TopicMessage(f"m{i}", 0.0) for i in range(n)]
    return (_per_message_us(lambda i: list(range(subs)), n), _per_message_us(lambda i: index.match(()), n),
            _per_message_us(lambda i: topic.match(), n),
            _per_message_us(lambda i: topic.publish(messages[i], 0.0, _accept), n))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--messages", type=int, default=20_000)
    args = parser.parse_args()
    rng = random.Random(1)
    print(f"{'filter':<12}{'subs':>6}{'naive':>10}{'index':>10}{'cached':>10}{'publish':>10}   (us/message)")
    for name, bench in (("tag", bench_tags), ("routing_key", bench_keys), ("fanout", bench_fanout)):
        for subs in SIZES:
            row = bench(subs, args.messages, rng)
            print(f"{name:<12}{subs:>6}" + "".join(f"{v:>10.2f}" for v in row))


if __name__ == "__main__":
    main()
