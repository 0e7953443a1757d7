"""Exchanges as CMQ topics (SPEC M2-M6, M8).

Each (exchange, destination) pair is one subscription (M8) whose endpoint is that queue (or,
for exchange-to-exchange bindings, that exchange); each further binding key of the pair adds
a tag (direct, M2) or a binding key (topic, M3) to the same subscription, at most 5 (L3/L4).
An exchange holds at most 500 subscriptions (L5).

* ``direct``: tag filtering (T1). The routing key is the message's tag, ``x-cmq-tags`` adds
  more; the binding key ``""`` means "no tags" and takes everything (differs from RabbitMQ).
* ``topic``: routing-key filtering with ``*`` / ``#`` (T4).
* ``fanout``: subscriptions without a filter.
* ``headers``: RabbitMQ's x-match rules, a gateway extension (M5).
"""

from __future__ import annotations

from collections.abc import Iterable, KeysView, Mapping
from itertools import islice
from typing import Any

from gateway.broker.arguments import text
from gateway.broker.errors import precondition
from gateway.broker.headers_match import headers_match, valid_x_match
from gateway.broker.policies import Policy, exchange_alternate
from semantics.errors import LimitError
from semantics.limits import MAX_SUBSCRIPTIONS, TOPIC_MAX_MSG_SIZE_DEFAULT
from semantics.matching import validate_tags
from semantics.names import cmq_name
from semantics.profile import CMQ_LIMITS, Limits
from semantics.retry import DEFAULT_STRATEGY, NotifyStrategy
from semantics.topic import FilterType, Topic

__all__ = ["BIND_TAGS_LISTED", "Binding", "Dest", "bind_tags_count", "Exchange", "EXCHANGE_TYPES", "X_MAX_MESSAGE_SIZE", "message_tags", "sub_label", "sub_name"]

# Exchange argument that is ours: the topic's MaximumMessageSize (L6).
X_MAX_MESSAGE_SIZE = "x-cmq-max-message-size"

EXCHANGE_TYPES = ("direct", "topic", "fanout", "headers")

# A destination: ("q", queue name) or ("x", exchange name).
Dest = tuple[str, str]

# A bind audit record lists the subscription's keys (``tags``), the first this many of them;
# past that it says how many there are (``tags_count``). Listing all of them in the record of
# every bind made n binds of one pair write O(n^2) (SE5: 10,000 MQTT filters, 50 million).
BIND_TAGS_LISTED = 64


def bind_tags_count(count: int) -> dict[str, int]:
    """The extra field of a bind record whose ``tags`` is cut at BIND_TAGS_LISTED."""
    return {"tags_count": count} if count > BIND_TAGS_LISTED else {}


class Binding:
    """One subscription: the (exchange, destination) pair and its binding keys (M8).

    The keys are held as an ordered set: a key added, looked up or removed costs O(1), so a
    pair given n binding keys costs O(n) in all (SE5). ``keys`` is a copy, in binding order."""

    __slots__ = ("_keys", "arguments", "dest", "notify_strategy", "source")

    def __init__(self, source: str, dest: Dest, keys: Iterable[str] = (),
                 arguments: dict[str, dict[str, Any]] | None = None,
                 notify_strategy: str = "EXPONENTIAL_DECAY_RETRY") -> None:
        self.source = source
        self.dest = dest
        self._keys: dict[str, None] = dict.fromkeys(keys)
        # Binding arguments per key (headers exchanges match on them; x-cmq-notify-strategy).
        self.arguments: dict[str, dict[str, Any]] = arguments if arguments is not None else {}
        self.notify_strategy = notify_strategy

    def __repr__(self) -> str:
        return f"Binding({self.source!r}, {self.dest!r}, keys={len(self._keys)})"

    @property
    def keys(self) -> list[str]:
        return list(self._keys)

    @property
    def key_view(self) -> KeysView[str]:
        """The keys without a copy (O(1) to take, O(1) ``in``)."""
        return self._keys.keys()

    @property
    def key_count(self) -> int:
        return len(self._keys)

    def has_key(self, key: str) -> bool:
        return key in self._keys

    def first_keys(self, most: int) -> list[str]:
        """The first ``most`` keys, in binding order (what an audit record lists)."""
        return list(islice(self._keys, most))

    def add_key(self, key: str) -> None:
        self._keys[key] = None

    def remove_key(self, key: str) -> None:
        self._keys.pop(key, None)

    @property
    def name(self) -> str:
        """The subscription's name as the audit log shows it."""
        return f"{self.source}->{self.dest[0]}:{self.dest[1]}"


def message_tags(routing_key: str, headers: Mapping[str, Any] | None,
                 limits: Limits = CMQ_LIMITS) -> tuple[str, ...]:
    """M2: the routing key is the message's tag; ``x-cmq-tags`` adds more (validated, L3,
    against the profile's enforced ``limits``)."""
    tags: list[str] = [routing_key] if routing_key else []
    extra = headers.get("x-cmq-tags") if headers else None
    if extra is not None and not (isinstance(extra, str | bytes | list) and not extra):
        if isinstance(extra, str | bytes):
            extra = [extra]
        if not isinstance(extra, list) or not all(isinstance(t, str | bytes) for t in extra):
            # A client's mistake, not a header to ignore: the message would silently miss
            # every subscription its tags were meant to reach.
            raise precondition(f"header x-cmq-tags must be an array of strings (CMQ rule M2), got {extra!r:.80}", rule="M2",
                               value=extra)
        for t in extra:
            tags.append(t.decode("utf-8", "replace") if isinstance(t, bytes) else t)
    return validate_tags(tags, limits=limits) if tags else ()


class Exchange:
    """One AMQP exchange in one vhost, served as a CMQ topic (headers: matched here, M5)."""

    __slots__ = ("name", "type", "durable", "auto_delete", "internal", "arguments", "bindings",
                 "topic", "vhost", "on_tick", "policy", "labels")

    def __init__(self, vhost: str, name: str, type: str, *, durable: bool = False,
                 auto_delete: bool = False, internal: bool = False,
                 arguments: dict[str, Any] | None = None, limits: Limits = CMQ_LIMITS) -> None:
        self.vhost = vhost
        self.name = name
        self.type = type
        self.durable = durable
        self.auto_delete = auto_delete
        self.internal = internal
        self.arguments = dict(arguments or {})
        self.bindings: dict[Dest, Binding] = {}
        self.topic: Topic | None = None
        self.on_tick: Any = None  # set by the broker: runs the topic's retries and expiry
        self.policy: Policy | None = None  # the RabbitMQ policy applied (VHost.apply_policies)
        # subscription name -> sub_label(name, it): the route and enqueue records of every
        # message name its subscriptions, so each label is made once (label_of).
        self.labels: dict[str, str] = {}
        if type != "headers":
            # T5: tag filtering for direct and fanout (fanout subscriptions have no tags),
            # routing-key filtering for topic. The CMQ topic name is the L2 mapping of ours.
            size = self.arguments.get(X_MAX_MESSAGE_SIZE, TOPIC_MAX_MSG_SIZE_DEFAULT)
            if isinstance(size, bool) or not isinstance(size, int):
                raise precondition(f"{X_MAX_MESSAGE_SIZE} {size!r:.40} is not an integer (CMQ rule L6)",
                                   rule="L6", value=size)
            self.topic = Topic(cmq_name(name or "amq.default", "topic"),
                               FilterType.ROUTING_KEY if type == "topic" else FilterType.TAG,
                               max_message_size=size, limits=limits)

    def next_wakeup(self) -> float | None:
        return self.topic.next_wakeup() if self.topic is not None else None

    def run_due(self, now: float) -> None:
        if self.on_tick is not None:
            self.on_tick(self, now)

    def label_of(self, sub: str) -> str:
        """sub_label(self.name, sub), kept (see labels)."""
        label = self.labels.get(sub)
        if label is None:
            if len(self.labels) >= 4096:
                self.labels.clear()
            label = self.labels[sub] = sub_label(self.name, sub)
        return label

    @property
    def max_message_size(self) -> int:
        return self.topic.max_message_size if self.topic is not None else TOPIC_MAX_MSG_SIZE_DEFAULT

    @property
    def alternate(self) -> str | None:
        ae = self.arguments.get("alternate-exchange")
        if ae is None:
            return exchange_alternate(self.policy)  # the argument wins over a policy, as in RabbitMQ
        return text(ae) if isinstance(ae, str | bytes) else None

    # -- bindings (M8) ---------------------------------------------------------------------

    def bind(self, dest: Dest, key: str, arguments: Mapping[str, Any] | None) -> tuple[Binding, bool]:
        """Add ``key`` to the pair's subscription, creating it. Returns (binding, changed).
        The topic checks every limit (L3/L4/L5) before it changes anything."""
        args = dict(arguments or {})
        binding = self.bindings.get(dest)
        if binding is not None and binding.has_key(key):
            if self.type == "headers":
                binding.arguments[key] = args
            return binding, False
        if self.type == "headers":
            if not valid_x_match(args):
                raise precondition(f"invalid x-match field value {args.get('x-match')!r}; expected "
                                   "all, any, all-with-x, or any-with-x", rule="M5")
            if binding is None and len(self.bindings) >= MAX_SUBSCRIPTIONS:
                raise LimitError("L5", f"topic '{self.name}' already has {MAX_SUBSCRIPTIONS} subscriptions",
                                 value=len(self.bindings) + 1, limit=MAX_SUBSCRIPTIONS)
        strategy = args.get("x-cmq-notify-strategy")
        if isinstance(strategy, bytes):
            strategy = text(strategy)
        if strategy is not None and strategy not in ("BACKOFF_RETRY", "EXPONENTIAL_DECAY_RETRY"):
            raise precondition(f"x-cmq-notify-strategy {strategy!r} is not BACKOFF_RETRY or "
                               "EXPONENTIAL_DECAY_RETRY", rule="M8", value=strategy)
        name = sub_name(dest)
        filters = [] if self.type == "fanout" else [key]  # M4: fanout subscriptions have no filter
        if self.topic is not None:
            if binding is None:
                self.topic.subscribe(name, dest, filters,
                                     NotifyStrategy(strategy) if strategy else DEFAULT_STRATEGY)
            elif filters:
                self.topic.add_filter(name, key)
            if strategy is not None:
                self.topic.subscription(name).strategy = NotifyStrategy(strategy)
        if binding is None:
            binding = Binding(self.name, dest)
            self.bindings[dest] = binding
        binding.add_key(key)
        binding.arguments[key] = args
        if strategy is not None:
            binding.notify_strategy = strategy
        return binding, True

    def unbind(self, dest: Dest, key: str) -> bool:
        binding = self.bindings.get(dest)
        if binding is None or not binding.has_key(key):
            return False
        binding.remove_key(key)
        binding.arguments.pop(key, None)
        if not binding.key_count:
            self.unbind_dest(dest)
        elif self.topic is not None and self.type != "fanout":
            self.topic.remove_filter(sub_name(dest), key)
        return True

    def unbind_dest(self, dest: Dest) -> Binding | None:
        binding = self.bindings.pop(dest, None)
        if binding is not None and self.topic is not None:
            self.topic.unsubscribe(sub_name(dest))
        return binding

    # -- routing ---------------------------------------------------------------------------

    def headers_route(self, headers: Mapping[str, Any] | None) -> tuple[Dest, ...]:
        """M5: the destinations whose binding arguments match the headers (x-match)."""
        return tuple(b.dest for b in self.bindings.values()
                     if any(headers_match(a, headers) for a in b.arguments.values()))


def sub_label(exchange: str, name: str) -> str:
    """A subscription as the audit log names it: ``<exchange>-><kind>:<dest>`` (as bind
    records name it) for the subscriptions of bindings; an HTTP subscription's own name (L1
    names hold no ':')."""
    return f"{exchange}->{name}" if ":" in name else name


def sub_name(dest: Dest) -> str:
    """The subscription name of a (exchange, destination) pair, unique within the exchange."""
    return f"{dest[0]}:{dest[1]}"
