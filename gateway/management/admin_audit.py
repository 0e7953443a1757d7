"""A1 for administrative changes: users, vhosts, permissions and policies made, changed or
removed over the management API (its own paths and a definitions import) are audited, as
RabbitMQ emits ``user.created``, ``permission.deleted``, ``policy.set``... events.

The events, in the audit log's snake_case: ``user_created``, ``user_deleted``,
``user_password_changed``, ``user_tags_set``, ``vhost_created``, ``vhost_deleted``,
``permission_created`` (set, whether new or changed, as RabbitMQ's), ``permission_deleted``,
``policy_set``, ``policy_cleared``. Each carries the acting ``user`` and ``peer`` and the
changed ``object`` (``user:<name>``, ``vhost:<name>``, ``permission:<user>``,
``policy:<name>``); permissions and policies in their own ``vhost``, users in ``""`` (a user
belongs to no vhost). ``user_created`` and ``user_tags_set`` carry the user's ``tags``. A
password or its hash is never written. Deleting a user or a vhost takes its permissions with
it, in that one record. What a start-up loads from the config file is no one's action and
writes nothing (spark/SCHEMA.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from aiohttp import web

from gateway.admission import http_peer
from gateway.auth import User
from gateway.management.app import USER

__all__ = ["Actor", "actor", "user_changed"]


@dataclass(frozen=True)
class Actor:
    """Who made a change, and the audit log it goes to."""

    audit: Any
    user: str
    peer: str | None = None

    def emit(self, event: str, vhost: str, obj: str, **fields: Any) -> None:
        self.audit.emit(event, vhost, object=obj, user=self.user, peer=self.peer, **fields)

    def user_changed(self, before: User | None, after: User) -> None:
        user_changed(self, before, after)


def actor(request: web.Request, audit: Any) -> Actor:
    return Actor(audit, request[USER].name, http_peer(request))


def user_changed(who: Actor, before: User | None, after: User) -> None:
    """The records of a user put: created, or what changed (a new hash is a new password:
    a PUT with ``password`` salts it afresh, as RabbitMQ's does, and is a change too)."""
    obj = f"user:{after.name}"
    if before is None:
        who.emit("user_created", "", obj, tags=list(after.tags))
        return
    if before.password_hash != after.password_hash:
        who.emit("user_password_changed", "", obj)
    if sorted(before.tags) != sorted(after.tags):
        who.emit("user_tags_set", "", obj, tags=list(after.tags))
