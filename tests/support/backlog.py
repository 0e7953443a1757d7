"""The durable backlog the restart and folding tests publish: a direct exchange ``dx`` bound
to the durable queue ``backlog`` by keys ``a`` and ``b`` (every fourth message by ``b``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pika


def publish_backlog(ch: Any, first: int, n: int, body: Callable[[int], bytes],
                    props: Callable[[int], pika.BasicProperties]) -> None:
    """Messages ``first`` .. ``first + n - 1`` on channel ``ch``, each confirmed."""
    ch.confirm_delivery()
    ch.exchange_declare("dx", "direct", durable=True)
    ch.queue_declare("backlog", durable=True)
    for key in ("a", "b"):
        ch.queue_bind("backlog", "dx", key)
    for i in range(first, first + n):
        ch.basic_publish("dx", "a" if i % 4 else "b", body(i), props(i))
