"""CL2: the pure mapping onto JetStream (docs/CLUSTER.md, "Names and keys")."""

from __future__ import annotations

import re

from semantics.jetstream.config import ACK_WAIT_MARGIN, consumer_config, stream_config
from semantics.jetstream.names import kv_key, queue_stream, queue_subject, queue_token, store_key
from semantics.queue_attrs import QueueAttributes
from semantics.store.keys import make_key

STREAM_NAME = re.compile(r"^[A-Za-z0-9_-]+$")
KV_KEY = re.compile(r"^[-/_=.a-zA-Z0-9]+$")


def test_CL2_queue_token_is_deterministic_valid_and_distinct() -> None:
    names = [("/", "orders"), ("/", "orders.eu"), ("/", "orders/eu"), ("a", "b/c"), ("a/b", "c"),
             ("/", "x" * 255), ("/", "ünïcode queue *>"), ("/", "orders_eu")]
    tokens = {queue_token(v, q) for v, q in names}
    assert len(tokens) == len(names)
    for v, q in names:
        assert queue_token(v, q) == queue_token(v, q)
        assert STREAM_NAME.match(queue_stream(v, q))
        assert len(queue_stream(v, q)) <= 64
        assert queue_subject(v, q).startswith("cmq.q.") and queue_subject(v, q).count(".") == 2
    assert queue_token("/", "orders").startswith("orders_")


def test_CL2_kv_keys_round_trip_any_store_key() -> None:
    for key in [make_key("q", "/", "orders"), make_key("b", "/", "amq.topic", "q", "a/b%c", "#.x"),
                make_key("u", "user", "ünï"), make_key("x", "a/b", ""), "meta/format"]:
        kv = kv_key(key)
        assert KV_KEY.match(kv), kv
        assert store_key(kv) == key
    assert kv_key(make_key("q", "/", "orders")).startswith("q.")


def test_CL2_stream_and_consumer_follow_queue_attributes() -> None:
    attrs = QueueAttributes(visibility_timeout=7, msg_retention_seconds=3600, max_msg_heap_num=500)
    s = stream_config("/", "orders", attrs, replicas=3)
    assert s["max_age"] == 3600 and s["max_msgs"] == 500 and s["discard"] == "new"
    assert s["retention"] == "workqueue" and s["num_replicas"] == 3
    assert s["subjects"] == [queue_subject("/", "orders")]
    rewind = stream_config("/", "orders", attrs.replace(rewind_seconds=60), replicas=1)
    assert rewind["retention"] == "limits"  # Q6: deleted messages stay rewindable
    c = consumer_config(attrs)
    assert c["ack_wait"] == 7 + ACK_WAIT_MARGIN and c["ack_policy"] == "explicit"
    assert c["max_deliver"] == -1
