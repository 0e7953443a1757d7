"""The gateway's configuration: one YAML (or JSON) file, every key optional.

Every key, its type and range are in ``gateway.config_schema.SCHEMA``; the whole file is
checked before anything starts, and a wrong key is one line naming its path. The users /
vhosts / permissions keys use the shape of a RabbitMQ definitions export
(``rabbitmqctl export_definitions``), so such a file can be used as-is (W2)::

    listeners: [{host: "0.0.0.0", port: 5672}, {host: "::", port: 5672}]   # or [5672]
    data_dir: /var/lib/cmq-gateway
    strict_names: false               # L2
    profile: compatible               # PF1: compatible (RabbitMQ's sizes, CMQ's reported) or cmq
    salvage: false                    # open a damaged store, setting the damage aside
    users:
      - {name: alice, password_hash: "<from an export>", hashing_algorithm: rabbit_password_hashing_sha256}
      - {name: bob, password: "plain text is hashed on load",
         cmq_keys: [{secret_id: "AKID...", secret_key: "...", vhost: "/"}]}   # CA1: CMQ API keys
    vhosts: [{name: "/"}, {name: orders, profile: cmq}]  # or plain strings; profile: PF1
    permissions:
      - {user: alice, vhost: "/", configure: ".*", write: ".*", read: ".*"}
    loopback_users: [guest]           # users that may connect from loopback only
    limits: {frame_max: 131072, channel_max: 2047, heartbeat: 60,
             memory_high_watermark: 1073741824,   # bytes the broker holds (gateway/memory.py)
             disk_free_limit: 50000000,           # free bytes of the data dir's (and audit dir's) file system
             max_message_size: 134217728,         # a larger content header is refused (406)
             store_high_watermark: 0,             # optional quota on the store's files; 0: none
             max_connections: 0, fd_reserve: 256, # SE5, per listener (gateway/admission.py)
             http_idle_timeout: 10, http_body_timeout: 10, preauth_bytes: 65536}
    audit: {dir: /var/log/cmq-gateway, rotate_bytes: 67108864, rotate_seconds: 3600,
            retention_hours: 168, events: null}
    management: {port: 15672, host: "0.0.0.0"}   # or off; RabbitMQ's management HTTP API
    metrics: {port: 15692, host: "0.0.0.0"}      # or off; Prometheus /metrics
                                      # (without a host: 0.0.0.0 and ::, as the listeners)
    cmq_api: {port: 15680, host: "0.0.0.0"}      # or off; CMQ's HTTP API (CA1, gateway.cmqapi)
    mqtt: {port: 1883, host: "0.0.0.0", max_packet_size: 1048576,   # or off; MQTT 3.1.1/5.0 (MQ1)
           tls_port: 8883}            # MQTT over TLS with a tls section (or off); hosts: as AMQP
    tls:                              # SE2: AMQPS, and HTTPS for management and /metrics
      certfile: /etc/cmq-gateway/server.pem
      keyfile: /etc/cmq-gateway/server.key
      cafile: /etc/cmq-gateway/ca.pem           # RabbitMQ's cacertfile (also accepted)
      verify: verify_peer                       # or verify_none
      fail_if_no_peer_cert: false
      port: 5671                                # on the hosts of `listeners`
    push: {allow: ["https://hooks.example.com/*"], allow_addresses: []}   # SE3 (gateway.push_policy)

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
from gateway.config_schema import SchemaError, validate
from gateway.push_policy import PushPolicy

__all__ = [
    "AuditSettings",
    "CmqKey",
    "ConfigError",
    "GatewayConfig",
    "Limits",
    "Listener",
    "TLSSettings",
    "default_data_dir",
    "load_config",
]

DEFAULT_PORT = 5672
DEFAULT_MANAGEMENT_PORT = 15672
DEFAULT_METRICS_PORT = 15692
DEFAULT_TLS_PORT = 5671
# CA1: CMQ's HTTP API. Clear of RabbitMQ (5672, 5671, 15672, 15692, 25672, 4369), Spark (7077,
# 8080, 4040), MQTT (1883, 8883) and NATS (4222, 8222).
DEFAULT_CMQ_API_PORT = 15680
DEFAULT_MQTT_PORT = 1883
DEFAULT_MQTTS_PORT = 8883  # RabbitMQ's mqtt.listeners.ssl
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
    # SE5 (gateway/admission.py): connections each listener may hold (AMQP, AMQPS, MQTT,
    # MQTTS, management, metrics, CMQ API, each on its own); 0: no limit but the descriptors.
    max_connections: int = 0
    # SE4/SE5: seconds from accept until connection.open (AMQP) or CONNACK (MQTT) must have
    # been answered (RabbitMQ's handshake_timeout, 10 s); 0 turns the limit off.
    handshake_timeout: float = 10.0
    # SE5: descriptors kept free for the other listeners: with fewer free than this, a
    # listener holding fd_reserve/4 sockets or more closes new ones at once.
    fd_reserve: int = 256
    # SE5, HTTP listeners: seconds from accept (or from the previous response: keep-alive)
    # until a request's headers are complete, and from them until its body is read.
    http_idle_timeout: float = 10.0
    http_body_timeout: float = 10.0
    # SE5: bytes a connection may send before it is logged in (an MQTT CONNECT, and what
    # follows it, before CONNACK; HTTP request headers).
    preauth_bytes: int = 65536


@dataclass(frozen=True, slots=True)
class AuditSettings:
    dir: str | None = None
    rotate_bytes: int = 64 << 20
    rotate_seconds: int = 3600
    retention_hours: int = 168
    events: frozenset[str] | None = None  # None: every event


@dataclass(frozen=True, slots=True)
class TLSSettings:
    """SE2, with RabbitMQ's ssl_options names (gateway/tls.py builds the SSL context)."""

    certfile: str
    keyfile: str | None = None  # None: the key is in certfile
    cafile: str | None = None  # CA bundle for client certificates; RabbitMQ's cacertfile
    password: str | None = None  # of an encrypted keyfile
    verify: str = "verify_none"  # or verify_peer: ask for a client certificate
    fail_if_no_peer_cert: bool = False  # with verify_peer: refuse clients without one
    port: int = DEFAULT_TLS_PORT  # AMQPS, on the hosts of `listeners`; OFF: no AMQPS listener
    # Seconds for the TLS handshake itself (RabbitMQ's ssl_handshake_timeout, 5 s); the AMQP
    # handshake_timeout (SE4) starts once it is done.
    handshake_timeout: float = 5.0
    # EXTERNAL login: the user is the client certificate's CN (common_name) or its subject
    # DN (distinguished_name, RabbitMQ's default).
    ssl_cert_login_from: str = "distinguished_name"
    management: bool = True  # serve the management API over HTTPS
    metrics: bool = True  # serve /metrics over HTTPS
    cmq_api: bool = True  # serve CMQ's HTTP API over HTTPS


@dataclass(frozen=True, slots=True)
class CmqKey:
    """One SecretId/SecretKey pair of CMQ's HTTP API (CA1): requests signed with it act as
    ``user``, in ``vhost`` unless the request names another."""

    user: str
    secret_key: str
    vhost: str = "/"


@dataclass(slots=True)
class GatewayConfig:
    listeners: list[Listener] = field(
        default_factory=lambda: [Listener("0.0.0.0", DEFAULT_PORT), Listener("::", DEFAULT_PORT)]
    )
    data_dir: str | None = None
    # CL1: a NATS JetStream URL list (docs/CLUSTER.md) instead of the embedded store; None:
    # the embedded store in data_dir. nats: creds / tls_ca / tls_cert / tls_key file paths.
    store: str | None = None
    nats: dict[str, str] = field(default_factory=dict)
    # On JetStream, a transient message on a non-durable queue goes straight to a consumer of
    # the publishing gateway when it can (gateway.jetstream.direct; lost if that gateway is
    # killed before the ack). config: cluster: {direct_delivery: false}; --no-direct-delivery.
    direct_delivery: bool = True
    strict_names: bool = False
    profile: str = "compatible"  # PF1: "compatible" (the default) or "cmq"
    vhost_profiles: dict[str, str] = field(default_factory=dict)  # PF1: per-vhost overrides
    salvage: bool = False  # the store opens despite damaged confirmed data (semantics.store)
    users: UserDB = field(default_factory=UserDB.default)
    limits: Limits = field(default_factory=Limits)
    audit: AuditSettings = field(default_factory=AuditSettings)
    # The management API and /metrics: None is off. `cmq-gateway serve` turns them on at
    # RabbitMQ's ports (15672, 15692) unless the config or the command line says otherwise;
    # the in-process test gateways leave them off.
    management_port: int | None = None
    metrics_port: int | None = None
    # None: every IPv4 and IPv6 address (0.0.0.0 and ::), as the default AMQP listeners.
    management_host: str | None = None
    metrics_host: str | None = None
    cluster_name: str = "cmq-gateway"
    # SE3: the URLs HTTP subscriptions may push to; none until an administrator allows some.
    push: PushPolicy = field(default_factory=PushPolicy)
    # The topology part of a RabbitMQ definitions export given as the config (exchanges,
    # queues, bindings, policies...): imported once the gateway is up, as RabbitMQ's
    # load_definitions does. Empty when the file holds none.
    definitions: dict[str, Any] = field(default_factory=dict)
    tls: TLSSettings | None = None  # None: no TLS anywhere
    # CA1: CMQ's HTTP API (None: off; `cmq-gateway serve` turns it on at DEFAULT_CMQ_API_PORT)
    # and its key pairs by SecretId.
    cmq_api_port: int | None = None
    cmq_api_host: str = "0.0.0.0"
    cmq_keys: dict[str, CmqKey] = field(default_factory=dict)
    # MQ1: the MQTT listener; None is off. `cmq-gateway serve` turns it on at 1883 unless the
    # config or --mqtt-port says otherwise; the in-process test gateways leave it off.
    mqtt_port: int | None = None
    # None: the hosts of the AMQP listeners (0.0.0.0 and :: by default), as AMQPS.
    mqtt_host: str | None = None
    # MQTT over TLS (the tls section's certificate); None is off. `cmq-gateway serve` turns it on
    # at 8883 when there is a tls section, as --tls-port does for AMQPS.
    mqtt_tls_port: int | None = None
    mqtt_tls_port_defaulted: bool = False
    # Nobody asked for the port (the default 1883): when it is taken (a Mosquitto on the host)
    # the gateway says so and serves without MQTT instead of refusing to start.
    mqtt_port_defaulted: bool = False
    mqtt_max_packet_size: int = 1 << 20

    @property
    def vhosts(self) -> list[str]:
        return self.users.vhosts

    def tls_listeners(self) -> list[Listener]:
        """SE2: AMQPS on the port of ``tls``, on every host the plain listeners use."""
        if self.tls is None or self.tls.port == OFF:
            return []
        hosts = list(dict.fromkeys(lst.host for lst in self.listeners)) or ["0.0.0.0", "::"]
        return [Listener(h, self.tls.port) for h in hosts]

    def mqtt_listeners(self, port: int) -> list[Listener]:
        """MQ1: the MQTT (or MQTTS) listeners on ``port``: on ``mqtt_host``, or on every host the
        AMQP listeners use (dual-stack by default)."""
        if self.mqtt_host:
            return [Listener(self.mqtt_host, port)]
        hosts = list(dict.fromkeys(lst.host for lst in self.listeners)) or ["0.0.0.0", "::"]
        return [Listener(h, port) for h in hosts]

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
            raw = yaml.safe_load(f)
    except OSError as e:
        raise ConfigError(f"config: cannot read {path}: {(e.strerror or str(e)).lower()}") from None
    except UnicodeDecodeError as e:
        raise ConfigError(f"config: {path} is not UTF-8 text (byte {e.start})") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"config: {path} is not valid YAML: {_yaml_problem(e)}") from None
    return parse_config({} if raw is None else raw)


def _yaml_problem(e: yaml.YAMLError) -> str:
    """PyYAML's several-line message as one line: the problem and where."""
    mark = getattr(e, "problem_mark", None)
    problem = getattr(e, "problem", None) or str(e).splitlines()[0]
    where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    context = getattr(e, "context", None)
    return f"{problem}{where}" + (f" ({context})" if context else "")


def parse_config(raw: Any) -> GatewayConfig:
    """The configuration of a parsed file; ConfigError (one line) unless SCHEMA holds."""
    try:
        validate(raw)
    except SchemaError as e:
        raise ConfigError(f"config: {e}") from None
    raw = _set(raw)
    cfg = GatewayConfig()
    if "listeners" in raw:
        cfg.listeners = [_listener(x) for x in raw["listeners"]]
    cfg.data_dir = raw.get("data_dir")
    cfg.store = raw.get("store")
    cfg.nats = dict(raw.get("nats") or {})
    cfg.direct_delivery = _set(raw.get("cluster") or {}).get("direct_delivery", True)
    cfg.strict_names = raw.get("strict_names", False)
    cfg.salvage = raw.get("salvage", False)
    cfg.cluster_name = raw.get("cluster_name", cfg.cluster_name)
    cfg.profile = raw.get("profile", cfg.profile)  # the schema checked: compatible or cmq
    cfg.vhost_profiles = {v["name"]: v["profile"] for v in raw.get("vhosts", [])
                          if isinstance(v, Mapping) and v.get("profile") is not None}
    if any(k in raw for k in ("users", "vhosts", "permissions")):
        cfg.users = _userdb(raw)
    if raw.get("push") is not None:
        cfg.push = PushPolicy.parse(raw["push"])  # the schema checked its shape and networks
    cfg.definitions = {k: raw[k] for k in TOPOLOGY_KINDS if raw.get(k)}
    cfg.limits = Limits(**_known(Limits, raw.get("limits", {})))
    audit = _set(raw.get("audit", {}))
    if "events" in audit:
        audit["events"] = frozenset(audit["events"])
    cfg.audit = AuditSettings(**audit)
    if raw.get("tls") is not None:
        cfg.tls = _tls(_set(raw["tls"]))
    cfg.cmq_keys = _cmq_keys(raw.get("users", []))
    for key in ("management", "metrics", "cmq_api", "mqtt"):
        section = raw.get(key)
        port = section.get("port") if isinstance(section, Mapping) else section
        setattr(cfg, f"{key}_port", None if port is None else OFF if port is False or port == "off" else port)
        if isinstance(section, Mapping) and section.get("host") is not None:
            setattr(cfg, f"{key}_host", section["host"])
    mqtt = raw.get("mqtt")
    if isinstance(mqtt, Mapping) and mqtt.get("max_packet_size") is not None:
        cfg.mqtt_max_packet_size = mqtt["max_packet_size"]
    if isinstance(mqtt, Mapping) and mqtt.get("tls_port") is not None:
        cfg.mqtt_tls_port = OFF if mqtt["tls_port"] in (False, "off") else mqtt["tls_port"]
        if cfg.mqtt_tls_port != OFF and cfg.tls is None:
            raise ConfigError("config: mqtt.tls_port: needs a tls section (certfile, keyfile, ...)")
    return cfg


def _known(cls: Any, section: Mapping[str, Any]) -> dict[str, Any]:
    """The keys ``cls`` holds: SCHEMA already names the keys other branches are adding
    (handshake_timeout, disk_free_limit, max_message_size), their fields come with them."""
    names = {f.name for f in dataclasses.fields(cls)}
    return {k: v for k, v in _set(section).items() if k in names}


# What a definitions export holds beyond users, vhosts and permissions.
TOPOLOGY_KINDS = ("topic_permissions", "parameters", "global_parameters", "policies", "exchanges",
                  "queues", "bindings", "cmq_http_subscriptions")


def _set(section: Mapping[str, Any]) -> dict[str, Any]:
    """The keys given a value: null is the default (YAML's `key:` with nothing after it)."""
    return {k: v for k, v in section.items() if v is not None}


def _userdb(raw: Mapping[str, Any]) -> UserDB:
    vhosts = [v if isinstance(v, str) else v["name"] for v in raw.get("vhosts", [])]
    users: dict[str, User] = {}
    for i, u in enumerate(raw.get("users", [])):
        name = u["name"]
        if u.get("password_hash") is not None:
            pw_hash = u["password_hash"]
        elif u.get("password") is not None:
            pw_hash = hash_password(u["password"])
        else:
            raise ConfigError(f"config: users[{i}]: user {name!r} needs password or password_hash")
        tags = u.get("tags") or []
        if isinstance(tags, str):  # RabbitMQ exports tags as "a,b" before 3.12
            tags = [t for t in tags.split(",") if t]
        users[name] = User(name, pw_hash, tuple(tags))
    if not vhosts:
        vhosts = ["/"]
    perms: dict[tuple[str, str], Permission] = {}
    if not users:
        # Vhosts without users: RabbitMQ's guest stays, or nobody at all could log in.
        default = UserDB.default()
        users = dict(default.users)
        if "/" in vhosts:
            perms.update(default.permissions)
    for i, p in enumerate(raw.get("permissions", [])):
        # A permission naming a user or vhost that does not exist grants nothing: a typo.
        for key, known in (("user", list(users)), ("vhost", vhosts)):
            if p[key] not in known:
                raise ConfigError(f"config: permissions[{i}].{key}: {p[key]!r} is not in {key}s "
                                  f"({', '.join(known)})")
        perms[(p["user"], p["vhost"])] = Permission(p["configure"], p["write"], p["read"])
    loopback = raw.get("loopback_users", ["guest"])
    return UserDB(users, perms, vhosts, frozenset(loopback))


def _cmq_keys(users: list[Mapping[str, Any]]) -> dict[str, CmqKey]:
    keys: dict[str, CmqKey] = {}
    for i, u in enumerate(users):
        for j, k in enumerate(u.get("cmq_keys") or []):
            if k["secret_id"] in keys:
                raise ConfigError(f"config: users[{i}].cmq_keys[{j}].secret_id: {k['secret_id']!r} is "
                                  f"already the key of user {keys[k['secret_id']].user!r}")
            keys[k["secret_id"]] = CmqKey(u["name"], k["secret_key"], k.get("vhost") or "/")
    return keys


def _tls(values: dict[str, Any]) -> TLSSettings:
    """SCHEMA has checked the types; what is left are the rules between keys."""
    if "cacertfile" in values:  # RabbitMQ's name for it
        if "cafile" in values:
            raise ConfigError("config: tls: give cafile or cacertfile, not both")
        values["cafile"] = values.pop("cacertfile")
    if not values.get("certfile"):
        raise ConfigError("config: tls.certfile: required (the server certificate, PEM)")
    if values.get("verify") == "verify_peer" and values.get("cafile") is None:
        raise ConfigError("config: tls.verify: verify_peer needs cafile, the CA that signs client certificates")
    if values.get("port") in (False, "off"):
        values["port"] = OFF
    return TLSSettings(**values)


def _listener(x: Any) -> Listener:
    if isinstance(x, Mapping):
        return Listener(x.get("host") or "0.0.0.0", x.get("port", DEFAULT_PORT))
    return Listener("0.0.0.0", x)
