"""CL4/D2-D6 on JetStream: the retries of an HTTP subscription survive the gateway that
started them; another gateway takes them over once, and an HTTP subscription made through
one gateway is known to the others."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from typing import Any

import pika
import pytest

from gateway.management.testing import LOOPBACK_PUSH
from gateway.server import gateway_in_thread
from tests.support.http_endpoint import EndpointServer
from tests.support.natsd import NatsCluster


class Endpoint:
    """An HTTP endpoint answering 500 until ``healthy`` is set, then 200; counts the pushes."""

    def __init__(self) -> None:
        self.healthy = False
        self.pushes: list[tuple[float, int]] = []
        endpoint = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - the http.server hook
                self.rfile.read(int(self.headers.get("Content-Length", "0")))
                status = 200 if endpoint.healthy else 500
                endpoint.pushes.append((time.monotonic(), status))
                self.send_response(status)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = EndpointServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/notify"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def succeeded(self) -> int:
        return sum(1 for _, status in self.pushes if status == 200)


@pytest.fixture
def endpoint() -> Iterator[Endpoint]:
    e = Endpoint()
    yield e
    e.server.shutdown()


def _in_loop(gw: Any, fn: Any) -> Any:
    async def run() -> Any:
        return fn()
    return asyncio.run_coroutine_threadsafe(run(), gw.broker._loop).result(10)


def test_CL4_D6_retries_of_a_stopped_gateway_are_taken_over_once(core_nats: NatsCluster, endpoint: Endpoint) -> None:
    from gateway.push import HttpPusher

    topic = f"orders-{uuid.uuid4().hex[:6]}"
    opts: dict[str, Any] = {"hosts": ("127.0.0.1",), "store": core_nats.store_url, "push": LOOPBACK_PUSH}
    with gateway_in_thread(0, None, **opts) as b:
        with gateway_in_thread(0, None, **opts) as a:
            conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", a.port))
            ch = conn.channel()
            ch.exchange_declare(topic, "fanout", durable=True)
            _in_loop(a, lambda: HttpPusher.of(a.broker).subscribe("/", topic, "hook", endpoint.url,
                                                                 notify_strategy="EXPONENTIAL_DECAY_RETRY"))
            deadline = time.monotonic() + 10
            while ("/", topic, "hook") not in HttpPusher.of(b.broker).subscriptions:  # D7 on every gateway
                assert time.monotonic() < deadline, "the subscription did not reach the other gateway"
                time.sleep(0.05)
            ch.confirm_delivery()
            ch.basic_publish(topic, "", b"pay", pika.BasicProperties(delivery_mode=2))
            deadline = time.monotonic() + 10
            while not endpoint.pushes:
                assert time.monotonic() < deadline, "no first push"
                time.sleep(0.05)
            conn.close()
        stopped = time.monotonic()  # a is gone with its retry pending (D6: 1 s, 2 s, ...)
        endpoint.healthy = True
        deadline = time.monotonic() + 30
        while not endpoint.succeeded():
            assert time.monotonic() < deadline, f"the retry was not taken over: {endpoint.pushes}"
            time.sleep(0.1)
        assert endpoint.pushes[-1][0] >= stopped
        time.sleep(3.0)  # a second taker would push again now
        assert endpoint.succeeded() == 1, endpoint.pushes
