"""Message IDs and receipt handles (SPEC Q3).

A message ID is ``msg-`` followed by lowercase hex digits: a 48-bit random prefix drawn once
per process, then a 64-bit counter. That is unique within a process by construction and,
across restarts, unless two runs draw the same prefix (one chance in 2**48), at the cost of
one counter step and one f-string per message.

A receipt handle is an int from another counter: every receive draws a new one, so an older
handle of the same message never equals the latest (Q3: only the latest deletes). Its wire
form, ``<msg_id>.<hex>``, is for reply texts and the management API.
"""

from __future__ import annotations

import itertools
import re
import secrets
from collections.abc import Callable, Iterator

__all__ = ["MSG_ID_PREFIX", "format_handle", "process_prefix", "is_msg_id", "new_handle", "new_msg_id", "parse_handle"]

MSG_ID_PREFIX = "msg-"

_PROCESS_PREFIX = secrets.token_hex(6)
_handle_counter = itertools.count(1)
_MSG_ID_RE = re.compile(r"msg-[0-9a-f]+\Z")


def process_prefix() -> str:
    """The hex digits after ``msg-`` that every ID this process makes starts with."""
    return _PROCESS_PREFIX


# The counter's last three hex digits come from a table and the other thirteen change once
# every 4,096 IDs: two concatenations instead of formatting a 64-bit number in hex on every
# publish (270 -> ~100 ns an ID).
_LOW = tuple(f"{n:03x}" for n in range(4096))


def _ids() -> Iterator[str]:
    for high in itertools.count():
        head = f"{MSG_ID_PREFIX}{_PROCESS_PREFIX}{high:013x}"
        for low in _LOW:
            yield head + low


_next_id = _ids().__next__
_next_id()  # the counter starts at 1, as it always has

# A fresh ``msg-<hex>`` ID (Q3): the process's prefix and a 16-hex-digit counter. The
# generator's own __next__, not a function around it: one frame less on every publish.
new_msg_id: Callable[[], str] = _next_id




def is_msg_id(text: str) -> bool:
    """True for a text of the form ``msg-`` + lowercase hex digits."""
    return _MSG_ID_RE.match(text) is not None


def new_handle() -> int:
    """A fresh receipt handle number; never repeats within a process."""
    return next(_handle_counter)


def format_handle(msg_id: str, handle: int) -> str:
    """The wire form of a receipt handle: ``<msg_id>.<handle hex>``."""
    return f"{msg_id}.{handle:x}"


def parse_handle(text: str) -> tuple[str, int]:
    """Inverse of :func:`format_handle`; ValueError when ``text`` is not a handle."""
    msg_id, sep, number = text.rpartition(".")
    if not sep or not is_msg_id(msg_id):
        raise ValueError(f"not a receipt handle: {text!r}")
    return msg_id, int(number, 16)
