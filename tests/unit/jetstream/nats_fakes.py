"""What Handlers (gateway.jetstream.wire) needs of a nats-py connection and subscription, for
tests that feed it reads by hand: a parser awaiting a control line, and nothing else used."""

from __future__ import annotations

from typing import Any


class _Parser:
    state = 0  # AWAITING_CONTROL_LINE
    buf = b""

    async def parse(self, data: bytes) -> None:
        raise AssertionError("not used")

    def reset(self) -> None:
        pass


class Nc:
    def __init__(self) -> None:
        self._ps = _Parser()

    async def _process_msg(self, *args: Any) -> None:
        raise AssertionError("not used")


class Sub:
    def __init__(self, sid: int) -> None:
        self._id = sid
