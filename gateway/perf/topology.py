"""The exchanges, queues and bindings of each load pattern, and how messages are routed.

Patterns (the same wire traffic against any broker unless noted):

- `queue`: the default exchange straight to N queues (CMQ SendMessage); 1 delivery per message.
- `fanout`: one fanout exchange bound to N queues; N deliveries per message.
- `direct`: the tag pattern as RabbitMQ can express it. CMQ tags are N:M (a message carries up
  to 5 tags, a subscription up to 5); RabbitMQ's direct exchange matches one routing key
  against binding keys. The fair equivalent with the same fan-out: N queues in groups of K that
  share one binding key `tagG`; a message's routing key is one group's key, so it reaches
  exactly K of the N queues through N bindings, like a CMQ message with K tags reaching K of N
  single-tag subscriptions. It runs unchanged on the gateway (binding key = subscription tag,
  routing key = the message's tag, M2).
- `tags`: the CMQ-native form, for the gateway only: N queues each bound with its own tag
  `tagI`; a message carries K tags, one as routing key and K-1 in the `x-cmq-tags` header (M2),
  so it reaches the K queues of one group. On RabbitMQ it would reach only 1 queue.
- `topic`: a topic exchange, N queues in groups of K (K <= 5); queue j of group G binds one of
  `gG.*.*`, `gG.#`, `gG.a.*`, `gG.*.b`, `gG.#.b` (so both `*` and `#` are exercised), and a
  message with key `gG.a.b` matches all K of them: K deliveries per message.

Names are valid CMQ names (L1) so that the gateway's strict_names mode accepts them.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from pamqp import commands

from gateway.perf.client import AmqpClient

__all__ = ["PATTERNS", "Route", "Topology", "build_topology", "declare", "delete"]

PATTERNS = ("queue", "fanout", "direct", "tags", "topic")
_TOPIC_KEYS = ("g{g}.*.*", "g{g}.#", "g{g}.a.*", "g{g}.*.b", "g{g}.#.b")


@dataclass(frozen=True, slots=True)
class Route:
    exchange: str
    routing_key: str
    headers: dict[str, Any] | None = None


@dataclass(frozen=True)
class Topology:
    pattern: str
    exchange: str
    exchange_type: str | None
    queues: list[str]
    bindings: list[tuple[str, str]]  # (queue, binding key)
    routes: list[Route]
    deliveries_per_message: int
    durable: bool
    extra: dict[str, Any] = field(default_factory=dict)


def build_topology(pattern: str, run_id: str, queues: int, fanout_k: int, durable: bool) -> Topology:
    if pattern not in PATTERNS:
        raise ValueError(f"unknown pattern {pattern!r}; one of {', '.join(PATTERNS)}")
    if queues < 1:
        raise ValueError("--queues must be at least 1")
    names = [f"perf-{run_id}-q{i}" for i in range(queues)]
    if pattern == "queue":
        routes = [Route("", q) for q in names]
        return Topology(pattern, "", None, names, [], routes, 1, durable)
    exchange = f"perf-{run_id}-{pattern}"
    if pattern == "fanout":
        return Topology(
            pattern,
            exchange,
            "fanout",
            names,
            [(q, "") for q in names],
            [Route(exchange, "")],
            queues,
            durable,
        )
    if not 1 <= fanout_k <= 5 or queues % fanout_k:
        raise ValueError("--tag-fanout must be 1..5 (CMQ L3) and divide --queues")
    groups = queues // fanout_k
    if pattern == "direct":
        bindings = [(q, f"tag{i // fanout_k}") for i, q in enumerate(names)]
        routes = [Route(exchange, f"tag{g}") for g in range(groups)]
        return Topology(pattern, exchange, "direct", names, bindings, routes, fanout_k, durable)
    if pattern == "tags":
        bindings = [(q, f"tag{i}") for i, q in enumerate(names)]
        routes = [
            Route(
                exchange,
                f"tag{g * fanout_k}",
                {"x-cmq-tags": [f"tag{g * fanout_k + j}" for j in range(1, fanout_k)]}
                if fanout_k > 1
                else None,
            )
            for g in range(groups)
        ]
        return Topology(pattern, exchange, "direct", names, bindings, routes, fanout_k, durable)
    bindings = [(q, _TOPIC_KEYS[i % fanout_k].format(g=i // fanout_k)) for i, q in enumerate(names)]
    routes = [Route(exchange, f"g{g}.a.b") for g in range(groups)]
    return Topology(pattern, exchange, "topic", names, bindings, routes, fanout_k, durable)


async def declare(client: AmqpClient, topo: Topology, channel: int = 1) -> None:
    """Declare everything, pipelined: replies come back in order, so many RPCs can be in
    flight on one channel."""
    if topo.exchange_type is not None:
        await client.rpc(
            channel,
            commands.Exchange.Declare(
                exchange=topo.exchange, exchange_type=topo.exchange_type, durable=topo.durable
            ),
            commands.Exchange.DeclareOk,
        )
    await asyncio.gather(
        *(
            client.rpc(
                channel, commands.Queue.Declare(queue=q, durable=topo.durable), commands.Queue.DeclareOk
            )
            for q in topo.queues
        )
    )
    await asyncio.gather(
        *(
            client.rpc(
                channel,
                commands.Queue.Bind(queue=q, exchange=topo.exchange, routing_key=key),
                commands.Queue.BindOk,
            )
            for q, key in topo.bindings
        )
    )


async def delete(client: AmqpClient, topo: Topology, channel: int = 1) -> None:
    await asyncio.gather(
        *(client.rpc(channel, commands.Queue.Delete(queue=q), commands.Queue.DeleteOk) for q in topo.queues)
    )
    if topo.exchange_type is not None:
        await client.rpc(
            channel, commands.Exchange.Delete(exchange=topo.exchange), commands.Exchange.DeleteOk
        )
