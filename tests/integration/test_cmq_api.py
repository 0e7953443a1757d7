"""CMQ's HTTP API over real HTTP against a real gateway (SPEC CA1-CA3, Q1-Q8, T1-T5, SE3).

The client (tests/integration/cmq_client.py) is written from CMQ's public API pages, signing
included; every action is driven through it.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from typing import Any

import pytest
import requests

from tests.integration.cmq_client import CmqClient
from tests.integration.cmq_gateway import (
    STORES,
    WAIT,
    admin,
    cmq_gateway,
    drain,
    eventually,
    reader,
    store_of,
)
from tests.support.http_endpoint import serve_endpoint


@pytest.fixture(scope="module", params=STORES)
def endpoint(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A gateway in the cmq profile (PF2), every CMQ limit refused, as a CMQ application
    expects; test_CA2_PF4_compatible_profile_reports shows the default profile. On each store."""
    with cmq_gateway(str(tmp_path_factory.mktemp("cmq-api-data")), profile="cmq",
                     store=store_of(request)) as (_gw, url):
        yield url


@pytest.fixture
def cmq(endpoint: str) -> CmqClient:
    return admin(endpoint)


def _queue(cmq: CmqClient, unique: str, **attrs: Any) -> str:
    cmq.ok("CreateQueue", queueName=unique, **attrs)
    return unique


# -- CA1: requests, signatures, errors -------------------------------------------------------


def test_CA1_get_post_sha1_sha256(endpoint: str, unique: str) -> None:
    """CA1: GET and POST, HmacSHA1 and HmacSHA256 are all accepted."""
    for method in ("GET", "POST"):
        for sig in ("HmacSHA1", "HmacSHA256"):
            client = admin(endpoint, method=method, sign_method=sig)
            answer = client.ok("ListQueue")
            assert answer["message"] == "" and answer["requestId"]
            assert isinstance(answer["totalCount"], int)


def test_CA1_bad_signature_unknown_key_old_timestamp_replayed_nonce(endpoint: str, cmq: CmqClient) -> None:
    """CA1: each refused with 4100 (CMQ's authentication failure) and its reason."""
    params = cmq.signed("ListQueue", {})
    params["Signature"] = params["Signature"][:-4] + "AAA="
    answer = cmq.send(params)
    assert answer["code"] == 4100 and "signature" in answer["message"]
    stranger = CmqClient(endpoint, "AKIDnobody", "whatever")
    answer = stranger.call("ListQueue")
    assert answer["code"] == 4100 and "secretId" in answer["message"]
    old = cmq.signed("ListQueue", {}, timestamp=int(time.time()) - 3600)
    answer = cmq.send(old)
    assert answer["code"] == 4100 and "Timestamp" in answer["message"]
    once = cmq.signed("ListQueue", {})
    assert cmq.send(once)["code"] == 0
    answer = cmq.send(once)  # the same request again: a replay
    assert answer["code"] == 4100 and "Nonce" in answer["message"]
    wrong_key = CmqClient(endpoint, cmq.secret_id, "not-the-key")
    assert wrong_key.call("ListQueue")["code"] == 4100


def test_CA1_missing_parameters_unknown_action_method_repeats(endpoint: str, cmq: CmqClient) -> None:
    url = f"{endpoint}/v2/index.php"
    answer = requests.post(url, data={"Action": "ListQueue"}, timeout=WAIT).json()
    assert answer["code"] == 4000 and "SecretId" in answer["message"]
    assert requests.post(url, data={}, timeout=WAIT).json()["code"] == 4000
    answer = cmq.call("ShredQueue")
    assert answer == {"code": 4000, "message": "(10430)action name ShredQueue is not existed",
                      "requestId": answer["requestId"]}
    answer = requests.put(url, data={"Action": "ListQueue"}, timeout=WAIT).json()
    assert answer["code"] == 4000 and "(10410)" in answer["message"]
    answer = requests.post(url, data=[("Action", "ListQueue"), ("Action", "ListTopic")], timeout=WAIT).json()
    assert answer["code"] == 4000 and "(10330)" in answer["message"]
    assert cmq.call("GetQueueAttributes")["code"] == 4000  # queueName missing: (10390)


def test_CA1_permissions_of_the_keys_user(endpoint: str, cmq: CmqClient, unique: str) -> None:
    """CA1: a key carries its user's vhost permissions (reader: read only)."""
    queue = _queue(cmq, unique)
    cmq.ok("SendMessage", queueName=queue, msgBody="for the reader")
    other = reader(endpoint)
    assert other.call("CreateQueue", queueName=unique + "x")["code"] == 4101
    assert other.call("SendMessage", queueName=queue, msgBody="no")["code"] == 4101
    got = other.ok("ReceiveMessage", queueName=queue)
    assert got["msgBody"] == "for the reader"
    other.ok("DeleteMessage", queueName=queue, receiptHandle=got["receiptHandle"])
    elsewhere = reader(endpoint, vhost="no-such-vhost")
    assert elsewhere.call("ListQueue")["code"] == 4101


# -- CA2: queues -----------------------------------------------------------------------------


def test_CA2_queue_lifecycle(cmq: CmqClient, unique: str) -> None:
    created = cmq.ok("CreateQueue", queueName=unique, visibilityTimeout=60, maxMsgSize=2048,
                     msgRetentionSeconds=3600, pollingWaitSeconds=2, rewindSeconds=600)
    assert created["queueId"].startswith("queue-")
    assert cmq.call("CreateQueue", queueName=unique)["code"] == 4460
    assert cmq.call("CreateQueue", queueName="1starts-with-a-digit")["code"] == 4000
    listed = cmq.ok("ListQueue", searchWord=unique)
    assert listed["totalCount"] == 1 and listed["queueList"] == [{"queueId": created["queueId"], "queueName": unique}]
    attrs = cmq.ok("GetQueueAttributes", queueName=unique)
    assert (attrs["visibilityTimeout"], attrs["maxMsgSize"], attrs["msgRetentionSeconds"],
            attrs["pollingWaitSeconds"], attrs["rewindSeconds"]) == (60, 2048, 3600, 2, 600)
    assert (attrs["activeMsgNum"], attrs["inactiveMsgNum"]) == (0, 0)
    assert attrs["createTime"] <= attrs["lastModifyTime"]
    changed = cmq.ok("SetQueueAttributes", queueName=unique, visibilityTimeout=5, pollingWaitSeconds=0)
    assert (changed["visibilityTimeout"], changed["pollingWaitSeconds"], changed["maxMsgSize"]) == (5, 0, 2048)
    assert cmq.ok("GetQueueAttributes", queueName=unique)["visibilityTimeout"] == 5
    out_of_range = cmq.call("SetQueueAttributes", queueName=unique, visibilityTimeout=50000)
    assert out_of_range["code"] == 4000 and "L8" in out_of_range["message"]
    assert cmq.ok("GetQueueAttributes", queueName=unique)["visibilityTimeout"] == 5  # nothing changed
    cmq.ok("DeleteQueue", queueName=unique)
    assert cmq.call("GetQueueAttributes", queueName=unique)["code"] == 4440
    assert cmq.call("SendMessage", queueName=unique, msgBody="x")["code"] == 4440


def test_CA2_Q7_send_receive_delete(cmq: CmqClient, unique: str) -> None:
    """CA2, Q1, Q3, Q7: the receive answer carries CMQ's fields; a delete removes it."""
    queue = _queue(cmq, unique)
    sent = cmq.ok("SendMessage", queueName=queue, msgBody="hello 世界 & =")
    assert sent["msgId"].startswith("msg-")
    got = cmq.ok("ReceiveMessage", queueName=queue, pollingWaitSeconds=0)
    assert got["msgId"] == sent["msgId"] and got["msgBody"] == "hello 世界 & ="
    assert got["dequeueCount"] == 1
    assert got["enqueueTime"] <= got["firstDequeueTime"] < got["nextVisibleTime"]
    attrs = cmq.ok("GetQueueAttributes", queueName=queue)
    assert (attrs["activeMsgNum"], attrs["inactiveMsgNum"]) == (0, 1)
    assert attrs["minMsgTime"] == int(got["enqueueTime"])  # the received one still counts
    cmq.ok("DeleteMessage", queueName=queue, receiptHandle=got["receiptHandle"])
    assert cmq.ok("GetQueueAttributes", queueName=queue)["minMsgTime"] == 0
    empty = cmq.call("ReceiveMessage", queueName=queue, pollingWaitSeconds=0)
    assert (empty["code"], empty["message"]) == (7000, "(10200)no message")


def test_CA2_Q3_stale_receipt_handle_deletes_nothing(cmq: CmqClient, unique: str) -> None:
    """Q2, Q3: after the visibility timeout another receive gets a new handle; the old one
    deletes nothing and is answered 4430 invalid receiptHandle; the new one deletes."""
    queue = _queue(cmq, unique, visibilityTimeout=1)
    cmq.ok("SendMessage", queueName=queue, msgBody="twice")
    first = cmq.ok("ReceiveMessage", queueName=queue, pollingWaitSeconds=0)
    assert cmq.call("ReceiveMessage", queueName=queue, pollingWaitSeconds=0)["code"] == 7000  # Q2: Inactive
    second = cmq.ok("ReceiveMessage", queueName=queue, pollingWaitSeconds=5)  # Active again after 1 s
    assert second["msgId"] == first["msgId"] and second["dequeueCount"] == 2
    assert second["receiptHandle"] != first["receiptHandle"]
    stale = cmq.call("DeleteMessage", queueName=queue, receiptHandle=first["receiptHandle"])
    assert (stale["code"], stale["message"]) == (4430, "invalid receiptHandle")
    assert cmq.ok("GetQueueAttributes", queueName=queue)["inactiveMsgNum"] == 1  # still there
    assert cmq.call("DeleteMessage", queueName=queue, receiptHandle="garbage")["code"] == 4430
    cmq.ok("DeleteMessage", queueName=queue, receiptHandle=second["receiptHandle"])
    attrs = cmq.ok("GetQueueAttributes", queueName=queue)
    assert (attrs["activeMsgNum"], attrs["inactiveMsgNum"]) == (0, 0)


def test_CA2_batches_at_most_16(cmq: CmqClient, unique: str) -> None:
    queue = _queue(cmq, unique)
    too_many = cmq.call("BatchSendMessage", queueName=queue, msgBody=[f"m{i}" for i in range(17)])
    assert too_many["code"] == 4000 and "(10370)" in too_many["message"]
    sent = cmq.ok("BatchSendMessage", queueName=queue, msgBody=[f"m{i}" for i in range(16)])
    assert len({m["msgId"] for m in sent["msgList"]}) == 16
    assert cmq.call("BatchReceiveMessage", queueName=queue, numOfMsg=17)["code"] == 4000
    got = cmq.ok("BatchReceiveMessage", queueName=queue, numOfMsg=16)["msgInfoList"]
    assert sorted(m["msgBody"] for m in got) == sorted(f"m{i}" for i in range(16))
    assert {m["msgId"] for m in got} == {m["msgId"] for m in sent["msgList"]}
    handles = [m["receiptHandle"] for m in got]
    too_many = cmq.call("BatchDeleteMessage", queueName=queue, receiptHandle=handles + ["x"])
    assert too_many["code"] == 4000
    cmq.ok("BatchDeleteMessage", queueName=queue, receiptHandle=handles[:8])
    partial = cmq.call("BatchDeleteMessage", queueName=queue, receiptHandle=handles[7:9])
    assert (partial["code"], partial["message"]) == (6010, "delete message partially failed")
    assert partial["errorList"] == [{"code": 4430, "message": "invalid receiptHandle", "receiptHandle": handles[7]}]
    failed = cmq.call("BatchDeleteMessage", queueName=queue, receiptHandle=handles[:2])
    assert failed["code"] == 6020 and len(failed["errorList"]) == 2
    cmq.ok("BatchDeleteMessage", queueName=queue, receiptHandle=handles[9:])
    assert cmq.ok("GetQueueAttributes", queueName=queue)["inactiveMsgNum"] == 0


def test_CA2_Q5_long_polling_returns_when_a_message_arrives(endpoint: str, cmq: CmqClient, unique: str) -> None:
    queue = _queue(cmq, unique)
    box: dict[str, Any] = {}
    poller = threading.Thread(target=lambda: box.update(
        answer=admin(endpoint).call("ReceiveMessage", queueName=queue, pollingWaitSeconds=30)))
    poller.start()
    time.sleep(0.3)  # the poll is waiting (not a threshold: the answer below proves the order)
    sent = cmq.ok("SendMessage", queueName=queue, msgBody="arrived")
    poller.join(WAIT + 30)
    assert box["answer"]["code"] == 0 and box["answer"]["msgId"] == sent["msgId"]
    assert cmq.call("ReceiveMessage", queueName=queue, pollingWaitSeconds=1)["code"] == 7000
    assert cmq.call("ReceiveMessage", queueName=queue, pollingWaitSeconds=31)["code"] == 4000  # L8: 0-30


def test_CA2_Q5_queue_polling_wait_is_the_default(endpoint: str, cmq: CmqClient, unique: str) -> None:
    queue = _queue(cmq, unique, pollingWaitSeconds=30)
    box: dict[str, Any] = {}
    poller = threading.Thread(target=lambda: box.update(answer=admin(endpoint).call("ReceiveMessage", queueName=queue)))
    poller.start()
    time.sleep(0.3)
    cmq.ok("SendMessage", queueName=queue, msgBody="queue default wait")
    poller.join(WAIT + 30)
    assert box["answer"]["msgBody"] == "queue default wait"


def test_CA2_Q4_delay_seconds(cmq: CmqClient, unique: str) -> None:
    queue = _queue(cmq, unique)
    cmq.ok("SendMessage", queueName=queue, msgBody="later", delaySeconds=1)
    assert cmq.call("ReceiveMessage", queueName=queue, pollingWaitSeconds=0)["code"] == 7000
    assert cmq.ok("GetQueueAttributes", queueName=queue)["delayMsgNum"] == 1
    assert cmq.ok("ReceiveMessage", queueName=queue, pollingWaitSeconds=10)["msgBody"] == "later"
    assert cmq.call("SendMessage", queueName=queue, msgBody="x", delaySeconds=3601)["code"] == 4000


def test_CA2_Q6_rewind(cmq: CmqClient, unique: str) -> None:
    queue = _queue(cmq, unique, rewindSeconds=3600)
    start = int(time.time()) - 1
    sent = [cmq.ok("SendMessage", queueName=queue, msgBody=f"r{i}")["msgId"] for i in range(3)]
    assert [m["msgId"] for m in drain(cmq, queue)] == sent
    assert cmq.ok("GetQueueAttributes", queueName=queue)["rewindMsgNum"] == 3
    cmq.ok("RewindQueue", queueName=queue, startConsumeTime=start)
    assert [m["msgId"] for m in drain(cmq, queue)] == sent  # Q6: again, in production order
    too_old = cmq.call("RewindQueue", queueName=queue, startConsumeTime=start - 7200)
    assert too_old["code"] == 4000 and "Q6" in too_old["message"]
    plain = _queue(cmq, unique + "p")
    assert cmq.call("RewindQueue", queueName=plain, startConsumeTime=start)["code"] == 4000


def test_CA2_Q8_dead_letter_policy(cmq: CmqClient, unique: str) -> None:
    dlq = _queue(cmq, unique + "dlq")
    policy = json.dumps({"deadLetterQueue": dlq, "policy": 0, "maxReceiveCount": 1})
    queue = _queue(cmq, unique, visibilityTimeout=1, deadLetterPolicy=policy)
    attrs = cmq.ok("GetQueueAttributes", queueName=queue)
    assert attrs["deadLetterPolicy"] == {"deadLetterQueue": dlq, "policy": 0, "maxReceiveCount": 1}
    sent = cmq.ok("SendMessage", queueName=queue, msgBody="poison")
    cmq.ok("ReceiveMessage", queueName=queue)  # received once, never deleted
    moved = cmq.ok("ReceiveMessage", queueName=dlq, pollingWaitSeconds=20)
    assert moved["msgBody"] == "poison"
    assert cmq.call("ReceiveMessage", queueName=queue, pollingWaitSeconds=0)["code"] == 7000
    assert sent["msgId"]
    missing = json.dumps({"deadLetterQueue": unique + "nope", "policy": 0, "maxReceiveCount": 1})
    assert cmq.call("SetQueueAttributes", queueName=queue, deadLetterPolicy=missing)["code"] == 4440
    cmq.ok("SetQueueAttributes", queueName=queue, deadLetterPolicy="{}")
    assert cmq.ok("GetQueueAttributes", queueName=queue)["deadLetterPolicy"] is None


def test_CA2_message_size_and_heap_limits(cmq: CmqClient, unique: str) -> None:
    """L6 and L8 through SendMessage: 4400 too large, 4410 the queue holds maxMsgHeapNum."""
    full = _queue(cmq, unique + "f", maxMsgHeapNum=2)
    cmq.ok("BatchSendMessage", queueName=full, msgBody=["1", "2"])
    refused = cmq.call("SendMessage", queueName=full, msgBody="3")
    assert refused["code"] == 4410 and "L8" in refused["message"]
    queue = _queue(cmq, unique, maxMsgSize=1024)
    too_big = cmq.call("SendMessage", queueName=queue, msgBody="x" * 1025)
    assert too_big["code"] == 4400 and "L6" in too_big["message"]
    cmq.ok("SendMessage", queueName=queue, msgBody="x" * 1024)


# -- CA3: topics and subscriptions -----------------------------------------------------------


def test_CA3_topic_lifecycle(cmq: CmqClient, unique: str) -> None:
    tags, keys = unique + "t", unique + "k"
    assert cmq.ok("CreateTopic", topicName=tags)["topicId"].startswith("topic-")
    cmq.ok("CreateTopic", topicName=keys, filterType=2, maxMsgSize=4096)
    assert cmq.call("CreateTopic", topicName=tags)["code"] == 4460
    assert cmq.call("CreateTopic", topicName="a.b")["code"] == 4000
    assert cmq.call("CreateTopic", topicName=unique + "z", filterType=3)["code"] == 4000
    listed = cmq.ok("ListTopic", searchWord=unique)
    assert listed["totalCount"] == 2 and {t["topicName"] for t in listed["topicList"]} == {tags, keys}
    a = cmq.ok("GetTopicAttributes", topicName=tags)
    assert (a["filterType"], a["maxMsgSize"], a["msgRetentionSeconds"], a["msgCount"]) == (1, 65536, 86400, 0)
    assert cmq.ok("GetTopicAttributes", topicName=keys)["filterType"] == 2
    cmq.ok("SetTopicAttributes", topicName=tags, maxMsgSize=2048)
    assert cmq.ok("GetTopicAttributes", topicName=tags)["maxMsgSize"] == 2048
    assert cmq.call("SetTopicAttributes", topicName=tags, maxMsgSize=10)["code"] == 4000
    too_big = cmq.call("PublishMessage", topicName=tags, msgBody="x" * 2049)
    assert too_big["code"] == 4400 and "L6" in too_big["message"]
    cmq.ok("DeleteTopic", topicName=tags)
    assert cmq.call("GetTopicAttributes", topicName=tags)["code"] == 4440
    assert cmq.call("PublishMessage", topicName=tags, msgBody="x")["code"] == 4440


def test_CA3_queue_subscription_lifecycle(cmq: CmqClient, unique: str) -> None:
    topic, queue = unique + "t", _queue(cmq, unique + "q")
    cmq.ok("CreateTopic", topicName=topic)
    sub = cmq.ok("Subscribe", topicName=topic, subscriptionName="sub-a", protocol="queue", endpoint=queue,
                 filterTag=["apple"], notifyStrategy="BACKOFF_RETRY")
    assert sub["subscriptionId"].startswith("subscription-")
    again = cmq.call("Subscribe", topicName=topic, subscriptionName="sub-a", protocol="queue", endpoint=queue)
    assert again["code"] == 4490
    same_pair = cmq.call("Subscribe", topicName=topic, subscriptionName="sub-b", protocol="queue", endpoint=queue)
    assert same_pair["code"] == 4490 and "M8" in same_pair["message"]
    assert cmq.call("Subscribe", topicName=topic, subscriptionName="sub-c", protocol="queue",
                    endpoint=queue + "nope")["code"] == 4440
    assert cmq.call("Subscribe", topicName=topic, subscriptionName="sub-c", protocol="queue", endpoint=queue,
                    notifyContentFormat="JSON")["code"] == 4000
    assert cmq.call("Subscribe", topicName=topic, subscriptionName="sub-c", protocol="carrier-pigeon",
                    endpoint=queue)["code"] == 4000
    listed = cmq.ok("ListSubscriptionByTopic", topicName=topic)
    assert listed["totalCount"] == 1
    assert listed["subscriptionList"] == [{"subscriptionId": sub["subscriptionId"], "subscriptionName": "sub-a",
                                           "protocol": "queue", "endpoint": queue}]
    a = cmq.ok("GetSubscriptionAttributes", topicName=topic, subscriptionName="sub-a")
    assert (a["protocol"], a["endpoint"], a["notifyStrategy"], a["notifyContentFormat"], a["filterTag"]) == \
        ("queue", queue, "BACKOFF_RETRY", "SIMPLIFIED", ["apple"])
    cmq.ok("PublishMessage", topicName=topic, msgBody="pear", msgTag=["pear"])
    cmq.ok("PublishMessage", topicName=topic, msgBody="apple", msgTag=["fruit", "apple"])
    assert [m["msgBody"] for m in drain(cmq, queue)] == ["apple"]
    cmq.ok("SetSubscriptionAttributes", topicName=topic, subscriptionName="sub-a",
           notifyStrategy="EXPONENTIAL_DECAY_RETRY", filterTag=["pear", "plum"])
    a = cmq.ok("GetSubscriptionAttributes", topicName=topic, subscriptionName="sub-a")
    assert (a["notifyStrategy"], sorted(a["filterTag"])) == ("EXPONENTIAL_DECAY_RETRY", ["pear", "plum"])
    cmq.ok("BatchPublishMessage", topicName=topic, msgBody=["p1", "p2"], msgTag=["plum"])
    cmq.ok("PublishMessage", topicName=topic, msgBody="apple again", msgTag=["apple"])
    assert sorted(m["msgBody"] for m in drain(cmq, queue)) == ["p1", "p2"]
    cmq.ok("ClearSubscriptionFilterTags", topicName=topic, subscriptionName="sub-a")
    assert cmq.ok("GetSubscriptionAttributes", topicName=topic, subscriptionName="sub-a")["filterTag"] == []
    cmq.ok("PublishMessage", topicName=topic, msgBody="untagged")
    assert [m["msgBody"] for m in drain(cmq, queue)] == ["untagged"]  # T1: no tags take all
    cmq.ok("Unsubscribe", topicName=topic, subscriptionName="sub-a")
    assert cmq.ok("ListSubscriptionByTopic", topicName=topic)["totalCount"] == 0
    assert cmq.call("GetSubscriptionAttributes", topicName=topic, subscriptionName="sub-a")["code"] == 4440
    cmq.ok("PublishMessage", topicName=topic, msgBody="nobody", msgTag=["apple"])
    assert drain(cmq, queue) == []


def test_CA3_T4_routing_key_topic(cmq: CmqClient, unique: str) -> None:
    """CA3, T4: filterType 2 with binding keys ``1.*.0`` and ``1.#.0``."""
    topic = unique + "t"
    star, hash_ = _queue(cmq, unique + "s"), _queue(cmq, unique + "h")
    cmq.ok("CreateTopic", topicName=topic, filterType=2)
    assert cmq.call("Subscribe", topicName=topic, subscriptionName="no-keys", protocol="queue",
                    endpoint=star)["code"] == 4000  # (10710) lack of bindingKey
    cmq.ok("Subscribe", topicName=topic, subscriptionName="star", protocol="queue", endpoint=star,
           bindingKey=["1.*.0"])
    cmq.ok("Subscribe", topicName=topic, subscriptionName="hash", protocol="queue", endpoint=hash_,
           bindingKey=["1.#.0"])
    for key in ("1.x.0", "1.2.3.4.4.2.2.0", "1.0", "2.x.0"):
        cmq.ok("PublishMessage", topicName=topic, msgBody=key, routingKey=key)
    assert [m["msgBody"] for m in drain(cmq, star)] == ["1.x.0"]
    assert [m["msgBody"] for m in drain(cmq, hash_)] == ["1.x.0", "1.2.3.4.4.2.2.0", "1.0"]
    a = cmq.ok("GetSubscriptionAttributes", topicName=topic, subscriptionName="star")
    assert a["bindingKey"] == ["1.*.0"]


class _Endpoint(BaseHTTPRequestHandler):
    status = 200
    received: list[dict[str, Any]] = []

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        type(self).received.append({"body": body, "headers": dict(self.headers)})
        self.send_response(type(self).status)
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def http_endpoint() -> Iterator[tuple[str, type[_Endpoint]]]:
    handler = type("Handler", (_Endpoint,), {"received": [], "status": 200})
    with serve_endpoint(handler) as base:
        yield f"{base}/cmq", handler


def test_CA3_D7_http_subscription(cmq: CmqClient, unique: str, http_endpoint: tuple[str, Any]) -> None:
    url, handler = http_endpoint
    topic = unique + "t"
    cmq.ok("CreateTopic", topicName=topic)
    cmq.ok("Subscribe", topicName=topic, subscriptionName="hook", protocol="http", endpoint=url,
           filterTag=["a"], notifyContentFormat="JSON")
    a = cmq.ok("GetSubscriptionAttributes", topicName=topic, subscriptionName="hook")
    assert (a["protocol"], a["endpoint"], a["notifyContentFormat"], a["filterTag"]) == ("http", url, "JSON", ["a"])
    sent = cmq.ok("PublishMessage", topicName=topic, msgBody="pushed", msgTag=["a"])
    assert eventually(lambda: handler.received)
    notice = json.loads(handler.received[0]["body"])
    assert (notice["msgId"], notice["msgBody"], notice["topicName"], notice["subscriptionName"]) == \
        (sent["msgId"], "pushed", topic, "hook")
    cmq.ok("SetSubscriptionAttributes", topicName=topic, subscriptionName="hook", notifyContentFormat="SIMPLIFIED")
    cmq.ok("PublishMessage", topicName=topic, msgBody="raw", msgTag=["a"])
    assert eventually(lambda: len(handler.received) == 2)
    assert handler.received[1]["body"] == b"raw"
    cmq.ok("Unsubscribe", topicName=topic, subscriptionName="hook")
    assert cmq.ok("ListSubscriptionByTopic", topicName=topic)["totalCount"] == 0


def test_CA3_SE3_http_endpoint_must_be_allowed(cmq: CmqClient, unique: str) -> None:
    """SE3: an endpoint the push policy does not allow (here a private address) is refused."""
    topic = unique + "t"
    cmq.ok("CreateTopic", topicName=topic)
    refused = cmq.call("Subscribe", topicName=topic, subscriptionName="inside", protocol="http",
                       endpoint="http://10.1.2.3/hook")
    assert refused["code"] == 4000 and "(10630)" in refused["message"]
    wrong = cmq.call("Subscribe", topicName=topic, subscriptionName="inside", protocol="http",
                     endpoint="ftp://example.com/")
    assert wrong["code"] == 4000
    assert cmq.ok("ListSubscriptionByTopic", topicName=topic)["totalCount"] == 0
