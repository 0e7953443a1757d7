"""The seven comparison scenarios of `cmq-gateway perf compare` (see the README's table).

1. transient 16 B, 1 producer, 1 consumer, default exchange, no confirms
2. persistent 1 KB, confirm window 256, durable queue
3. fanout to 50 queues
4. a direct (tag) exchange with 500 bindings, each message reaching 5 of them. RabbitMQ has no
   N:M tags, so the fair equivalent is 500 queues in groups of 5 sharing one binding key; the
   gateway runs the same traffic (binding key = subscription tag, M2), or with `--tags-b` its
   native form: 500 single-tag subscriptions and messages carrying 5 tags (routing key +
   `x-cmq-tags`). Same bindings, same fan-out, same deliveries. See gateway.perf.topology.
5. a topic exchange with 500 `*`/`#` bindings, each message matching 5 of them
6. a backlog of N 1 KB persistent messages: broker memory per retained message, and the time a
   restart takes to recover them (gateway.perf.backlog)
7. latency at a fixed 1,000 msg/s: p50 and p99
8. fairness: scenario 1's flood, and beside it a consumer of another queue with prefetch 1 that
   acks each delivery 10 ms after it arrived. Alone it would take ~90 messages a second; how
   many it gets while the flood runs shows whether the flood starves it (issue 15). Its
   turnaround (ack written -> next delivery read) is where the broker made it wait.

Scenarios 1-5 publish as fast as the broker takes (its flow control decides), so their
latencies are queueing time; scenario 7 is the latency measurement.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from gateway.perf.config import RunConfig

__all__ = ["SCENARIOS", "TITLES", "scenario_config"]

TITLES: dict[int, str] = {
    1: "transient 16 B, 1 producer, 1 consumer, default exchange",
    2: "persistent 1 KB, confirms (window 256), durable queue",
    3: "fanout to 50 queues",
    4: "direct (tag) exchange, 500 bindings, each message to 5",
    5: "topic exchange, 500 */# bindings, each message to 5",
    6: "backlog of 1 KB persistent messages: memory and restart",
    7: "latency at a fixed 1,000 msg/s",
    8: "fairness: a prefetch-1 consumer acking after 10 ms beside scenario 1's flood",
}

# Multi-queue scenarios use two consumer connections (two worker processes) so that the
# deliveries, 5 or 50 per message, are not capped by one generator process.
SCENARIOS: dict[int, Callable[[RunConfig, bool], RunConfig]] = {
    1: lambda base, tags: replace(base, size=16, pattern="queue", queues=1),
    2: lambda base, tags: replace(base, size=1024, persistent=True, confirm=256, pattern="queue", queues=1),
    3: lambda base, tags: replace(base, size=16, pattern="fanout", queues=50, consumers=2),
    4: lambda base, tags: replace(
        base, size=16, pattern="tags" if tags else "direct", queues=500, tag_fanout=5, consumers=2
    ),
    5: lambda base, tags: replace(base, size=16, pattern="topic", queues=500, tag_fanout=5, consumers=2),
    6: lambda base, tags: replace(base, size=1024, persistent=True, confirm=1024, consumers=0),
    7: lambda base, tags: replace(base, size=16, pattern="queue", queues=1, rate=1000.0),
    8: lambda base, tags: replace(base, size=16, pattern="queue", queues=1, slow_ack_ms=10.0),
}


def scenario_config(number: int, uri: str, duration: float, native_tags: bool = False) -> RunConfig:
    # Scenarios 1-6 measure throughput: unlimited, whatever a plain run's default rate is.
    base = RunConfig(uri=uri, duration=duration, rate=0.0, progress=True)
    return SCENARIOS[number](base, native_tags)
