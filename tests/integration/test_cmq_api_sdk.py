"""Tencent's own CMQ SDK for Python 3 (PyPI ``qcloud-cmq-sdk-py3``, module ``cmq``), used
unchanged against the gateway (SPEC CA1-CA3): its signing, its parameter names, its reading
of our answers."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from cmq.account import Account
from cmq.cmq_exception import CMQServerException
from cmq.queue import Message, QueueMeta
from cmq.subscription import SubscriptionMeta
from cmq.topic import Message as TopicMessage
from cmq.topic import TopicMeta

from tests.integration.cmq_gateway import ADMIN_ID, ADMIN_KEY, STORES, cmq_gateway, store_of


@pytest.fixture(scope="module", params=STORES)
def endpoint(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with cmq_gateway(str(tmp_path_factory.mktemp("cmq-sdk")), store=store_of(request)) as (_gw, url):
        yield url


@pytest.fixture(autouse=True)
def _sdk_log_elsewhere(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The SDK opens CMQ_python_sdk.log in the working directory: a temporary one, not the repo."""
    monkeypatch.chdir(tmp_path)


def _account(endpoint: str) -> Account:
    account = Account(endpoint, ADMIN_ID, ADMIN_KEY)
    account.close_log()
    return account


def test_CA2_sdk_queue_actions(endpoint: str, unique: str) -> None:
    account = _account(endpoint)
    queue = account.get_queue(unique)
    meta = QueueMeta()
    meta.visibilityTimeout = 10
    queue.create(meta)
    sent = queue.send_message(Message("hello sdk"))
    got = queue.receive_message(polling_wait_seconds=5)
    assert (got.msgBody, got.msgId, got.dequeueCount) == ("hello sdk", sent.msgId, 1)
    queue.delete_message(got.receiptHandle)
    with pytest.raises(CMQServerException) as e:
        queue.receive_message(polling_wait_seconds=0)
    assert e.value.code == 7000
    with pytest.raises(CMQServerException) as e:
        queue.delete_message(got.receiptHandle)
    assert e.value.code == 4430
    ids = [m.msgId for m in queue.batch_send_message([Message(f"b{i}") for i in range(3)])]
    batch = queue.batch_receive_message(3, polling_wait_seconds=5)
    assert sorted(m.msgId for m in batch) == sorted(ids)
    queue.batch_delete_message([m.receiptHandle for m in batch])
    attrs = queue.get_attributes()
    assert (attrs.visibilityTimeout, attrs.activeMsgNum, attrs.inactiveMsgNum) == (10, 0, 0)
    meta.visibilityTimeout = 20
    queue.set_attributes(meta)
    assert queue.get_attributes().visibilityTimeout == 20
    total, listed, _next = account.list_queue(searchWord=unique)
    assert total == 1 and listed[0]["queueName"] == unique
    account.set_sign("sha256")
    account.get_client().set_method("GET")
    assert account.list_queue(searchWord=unique)[0] == 1
    queue.delete()
    with pytest.raises(CMQServerException) as e:
        queue.get_attributes()
    assert e.value.code == 4440


def test_CA3_sdk_topic_and_subscription_actions(endpoint: str, unique: str) -> None:
    account = _account(endpoint)
    queue = account.get_queue(unique)
    queue.create(QueueMeta())
    topic = account.get_topic(unique + "t")
    topic.create(TopicMeta())
    sub = account.get_subscription(unique + "t", "sdk-sub")
    meta = SubscriptionMeta()
    meta.Endpoint, meta.Protocal, meta.NotifyContentFormat, meta.FilterTag = unique, "queue", "SIMPLIFIED", ["a"]
    sub.create(meta)
    total, subs, _next = topic.list_subscription()
    assert total == 1 and subs[0]["subscriptionName"] == "sdk-sub"
    attrs = sub.get_attributes()
    assert (attrs.NotifyContentFormat, attrs.FilterTag) == ("SIMPLIFIED", ["a"])
    topic.publish_message(TopicMessage("not for us", ["b"]))
    sent = topic.publish_message(TopicMessage("tagged", ["a"]))
    got = queue.receive_message(polling_wait_seconds=5)
    assert (got.msgBody, got.msgId) == ("tagged", sent.msgId)
    topic.batch_publish_message([TopicMessage("x"), TopicMessage("y")], msgtag=["a"])
    assert sorted(m.msgBody for m in queue.batch_receive_message(16, polling_wait_seconds=5)) == ["x", "y"]
    sub.clearFilterTags()
    meta.NotifyStrategy = "BACKOFF_RETRY"
    meta.FilterTag = []
    sub.set_attributes(meta)
    assert sub.get_attributes().NotifyStrategy == "BACKOFF_RETRY"
    assert topic.get_attributes().filterType == 1
    total, topics, _next = account.list_topic(searchWord=unique)
    assert total == 1 and topics[0]["topicName"] == unique + "t"
    sub.delete()
    topic.delete()
    with pytest.raises(CMQServerException) as e:
        topic.get_attributes()
    assert e.value.code == 4440
