"""A1 for administrative changes: users, vhosts, permissions and policies made, changed or
deleted over the management API (its paths and a definitions import) are audited with the
acting user and peer, in the log's snake_case events, and never with a password or its hash
(gateway.management.admin_audit). A lesser user refused (SE1) writes auth_failure, not the
change. A real aiohttp client against a real gateway; the audit files read back."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import aiohttp

from gateway.audit import ADMIN_EVENTS
from gateway.config import AuditSettings, parse_config
from gateway.management.testing import operator_gateway
from tests.support.audit_files import records

GUEST = aiohttp.BasicAuth("guest", "guest")
CAROL = aiohttp.BasicAuth("carol", "carol-secret-1")
SECRETS = ("guest", "carol-secret-1", "carol-secret-2", "dave-secret")


async def _call(http: aiohttp.ClientSession, method: str, url: str, auth: aiohttp.BasicAuth = GUEST,
                **kw: Any) -> int:
    async with http.request(method, url, auth=auth, **kw) as r:
        await r.read()
        return r.status


async def test_A1_user_vhost_permission_and_policy_changes_are_audited(tmp_path: Path) -> None:
    users = parse_config({"users": [{"name": "guest", "password": "guest", "tags": ["administrator"]}],
                          "permissions": [{"user": "guest", "vhost": "/", "configure": ".*", "write": ".*",
                                           "read": ".*"}]}).users
    audit_dir = tmp_path / "audit"
    async with operator_gateway(str(tmp_path / "data"), audit=AuditSettings(dir=str(audit_dir)), users=users) as og, \
            aiohttp.ClientSession() as http:
        api = f"{og.management_url}/api"
        steps: list[tuple[str, str, dict[str, Any], int]] = [
            ("PUT", "/vhosts/v1", {}, 201),
            ("PUT", "/vhosts/v1", {}, 204),  # nothing changed: no record
            ("PUT", "/users/carol", {"json": {"password": "carol-secret-1", "tags": "management"}}, 201),
            ("PUT", "/users/carol", {"json": {"password": "carol-secret-2"}}, 204),
            ("PUT", "/users/carol", {"json": {"tags": "management,monitoring"}}, 204),
            ("PUT", "/permissions/v1/carol", {"json": {"configure": "", "write": ".*", "read": ".*"}}, 201),
            ("PUT", "/policies/v1/ttl", {"json": {"pattern": "^q", "definition": {"message-ttl": 1000},
                                                  "apply-to": "queues"}}, 201),
            ("DELETE", "/policies/v1/ttl", {}, 204),
            ("DELETE", "/permissions/v1/carol", {}, 204),
        ]
        for method, path, kw, status in steps:
            assert await _call(http, method, api + path, **kw) == status, (method, path)
        # carol logs in with the password she has now; a management user may not make users (SE1).
        carol = aiohttp.BasicAuth("carol", "carol-secret-2")
        assert await _call(http, "PUT", f"{api}/users/mallory", auth=carol, json={"password": "x"}) == 401
        definitions = {"vhosts": [{"name": "v2"}],
                       "users": [{"name": "dave", "password": "dave-secret", "tags": ""}],
                       "permissions": [{"user": "dave", "vhost": "v2", "configure": ".*", "write": ".*",
                                        "read": ".*"}],
                       "policies": [{"vhost": "v2", "name": "cap", "pattern": ".*", "apply-to": "queues",
                                     "definition": {"max-length": 10}, "priority": 0}]}
        assert await _call(http, "POST", f"{api}/definitions", json=definitions) == 200
        assert await _call(http, "DELETE", f"{api}/users/carol") == 204
        assert await _call(http, "DELETE", f"{api}/vhosts/v1") == 204
        assert og.gateway.audit.flush(10)
        written = records(audit_dir, include_open=True)

    admin = [r for r in written if r["event"] in ADMIN_EVENTS]
    got = [(r["event"], r["vhost"], r["object"], r["user"], r.get("tags")) for r in admin]
    assert got == [
        ("vhost_created", "v1", "vhost:v1", "guest", None),
        ("user_created", "", "user:carol", "guest", ["management"]),
        ("user_password_changed", "", "user:carol", "guest", None),
        ("user_tags_set", "", "user:carol", "guest", ["management", "monitoring"]),
        ("permission_created", "v1", "permission:carol", "guest", None),
        ("policy_set", "v1", "policy:ttl", "guest", None),
        ("policy_cleared", "v1", "policy:ttl", "guest", None),
        ("permission_deleted", "v1", "permission:carol", "guest", None),
        # the definitions import, in its order: vhosts, users, permissions, policies
        ("vhost_created", "v2", "vhost:v2", "guest", None),
        ("user_created", "", "user:dave", "guest", []),
        ("permission_created", "v2", "permission:dave", "guest", None),
        ("policy_set", "v2", "policy:cap", "guest", None),
        ("user_deleted", "", "user:carol", "guest", None),
        ("vhost_deleted", "v1", "vhost:v1", "guest", None),
    ]
    assert all(r["peer"].startswith("127.0.0.1:") for r in admin), admin
    # SE1: the refused change is an auth_failure of carol's, and no record of a change.
    refused = [r for r in written if r["event"] == "auth_failure"]
    assert [(r["user"], r["protocol"]) for r in refused] == [("carol", "http")], refused
    assert "PUT /api/users/mallory" in refused[0]["reason"]
    assert not any("mallory" in json.dumps(r) for r in admin)
    # Never a password or a hash in the log.
    text = "\n".join(json.dumps(r) for r in written)
    hashes = [u.password_hash for u in users.users.values()]
    assert not any(s in text for s in SECRETS[1:]) and "password_hash" not in text
    assert not any(h in text for h in hashes)
