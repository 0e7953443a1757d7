"""Pure parts of the operator's window: rates, the audit tee, the exposition, the notify body
(SPEC D7, D9)."""

from __future__ import annotations

import json
from typing import Any

from gateway.metrics import COMMIT_BUCKETS, Counters, RateTracker, _labels
from gateway.push import HttpSubscription, notify_request
from semantics.topic import FilterType, Topic, TopicMessage


class Sink:
    def __init__(self) -> None:
        self.seen: list[tuple[str, str, dict[str, Any]]] = []
        self.closed = False

    def emit(self, event: str, vhost: str, **fields: Any) -> None:
        self.seen.append((event, vhost, fields))

    def close(self) -> None:
        self.closed = True


def test_rates_between_the_oldest_kept_sample_and_the_newest() -> None:
    counts = {"k": 0}
    rt = RateTracker(lambda: dict(counts), window=5.0, clock=lambda: 0.0)
    assert rt.rate("k") == 0.0  # no sample yet
    rt.sample(0.0)
    counts["k"] = 10
    assert rt.rate("k") == 0.0  # one sample: no rate yet
    rt.sample(5.0)
    assert rt.rate("k") == 2.0
    counts["k"] = 40
    rt.sample(10.0)  # the sample at 0 falls out of the window; base is the one at 5
    assert rt.rate("k") == 6.0
    assert rt.rate("missing") == 0.0


def test_tee_counts_and_passes_every_event_on_unchanged() -> None:
    sink = Sink()
    c = Counters(sink)
    c.emit("publish", "/", topic="x", size=3)
    c.emit("route", "/", topic="x", msg_id="m1")
    c.emit("enqueue", "/", queue="q", topic="x")
    c.emit("enqueue", "/", queue="q", topic=None)
    c.emit("deliver", "/", queue="q", attempt=1)
    c.emit("deliver", "/", queue="q", attempt=2)
    c.emit("ack", "/", queue="q")
    c.emit("discard", "v2", reason="no_match")
    c.emit("retry", "/", policy="BACKOFF_RETRY", attempt=2)
    c.close()
    assert [e for e, _, _ in sink.seen] == ["publish", "route", "enqueue", "enqueue", "deliver", "deliver",
                                            "ack", "discard", "retry"]
    assert sink.seen[0] == ("publish", "/", {"topic": "x", "size": 3}) and sink.closed
    assert (c.count("publish"), c.count("deliver", "/"), c.routed["/"], c.redelivered["/"]) == (1, 2, 2, 1)
    assert (c.queue_stat("/", "q", "publish"), c.queue_stat("/", "q", "deliver"),
            c.queue_stat("/", "q", "redeliver"), c.queue_stat("/", "q", "ack")) == (2, 2, 1, 1)
    assert (c.exchange_stat("/", "x", "publish_in"), c.exchange_stat("/", "x", "publish_out")) == (1, 1)
    assert (dict(c.discarded), dict(c.retries)) == ({("v2", "no_match"): 1}, {("/", "BACKOFF_RETRY", 2): 1})


def test_commit_histogram_buckets_are_upper_bounds() -> None:
    c = Counters(Sink())
    for seconds in (0.0005, 0.0006, 0.3, 99.0):
        c.observe_commit(seconds)
    assert c.commit_buckets[0] == 1  # 0.0005 <= 0.0005
    assert c.commit_buckets[1] == 1  # 0.0006 <= 0.001
    assert c.commit_buckets[COMMIT_BUCKETS.index(0.5)] == 1
    assert c.commit_buckets[-1] == 1 and c.commit_count == 4


def test_label_values_are_escaped() -> None:
    assert _labels({"queue": 'a"b\\c\nd'}) == '{queue="a\\"b\\\\c\\nd"}'


def test_D7_notify_body_json_and_simplified() -> None:
    """D7: CMQ's JSON notify body (routing-key topic: bindingKey) and the SIMPLIFIED raw body."""

    class Msg:
        body = "héllo".encode()

    topic = Topic("events", FilterType.ROUTING_KEY)
    tmsg = TopicMessage("msg-00ff", 1_700_000_123.9, (), "a.b", Msg(), 6)
    sub = HttpSubscription("/", "events", "hook", "http://h/x", owner="1250000000")
    body, headers = notify_request(sub, topic, tmsg)
    assert json.loads(body) == {"TopicOwner": "1250000000", "topicName": "events", "subscriptionName": "hook",
                                "msgId": "msg-00ff", "msgBody": "héllo", "publishTime": 1_700_000_123,
                                "bindingKey": "a.b"}
    assert (headers["x-cmq-message-id"], headers["Content-Type"]) == ("msg-00ff", "text/plain")
    simple = HttpSubscription("/", "events", "hook", "http://h/x", content_format="SIMPLIFIED")
    body, headers = notify_request(simple, topic, tmsg)
    assert (body, headers["x-cmq-message-id"]) == ("héllo".encode(), "msg-00ff")
