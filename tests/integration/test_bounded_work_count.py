"""SE5, counted in calls, not seconds: on a running gateway, a SUBSCRIBE of 2,000 filters (and
its UNSUBSCRIBE) makes about twice the calls one of 1,000 does, not four times: n filters
cost O(n) in all, over the whole path (MQTT session, broker session, vhost, exchange, topic
index, audit record, PF4 report)."""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gateway.mqtt import codec as P
from gateway.server import gateway_in_thread
from tests.integration.mqtt_client import RawClient

COUNTED = {"n": 0}


def _count(_frame: object, event: str, _arg: object) -> None:
    if event == "call" or event == "c_call":
        COUNTED["n"] += 1


def _install(_frame: object, _event: str, _arg: object) -> None:
    """The first profile event of each new thread: the gateway's loop thread counts from now
    on, any other thread stops being profiled."""
    sys.setprofile(_count if threading.current_thread().name == "cmq-gateway" else None)


@pytest.fixture(name="gw")
def gw_fixture(tmp_path: Path) -> Iterator[Any]:
    threading.setprofile(_install)
    try:
        with gateway_in_thread(port=0, hosts=("127.0.0.1",), data_dir=str(tmp_path / "data"), mqtt_port=0,
                               mqtt_host="127.0.0.1") as g:
            threading.setprofile(None)  # threads started later (clients, executors) are not counted
            yield g
    finally:
        threading.setprofile(None)


def _calls(work: Any) -> tuple[int, Any]:
    before = COUNTED["n"]
    out = work()
    return COUNTED["n"] - before, out


def test_SE5_twice_the_filters_cost_twice_the_calls(gw: Any) -> None:
    costs = {}
    for n in (1000, 2000):
        c = RawClient(gw.mqtt.port, 5)
        c.connect(f"count-{n}")
        filters = [f"count/{n}/{i}/+" for i in range(n)]

        def subscribe(c: RawClient = c, filters: list[str] = filters) -> Any:
            c.send(P.Subscribe(1, [(f, 1) for f in filters]))
            return c.recv(timeout=120)

        def unsubscribe(c: RawClient = c, filters: list[str] = filters) -> Any:
            c.send(P.Unsubscribe(2, filters))
            return c.recv(timeout=120)

        sub_calls, suback = _calls(subscribe)
        assert isinstance(suback, P.SubAck) and suback.reason_codes == [1] * n
        unsub_calls, unsuback = _calls(unsubscribe)
        assert isinstance(unsuback, P.UnsubAck) and unsuback.reason_codes == [0] * n
        costs[n] = (sub_calls, unsub_calls)
        c.close()
    (sub1, unsub1), (sub2, unsub2) = costs[1000], costs[2000]
    assert sub1 > 1000 and unsub1 > 1000  # the counter saw the gateway's work
    # Linear: twice the filters, about twice the calls (quadratic work would be about 4x, as
    # before SE5's change: 3.4x for SUBSCRIBE and more for UNSUBSCRIBE).
    assert sub2 <= 2.3 * sub1, costs
    assert unsub2 <= 2.3 * unsub1, costs
