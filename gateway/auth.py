"""Users, passwords and vhost permissions, as RabbitMQ keeps them (W2).

Passwords are stored as ``rabbit_password_hashing_sha256`` hashes: base64 of a 4-byte random
salt followed by SHA-256(salt + UTF-8 password). That is what ``rabbitmqctl
export_definitions`` writes, so exported users log in here unchanged. Hashes made by
RabbitMQ's other modules (``rabbit_password_hashing_sha512``, ``rabbit_password_hashing_md5``)
are the same with another digest, told apart by their length, so they log in too.

Permissions are three regular expressions per (user, vhost): configure, write, read. As in
RabbitMQ they are searched (not anchored) in the resource name, the empty pattern grants
nothing, and the default exchange is checked under the name ``amq.default``.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import re
import struct
from dataclasses import dataclass, field
from functools import cached_property
from typing import Literal

from pamqp import decode

__all__ = [
    "AuthError",
    "Permission",
    "User",
    "UserDB",
    "check_password",
    "hash_password",
    "hashing_algorithm",
    "parse_response",
]

MECHANISMS = ("PLAIN", "AMQPLAIN")
Access = Literal["configure", "write", "read"]


class AuthError(Exception):
    """A login refused. ``str()`` is the reply text after ``ACCESS_REFUSED - ``, as RabbitMQ
    words it (the same for an unknown user and a wrong password, so a client cannot probe
    user names); ``cause`` says which it was, for the gateway's log and the audit record."""

    def __init__(self, text: str, cause: str = "") -> None:
        super().__init__(text)
        self.cause = cause or text


def hash_password(password: str, *, salt: bytes | None = None) -> str:
    salt = os.urandom(4) if salt is None else salt
    return base64.b64encode(salt + hashlib.sha256(salt + password.encode()).digest()).decode()


# RabbitMQ's password hashing modules, by the length of their digest.
HASHING_ALGORITHMS = {32: "rabbit_password_hashing_sha256", 64: "rabbit_password_hashing_sha512",
                      16: "rabbit_password_hashing_md5"}
_DIGESTS = {32: hashlib.sha256, 64: hashlib.sha512, 16: hashlib.md5}


def hashing_algorithm(password_hash: str) -> str | None:
    """The RabbitMQ hashing module that made ``password_hash``, or None when it is none of them."""
    try:
        raw = base64.b64decode(password_hash, validate=True)
    except ValueError:
        return None
    return HASHING_ALGORITHMS.get(len(raw) - 4)


def check_password(password: str, password_hash: str) -> bool:
    try:
        raw = base64.b64decode(password_hash, validate=True)
    except ValueError:
        return False
    digest_of = _DIGESTS.get(len(raw) - 4)
    if digest_of is None:
        return False
    salt, digest = raw[:4], raw[4:]
    return hmac.compare_digest(digest, digest_of(salt + password.encode()).digest())


def parse_response(mechanism: str, response: str | bytes) -> tuple[str, str]:
    """(username, password) from a connection.start-ok response."""
    data = response.encode() if isinstance(response, str) else bytes(response)
    if mechanism == "PLAIN":
        # RFC 4616: [authzid] NUL authcid NUL passwd
        parts = data.split(b"\x00")
        if len(parts) != 3:
            raise AuthError("PLAIN response is malformed")
        return parts[1].decode(errors="replace"), parts[2].decode(errors="replace")
    if mechanism == "AMQPLAIN":
        # A field table without its leading length (RabbitMQ's rabbit_auth_mechanism_amqplain).
        try:
            _, table = decode.field_table(struct.pack(">I", len(data)) + data)
        except Exception:
            raise AuthError("AMQPLAIN response is malformed")
        login, password = table.get("LOGIN"), table.get("PASSWORD")
        if login is None or password is None:
            raise AuthError("AMQPLAIN response lacks LOGIN or PASSWORD")
        return _text(login), _text(password)
    raise AuthError(f"unsupported authentication mechanism {mechanism!r}")


def _text(value: object) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


@dataclass(frozen=True, slots=True)
class User:
    name: str
    password_hash: str
    tags: tuple[str, ...] = ()


@dataclass(frozen=True)
class Permission:
    configure: str = ".*"
    write: str = ".*"
    read: str = ".*"

    @cached_property
    def _compiled(self) -> dict[str, re.Pattern[str] | None]:
        return {k: (re.compile(p) if p else None) for k, p in
                (("configure", self.configure), ("write", self.write), ("read", self.read))}

    def allows(self, access: Access, resource: str) -> bool:
        """Whether ``access`` to the exchange or queue named ``resource`` is granted."""
        pattern = self._compiled[access]
        if pattern is None:
            return False
        return pattern.search(resource or "amq.default") is not None


@dataclass(slots=True)
class UserDB:
    users: dict[str, User]
    permissions: dict[tuple[str, str], Permission]
    vhosts: list[str] = field(default_factory=lambda: ["/"])
    loopback_users: frozenset[str] = frozenset({"guest"})

    @classmethod
    def default(cls) -> UserDB:
        """RabbitMQ's out-of-the-box state: guest/guest with full rights on ``/``."""
        return cls({"guest": User("guest", hash_password("guest"), ("administrator",))},
                   {("guest", "/"): Permission()})

    def authenticate(self, mechanism: str, response: str | bytes, *, from_loopback: bool) -> User:
        """The user a start-ok response logs in as, or AuthError with RabbitMQ's wording."""
        username, password = parse_response(mechanism, response)
        user = self.users.get(username)
        if user is None or not check_password(password, user.password_hash):
            raise AuthError(f"Login was refused using authentication mechanism {mechanism}. "
                            "For details see the broker logfile.",
                            "unknown user" if user is None else "wrong password")
        if username in self.loopback_users and not from_loopback:
            # W2: the default user only from loopback, as RabbitMQ's loopback_users.
            raise AuthError(f"user '{username}' can only connect via localhost", "loopback-only user from a remote address")
        return user

    def authenticate_external(self, username: str, *, from_loopback: bool) -> User:
        """EXTERNAL (SE2): the TLS layer vouched for ``username``; the user must still exist,
        and loopback_users still apply, as RabbitMQ's check_user_login without a password."""
        user = self.users.get(username)
        if user is None:
            raise AuthError("Login was refused using authentication mechanism EXTERNAL. "
                            "For details see the broker logfile.", "unknown user (client certificate)")
        if username in self.loopback_users and not from_loopback:
            raise AuthError(f"user '{username}' can only connect via localhost", "loopback-only user from a remote address")
        return user

    def vhost_permission(self, username: str, vhost: str) -> Permission | None:
        """The user's rights on the vhost, None when the vhost is closed to them or unknown."""
        if vhost not in self.vhosts:
            return None
        return self.permissions.get((username, vhost))
