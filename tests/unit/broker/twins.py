"""What the compiled-twin tests of the broker's loops share (test_deliver_run, test_enqueue_lean)."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from gateway.broker import vhost as vhost_module


@contextmanager
def running(module: Any, name: str, loop: Any) -> Iterator[None]:
    """``module.name`` (the loop the broker calls) replaced by ``loop``, and the vhost's message
    IDs made deterministic (``id-000001`` on): the compiled and the Python run name their
    messages alike, so that their records, frames and states compare equal."""
    counter = itertools.count(1)
    ids: Callable[[], str] = lambda: f"id-{next(counter):06d}"  # noqa: E731
    saved = getattr(module, name), vhost_module.new_msg_id
    setattr(module, name, loop)
    vhost_module.new_msg_id = ids
    try:
        yield
    finally:
        setattr(module, name, saved[0])
        vhost_module.new_msg_id = saved[1]
