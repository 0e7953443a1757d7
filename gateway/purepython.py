"""The one switch of the optional C modules (gateway/protocol/_frames.c, gateway/audit/_format.c,
gateway/broker/_queue.c, gateway/jetstream/_wire.c): ``CMQ_GATEWAY_PURE_PYTHON=1`` makes the
gateway run their Python twins even where they were built, so that the reference paths can be
run and measured on the same install."""

from __future__ import annotations

import os

__all__ = ["pure_python"]


def pure_python() -> bool:
    """Whether the Python twins must be used (``CMQ_GATEWAY_PURE_PYTHON`` set, and not to 0)."""
    return os.environ.get("CMQ_GATEWAY_PURE_PYTHON", "") not in ("", "0")
