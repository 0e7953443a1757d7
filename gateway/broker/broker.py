"""The broker: vhosts (M1), the store, one scheduler and the group-commit flusher (M14)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from semantics.clock import Clock, SystemClock

__all__ = ["Broker", "BrokerConfig"]


@dataclass
class BrokerConfig:
    """What the broker reads from the gateway configuration (any object with these attributes
    works; missing ones take these defaults)."""

    vhosts: list[str] = field(default_factory=lambda: ["/"])
    strict_names: bool = False
    fsync: bool = True


class Broker:
    """All vhosts of one gateway process.

    Open with ``await Broker.open(data_dir, clock=..., audit=..., config=...)``; ``data_dir``
    None keeps everything in memory. Durable exchanges, queues, bindings and persistent
    messages in durable queues are journaled in the store and recovered on open.
    """

    def __init__(self, data_dir: str | None, *, clock: Clock, audit: Any, config: Any) -> None:
        self.data_dir = data_dir
        self.clock = clock
        self.audit = audit
        self.config = config

    @classmethod
    async def open(cls, data_dir: str | None, *, clock: Clock | None = None, audit: Any = None,
                   config: Any = None) -> Broker:
        """Open the store under ``data_dir``, recover durable state and start the flusher."""
        return cls(data_dir, clock=clock or SystemClock(), audit=audit, config=config)

    def advance_time(self, seconds: float) -> None:
        """Tests: move a ManualClock forward and run everything that fell due."""
        raise NotImplementedError

    def run_due(self) -> None:
        """Run every queue tick and topic retry whose deadline has passed."""
        raise NotImplementedError

    async def close(self) -> None:
        """Flush the store, stop the timers and the flusher."""
