"""The CMQ API held to the AMQP core's standard (issue 26 items 8 and Build 2/5; SPEC CA1,
CA3, SE1, SE6), on both stores: replays refused across restarts and across the gateways of a
JetStream cluster, unsigned ``@`` values refused, listings as the caller's permissions allow,
every error a CMQ answer, subscription names as CMQ documents them, and no SendMessage taken
while the memory alarm holds AMQP publishers."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import requests

from gateway.auth import Permission, User, UserDB, hash_password
from gateway.config import CmqKey, Limits
from tests.integration.cmq_client import CmqClient, sign
from tests.integration.cmq_gateway import ADMIN_ID, ADMIN_KEY, STORES, admin, cmq_gateway, store_of

NOBODY_ID, NOBODY_KEY = "AKIDnobody00000000000000000000000000", "nobody-secret-key-0123456789abcdef"
SOME_ID, SOME_KEY = "AKIDsome0000000000000000000000000000", "some-secret-key-0123456789abcdef00"


def _users() -> UserDB:
    """admin; ``nobody`` with a permission entry that grants nothing; ``some`` with rights on
    names starting ``vis-`` only."""
    return UserDB({"admin": User("admin", hash_password("admin"), ("administrator",)),
                   "nobody": User("nobody", hash_password("nobody")),
                   "some": User("some", hash_password("some"))},
                  {("admin", "/"): Permission(), ("nobody", "/"): Permission("^$", "^$", "^$"),
                   ("some", "/"): Permission("^vis-.*", "^vis-.*", "^vis-.*")},
                  ["/"], frozenset())


KEYS = {ADMIN_ID: CmqKey("admin", ADMIN_KEY), NOBODY_ID: CmqKey("nobody", NOBODY_KEY),
        SOME_ID: CmqKey("some", SOME_KEY)}


@pytest.fixture(scope="module", params=STORES)
def endpoint(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with cmq_gateway(str(tmp_path_factory.mktemp("cmq-hardening")), store=store_of(request), users=_users(),
                     cmq_keys=KEYS) as (_gw, url):
        yield url


@pytest.fixture
def cmq(endpoint: str) -> CmqClient:
    return admin(endpoint)


def _portless(client: CmqClient) -> CmqClient:
    """Signs for the host without its port (the gateway accepts both), so that the same
    signed request is valid on another gateway's port: a captured request replayed there."""
    client.host = client.host.rsplit(":", 1)[0]
    return client


# -- SE6 / CA1: replays ----------------------------------------------------------------------


def test_SE6_CA1_nonce_remembered_across_a_restart(tmp_path: Any) -> None:
    """A request taken once is refused as a replay by the same data directory's next gateway."""
    data = str(tmp_path / "data")
    with cmq_gateway(data) as (_gw, url):
        client = _portless(admin(url))
        captured = client.signed("CreateQueue", {"queueName": "replayed-q"})
        assert client.send(captured)["code"] == 0
        client.ok("DeleteQueue", queueName="replayed-q")
    with cmq_gateway(data) as (_gw, url):
        again = admin(url).send(captured)
        assert again["code"] == 4100 and "Nonce" in again["message"], again
        assert admin(url).call("GetQueueAttributes", queueName="replayed-q")["code"] == 4440


def test_SE6_CA1_nonce_shared_by_the_gateways_of_a_cluster(nats_single: Any, tmp_path: Any) -> None:
    """Two gateways on one JetStream: a request taken by one is a replay at the other, and at
    a gateway started afterwards on the same cluster."""
    store = nats_single.store_url
    with cmq_gateway(str(tmp_path / "a"), store=store) as (_a, url_a), \
            cmq_gateway(str(tmp_path / "b"), store=store) as (_b, url_b):
        client = _portless(admin(url_a))
        captured = client.signed("ListQueue", {})
        assert client.send(captured)["code"] == 0
        at_b = admin(url_b).send(captured)
        assert at_b["code"] == 4100 and "Nonce" in at_b["message"], at_b
        fresh = _portless(admin(url_b)).signed("ListQueue", {})
        assert admin(url_b).send(fresh)["code"] == 0  # another nonce: taken
    with cmq_gateway(str(tmp_path / "c"), store=store) as (_c, url_c):
        later = admin(url_c).send(captured)
        assert later["code"] == 4100 and "Nonce" in later["message"], later


# -- CA1: every value signed -----------------------------------------------------------------


def test_CA1_unsigned_at_values_in_a_post_are_refused(cmq: CmqClient, unique: str) -> None:
    """Issue 26: a value starting with ``@``, which the SDKs leave out of the signature, added
    to a signed batch is refused and nothing is sent; signed over every value, such a body is
    taken as it is."""
    cmq.ok("CreateQueue", queueName=unique)
    signed = cmq.signed("BatchSendMessage", {"queueName": unique, "msgBody": ["mine"]})
    tampered = {**signed, "msgBody.2": "@appended"}
    refused = cmq.send(tampered)
    assert refused["code"] == 4000 and "msgBody.2" in refused["message"], refused
    attrs = cmq.ok("GetQueueAttributes", queueName=unique)
    assert attrs["activeMsgNum"] == 0
    cmq.ok("SendMessage", queueName=unique, msgBody="@signed-body")  # this client signs every value
    got = cmq.ok("ReceiveMessage", queueName=unique, pollingWaitSeconds=5)
    assert got["msgBody"] == "@signed-body"


# -- SE1 / CA1: listings as permitted ----------------------------------------------------------


def test_SE1_CA1_listings_show_only_what_the_key_may_use(endpoint: str, cmq: CmqClient, unique: str) -> None:
    """A key whose user has no right on a name neither lists it nor reads its counts (4101),
    as RabbitMQ shows a user only what its permissions reach."""
    hidden, shown = f"hid-{unique}", f"vis-{unique}"
    for name in (hidden, shown):
        cmq.ok("CreateQueue", queueName=name)
        cmq.ok("CreateTopic", topicName=name)
        cmq.ok("SendMessage", queueName=name, msgBody="counted")
    nobody = CmqClient(endpoint, NOBODY_ID, NOBODY_KEY)
    some = CmqClient(endpoint, SOME_ID, SOME_KEY)
    listed = nobody.ok("ListQueue", searchWord=unique)
    assert (listed["totalCount"], listed["queueList"]) == (0, [])
    assert nobody.ok("ListTopic", searchWord=unique)["topicList"] == []
    assert nobody.call("GetQueueAttributes", queueName=shown)["code"] == 4101
    assert nobody.call("GetTopicAttributes", topicName=shown)["code"] == 4101
    assert nobody.call("ListSubscriptionByTopic", topicName=shown)["code"] == 4101
    assert [q["queueName"] for q in some.ok("ListQueue", searchWord=unique)["queueList"]] == [shown]
    assert [t["topicName"] for t in some.ok("ListTopic", searchWord=unique)["topicList"]] == [shown]
    assert some.ok("GetQueueAttributes", queueName=shown)["activeMsgNum"] == 1
    assert some.call("GetQueueAttributes", queueName=hidden)["code"] == 4101
    assert {q["queueName"] for q in cmq.ok("ListQueue", searchWord=unique)["queueList"]} == {hidden, shown}


def test_SE1_CA1_a_key_without_rights_is_refused_every_action_and_changes_nothing(endpoint: str, cmq: CmqClient,
                                                                                 unique: str) -> None:
    """Every queue, topic and subscription action of a key whose user has no right on the
    name (``nobody``: none at all; ``some``: on ``vis-`` names only) is CMQ's 4101, on JetStream
    as on the embedded store, and the queue, topic and subscription are as they were."""
    queue, topic = f"hid-{unique}q", f"hid-{unique}t"
    cmq.ok("CreateQueue", queueName=queue)
    cmq.ok("CreateTopic", topicName=topic)
    cmq.ok("Subscribe", topicName=topic, subscriptionName="s1", protocol="queue", endpoint=queue)
    cmq.ok("SendMessage", queueName=queue, msgBody="held")
    handle = cmq.ok("ReceiveMessage", queueName=queue, pollingWaitSeconds=5)["receiptHandle"]
    sub = {"topicName": topic, "subscriptionName": "s1"}
    actions: list[tuple[str, dict[str, Any]]] = [
        ("CreateQueue", {"queueName": queue + "2"}), ("DeleteQueue", {"queueName": queue}),
        ("GetQueueAttributes", {"queueName": queue}),
        ("SetQueueAttributes", {"queueName": queue, "visibilityTimeout": 5}),
        ("RewindQueue", {"queueName": queue, "startConsumeTime": 1}),
        ("SendMessage", {"queueName": queue, "msgBody": "no"}),
        ("BatchSendMessage", {"queueName": queue, "msgBody": ["no"]}),
        ("ReceiveMessage", {"queueName": queue}), ("BatchReceiveMessage", {"queueName": queue, "numOfMsg": 2}),
        ("DeleteMessage", {"queueName": queue, "receiptHandle": handle}),
        ("BatchDeleteMessage", {"queueName": queue, "receiptHandle": [handle]}),
        ("CreateTopic", {"topicName": topic + "2"}), ("DeleteTopic", {"topicName": topic}),
        ("GetTopicAttributes", {"topicName": topic}), ("SetTopicAttributes", {"topicName": topic, "maxMsgSize": 2048}),
        ("PublishMessage", {"topicName": topic, "msgBody": "no"}),
        ("BatchPublishMessage", {"topicName": topic, "msgBody": ["no"]}),
        ("Subscribe", {**sub, "subscriptionName": "s2", "protocol": "queue", "endpoint": queue}),
        ("Unsubscribe", sub), ("GetSubscriptionAttributes", sub),
        ("SetSubscriptionAttributes", {**sub, "notifyStrategy": "EXPONENTIAL_DECAY_RETRY"}),
        ("ClearSubscriptionFilterTags", sub), ("ListSubscriptionByTopic", {"topicName": topic})]
    for client in (CmqClient(endpoint, NOBODY_ID, NOBODY_KEY), CmqClient(endpoint, SOME_ID, SOME_KEY)):
        refused = {action: client.call(action, **params)["code"] for action, params in actions}
        assert set(refused.values()) == {4101}, (client.secret_id, refused)
    attrs = cmq.ok("GetQueueAttributes", queueName=queue)
    assert (attrs["activeMsgNum"], attrs["inactiveMsgNum"], attrs["visibilityTimeout"]) == (0, 1, 30), attrs
    assert cmq.ok("GetTopicAttributes", topicName=topic)["maxMsgSize"] != 2048
    assert [s["subscriptionName"] for s in cmq.ok("ListSubscriptionByTopic", topicName=topic)["subscriptionList"]] \
        == ["s1"]
    assert cmq.call("GetQueueAttributes", queueName=queue + "2")["code"] == 4440


# -- CA1: every error a CMQ answer -----------------------------------------------------------


def test_CA1_odd_numbers_and_indexes_are_cmq_errors_not_http_500(endpoint: str, cmq: CmqClient,
                                                                 unique: str) -> None:
    """Issue 26: an integer of 5,000 digits (int() refuses past 4,300) and a list index that
    str.isdigit() takes but int() does not (``msgBody.²``) were bare HTTP 500s."""
    cmq.ok("CreateQueue", queueName=unique)
    huge = "9" * 5000
    for action, params in (("ListQueue", {"offset": huge}), ("ListQueue", {"limit": huge}),
                           ("SendMessage", {"queueName": unique, "msgBody": "x", "delaySeconds": huge}),
                           ("ReceiveMessage", {"queueName": unique, "pollingWaitSeconds": huge}),
                           ("SetQueueAttributes", {"queueName": unique, "visibilityTimeout": huge}),
                           ("CreateTopic", {"topicName": unique, "maxMsgSize": huge}),
                           ("RewindQueue", {"queueName": unique, "startConsumeTime": huge})):
        answer = cmq.call(action, **params)  # CmqClient.send checks HTTP 200 and the JSON fields
        assert answer["code"] == 4000 and "out of range" in answer["message"], (action, answer)
    odd = cmq.signed("BatchSendMessage", {"queueName": unique, "msgBody": ["a"]})
    odd["msgBody.²"] = "b"
    odd["Signature"] = sign(ADMIN_KEY, "POST", cmq.host, "/v2/index.php",
                            {k: v for k, v in odd.items() if k != "Signature"})
    resp = requests.post(f"{endpoint}/v2/index.php", data=odd, timeout=30)
    assert resp.status_code == 200 and resp.json()["code"] == 0, resp.text
    assert len(resp.json()["msgList"]) == 1  # ``msgBody.²`` is no index: one message


def test_CA1_a_dead_letter_policy_nested_past_the_recursion_limit_is_a_param_error(cmq: CmqClient,
                                                                                 unique: str) -> None:
    """A ``deadLetterPolicy`` of 10,000 nested lists is JSON Python cannot read (RecursionError),
    which was CMQ's 6000 (an internal error); it is a parameter error (10360) as any other
    policy that is not JSON, on CreateQueue and SetQueueAttributes."""
    for deep in ("[" * 10_000, '{"a":' * 10_000):
        answer = cmq.call("CreateQueue", queueName=unique, deadLetterPolicy=deep)
        assert answer["code"] == 4000 and "(10360)" in answer["message"], answer["message"][:200]
    cmq.ok("CreateQueue", queueName=unique)
    answer = cmq.call("SetQueueAttributes", queueName=unique, deadLetterPolicy="[" * 10_000)
    assert answer["code"] == 4000 and "(10360)" in answer["message"], answer["message"][:200]


# -- CA3: subscription names -------------------------------------------------------------------


def test_CA3_subscription_names_as_cmq_documents_them(cmq: CmqClient, unique: str) -> None:
    """Subscribe's page: at most 64 characters, starting with a letter; ``s1`` (refused 10580
    before) and one letter are names, ``1s`` and 65 characters are not."""
    topic, queue = unique + "t", unique + "q"
    cmq.ok("CreateTopic", topicName=topic)
    longest = "s" + "x" * 63
    for i, name in enumerate(("s1", "a", longest)):
        cmq.ok("CreateQueue", queueName=f"{queue}{i}")
        cmq.ok("Subscribe", topicName=topic, subscriptionName=name, protocol="queue", endpoint=f"{queue}{i}")
        assert cmq.ok("GetSubscriptionAttributes", topicName=topic, subscriptionName=name)["endpoint"] == f"{queue}{i}"
    for name in ("1s", "s" * 65, "s.1", "-s"):
        answer = cmq.call("Subscribe", topicName=topic, subscriptionName=name, protocol="queue", endpoint=f"{queue}0")
        assert answer["code"] == 4000 and "10580" in answer["message"], (name, answer)
    cmq.ok("PublishMessage", topicName=topic, msgBody="to all")
    for i in range(3):
        assert cmq.ok("ReceiveMessage", queueName=f"{queue}{i}", pollingWaitSeconds=10)["msgBody"] == "to all"


# -- SE6: the memory alarm holds the API's publishers too -------------------------------------


@pytest.mark.parametrize("store", STORES)
def test_SE6_send_refused_while_the_memory_alarm_is_raised(request: pytest.FixtureRequest, store: str,
                                                           tmp_path: Any) -> None:
    """With the memory mark below what the gateway holds, SendMessage and PublishMessage are
    answered 4410 (CMQ's "queue full": nothing stored, send later) and nothing is stored;
    receives and management still work."""
    store_url = str(request.getfixturevalue("nats_single").store_url) if store == "jetstream" else None
    with cmq_gateway(str(tmp_path / "data"), store=store_url, limits=Limits(memory_high_watermark=1)) as (_gw, url):
        client = admin(url)
        client.ok("CreateQueue", queueName="alarmq")
        client.ok("CreateTopic", topicName="alarmt")
        client.ok("Subscribe", topicName="alarmt", subscriptionName="s1", protocol="queue", endpoint="alarmq")
        for action, params in (("SendMessage", {"queueName": "alarmq", "msgBody": "x"}),
                               ("BatchSendMessage", {"queueName": "alarmq", "msgBody": ["x", "y"]}),
                               ("PublishMessage", {"topicName": "alarmt", "msgBody": "x"})):
            answer = client.call(action, **params)
            assert answer["code"] == 4410 and "SE6" in answer["message"], (action, answer)
        attrs = client.ok("GetQueueAttributes", queueName="alarmq")
        assert (attrs["activeMsgNum"], attrs["inactiveMsgNum"], attrs["delayMsgNum"]) == (0, 0, 0)
        assert client.call("ReceiveMessage", queueName="alarmq", pollingWaitSeconds=0)["code"] == 7000


def test_CA2_L8_a_send_jetstream_refuses_is_4410_on_every_gateway(nats_single: Any, tmp_path: Any) -> None:
    """L8 across two gateways of one JetStream: gateway B has not seen the two messages A
    sent (its own count of the queue is older), JetStream's max_msgs refuses B's send: B
    answers 4410, not 0 (a 0 would be a message confirmed and never stored)."""
    store = nats_single.store_url
    with cmq_gateway(str(tmp_path / "a"), store=store) as (_a, url_a), \
            cmq_gateway(str(tmp_path / "b"), store=store) as (_b, url_b):
        a, b = admin(url_a), admin(url_b)
        a.ok("CreateQueue", queueName="heap2", maxMsgHeapNum=2)
        assert b.ok("GetQueueAttributes", queueName="heap2")["activeMsgNum"] == 0
        a.ok("BatchSendMessage", queueName="heap2", msgBody=["1", "2"])
        refused = b.call("SendMessage", queueName="heap2", msgBody="3")
        assert refused["code"] == 4410 and "L8" in refused["message"], refused
        assert a.ok("GetQueueAttributes", queueName="heap2")["activeMsgNum"] == 2
        bodies = sorted(m["msgBody"] for m in b.ok("BatchReceiveMessage", queueName="heap2", numOfMsg=16,
                                                   pollingWaitSeconds=5)["msgInfoList"])
        assert bodies in (["1", "2"], ["1"], ["2"])  # what B's pull found by then; never "3"
