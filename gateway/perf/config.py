"""The settings of one load run (what the `perf run` options fill in)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

__all__ = ["RunConfig"]


@dataclass(frozen=True)
class RunConfig:
    uri: str = "amqp://guest:guest@127.0.0.1:5672/"
    producers: int = 1
    consumers: int = 1
    size: int = 16
    persistent: bool = False
    durable: bool | None = None  # None: durable queues exactly when messages are persistent
    confirm: int = 0  # publisher-confirm window (unconfirmed messages in flight); 0 = off
    # Per producer, msg/s: a load a broker sustains, so a plain run measures latency rather
    # than queueing (unlimited, the default used to give a 1.6 s p50); 0 = as fast as possible.
    rate: float = 1000.0
    duration: float = 10.0
    pattern: str = "queue"
    queues: int = 1
    tag_fanout: int = 5  # direct/tags/topic: deliveries per message
    prefetch: int = 1000
    multi_ack: int = 1  # ack every N deliveries with multiple=true; 0 = no-ack consume
    producer_processes: int = 0  # 0: one per producer, at most the CPU count
    consumer_processes: int = 0
    drain_timeout: float = 10.0
    # Fairness (scenario 8): one more consumer, on a queue of its own with a backlog, prefetch 1,
    # acking each delivery this many ms after it arrived; 0 = none.
    slow_ack_ms: float = 0.0
    # The producers' kernel send buffer, bytes; 0 = the system's (up to tcp_wmem's maximum, 4 MiB
    # on Linux): what a flood holds in the kernel while the broker reads no faster, counted as
    # sent. A small one measures how far behind the broker's deliveries are, not the kernel's.
    sndbuf: int = 0
    json: bool = False
    progress: bool = True

    @property
    def durable_queues(self) -> bool:
        return self.persistent if self.durable is None else self.durable

    def public(self) -> dict[str, Any]:
        """The settings for the JSON result, password removed from the URI."""
        from gateway.perf.client import parse_uri

        d = asdict(self)
        shown = []
        for uri in self.uri.split(","):
            a = parse_uri(uri)
            shown.append(f"amqp://{a.user}@{a.host}:{a.port}/{a.vhost if a.vhost != '/' else ''}")
        d["uri"] = ",".join(shown)
        d["durable"] = self.durable_queues
        del d["json"], d["progress"]
        return d
