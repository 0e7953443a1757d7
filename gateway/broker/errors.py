"""The refusals the mapping raises, worded as RabbitMQ words them (SPEC M16).

Channel-level faults are :class:`semantics.errors.CMQError` (the session closes the channel
with ``reply_code`` / ``reply_text``); :class:`ConnectionFault` closes the connection.
"""

from __future__ import annotations

from gateway.broker.arguments import amqp_type
from semantics.errors import (
    ACCESS_REFUSED,
    NOT_FOUND,
    PRECONDITION_FAILED,
    RESOURCE_LOCKED,
    CMQError,
)

__all__ = [
    "COMMAND_INVALID",
    "ConnectionFault",
    "NOT_IMPLEMENTED",
    "NO_ROUTE",
    "access_refused",
    "inequivalent",
    "not_found",
    "precondition",
    "resource_locked",
]

NO_ROUTE = 312
CHANNEL_ERROR = 504
COMMAND_INVALID = 503
NOT_ALLOWED = 530
NOT_IMPLEMENTED = 540


class ConnectionFault(CMQError):
    """A fault RabbitMQ answers with connection.close (503, 504, 530, 540)."""


def _q(name: str) -> str:
    return f"'{name}'"


def not_found(kind: str, name: str, vhost: str) -> CMQError:
    return CMQError("M16", f"no {kind} {_q(name)} in vhost {_q(vhost)}", reply_code=NOT_FOUND, value=name)


def inequivalent(arg: str, kind: str, name: str, vhost: str, received: object, current: object) -> CMQError:
    # RabbitMQ: "inequivalent arg 'type' for exchange 'x' in vhost '/': received 'fanout'
    # but current is 'direct'"; against a missing argument: "received the value '2000' of type
    # 'signedint' but current is none".
    def show(v: object, typed: bool) -> str:
        if v is None:
            return "none"
        text = ("true" if v else "false") if isinstance(v, bool) else v if isinstance(v, str) else str(v)
        return f"the value {_q(text)} of type {_q(amqp_type(v))}" if typed else _q(text)
    typed = received is None or current is None
    return CMQError("M16", f"inequivalent arg {_q(arg)} for {kind} {_q(name)} in vhost {_q(vhost)}: "
                    f"received {show(received, typed)} but current is {show(current, typed)}",
                    reply_code=PRECONDITION_FAILED, value=received)


def access_refused(text: str, rule: str = "M16") -> CMQError:
    return CMQError(rule, text, reply_code=ACCESS_REFUSED)


def resource_locked(name: str, vhost: str) -> CMQError:
    return CMQError("M16", f"cannot obtain exclusive access to locked queue {_q(name)} in vhost "
                    f"{_q(vhost)}. It could be originally declared on another connection or the "
                    "exclusive property value does not match that of the original declaration.",
                    reply_code=RESOURCE_LOCKED, value=name)


def precondition(text: str, rule: str = "M16", value: object = None) -> CMQError:
    return CMQError(rule, text, reply_code=PRECONDITION_FAILED, value=value)
