"""A realistic RabbitMQ estate, declared on the local RabbitMQ 3.10 and exported by
``rabbitmqctl export_definitions``; and the routing probe that compares two brokers.

The estate lives in a vhost of its own (``defs-<random>``), deleted afterwards with its user.
Names and keys stay within CMQ's limits (L1-L4) except ONE binding key, longer than a direct
exchange's tag may be (L3), which an import must either take or list: never lose.
"""

from __future__ import annotations

import json
import random
import subprocess
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pika

TYPES = ("direct", "topic", "fanout", "headers")
PROBES: dict[str, list[tuple[str, dict[str, str] | None]]] = {
    "direct": [("k-a", None), ("k-b", None), ("k-c", None), ("k-zz", None)],
    "topic": [("a.b.c", None), ("a.x", None), ("b.z", None), ("a", None), ("c", None)],
    "fanout": [("", None)],
    "headers": [("", {"h1": "v1", "h2": "v2"}), ("", {"h1": "v1"}), ("", {"h3": "v3"}), ("", {"h9": "x"})],
}
LONG_KEY = "k-longer-than-a-cmq-tag"  # 23 characters: beyond L3's 16 for a direct exchange
QUEUE_ARGS: list[dict[str, Any]] = [
    {}, {"x-message-ttl": 600000}, {"x-max-length": 1000}, {"x-expires": 3600000}, {"x-max-priority": 5},
    {"x-dead-letter-exchange": "dlx-ex"}, {"x-overflow": "reject-publish", "x-max-length": 500},
    {"x-single-active-consumer": True}, {"x-max-length-bytes": 1048576},
]
POLICIES = [  # name, pattern, apply-to, priority, definition
    ("dlx", "^work-", "queues", 1, {"dead-letter-exchange": "dlx-ex"}),
    ("ttl", "^ttl-", "queues", 1, {"message-ttl": 300, "dead-letter-exchange": "dlx-ex"}),
    ("cap", "^capped-", "queues", 2, {"max-length": 3}),
    ("cap-low", "^capped-", "queues", 1, {"max-length": 10, "ha-mode": "all", "queue-mode": "lazy"}),
    ("ae", "^dx-01$", "exchanges", 0, {"alternate-exchange": "ae-spill"}),
]


def rabbitmqctl(*args: str) -> str:
    return subprocess.run(["rabbitmqctl", "-q", *args], check=True, capture_output=True, text=True,
                          timeout=120).stdout


@dataclass
class Estate:
    vhost: str
    user: str
    password: str
    definitions: dict[str, Any]
    exchanges: dict[str, str] = field(default_factory=dict)  # name -> type, the ones probed
    queues: list[str] = field(default_factory=list)  # the ones drained by the probe
    rabbit_routes: dict[str, list[str]] = field(default_factory=dict)

    def url(self, port: int, user: str = "guest", password: str = "guest") -> str:
        return f"amqp://{user}:{password}@127.0.0.1:{port}/{quote(self.vhost, safe='')}"


def _declare(ch: Any, rng: random.Random) -> tuple[dict[str, str], list[str]]:
    plain = [f"q-{i:02d}" for i in range(40)]
    for i, name in enumerate(plain):
        ch.queue_declare(name, durable=True, arguments=QUEUE_ARGS[i % len(QUEUE_ARGS)] or None)
    special = [*(f"work-{i}" for i in range(5)), "capped-0", "capped-1", "ttl-0", "ttl-1", "dead-letters"]
    for name in special:
        ch.queue_declare(name, durable=True)
    ch.queue_declare("qq-00", durable=True, arguments={"x-queue-type": "quorum", "x-delivery-limit": 5})
    probed: dict[str, str] = {}
    for t in TYPES:
        for i in range(12):
            name = f"{t[0]}x-{i:02d}"
            # (No internal exchange: RabbitMQ's export leaves internal exchanges out.)
            args = {"alternate-exchange": "ae-spill"} if name == "dx-00" else None
            ch.exchange_declare(name, t, durable=True, auto_delete=name == "tx-10", arguments=args)
            probed[name] = t
    ch.exchange_declare("dlx-ex", "fanout", durable=True)
    ch.exchange_declare("ae-spill", "fanout", durable=True)
    ch.queue_bind("dead-letters", "dlx-ex")
    ch.queue_bind("q-39", "ae-spill")
    for name, t in [(n, t) for n, t in probed.items()]:
        a, b, c = rng.sample(plain[:39], 3)
        if t == "direct":
            ch.queue_bind(a, name, "k-a")
            ch.queue_bind(b, name, "k-b")
            ch.queue_bind(c, name, "k-a")
            ch.queue_bind(c, name, "k-c")
        elif t == "topic":
            ch.queue_bind(a, name, "a.*.c")
            ch.queue_bind(b, name, "a.#")
            ch.queue_bind(b, name, "#.z")
        elif t == "fanout":
            ch.queue_bind(a, name)
            ch.queue_bind(b, name)
        else:
            ch.queue_bind(a, name, "", arguments={"x-match": "all", "h1": "v1", "h2": "v2"})
            ch.queue_bind(b, name, "", arguments={"x-match": "any", "h1": "v1", "h3": "v3"})
    # Exchange-to-exchange bindings, policy-shaped queues.
    ch.exchange_bind("fx-02", "dx-02", "k-a")
    ch.exchange_bind("tx-04", "fx-04", "")
    ch.exchange_bind("fx-11", "tx-11", "a.#")
    ch.queue_bind("q-38", "fx-11")
    ch.exchange_bind("fx-05", "hx-05", "", arguments={"x-match": "any", "h9": "x"})
    for i in range(5):
        ch.queue_bind(f"work-{i}", "dx-06", "k-b")
    ch.queue_bind("capped-0", "fx-07")
    ch.queue_bind("qq-00", "fx-09")
    ch.queue_bind("q-00", "dx-08", LONG_KEY)
    return probed, [*plain, *special[:7], "dead-letters", "qq-00"]


def route_outcome(url: str, exchanges: dict[str, str], queues: list[str]) -> dict[str, list[str]]:
    """Publish every probe through every exchange (confirmed), then drain every queue: which
    queue got which probe."""
    conn = pika.BlockingConnection(pika.URLParameters(url))
    try:
        ch = conn.channel()
        for q in queues:
            ch.queue_purge(q)
        ch.confirm_delivery()
        for name, t in sorted(exchanges.items()):
            for i, (key, headers) in enumerate(PROBES[t]):
                ch.basic_publish(name, key, f"{name}|{i}".encode(), pika.BasicProperties(headers=headers))
        out: dict[str, list[str]] = {}
        for q in queues:
            got = []
            while True:
                method, _, body = ch.basic_get(q, auto_ack=True)
                if method is None:
                    break
                got.append(body.decode())
            out[q] = sorted(got)
        return out
    finally:
        conn.close()


def policy_outcome(url: str) -> dict[str, Any]:
    """What the policies do: a rejected message goes to the DLX, a TTL'd one too, a capped
    queue keeps its newest 3 of 5."""
    conn = pika.BlockingConnection(pika.URLParameters(url))
    try:
        ch = conn.channel()
        ch.confirm_delivery()
        ch.queue_purge("dead-letters")
        ch.basic_publish("", "work-0", b"to-reject")
        method, _, _ = ch.basic_get("work-0")
        assert method is not None
        ch.basic_reject(method.delivery_tag, requeue=False)
        ch.basic_publish("", "ttl-0", b"to-expire")
        dead = []
        deadline = time.monotonic() + 30  # hang protection only
        while len(dead) < 2 and time.monotonic() < deadline:
            method, props, body = ch.basic_get("dead-letters", auto_ack=True)
            if method is None:
                time.sleep(0.05)
                continue
            death = (props.headers or {}).get("x-death") or [{}]
            dead.append((body.decode(), death[0].get("reason"), death[0].get("queue"),
                         (props.headers or {}).get("x-first-death-reason")))
        ch.queue_purge("capped-1")
        for i in range(5):
            ch.basic_publish("", "capped-1", f"c{i}".encode())
        kept = []
        while (got := ch.basic_get("capped-1", auto_ack=True))[0] is not None:
            kept.append(got[2].decode())
        return {"dead": sorted(dead), "capped": kept}
    finally:
        conn.close()


def own_vhost(defs: dict[str, Any], vhost: str) -> dict[str, Any]:
    """The part of a full export that belongs to ``vhost`` (others' test vhosts are left out)."""
    out = {k: v for k, v in defs.items() if not isinstance(v, list)}
    for kind, items in defs.items():
        if isinstance(items, list) and kind not in ("users", "vhosts", "global_parameters"):
            out[kind] = [x for x in items if x.get("vhost") == vhost]
    users = {p["user"] for p in out["permissions"]}
    out["users"] = [u for u in defs["users"] if u["name"] in users]
    out["vhosts"] = [v for v in defs["vhosts"] if v["name"] == vhost]
    out["global_parameters"] = defs.get("global_parameters", [])
    return out


@contextmanager
def rabbit_estate(tmp: Path) -> Iterator[Estate]:
    vhost, user, password = f"defs-{uuid.uuid4().hex[:8]}", f"defs-{uuid.uuid4().hex[:8]}", "s3cret-pw"
    rabbitmqctl("add_vhost", vhost)
    rabbitmqctl("add_user", user, password)
    try:
        rabbitmqctl("set_user_tags", user, "management")
        for who in ("guest", user):
            rabbitmqctl("set_permissions", "-p", vhost, who, ".*", ".*", ".*")
        rabbitmqctl("set_topic_permissions", "-p", vhost, user, "amq.topic", "^a", "^a")
        rabbitmqctl("set_vhost_limits", "-p", vhost, '{"max-connections": 1000}')
        for name, pattern, apply_to, priority, definition in POLICIES:
            rabbitmqctl("set_policy", "-p", vhost, "--apply-to", apply_to, "--priority", str(priority),
                        name, pattern, json.dumps(definition))
        estate = Estate(vhost, user, password, {})
        conn = pika.BlockingConnection(pika.URLParameters(estate.url(5672)))
        try:
            estate.exchanges, estate.queues = _declare(conn.channel(), random.Random(7))
        finally:
            conn.close()
        # To standard output: the node itself would write a file, as its own OS user.
        full = json.loads(rabbitmqctl("export_definitions", "-", "--format", "json"))
        (tmp / "rabbit-definitions.json").write_text(json.dumps(full))  # kept for a look after a failure
        estate.definitions = own_vhost(full, vhost)
        estate.rabbit_routes = route_outcome(estate.url(5672), estate.exchanges, estate.queues)
        yield estate
    finally:
        rabbitmqctl("delete_vhost", vhost)
        rabbitmqctl("delete_user", user)
