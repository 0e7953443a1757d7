"""Decode connection.start-ok responses of the PLAIN and AMQPLAIN mechanisms (SPEC W2), and
which mechanisms connection.start offers (EXTERNAL, SE2).

The transport authenticates; these only take the response bytes apart.
"""

from __future__ import annotations

import struct

from gateway.protocol.fieldtable import decode_table

__all__ = ["EXTERNAL", "MECHANISMS", "decode_amqplain", "decode_plain", "decode_response", "offered"]

MECHANISMS = "PLAIN AMQPLAIN"
# RabbitMQ's rabbitmq_auth_mechanism_ssl: the user is named by the client's TLS certificate and
# the start-ok response is ignored.
EXTERNAL = "EXTERNAL"


def offered(external: bool) -> str:
    """connection.start's mechanisms: EXTERNAL only where a verified certificate names a user
    (RabbitMQ's should_offer), first, as its documentation configures it."""
    return f"{EXTERNAL} {MECHANISMS}" if external else MECHANISMS


def decode_plain(response: bytes) -> tuple[str, str]:
    """RFC 4616: ``[authzid] NUL authcid NUL passwd`` -> (user, password)."""
    parts = response.split(b"\x00")
    if len(parts) != 3:
        raise ValueError("PLAIN response is not authzid NUL user NUL password")
    return parts[1].decode("utf-8"), parts[2].decode("utf-8")


def decode_amqplain(response: bytes) -> tuple[str, str]:
    """AMQPLAIN: a field table without its length prefix, holding LOGIN and PASSWORD."""
    table, _ = decode_table(struct.pack(">I", len(response)) + response)
    login, password = table.get("LOGIN"), table.get("PASSWORD")
    if not isinstance(login, str | bytes) or not isinstance(password, str | bytes):
        raise ValueError("AMQPLAIN response lacks LOGIN or PASSWORD")
    if isinstance(login, bytes):
        login = login.decode("utf-8")
    if isinstance(password, bytes):
        password = password.decode("utf-8")
    return login, password


def decode_response(mechanism: str, response: bytes) -> tuple[str, str]:
    """(user, password) for PLAIN or AMQPLAIN; ValueError for anything else or malformed."""
    if mechanism == "PLAIN":
        return decode_plain(response)
    if mechanism == "AMQPLAIN":
        return decode_amqplain(response)
    raise ValueError(f"unsupported mechanism {mechanism!r}")
