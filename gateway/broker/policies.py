"""RabbitMQ policies, applied to queues and exchanges as RabbitMQ applies them (SPEC M7).

A policy names a vhost, a ``pattern`` (a regular expression *searched* in the object's name,
as RabbitMQ's ``re:run``), ``apply-to`` (``queues``, ``exchanges`` or ``all``; 3.12's
``classic_queues``, ``quorum_queues`` and ``streams`` by the queue's ``x-queue-type``), a
``priority`` and a ``definition``. Of the policies that match an object exactly one applies:
the highest priority; on a tie the first by name (RabbitMQ leaves ties unspecified).

Policies apply to the objects that exist when the policy is set AND to every object declared
later, and a change or deletion takes effect at once, as in RabbitMQ: the broker asks
:func:`choose` at each declare and again for every object when a policy changes.

A definition key becomes the queue (or exchange) argument of the same meaning; when both the
argument and the policy set it, RabbitMQ's resolution holds: the lower value for the limits
(``message-ttl``, ``max-length``, ``expires``, ``delivery-limit``), the argument for the
others. Keys the gateway cannot honour are kept (so that an export gives them back) and
listed by :meth:`Policy.not_applied` with the reason.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from gateway.broker.policy_validation import refusal

log = logging.getLogger(__name__)

__all__ = ["APPLY_TO", "NOT_APPLIED", "POLICY_KEYS", "Policy", "PolicyError", "choose",
           "exchange_alternate", "queue_arguments"]

ARG, MIN = "argument wins", "lower value wins"

# definition key -> (the argument it sets, "queue" or "exchange", resolution with the argument)
POLICY_KEYS: dict[str, tuple[str, str, str]] = {
    "dead-letter-exchange": ("x-dead-letter-exchange", "queue", ARG),
    "dead-letter-routing-key": ("x-dead-letter-routing-key", "queue", ARG),
    "message-ttl": ("x-message-ttl", "queue", MIN),
    "max-length": ("x-max-length", "queue", MIN),
    "expires": ("x-expires", "queue", MIN),
    "overflow": ("x-overflow", "queue", ARG),
    "delivery-limit": ("x-delivery-limit", "queue", MIN),
    "alternate-exchange": ("alternate-exchange", "exchange", ARG),
}

_MIRRORING = "classic queue mirroring: the gateway is one node (or shares one store, CL1); nothing to mirror"
_FEDERATION = "federation is not supported by the gateway"
_STREAM = "stream queues are served as CMQ queues; stream retention keys have no effect"
NOT_APPLIED: dict[str, str] = {
    "ha-mode": _MIRRORING, "ha-params": _MIRRORING, "ha-sync-mode": _MIRRORING,
    "ha-sync-batch-size": _MIRRORING, "ha-promote-on-shutdown": _MIRRORING,
    "ha-promote-on-failure": _MIRRORING,
    "queue-mode": "CMQ queues keep their messages in the store: there is no lazy mode to choose",
    "queue-version": "classic queue storage versions have no meaning for CMQ queues",
    "queue-master-locator": "the gateway is one node: there is no queue leader to place",
    "queue-leader-locator": "the gateway is one node: there is no queue leader to place",
    "federation-upstream": _FEDERATION, "federation-upstream-set": _FEDERATION,
    "max-length-bytes": "the CMQ queue model has no byte limit",
    "max-in-memory-length": "quorum-queue memory limits have no meaning for CMQ queues",
    "max-in-memory-bytes": "quorum-queue memory limits have no meaning for CMQ queues",
    "dead-letter-strategy": "at-least-once dead-lettering is quorum-specific; dead-lettering is at-most-once here",
    "max-age": _STREAM, "stream-max-segment-size-bytes": _STREAM,
    "initial-cluster-size": "the gateway is one node: no replica count to choose",
    "target-group-size": "the gateway is one node: no replica count to choose",
}

APPLY_TO = ("queues", "exchanges", "all", "classic_queues", "quorum_queues", "streams")
_OVERFLOW = ("drop-head", "reject-publish", "reject-publish-dlx")


class PolicyError(ValueError):
    """A policy RabbitMQ would refuse (bad pattern, apply-to, priority or value)."""


def _text(v: Any) -> Any:
    return v.decode() if isinstance(v, bytes) else v


def _check_value(key: str, value: Any) -> None:
    """The types the gateway needs to apply a key (held by every stored policy, old ones too)."""
    if key in ("dead-letter-exchange", "dead-letter-routing-key", "alternate-exchange"):
        if not isinstance(value, str):
            raise PolicyError(f"{key} {value!r} must be a string")
    elif key in ("message-ttl", "max-length", "delivery-limit", "expires"):
        if isinstance(value, bool) or not isinstance(value, int) or value < (1 if key == "expires" else 0):
            raise PolicyError(f"{key} {value!r} must be an integer >= {1 if key == 'expires' else 0}")
    elif key == "overflow" and value not in _OVERFLOW:
        raise PolicyError(f"overflow {value!r} must be one of {', '.join(_OVERFLOW)}")


@dataclass(frozen=True)
class Policy:
    vhost: str
    name: str
    pattern: str
    apply_to: str = "all"
    priority: int | float = 0  # RabbitMQ takes any JSON number
    definition: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.apply_to not in APPLY_TO:
            raise PolicyError(f"apply-to {self.apply_to!r} must be one of {', '.join(APPLY_TO)}")
        if isinstance(self.priority, bool) or not isinstance(self.priority, int | float):
            raise PolicyError(f"priority {self.priority!r} must be an integer")
        if not isinstance(self.definition, dict) or not self.definition:
            raise PolicyError("definition must be a non-empty object")
        try:
            _ = self.regex
        except re.error as e:
            raise PolicyError(f"pattern {self.pattern!r} is not a regular expression: {e}") from None
        for key, value in self.definition.items():
            _check_value(key, value)

    @classmethod
    def checked(cls, raw: Mapping[str, Any], vhost: str | None = None, name: str | None = None) -> Policy:
        """A policy a client gives (``PUT /api/policies``, a definitions import): PolicyError
        with RabbitMQ's reason for whatever RabbitMQ refuses, nothing stored (M7, M16)."""
        why = refusal(raw)
        if why is not None:
            raise PolicyError(why)
        return cls.from_json(raw, vhost, name)

    @classmethod
    def from_json(cls, raw: Mapping[str, Any], vhost: str | None = None, name: str | None = None) -> Policy:
        """A policy as RabbitMQ's definitions spell it, as the store holds it. A store written
        before the gateway refused what RabbitMQ refuses may hold a policy RabbitMQ would not
        take (an unknown key, a kept key's bad value): it still loads, as it did, logged."""
        why = refusal(raw) if isinstance(raw, Mapping) else None
        if why is not None:
            log.warning("policy %r in vhost %r holds what RabbitMQ refuses (%s): kept as stored; "
                        "set it again to correct it", name if name is not None else raw.get("name"),
                        vhost if vhost is not None else raw.get("vhost"), why.strip().replace("\n\n", ": "))
        if not isinstance(raw, Mapping):
            raise PolicyError("a policy must be an object")
        try:
            pattern = raw["pattern"]
            definition = raw["definition"]
        except KeyError as e:
            raise PolicyError(f"missing key {e.args[0]}") from None
        if not isinstance(pattern, str):
            raise PolicyError(f"pattern {pattern!r} must be a string")
        priority = raw.get("priority", 0)
        if isinstance(priority, str) and priority.lstrip("-").isdigit():
            priority = int(priority)  # rabbitmqadmin sends it as text
        return cls(str(vhost if vhost is not None else raw.get("vhost", "/")),
                   str(name if name is not None else raw["name"]), pattern,
                   str(raw.get("apply-to", "all")), priority,
                   {str(k): _text(v) for k, v in dict(definition).items()} if isinstance(definition, Mapping)
                   else definition)

    def to_json(self) -> dict[str, Any]:
        return {"vhost": self.vhost, "name": self.name, "pattern": self.pattern, "apply-to": self.apply_to,
                "definition": dict(self.definition), "priority": self.priority}

    @cached_property
    def regex(self) -> re.Pattern[str]:
        return re.compile(self.pattern)

    def matches(self, kind: str, name: str, arguments: Mapping[str, Any] | None = None) -> bool:
        """Whether this policy's apply-to and pattern take the queue or exchange ``name``."""
        a = self.apply_to
        if kind == "exchange":
            if a not in ("exchanges", "all"):
                return False
        elif a == "exchanges":
            return False
        elif a in ("classic_queues", "quorum_queues", "streams"):
            qtype = _text((arguments or {}).get("x-queue-type")) or "classic"
            if {"classic_queues": "classic", "quorum_queues": "quorum", "streams": "stream"}[a] != qtype:
                return False
        return self.regex.search(name) is not None

    def not_applied(self) -> list[tuple[str, str]]:
        """(key, reason) for every definition key the gateway does not honour."""
        out = []
        for key in self.definition:
            if key in POLICY_KEYS:
                continue
            out.append((key, NOT_APPLIED.get(key, "not a policy key the gateway knows")))
        return out


def choose(policies: Iterable[Policy], kind: str, name: str,
           arguments: Mapping[str, Any] | None = None) -> Policy | None:
    """The one policy that applies: highest priority, then first by name."""
    best: Policy | None = None
    for p in policies:
        if p.matches(kind, name, arguments) and (
                best is None or p.priority > best.priority or (p.priority == best.priority and p.name < best.name)):
            best = p
    return best


def queue_arguments(declared: Mapping[str, Any] | None, policy: Policy | None) -> dict[str, Any]:
    """The arguments a queue behaves by: the declared ones with the policy's keys resolved in."""
    out = dict(declared or {})
    if policy is None:
        return out
    for key, value in policy.definition.items():
        mapped = POLICY_KEYS.get(key)
        if mapped is None or mapped[1] != "queue":
            continue
        arg, _, resolution = mapped
        if arg not in out:
            out[arg] = value
        elif resolution == MIN and isinstance(out[arg], int) and not isinstance(out[arg], bool):
            out[arg] = min(out[arg], value)
    if "x-dead-letter-routing-key" in out and "x-dead-letter-exchange" not in out:
        del out["x-dead-letter-routing-key"]  # RabbitMQ: a routing key alone does nothing
    return out


def exchange_alternate(policy: Policy | None) -> str | None:
    """The alternate exchange a policy gives (the exchange's own argument still wins)."""
    if policy is None:
        return None
    ae = policy.definition.get("alternate-exchange")
    return ae if isinstance(ae, str) else None
