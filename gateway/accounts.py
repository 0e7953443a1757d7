"""Users, vhosts and permissions changed at run time, journaled in the broker's store (SE4).

The configuration file gives the user database its starting state (gateway.config); what an
administrator changes over the management API (``/api/users``, ``/api/vhosts``,
``/api/permissions``, a definitions import) is written to the store under the ``u/`` keys
(gateway.broker.persistence) and applied again on top of the configuration when the broker
opens, so it survives a restart. A deletion is kept as a tombstone record, so that a user
or vhost the configuration also names stays deleted.

Each record repeats the names it is about in its value; keys only have to be unique.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from gateway.auth import Permission, User, UserDB
from gateway.broker import persistence as P

__all__ = ["Accounts"]


class Accounts:
    """The broker's user database (``broker.config.users``), changed durably."""

    def __init__(self, users: UserDB, broker: Any) -> None:
        self.users = users
        self.broker = broker

    # -- changes -----------------------------------------------------------------------------

    def put_user(self, name: str, password_hash: str, tags: Iterable[str]) -> User:
        user = User(name, password_hash, tuple(tags))
        self.users.users[name] = user
        self._put(P.user_key(name), {"kind": "user", "name": name, "password_hash": password_hash,
                                     "tags": list(user.tags)})
        return user

    def delete_user(self, name: str) -> bool:
        """The user and their permissions, as RabbitMQ's delete_user."""
        if self.users.users.pop(name, None) is None:
            return False
        self._put(P.user_key(name), {"kind": "user", "name": name, "deleted": True})
        for user, vhost in [k for k in self.users.permissions if k[0] == name]:
            self.clear_permission(user, vhost)
        return True

    def put_vhost(self, name: str) -> bool:
        """True when the vhost is new."""
        self.broker.vhost(name)
        if name in self.users.vhosts:
            return False
        self.users.vhosts.append(name)
        self._put(P.user_vhost_key(name), {"kind": "vhost", "name": name})
        return True

    def forget_vhost(self, name: str) -> bool:
        """The vhost's name and permissions (the broker's objects in it are the caller's)."""
        if name not in self.users.vhosts:
            return False
        self.users.vhosts.remove(name)
        self._put(P.user_vhost_key(name), {"kind": "vhost", "name": name, "deleted": True})
        for user, vhost in [k for k in self.users.permissions if k[1] == name]:
            self.clear_permission(user, vhost)
        return True

    def set_permission(self, user: str, vhost: str, perm: Permission) -> None:
        self.users.permissions[user, vhost] = perm
        self._rebind(user, vhost)
        self._put(P.permission_key(vhost, user), {"kind": "permission", "user": user, "vhost": vhost,
                                                  "configure": perm.configure,
                                                  "write": perm.write, "read": perm.read})

    def clear_permission(self, user: str, vhost: str) -> bool:
        if self.users.permissions.pop((user, vhost), None) is None:
            return False
        self._rebind(user, vhost)
        self._put(P.permission_key(vhost, user), {"kind": "permission", "user": user, "vhost": vhost,
                                                  "deleted": True})
        return True

    def _rebind(self, user: str, vhost: str) -> None:
        """SE1: the user's open connections on ``vhost`` are held to the new permissions."""
        for session in list(getattr(self.broker, "sessions", ())):
            if session.user == user and session.vhost_name == vhost:
                session.permissions_changed()

    def _put(self, key: str, record: dict[str, Any]) -> None:
        self.broker.persist(key, P.encode_json(record))

    # -- recovery ----------------------------------------------------------------------------

    def recover(self) -> int:
        """Apply the journaled changes on top of the configured database; the count applied."""
        records = [P.decode_json(raw) for _, raw in self.broker.store.items(P.ACCOUNTS_PREFIX)]
        by_kind: dict[str, list[dict[str, Any]]] = {"vhost": [], "user": [], "permission": []}
        for r in records:
            by_kind.setdefault(r.get("kind", ""), []).append(r)
        db = self.users
        for r in by_kind["vhost"]:  # first: permissions refer to them
            if r.get("deleted"):
                if r["name"] in db.vhosts:
                    db.vhosts.remove(r["name"])
            elif r["name"] not in db.vhosts:
                db.vhosts.append(r["name"])
                self.broker.vhost(r["name"])
        for r in by_kind["user"]:
            if r.get("deleted"):
                db.users.pop(r["name"], None)
            else:
                db.users[r["name"]] = User(r["name"], r["password_hash"], tuple(r["tags"]))
        for r in by_kind["permission"]:
            if r.get("deleted"):
                db.permissions.pop((r["user"], r["vhost"]), None)
            else:
                db.permissions[r["user"], r["vhost"]] = Permission(r["configure"], r["write"], r["read"])
        return len(records)
