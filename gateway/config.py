"""The gateway's configuration: one YAML (or JSON) file, every key optional.

The users / vhosts / permissions keys use the shape of a RabbitMQ definitions export
(``rabbitmqctl export_definitions``), so such a file can be used as-is (W2)::

    listeners: [{host: "0.0.0.0", port: 5672}, {host: "::", port: 5672}]
    data_dir: /var/lib/cmq-gateway
    strict_names: false               # L2
    salvage: false                    # open a damaged store, setting the damage aside
    users:
      - {name: alice, password_hash: "<base64>", hashing_algorithm: rabbit_password_hashing_sha256}
      - {name: bob, password: "plain text is hashed on load"}
    vhosts: [{name: "/"}, {name: orders}]      # or plain strings
    permissions:
      - {user: alice, vhost: "/", configure: ".*", write: ".*", read: ".*"}
    loopback_users: [guest]           # users that may connect from loopback only
    limits: {frame_max: 131072, channel_max: 2047, heartbeat: 60,
             memory_high_watermark: 1073741824,   # bytes the broker holds (gateway/memory.py)
             disk_free_limit: 50000000,           # free bytes of the data dir's file system
             max_message_size: 134217728,         # a larger content header is refused (406)
             store_high_watermark: 0}             # optional quota on the store's files; 0: none
    audit: {dir: /var/log/cmq-gateway, rotate_bytes: 67108864, rotate_seconds: 3600,
            retention_hours: 168, events: null}
    management: {port: 15672, host: "0.0.0.0"}   # RabbitMQ's management HTTP API + /api/cmq
    metrics: {port: 15692, host: "0.0.0.0"}      # Prometheus /metrics

With no users at all, the default ``guest``/``guest`` user with full rights on ``/`` exists,
as in RabbitMQ, and may connect only from loopback.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import yaml

from gateway.auth import Permission, User, UserDB, hash_password

__all__ = [
    "AuditSettings",
    "ConfigError",
    "GatewayConfig",
    "Limits",
    "Listener",
    "default_data_dir",
    "load_config",
]

DEFAULT_PORT = 5672
DEFAULT_MANAGEMENT_PORT = 15672
DEFAULT_METRICS_PORT = 15692
OFF = -1  # management / metrics explicitly turned off (config `management: off`, `--management-port off`)


class ConfigError(ValueError):
    """The configuration file is unreadable or holds a value of the wrong shape."""


@dataclass(frozen=True, slots=True)
class Listener:
    host: str
    port: int


@dataclass(frozen=True, slots=True)
class Limits:
    frame_max: int = 131072
    channel_max: int = 2047
    heartbeat: int = 60
    # W5: while a resource alarm is in effect publishers get connection.blocked and are no
    # longer read from. Memory: the bytes the broker holds (gateway/memory.py) above this;
    # 40% of RAM, RabbitMQ's vm_memory_high_watermark default.
    memory_high_watermark: int = field(default_factory=lambda: _physical_memory() * 2 // 5)
    # Disk: the data directory's file system has less free space than this (RabbitMQ's
    # disk_free_limit and its default, 50 MB), or the store failed to write.
    disk_free_limit: int = 50_000_000
    # Optional quota on the store's files (bytes; 0: none). Before disk_free_limit this was
    # the only disk alarm; a configuration that sets it keeps that meaning.
    store_high_watermark: int = 0
    # Fraction of the memory mark below which connection.unblocked is sent (hysteresis).
    low_watermark_ratio: float = 0.8
    # A content header declaring a larger body is refused with 406 (RabbitMQ's
    # max_message_size and its 3.10 default, 128 MiB).
    max_message_size: int = 128 << 20
    max_connections: int = 0  # 0: unlimited


@dataclass(frozen=True, slots=True)
class AuditSettings:
    dir: str | None = None
    rotate_bytes: int = 64 << 20
    rotate_seconds: int = 3600
    retention_hours: int = 168
    events: frozenset[str] | None = None  # None: every event


@dataclass(slots=True)
class GatewayConfig:
    listeners: list[Listener] = field(
        default_factory=lambda: [Listener("0.0.0.0", DEFAULT_PORT), Listener("::", DEFAULT_PORT)]
    )
    data_dir: str | None = None
    strict_names: bool = False
    salvage: bool = False  # the store opens despite damaged confirmed data (semantics.store)
    users: UserDB = field(default_factory=UserDB.default)
    limits: Limits = field(default_factory=Limits)
    audit: AuditSettings = field(default_factory=AuditSettings)
    # The management API and /metrics: None is off. `cmq-gateway serve` turns them on at
    # RabbitMQ's ports (15672, 15692) unless the config or the command line says otherwise;
    # the in-process test gateways leave them off.
    management_port: int | None = None
    metrics_port: int | None = None
    management_host: str = "0.0.0.0"
    metrics_host: str = "0.0.0.0"
    cluster_name: str = "cmq-gateway"

    @property
    def vhosts(self) -> list[str]:
        return self.users.vhosts

    def with_listen(self, host: str | None, port: int | None) -> GatewayConfig:
        """The command line's --host/--port replace the file's listeners."""
        if host is None and port is None:
            return self
        if host is None:
            listeners = [Listener(lst.host, port if port is not None else lst.port) for lst in self.listeners]
        else:
            listeners = [Listener(host, port if port is not None else DEFAULT_PORT)]
        return dataclasses.replace(self, listeners=listeners)


def _physical_memory() -> int:
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return 4 << 30


def default_data_dir() -> str:
    """The per-user data directory (XDG), so `cmq-gateway serve` run from anywhere finds its data."""
    base = os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local", "share")
    return os.path.join(base, "cmq-gateway")


def load_config(path: str | None) -> GatewayConfig:
    if path is None:
        return GatewayConfig()
    try:
        with open(path, encoding="utf-8") as f:
            raw = yaml.safe_load(f) or {}
    except OSError as e:
        raise ConfigError(f"cannot read config {path}: {e.strerror}") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"config {path} is not valid YAML: {e}") from None
    if not isinstance(raw, Mapping):
        raise ConfigError(f"config {path}: the top level must be a mapping")
    return parse_config(raw)


def parse_config(raw: Mapping[str, Any]) -> GatewayConfig:
    cfg = GatewayConfig()
    if "listeners" in raw:
        cfg.listeners = [_listener(x) for x in _list(raw, "listeners")]
    if raw.get("data_dir") is not None:
        cfg.data_dir = str(raw["data_dir"])
    cfg.strict_names = bool(raw.get("strict_names", False))
    cfg.salvage = bool(raw.get("salvage", False))
    cfg.cluster_name = str(raw.get("cluster_name", cfg.cluster_name))
    if any(k in raw for k in ("users", "vhosts", "permissions")):
        cfg.users = _userdb(raw)
    if "limits" in raw:
        cfg.limits = _fill(Limits, _map(raw, "limits"), "limits")
    if "audit" in raw:
        audit = dict(_map(raw, "audit"))
        if audit.get("events") is not None:
            audit["events"] = frozenset(str(e) for e in audit["events"])
        cfg.audit = _fill(AuditSettings, audit, "audit")
    cfg.management_port = _port_of(raw, "management")
    cfg.metrics_port = _port_of(raw, "metrics")
    for key in ("management", "metrics"):
        section = raw.get(key)
        if isinstance(section, Mapping) and section.get("host") is not None:
            setattr(cfg, f"{key}_host", str(section["host"]))
    return cfg


def _userdb(raw: Mapping[str, Any]) -> UserDB:
    vhosts: list[str] = []
    for v in _list(raw, "vhosts"):
        vhosts.append(str(v["name"]) if isinstance(v, Mapping) else str(v))
    users: dict[str, User] = {}
    for u in _list(raw, "users"):
        if not isinstance(u, Mapping) or "name" not in u:
            raise ConfigError(f"users: each entry needs a name, got {u!r}")
        name = str(u["name"])
        if "password_hash" in u:
            algo = str(u.get("hashing_algorithm", "rabbit_password_hashing_sha256"))
            if algo != "rabbit_password_hashing_sha256":
                raise ConfigError(f"user {name!r}: hashing algorithm {algo} is not supported")
            pw_hash = str(u["password_hash"])
        elif "password" in u:
            pw_hash = hash_password(str(u["password"]))
        else:
            raise ConfigError(f"user {name!r} has neither password_hash nor password")
        tags = u.get("tags", [])
        if isinstance(tags, str):  # RabbitMQ exports tags as "a,b" before 3.12
            tags = [t for t in tags.split(",") if t]
        users[name] = User(name, pw_hash, tuple(str(t) for t in tags))
    perms: dict[tuple[str, str], Permission] = {}
    for p in _list(raw, "permissions"):
        try:
            key = (str(p["user"]), str(p["vhost"]))
            perms[key] = Permission(str(p["configure"]), str(p["write"]), str(p["read"]))
        except (KeyError, TypeError):
            raise ConfigError(f"permissions: need user, vhost, configure, write, read; got {p!r}")
    loopback = raw.get("loopback_users", ["guest"])
    if not vhosts:
        vhosts = ["/"]
    return UserDB(users, perms, vhosts, frozenset(str(x) for x in loopback))


def _listener(x: Any) -> Listener:
    if isinstance(x, Mapping):
        return Listener(str(x.get("host", "0.0.0.0")), int(x.get("port", DEFAULT_PORT)))
    if isinstance(x, int):
        return Listener("0.0.0.0", x)
    raise ConfigError(f"listeners: expected {{host, port}}, got {x!r}")


def _port_of(raw: Mapping[str, Any], key: str) -> int | None:
    section = raw.get(key)
    if section is None:
        return None
    if section is False or section == "off":
        return OFF
    if isinstance(section, Mapping):
        return None if section.get("port") is None else int(section["port"])
    return int(section)


def _fill(cls: Any, values: Mapping[str, Any], where: str) -> Any:
    known = {f.name: f for f in dataclasses.fields(cls)}
    unknown = set(values) - set(known)
    if unknown:
        raise ConfigError(f"{where}: unknown keys {sorted(unknown)}")
    try:
        return cls(**{k: v for k, v in values.items()})
    except TypeError as e:
        raise ConfigError(f"{where}: {e}") from None


def _list(raw: Mapping[str, Any], key: str) -> list[Any]:
    value = raw.get(key) or []
    if not isinstance(value, list):
        raise ConfigError(f"{key}: expected a list")
    return value


def _map(raw: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    value = raw.get(key) or {}
    if not isinstance(value, Mapping):
        raise ConfigError(f"{key}: expected a mapping")
    return value
