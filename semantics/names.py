"""CMQ topic and queue names (SPEC L1) and their mapping from AMQP names (SPEC L2).

A CMQ name is 3-64 bytes of ``[A-Za-z0-9_-]``, case-sensitive; a queue name also starts with
a letter (L1). AMQP names are up to 255 bytes of anything (``amq.gen-...``, ``orders.eu``,
``celery@host``) and are kept exactly as the client gave them; each one maps to a valid CMQ
name that is a pure function of the AMQP name (L2):

* a name that is already valid maps to itself;
* otherwise every byte outside the alphabet becomes ``_``, a queue name that does not start
  with a letter gets a ``q`` in front, the result is cut to leave room for a suffix, and
  ``-`` plus 8 hex digits of the SHA-256 of the original name are appended. The suffix keeps
  two AMQP names that sanitize alike (``a.b`` and ``a:b``) apart.

With ``strict=True`` a name that is not already valid is refused with 406 naming L2.
"""

from __future__ import annotations

import hashlib
import re
from typing import Literal

from semantics.errors import LimitError
from semantics.limits import AMQP_NAME_MAX_BYTES, NAME_MAX_BYTES, NAME_MIN_BYTES

__all__ = [
    "Kind",
    "cmq_name",
    "is_valid_name",
    "validate_amqp_name",
    "validate_queue_name",
    "validate_topic_name",
]

Kind = Literal["topic", "queue"]

# fullmatch on ASCII patterns: a non-ASCII character never matches, so the character count
# equals the byte count whenever the pattern matches.
_TOPIC_RE = re.compile(rf"[A-Za-z0-9_-]{{{NAME_MIN_BYTES},{NAME_MAX_BYTES}}}")
_QUEUE_RE = re.compile(rf"[A-Za-z][A-Za-z0-9_-]{{{NAME_MIN_BYTES - 1},{NAME_MAX_BYTES - 1}}}")
_BAD_BYTES_RE = re.compile(rb"[^A-Za-z0-9_-]")
_SUFFIX_HEX = 8
_SUFFIX_LEN = 1 + _SUFFIX_HEX  # "-" + hex digits


def is_valid_name(name: str, kind: Kind = "topic") -> bool:
    """True when ``name`` is a valid CMQ name of that kind (L1)."""
    return (_QUEUE_RE if kind == "queue" else _TOPIC_RE).fullmatch(name) is not None


def _validate(name: str, kind: Kind) -> str:
    if is_valid_name(name, kind):
        return name
    size = len(name.encode("utf-8"))
    if not NAME_MIN_BYTES <= size <= NAME_MAX_BYTES:
        why = f"is {size} bytes, not {NAME_MIN_BYTES}-{NAME_MAX_BYTES}"
    elif _BAD_BYTES_RE.search(name.encode("utf-8")):
        why = "holds characters outside [A-Za-z0-9_-]"
    else:
        why = "must start with a letter"
    raise LimitError("L1", f"{kind} name {name!r} {why}", value=name, limit=(NAME_MIN_BYTES, NAME_MAX_BYTES))


def validate_topic_name(name: str) -> str:
    """Return ``name`` if it is a valid CMQ topic name, else raise LimitError L1."""
    return _validate(name, "topic")


def validate_queue_name(name: str) -> str:
    """Return ``name`` if it is a valid CMQ queue name (starts with a letter), else LimitError L1."""
    return _validate(name, "queue")


def validate_amqp_name(name: str) -> bytes:
    """L2: an AMQP short string holds at most 255 bytes; return its UTF-8 bytes."""
    raw = name.encode("utf-8")
    if len(raw) > AMQP_NAME_MAX_BYTES:
        raise LimitError("L2", f"name of {len(raw)} bytes is longer than {AMQP_NAME_MAX_BYTES} bytes",
                         value=len(raw), limit=AMQP_NAME_MAX_BYTES)
    return raw


def cmq_name(amqp_name: str, kind: Kind = "topic", *, strict: bool = False) -> str:
    """The deterministic, valid CMQ name of an AMQP exchange (``topic``) or queue name (L2).

    ``strict``: refuse (406, rule L2) any name that is not already a valid CMQ name.
    """
    raw = validate_amqp_name(amqp_name)
    if is_valid_name(amqp_name, kind):
        return amqp_name
    if strict:
        raise LimitError("L2", f"{kind} name {amqp_name!r} is not a valid CMQ name (3-64 bytes of "
                         "[A-Za-z0-9_-]" + (", starting with a letter" if kind == "queue" else "")
                         + "), so CMQ could not hold it", value=len(raw), limit=NAME_MAX_BYTES)
    body = _BAD_BYTES_RE.sub(b"_", raw).decode("ascii")
    if kind == "queue" and not body[:1].isalpha():
        body = "q" + body
    digest = hashlib.sha256(raw).hexdigest()[:_SUFFIX_HEX]
    return f"{body[: NAME_MAX_BYTES - _SUFFIX_LEN]}-{digest}"
