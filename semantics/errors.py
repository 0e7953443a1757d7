"""Typed refusals of the CMQ model.

Every refusal carries the SPEC rule it enforces, the offending value and the AMQP reply code
the gateway closes the channel (or connection) with (SPEC M16). The gateway prefixes the
reply-code name (``PRECONDITION_FAILED - ``); ``str(error)`` is the rest of the reply text.
"""

from __future__ import annotations

__all__ = [
    "ACCESS_REFUSED",
    "CMQError",
    "LimitError",
    "NOT_FOUND",
    "PRECONDITION_FAILED",
    "RESOURCE_LOCKED",
    "REPLY_NAMES",
]

_SHORTSTR_MAX = 255  # bytes in an AMQP short string, such as a reply text

# AMQP 0-9-1 reply codes that the semantics layer can ask for (channel-level faults).
NOT_FOUND = 404
RESOURCE_LOCKED = 405
PRECONDITION_FAILED = 406
ACCESS_REFUSED = 403

REPLY_NAMES = {
    312: "NO_ROUTE",
    320: "CONNECTION_FORCED",
    403: "ACCESS_REFUSED",
    404: "NOT_FOUND",
    405: "RESOURCE_LOCKED",
    406: "PRECONDITION_FAILED",
    501: "FRAME_ERROR",
    502: "SYNTAX_ERROR",
    503: "COMMAND_INVALID",
    504: "CHANNEL_ERROR",
    505: "UNEXPECTED_FRAME",
    506: "RESOURCE_ERROR",
    530: "NOT_ALLOWED",
    540: "NOT_IMPLEMENTED",
    541: "INTERNAL_ERROR",
}


class CMQError(Exception):
    """A refusal by the CMQ model. ``rule`` is the SPEC ID (e.g. ``"L5"``)."""

    def __init__(self, rule: str, text: str, *, reply_code: int = PRECONDITION_FAILED, value: object = None) -> None:
        super().__init__(text)
        self.rule = rule
        self.text = text
        self.reply_code = reply_code
        self.value = value

    @property
    def reply_text(self) -> str:
        """The AMQP reply text, as RabbitMQ formats it: ``NAME - detail``, cut to the 255
        bytes a short string holds (a refusal may quote a 255-byte name or key), keeping the
        rule at its end."""
        text = f"{REPLY_NAMES.get(self.reply_code, 'ERROR')} - {self.text}"
        raw = text.encode("utf-8")
        if len(raw) <= _SHORTSTR_MAX:
            return text
        tail = f"... (CMQ limit {self.rule})" if self.text.endswith(f"(CMQ limit {self.rule})") else "..."
        keep = _SHORTSTR_MAX - len(tail.encode("utf-8"))
        return raw[:keep].decode("utf-8", "ignore") + tail


class LimitError(CMQError):
    """A CMQ limit (SPEC "Names and limits") was broken; nothing stored was changed."""

    def __init__(self, rule: str, text: str, *, value: object = None, limit: object = None,
                 reply_code: int = PRECONDITION_FAILED) -> None:
        super().__init__(rule, f"{text} (CMQ limit {rule})", reply_code=reply_code, value=value)
        self.limit = limit
