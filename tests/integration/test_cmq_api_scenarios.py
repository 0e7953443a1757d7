"""The tag-matching scenarios 1-5 of the seeds (cmq-tag-matching), through CMQ's HTTP API
(SPEC CA3, T1, T2, D1, D2, D6, D7, D8, D9)."""

from __future__ import annotations

from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from typing import Any

import pytest

from tests.integration.cmq_client import CmqClient
from tests.integration.cmq_gateway import STORES, admin, cmq_gateway, drain, eventually, store_of
from tests.support.http_endpoint import serve_endpoint

TAGS = ["apple", "imac", "iphone", "macbook"]  # the producer's message filter tags


@pytest.fixture(scope="module", params=STORES)
def cmq(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[CmqClient]:
    with cmq_gateway(str(tmp_path_factory.mktemp("cmq-scenarios")), store=store_of(request)) as (_gw, url):
        yield admin(url)


def _publish(cmq: CmqClient, topic: str, bodies: list[str], tags: list[str]) -> None:
    for i in range(0, len(bodies), 16):
        cmq.ok("BatchPublishMessage", topicName=topic, msgBody=bodies[i:i + 16], msgTag=tags)


def _subscribers(cmq: CmqClient, topic: str, unique: str, tags: dict[str, list[str]]) -> dict[str, str]:
    queues = {}
    for name, filters in tags.items():
        queue = cmq.ok("CreateQueue", queueName=f"{unique}{name}") and f"{unique}{name}"
        cmq.ok("Subscribe", topicName=topic, subscriptionName=f"sub-{name}", protocol="queue", endpoint=queue,
               filterTag=filters)
        queues[name] = queue
    return queues


def _received(cmq: CmqClient, queues: dict[str, str]) -> dict[str, int]:
    return {name: len(drain(cmq, queue)) for name, queue in queues.items()}


def test_T1_scenario_1_tags_match_n_to_m(cmq: CmqClient, unique: str) -> None:
    """A apple, B xiaomi, C imac+xiaomi, D none; 100 messages tagged apple, imac, iphone,
    macbook: A, C and D receive the 100, B none."""
    topic = unique + "t"
    cmq.ok("CreateTopic", topicName=topic)
    queues = _subscribers(cmq, topic, unique, {"A": ["apple"], "B": ["xiaomi"], "C": ["imac", "xiaomi"], "D": []})
    _publish(cmq, topic, [f"m{i}" for i in range(100)], TAGS)
    assert _received(cmq, queues) == {"A": 100, "B": 0, "C": 100, "D": 100}


def test_T1_scenario_2_no_subscriber_tags(cmq: CmqClient, unique: str) -> None:
    topic = unique + "t"
    cmq.ok("CreateTopic", topicName=topic)
    queues = _subscribers(cmq, topic, unique, {n: [] for n in "ABCD"})
    _publish(cmq, topic, [f"m{i}" for i in range(100)], TAGS)
    assert _received(cmq, queues) == dict.fromkeys("ABCD", 100)


def test_T2_scenario_3_no_match_is_discarded_at_once(cmq: CmqClient, unique: str) -> None:
    """A xiaomi only: the 100 messages match nothing, are discarded and never retained."""
    topic = unique + "t"
    cmq.ok("CreateTopic", topicName=topic)
    queues = _subscribers(cmq, topic, unique, {"A": ["xiaomi"]})
    _publish(cmq, topic, [f"m{i}" for i in range(100)], TAGS)
    assert cmq.ok("GetTopicAttributes", topicName=topic)["msgCount"] == 0
    assert _received(cmq, queues) == {"A": 0}


class _Failing(BaseHTTPRequestHandler):
    """Subscriber A's HTTP endpoint: fails every message whose body index is >= 100."""

    ok: list[str] = []

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"])).decode()
        good = int(body[1:]) < 100
        if good:
            type(self).ok.append(body)
        self.send_response(200 if good else 500)
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def failing_endpoint() -> Iterator[tuple[str, type[_Failing]]]:
    handler = type("Handler", (_Failing,), {"ok": []})
    with serve_endpoint(handler) as base:
        yield f"{base}/a", handler


def test_D2_D8_scenario_4_retention_blocking_and_republish(cmq: CmqClient, unique: str,
                                                          failing_endpoint: tuple[str, Any]) -> None:
    """200 messages to A (HTTP, fails from the 101st), B (a queue full after 170) and C:
    the 100 messages some subscriber still owes are retained (D2); C has all 200. A republish
    of 100 more: C receives only the new ones, A and B keep theirs (D8)."""
    url, handler = failing_endpoint
    topic = unique + "t"
    cmq.ok("CreateTopic", topicName=topic)
    cmq.ok("Subscribe", topicName=topic, subscriptionName="sub-A", protocol="http", endpoint=url,
           notifyContentFormat="SIMPLIFIED")
    cmq.ok("CreateQueue", queueName=unique + "B", maxMsgHeapNum=170)
    cmq.ok("Subscribe", topicName=topic, subscriptionName="sub-B", protocol="queue", endpoint=unique + "B")
    cmq.ok("CreateQueue", queueName=unique + "C")
    cmq.ok("Subscribe", topicName=topic, subscriptionName="sub-C", protocol="queue", endpoint=unique + "C")
    _publish(cmq, topic, [f"m{i}" for i in range(200)], [])
    assert eventually(lambda: len(handler.ok) == 100)
    assert eventually(lambda: cmq.ok("GetTopicAttributes", topicName=topic)["msgCount"] == 100)
    waiting = {s: cmq.ok("GetSubscriptionAttributes", topicName=topic, subscriptionName=f"sub-{s}")["msgCount"]
               for s in "ABC"}
    assert waiting == {"A": 100, "B": 30, "C": 0}  # D9
    c_first = sorted(int(m["msgBody"][1:]) for m in drain(cmq, unique + "C"))
    assert c_first == list(range(200))
    _publish(cmq, topic, [f"m{i}" for i in range(200, 300)], [])
    assert eventually(lambda: cmq.ok("GetTopicAttributes", topicName=topic)["msgCount"] == 200)
    c_second = sorted(int(m["msgBody"][1:]) for m in drain(cmq, unique + "C"))
    assert c_second == list(range(200, 300))  # only the new ones
    assert len(handler.ok) == 100


def test_D2_scenario_5_all_succeed_nothing_retained(cmq: CmqClient, unique: str) -> None:
    topic = unique + "t"
    cmq.ok("CreateTopic", topicName=topic)
    queues = _subscribers(cmq, topic, unique, {n: [] for n in "ABC"})
    _publish(cmq, topic, [f"m{i}" for i in range(200)], [])
    assert cmq.ok("GetTopicAttributes", topicName=topic)["msgCount"] == 0
    assert _received(cmq, queues) == dict.fromkeys("ABC", 200)
