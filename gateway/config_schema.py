"""Every configuration key, its type and its range, in one table (``SCHEMA``).

The whole file is checked at start, before anything is opened, so that a misspelled key or a
wrong value is one line naming the key path and what is allowed, and never a gateway that
starts and then fails every connection (``frame_max: "big"`` used to end in 541 at each
connection.tune). Why not pydantic: the error has to be one line in the operator's words,
several keys take two shapes (``listeners: [5672]`` or ``[{host, port}]``, ``management: off``
or a port or a mapping), and a RabbitMQ definitions export must pass as-is; the small checker
below does that without another compiled dependency.

A null value is the key's default, wherever it appears (YAML's ``key:`` with nothing after).
"""

from __future__ import annotations

import difflib
import ipaddress
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from gateway.audit import EVENTS
from gateway.auth import HASHING_ALGORITHMS, hashing_algorithm

__all__ = ["SCHEMA", "SchemaError", "validate"]


class SchemaError(ValueError):
    """One line: the key path, what was expected, what was found."""


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _at(path: str) -> str:
    return f"{path}: " if path else ""


class Spec:
    what = "a value"

    def check(self, value: Any, path: str) -> None:
        if not self.accepts(value):
            raise SchemaError(f"{_at(path)}expected {self.what}, got {_show(value)}")

    def accepts(self, value: Any) -> bool:
        raise NotImplementedError


class Anything(Spec):
    """A key the gateway reads nothing from (the rest of a RabbitMQ definitions export)."""

    def accepts(self, value: Any) -> bool:
        return True


def _range(lo: float | None, hi: float | None, gt: float | None = None) -> str:
    if gt is not None:
        return f" > {gt:g}"
    if lo is not None and hi is not None:
        return f" {lo}..{hi}"
    return f" >= {lo}" if lo is not None else ""


@dataclass
class Int(Spec):
    lo: int | None = None
    hi: int | None = None

    def __post_init__(self) -> None:
        self.what = "an integer" + _range(self.lo, self.hi)

    def accepts(self, value: Any) -> bool:
        return (type(value) is int and (self.lo is None or value >= self.lo)
                and (self.hi is None or value <= self.hi))


@dataclass
class Num(Spec):
    """A number (int or float); ``gt`` is an exclusive lower bound."""

    gt: float | None = None
    hi: float | None = None
    ge: float | None = None  # an inclusive lower bound, where 0 means "off"

    def __post_init__(self) -> None:
        self.what = ("a number" + _range(self.ge, None, self.gt)
                     + (f" and <= {self.hi:g}" if self.hi else ""))

    def accepts(self, value: Any) -> bool:
        return (type(value) in (int, float) and (self.gt is None or value > self.gt)
                and (self.ge is None or value >= self.ge) and (self.hi is None or value <= self.hi))


@dataclass
class Str(Spec):
    """A string; ``valid`` (when given) is the further test named by ``what``."""

    what: str = "a string"
    valid: Callable[[str], bool] | None = None

    def accepts(self, value: Any) -> bool:
        return isinstance(value, str) and (self.valid is None or self.valid(value))


class Bool(Spec):
    what = "true or false"

    def accepts(self, value: Any) -> bool:
        return isinstance(value, bool)


class Enum(Spec):
    def __init__(self, *values: Any, what: str = "") -> None:
        self.values = values
        self.what = what or "one of " + ", ".join(str(v) for v in values)

    def accepts(self, value: Any) -> bool:
        return any(value is v if isinstance(v, bool) else value == v for v in self.values)

    def check(self, value: Any, path: str) -> None:
        if not self.accepts(value):
            close = _closest(str(value), [str(v) for v in self.values])
            hint = f" (did you mean {close!r}?)" if close else ""
            raise SchemaError(f"{_at(path)}expected {self.what}, got {_show(value)}{hint}")


@dataclass
class ListOf(Spec):
    item: Spec

    def __post_init__(self) -> None:
        self.what = f"a list (of {self.item.what})"

    def accepts(self, value: Any) -> bool:
        return isinstance(value, list)

    def check(self, value: Any, path: str) -> None:
        super().check(value, path)
        _all_of(partial(self.item.check, v, f"{path}[{i}]") for i, v in enumerate(value))


@dataclass
class Map(Spec):
    """A mapping with these keys (each optional unless in ``required``), nothing else."""

    keys: dict[str, Spec]
    required: tuple[str, ...] = ()
    what: str = field(default="")

    def __post_init__(self) -> None:
        # The keys a reader sets: a definitions export's other keys are taken, not offered.
        self.offered = [k for k, spec in self.keys.items() if not isinstance(spec, Anything)]
        self.what = self.what or "a mapping {" + ", ".join(self.offered) + "}"

    def accepts(self, value: Any) -> bool:
        return isinstance(value, Mapping)

    def check(self, value: Any, path: str) -> None:
        super().check(value, path)
        _all_of(self._checks(value, path))

    def _checks(self, value: Mapping[Any, Any], path: str) -> Iterator[Callable[[], None]]:
        for key, v in value.items():
            spec = self.keys.get(key) if isinstance(key, str) else None
            if spec is None:
                yield partial(_raise, _at(path) + _unknown(key, self.offered))
            elif v is not None:
                yield partial(spec.check, v, f"{path}.{key}" if path else key)
        missing = [k for k in self.required if value.get(k) is None]
        if missing:
            yield partial(_raise, f"{_at(path)}missing {', '.join(missing)} (each entry needs "
                                  f"{', '.join(self.required)})")


def _raise(line: str) -> None:
    raise SchemaError(line)


def _all_of(checks: Iterable[Callable[[], None]]) -> None:
    """Run every check; the mistakes of all of them in one SchemaError, "; " between them, so
    that a file with several is fixed in one go (issue 30: they came one start at a time)."""
    found = []
    for check in checks:
        try:
            check()
        except SchemaError as e:
            found.append(str(e))
    if found:
        raise SchemaError("; ".join(found))


def _closest(word: str, choices: list[str]) -> str | None:
    """The choice ``word`` was most likely meant to be, whatever its case."""
    by_lower = {c.lower(): c for c in choices}
    close = difflib.get_close_matches(word.lower(), list(by_lower), n=1)
    return by_lower[close[0]] if close else None


def _unknown(key: Any, known: list[str]) -> str:
    close = _closest(str(key), known)
    if close:
        return f"unknown key {key!r} (did you mean {close!r}?)"
    return f"unknown key {key!r} (known keys: {', '.join(known)})"


class OneOf(Spec):
    """The first alternative that takes the value's shape checks it (so a mapping's error
    names the key inside it, not "expected a or b")."""

    def __init__(self, *alternatives: Spec) -> None:
        self.alternatives = alternatives
        self.what = " or ".join(a.what for a in alternatives)

    def accepts(self, value: Any) -> bool:
        return any(a.accepts(value) for a in self.alternatives)

    def check(self, value: Any, path: str) -> None:
        for a in self.alternatives:
            if isinstance(a, Map | ListOf) and a.accepts(value):
                a.check(value, path)
                return
        super().check(value, path)


def _is_regex(text: str) -> bool:
    try:
        re.compile(text)
    except re.error:
        return False
    return True


def _is_network(text: str) -> bool:
    try:
        ipaddress.ip_network(text, strict=False)
    except ValueError:
        return False
    return True


def _is_rabbit_hash(text: str) -> bool:
    return hashing_algorithm(text) is not None


PORT = Int(0, 65535)
OFF = Enum(False, "off", what="off")  # YAML reads a bare `off` as false
BYTES = Int(1)
PERMISSION_PATTERN = Str("a regular expression", _is_regex)
PROFILE = Enum("compatible", "cmq")

USER = Map({
    "name": Str(),
    "password": Str(),
    "password_hash": Str("RabbitMQ's base64 salted SHA-256, SHA-512 or MD5 (as rabbitmqctl "
                         "export_definitions writes it; or give password: instead)", _is_rabbit_hash),
    "hashing_algorithm": Enum(*sorted(HASHING_ALGORITHMS.values())),
    "tags": OneOf(ListOf(Str()), Str()),  # RabbitMQ exports "a,b" before 3.12
    "limits": Anything(),  # RabbitMQ's per-user limits: exported, not enforced here
    # CA1: the user's key pairs for CMQ's HTTP API (gateway.cmqapi); vhost: the default one.
    "cmq_keys": ListOf(Map({"secret_id": Str(), "secret_key": Str(), "vhost": Str()},
                           required=("secret_id", "secret_key"))),
}, required=("name",))

VHOST = OneOf(Str(), Map({
    "name": Str(),
    "profile": PROFILE,
    "limits": Anything(), "metadata": Anything(), "description": Anything(), "tags": Anything(),
    "default_queue_type": Anything(),
}, required=("name",)))

PERMISSION = Map({"user": Str(), "vhost": Str(), "configure": PERMISSION_PATTERN,
                  "write": PERMISSION_PATTERN, "read": PERMISSION_PATTERN},
                 required=("user", "vhost", "configure", "write", "read"))

OPERATOR_PORT = OneOf(OFF, PORT, Map({"port": OneOf(OFF, PORT), "host": Str()}))

LIMITS = Map({
    "frame_max": Int(4096, 2**31 - 1),
    "channel_max": Int(0, 65535),
    "heartbeat": Int(0, 65535),
    "memory_high_watermark": BYTES,
    "store_high_watermark": Int(0),  # an optional quota on the store's files; 0: none
    "low_watermark_ratio": Num(gt=0, hi=1),
    "max_connections": Int(0),  # per listener (SE5)
    "fd_reserve": Int(0),
    "http_idle_timeout": Num(ge=0),  # seconds; 0 turns the limit off
    "http_body_timeout": Num(ge=0),
    "preauth_bytes": Int(256, 268435455),
    # Branch alarms.
    "handshake_timeout": Num(ge=0),  # seconds; 0 turns the limit off (SE4)
    "disk_free_limit": Int(0),
    "max_message_size": Int(1, 536870912),
})

AUDIT = Map({
    "dir": Str(),
    "rotate_bytes": BYTES,
    "rotate_seconds": Num(gt=0),
    "retention_hours": Num(gt=0),
    "events": ListOf(Enum(*sorted(EVENTS))),
})

TLS = Map({
    "certfile": Str(), "keyfile": Str(), "cafile": Str(),
    "cacertfile": Str(),  # RabbitMQ's name for cafile
    "password": Str(),  # of an encrypted keyfile
    "verify": Enum("verify_none", "verify_peer"),
    "fail_if_no_peer_cert": Bool(),
    "port": OneOf(PORT, OFF),
    "handshake_timeout": Num(gt=0),
    "ssl_cert_login_from": Enum("common_name", "distinguished_name"),
    "management": Bool(),
    "metrics": Bool(),
    "cmq_api": Bool(),
})

SCHEMA = Map({
    "listeners": ListOf(OneOf(PORT, Map({"host": Str(), "port": PORT}))),
    "data_dir": Str(),
    # CL1 (docs/CLUSTER.md): nats://[user:pass@]host:port[,host:port...] instead of data_dir's
    # embedded store; creds/TLS as nats-py takes them.
    "store": Str("nats://HOST:PORT[,HOST:PORT...]", lambda s: s.startswith(("nats://", "tls://"))),
    "nats": Map({"creds": Str(), "tls_ca": Str(), "tls_cert": Str(), "tls_key": Str()}),
    "cluster": Map({"direct_delivery": Bool()}),  # gateway.jetstream.direct
    "strict_names": Bool(),
    "salvage": Bool(),
    "cluster_name": Str(),
    "users": ListOf(USER),
    "vhosts": ListOf(VHOST),
    "permissions": ListOf(PERMISSION),
    "loopback_users": ListOf(Str()),
    "limits": LIMITS,
    "audit": AUDIT,
    "management": OPERATOR_PORT,
    "metrics": OPERATOR_PORT,
    "cmq_api": OPERATOR_PORT,  # CA1: CMQ's HTTP API (gateway.cmqapi)
    "tls": TLS,  # branch tls-timeouts
    # MQ1: the MQTT listener (gateway/mqtt); max_packet_size bounds what a client may send (MQ7).
    "mqtt": OneOf(OFF, PORT, Map({"port": OneOf(OFF, PORT), "host": Str(), "max_packet_size": Int(2, 268435455),
                                     "tls_port": OneOf(OFF, PORT)})),
    "profile": PROFILE,  # branch profiles
    # SE3 (gateway.push_policy): URL globs, and the private networks pushes may reach anyway.
    "push": Map({"allow": ListOf(Str()), "allow_addresses": ListOf(Str("an IP network such as 10.1.0.0/16",
                                                                        _is_network))}),
    # The rest of a RabbitMQ definitions export (W2: such a file works as-is).
    **{key: Anything() for key in (
        "rabbit_version", "rabbitmq_version", "product_name", "product_version", "topic_permissions",
        "parameters", "global_parameters", "policies", "queues", "exchanges", "bindings",
        "cmq_http_subscriptions")},
})


def validate(raw: Any) -> None:
    """Raise SchemaError (one line) naming every key that is unknown or of the wrong type."""
    if not isinstance(raw, Mapping):
        raise SchemaError(f"the top level must be a mapping of keys, got {_show(raw)}")
    SCHEMA.check(raw, "")
