"""What the broker uses of a store: the seam between the broker and where its state lives.

Two implementations: the embedded :class:`semantics.store.Store` (a journal and snapshots on
one disk; the default) and ``gateway.jetstream.store.JetStreamStore`` (a NATS JetStream key-value
bucket, so that several gateways share one state: docs/CLUSTER.md). The broker is typed
against this Protocol only, so that neither implementation needs the other; the embedded
store satisfies it as it is, with no wrapper between the broker and its calls.

The contract the broker relies on (M14): ``put``/``delete`` change what ``get``/``items``
answer at once and return a log sequence number; ``durable_lsn`` is the highest LSN at or
below which every change is durable wherever the store keeps it (fsynced; for JetStream,
acknowledged by the stream's replicas); ``sync()`` makes everything put so far durable, or
raises ``StoreFailedError`` keeping it pending for a later ``sync()``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Protocol, runtime_checkable

__all__ = ["StoreBackend"]


@runtime_checkable
class StoreBackend(Protocol):
    """See the module docstring."""

    recovery: Any  # what opening it found (semantics.store.RecoveryReport or alike)
    @property
    def checkpoint_token(self) -> bytes | None:
        """Names the checkpoint this open will close with, for a store that reopens from one
        (the embedded journal: its recovery cache is keyed to it, and a put of an unchanged
        record during recovery would make it stale); None for one without (JetStream)."""
        ...

    def put(self, key: str, value: bytes) -> int: ...

    def delete(self, key: str) -> int: ...

    def get(self, key: str) -> bytes | None: ...

    def __contains__(self, key: str) -> bool: ...

    def __len__(self) -> int: ...

    def items(self, prefix: str = "") -> Iterator[tuple[str, bytes]]: ...

    def keys(self, prefix: str = "") -> list[str]: ...

    def heads(self, prefix: str, size: int) -> Iterator[tuple[str, bytes, int]]:
        """``(key, the first size bytes of its value, its length)``: recovery reads only the
        heads of message records, so the embedded store copies no body at start-up."""
        ...

    @property
    def durable_lsn(self) -> int: ...

    @property
    def live_bytes(self) -> int: ...

    @property
    def failed(self) -> BaseException | None: ...

    def sync(self) -> int: ...

    def maybe_compact(self, *, force: bool = False) -> bool: ...

    def close(self, *, sync: bool = True) -> None: ...
