"""W2: RabbitMQ password hashes, PLAIN/AMQPLAIN responses, permissions and the config file."""

from __future__ import annotations

import base64
import hashlib
import json
import struct

import pytest
from pamqp import encode

from gateway.auth import AuthError, Permission, UserDB, check_password, hash_password, parse_response
from gateway.config import ConfigError, Listener, load_config

# Exported by `rabbitmqctl export_definitions` from RabbitMQ 3.10.8 for user/password s3cret.
RABBIT_HASH = "hZ1A8UybNMZfdOYL4k2UaclisRo1H+9whCH2zb4fHfz8Rnwp"


def test_W2_rabbitmq_exported_hash_verifies() -> None:
    assert check_password("s3cret", RABBIT_HASH) is True
    assert check_password("s3cret ", RABBIT_HASH) is False


def test_W2_hash_is_salted_sha256_base64() -> None:
    h = hash_password("guest", salt=b"\x01\x02\x03\x04")
    raw = base64.b64decode(h)
    assert raw[:4] == b"\x01\x02\x03\x04"
    assert raw[4:] == hashlib.sha256(b"\x01\x02\x03\x04guest").digest()
    assert check_password("guest", h) is True
    assert hash_password("guest") != hash_password("guest")  # a fresh salt each time


def test_W2_plain_and_amqplain_responses() -> None:
    assert parse_response("PLAIN", "\x00alice\x00pw") == ("alice", "pw")
    table = encode.field_table({"LOGIN": "bob", "PASSWORD": "pw2"})[4:]  # without its length
    assert parse_response("AMQPLAIN", table) == ("bob", "pw2")
    with pytest.raises(AuthError, match="unsupported authentication mechanism 'EXTERNAL'"):
        parse_response("EXTERNAL", b"")
    with pytest.raises(AuthError, match="PLAIN response is malformed"):
        parse_response("PLAIN", b"alice")
    assert struct.unpack(">I", encode.field_table({})[:4]) == (0,)


def test_W2_guest_only_from_loopback() -> None:
    db = UserDB.default()
    assert db.authenticate("PLAIN", "\x00guest\x00guest", from_loopback=True).name == "guest"
    with pytest.raises(AuthError, match="user 'guest' can only connect via localhost"):
        db.authenticate("PLAIN", "\x00guest\x00guest", from_loopback=False)
    with pytest.raises(AuthError, match="Login was refused using authentication mechanism PLAIN"):
        db.authenticate("PLAIN", "\x00guest\x00wrong", from_loopback=True)


def test_W2_permissions_are_searched_regexes() -> None:
    p = Permission(configure="^app-", write="orders", read="")
    assert p.allows("configure", "app-queue") is True
    assert p.allows("configure", "other") is False
    assert p.allows("write", "x.orders.y") is True  # unanchored, as RabbitMQ's re:run
    assert p.allows("read", "anything") is False  # the empty pattern grants nothing
    assert Permission(write="^amq\\.default$").allows("write", "") is True


def test_W2_definitions_export_loads(tmp_path) -> None:
    path = tmp_path / "defs.yaml"
    definitions = {
        "users": [{"name": "alice", "password_hash": RABBIT_HASH,
                   "hashing_algorithm": "rabbit_password_hashing_sha256", "tags": ["administrator"]}],
        "vhosts": [{"name": "/"}, {"name": "orders"}],
        "permissions": [{"user": "alice", "vhost": "orders", "configure": ".*", "write": ".*", "read": ".*"}],
        "listeners": [{"host": "::1", "port": 5999}], "strict_names": True,
        "limits": {"heartbeat": 5}, "audit": {"dir": "/tmp/a", "events": ["publish"]},
    }
    path.write_text(json.dumps(definitions))  # JSON, as RabbitMQ exports it, is YAML too
    cfg = load_config(str(path))
    assert cfg.listeners == [Listener("::1", 5999)]
    assert cfg.strict_names is True
    assert cfg.vhosts == ["/", "orders"]
    assert cfg.limits.heartbeat == 5
    assert cfg.audit.events == frozenset({"publish"})
    assert cfg.users.authenticate("PLAIN", "\x00alice\x00s3cret", from_loopback=False).tags == ("administrator",)
    assert cfg.users.vhost_permission("alice", "/") is None
    assert cfg.users.vhost_permission("alice", "orders") == Permission(".*", ".*", ".*")
    assert cfg.management_port is None


def test_config_rejects_unknown_limit(tmp_path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("limits: {heartbeats: 5}\n")
    with pytest.raises(ConfigError, match=r"^config: limits: unknown key 'heartbeats' \(did you mean 'heartbeat'\?\)$"):
        load_config(str(path))
