"""A gateway with its management API and metrics on free ports, for tests and demos.

    async with operator_gateway(clock=ManualClock()) as og:
        og.gateway.port, og.management_url, og.metrics_url, og.pusher

Everything runs in the calling event loop (the broker's), bound to 127.0.0.1 port 0: never
5672, 15672 or 15692.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from gateway.management.app import start_management
from gateway.metrics import start_metrics
from gateway.push import HttpPusher
from gateway.push_policy import PushPolicy

__all__ = ["LOOPBACK_PUSH", "OperatorGateway", "operator_gateway"]

# SE3 refuses loopback endpoints; tests that push to a local HTTP server allow them explicitly.
LOOPBACK_PUSH = PushPolicy(allow=("http://127.0.0.1:*",), allow_addresses=("127.0.0.0/8",))


@dataclass
class OperatorGateway:
    gateway: Any
    management_url: str
    metrics_url: str
    pusher: HttpPusher

    @property
    def broker(self) -> Any:
        return self.gateway.broker

    @property
    def amqp_url(self) -> str:
        return f"amqp://guest:guest@127.0.0.1:{self.gateway.port}/%2F"


@contextlib.asynccontextmanager
async def operator_gateway(data_dir: str | None = None, *, clock: Any = None,
                           push_timeout: float = 15.0, **overrides: Any) -> AsyncIterator[OperatorGateway]:
    from gateway.server import running_gateway

    async with running_gateway(0, data_dir, hosts=("127.0.0.1",), clock=clock, **overrides) as gw:
        pusher = HttpPusher(gw.broker, timeout=push_timeout)
        mgmt = await start_management(gw, "127.0.0.1", 0, pusher=pusher)
        metrics = await start_metrics(gw, "127.0.0.1", 0)
        try:
            yield OperatorGateway(gw, f"http://127.0.0.1:{_port(mgmt)}", f"http://127.0.0.1:{_port(metrics)}",
                                  pusher)
        finally:
            await mgmt.cleanup()
            await metrics.cleanup()


def _port(runner: Any) -> int:
    return int(runner.addresses[0][1])
