"""Policies refused exactly as RabbitMQ refuses them (SPEC M7, M16): the same bodies sent to
RabbitMQ's management API on this machine (127.0.0.1:15672, guest/guest) and to the gateway's,
on both stores. Where RabbitMQ takes a policy the gateway takes it and stores the same;
where RabbitMQ refuses it (400, or its 500 / dropped connection for a value its validator
crashes on) the gateway answers 400 with RabbitMQ's reason and stores nothing, in a PUT and in
a definitions import alike. Found by the fuzzers: ``{"max-length-bytes": "NaN"}`` and unknown
definition keys were stored, for only the keys the gateway applies were checked."""

from __future__ import annotations

import html
import json
import sys
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pika
import pytest
import requests

from tests.integration.cmq_gateway import STORES

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))

from fuzz_requests import write_config  # noqa: E402
from serve_process import Served, nats_store  # noqa: E402

pytestmark = pytest.mark.rabbitmq

RABBIT = "http://127.0.0.1:15672"
AUTH = ("guest", "guest")


def _policy(definition: Any, **extra: Any) -> dict[str, Any]:
    return {"pattern": "^p\\.", "definition": definition, **extra}


# Bodies RabbitMQ 3.10.8 takes or refuses, the keys the gateway applies and those it only keeps.
BODIES: list[Any] = [
    _policy({"max-length-bytes": "NaN"}), _policy({"max-length-bytes": -1}), _policy({"max-length-bytes": 10}),
    _policy({"max-length-bytes": 1.5}), _policy({"max-length": 1.0}), _policy({"message-ttl": True}),
    _policy({"expires": 0}), _policy({"delivery-limit": "3"}), _policy({"max-length": 10 ** 20}),
    _policy({"queue-mode": "lazy"}), _policy({"queue-mode": "eager"}), _policy({"queue-mode": None}),
    _policy({"queue-version": 2}), _policy({"queue-version": 3}),
    _policy({"overflow": "reject-publish-dlx"}), _policy({"overflow": "spill"}),
    _policy({"dead-letter-exchange": 1}), _policy({"alternate-exchange": ["a"]}),
    _policy({"dead-letter-strategy": "at-least-once"}), _policy({"dead-letter-strategy": "sometimes"}),
    _policy({"max-age": "7D"}), _policy({"max-age": "7"}), _policy({"max-age": "0D"}), _policy({"max-age": "1d"}),
    _policy({"max-age": 7}), _policy({"max-age": "D"}),
    _policy({"stream-max-segment-size-bytes": 500_000_000}), _policy({"stream-max-segment-size-bytes": 3_000_000_001}),
    _policy({"queue-leader-locator": "balanced"}), _policy({"queue-leader-locator": "min-masters"}),
    _policy({"queue-master-locator": "min-masters"}), _policy({"queue-master-locator": "balanced"}),
    _policy({"initial-cluster-size": 3}), _policy({"initial-cluster-size": -3}),
    _policy({"max-in-memory-length": 5}), _policy({"max-in-memory-bytes": "5"}),
    _policy({"ha-mode": "all"}), _policy({"ha-mode": "all", "ha-params": 2}), _policy({"ha-mode": "exactly"}),
    _policy({"ha-mode": "exactly", "ha-params": 2, "ha-sync-mode": "automatic"}),
    _policy({"ha-mode": "exactly", "ha-params": "2"}), _policy({"ha-mode": "nodes", "ha-params": ["rabbit@a"]}),
    _policy({"ha-mode": "nodes", "ha-params": []}), _policy({"ha-mode": "nodes", "ha-params": [1]}),
    _policy({"ha-mode": "all", "ha-sync-mode": "sometimes"}), _policy({"ha-mode": "all", "ha-sync-batch-size": 0}),
    _policy({"ha-mode": "all", "ha-promote-on-shutdown": "never"}), _policy({"ha-mode": "ALL"}),
    _policy({"ha-mode": 1}), _policy({"ha-params": 2}), _policy({"ha-sync-mode": "manual"}),
    _policy({"x-what": 1}), _policy({"max-length": 1, "x-a": 1, "x-b": "s"}), _policy({"max-length": -1, "x-a": 1}),
    _policy({"consumer-timeout": 1000}), _policy({"max-segment-size": 1}), _policy({"": 1}),
    _policy({"max-length": 1, "message-ttl": -1, "expires": 0}),
    _policy({}), _policy([]), _policy("max-length"), _policy(None),
    _policy({"max-length": 1}, priority=1.5), _policy({"max-length": 1}, priority=-5),
    _policy({"max-length": 1}, priority="3"), _policy({"max-length": 1}, priority=None),
    _policy({"max-length": 1}, priority=True),
    _policy({"max-length": 1}, **{"apply-to": "queues"}), _policy({"max-length": 1}, **{"apply-to": "topics"}),
    _policy({"max-length": 1}, **{"apply-to": ""}), _policy({"max-length": 1}, **{"apply-to": None}),
    _policy({"max-length": 1}, **{"apply-to": 1}),
    {"pattern": "(", "definition": {"max-length": 1}}, {"pattern": 1, "definition": {"max-length": 1}},
    {"pattern": None, "definition": {"max-length": 1}}, {"pattern": "", "definition": {"max-length": 1}},
    {"definition": {"max-length": 1}}, {"pattern": "."}, {},
]
# Reasons compared as text; a pattern's reason names its regular-expression library's error.
PATTERN_ERROR = "Validation failed\n\npattern should be regular expression but is invalid: "


def _put(base: str, vhost: str, name: str, body: Any) -> tuple[int, str]:
    try:
        r = requests.put(f"{base}/api/policies/{quote(vhost, safe='')}/{name}", data=json.dumps(body), auth=AUTH,
                         headers={"content-type": "application/json"}, timeout=30)
    except requests.ConnectionError:
        return 0, ""  # RabbitMQ 3.10.8 drops the connection on queue-master-locator 1.5
    reason = r.json().get("reason", "") if r.status_code == 400 else ""
    return r.status_code, reason


def _stored(base: str, vhost: str, name: str) -> dict[str, Any] | None:
    r = requests.get(f"{base}/api/policies/{quote(vhost, safe='')}/{name}", auth=AUTH, timeout=30)
    if r.status_code == 404:
        return None
    body = r.json()
    return {k: body[k] for k in ("pattern", "apply-to", "definition", "priority")}


def _same_refusal(rabbit: tuple[int, str], ours: tuple[int, str], body: Any) -> None:
    assert ours[0] == 400, (body, rabbit, ours)
    if rabbit[0] != 400:
        return  # RabbitMQ's 500: its validator crashed; there is no reason to compare
    if rabbit[1].startswith(PATTERN_ERROR):
        assert ours[1].startswith(PATTERN_ERROR), (body, rabbit, ours)
    else:
        assert ours[1] == rabbit[1], (body, rabbit, ours)


def _serve(tmp_path: Path, store_url: str | None) -> tuple[Served, str]:
    """A gateway process on ``tmp_path``'s data (again, after a stop) and its management URL."""
    gw = Served(tmp_path / "data", tmp_path / "gateway.log", store=store_url,
                config=write_config(tmp_path / "gateway.yaml"), management_port=0)
    return gw, f"http://127.0.0.1:{gw.ports['management_port']}"


@pytest.fixture
def rabbit_vhost() -> Any:
    vhost = f"hpol-{uuid.uuid4().hex[:8]}"
    assert requests.put(f"{RABBIT}/api/vhosts/{vhost}", auth=AUTH, timeout=30).status_code in (201, 204)
    try:
        yield vhost
    finally:
        requests.delete(f"{RABBIT}/api/vhosts/{vhost}", auth=AUTH, timeout=30)


@pytest.mark.parametrize("store", STORES)
def test_M7_M16_policy_puts_are_taken_and_refused_as_rabbitmq_does(tmp_path: Path, store: str,
                                                                   rabbit_vhost: str) -> None:
    with nats_store(store if store == "jetstream" else None) as store_url:
        gw, ours = _serve(tmp_path, store_url)
        try:
            assert requests.put(f"{ours}/api/vhosts/{rabbit_vhost}", auth=AUTH, timeout=30).status_code == 201
            taken = 0
            for i, body in enumerate(BODIES):
                name = f"p{i}"
                rabbit, gateway = _put(RABBIT, rabbit_vhost, name, body), _put(ours, rabbit_vhost, name, body)
                if rabbit[0] in (201, 204):
                    taken += 1
                    assert gateway[0] == rabbit[0], (body, rabbit, gateway)
                    assert _stored(ours, rabbit_vhost, name) == _stored(RABBIT, rabbit_vhost, name), body
                else:
                    _same_refusal(rabbit, gateway, body)
                    assert _stored(ours, rabbit_vhost, name) is None, body  # nothing half-stored
            kept = {p["name"] for p in requests.get(f"{ours}/api/policies/{rabbit_vhost}", auth=AUTH,
                                                    timeout=30).json()}
            # What was stored comes back the same after a restart, and nothing else with it.
            gw.stop()
            gw, ours = _serve(tmp_path, store_url)
            again = {p["name"] for p in requests.get(f"{ours}/api/policies/{rabbit_vhost}", auth=AUTH,
                                                     timeout=30).json()}
        finally:
            gw.stop()
    assert taken >= 15 and len(kept) == taken and again == kept


@pytest.mark.parametrize("store", STORES)
def test_M7_M16_a_definitions_import_refuses_the_policy_rabbitmq_refuses_and_stores_the_rest(
        tmp_path: Path, store: str, rabbit_vhost: str) -> None:
    """RabbitMQ's import stops at the bad policy (400, its reason and "(vhost/name)"), having
    stored what came before it; the gateway's lists it in the report with RabbitMQ's reason
    and imports the rest (complete false, the CLI's exit status 1: README's import row)."""
    policies = [{"vhost": rabbit_vhost, "name": "good", "pattern": "^a", "definition": {"max-length": 1},
                 "priority": 0, "apply-to": "queues"},
                {"vhost": rabbit_vhost, "name": "bad", "pattern": "^b", "definition": {"max-length-bytes": "NaN"},
                 "priority": 0, "apply-to": "queues"},
                {"vhost": rabbit_vhost, "name": "unknown", "pattern": "^c", "definition": {"max-lenght": 3},
                 "priority": 0, "apply-to": "queues"}]
    for bad in policies[1:]:
        r = requests.post(f"{RABBIT}/api/definitions", json={"policies": [bad]}, auth=AUTH, timeout=30)
        assert r.status_code == 400
        bad["rabbit_reason"] = html.unescape(r.json()["reason"]).removesuffix(f" ({rabbit_vhost}/{bad['name']})")
    with nats_store(store if store == "jetstream" else None) as store_url:
        gw, ours = _serve(tmp_path, store_url)
        try:
            body = {"vhosts": [{"name": rabbit_vhost}],
                    "policies": [{k: v for k, v in p.items() if k != "rabbit_reason"} for p in policies]}
            report = requests.post(f"{ours}/api/definitions", json=body, auth=AUTH, timeout=30).json()
            stored = {p["name"] for p in requests.get(f"{ours}/api/policies/{rabbit_vhost}", auth=AUTH,
                                                      timeout=30).json()}
        finally:
            gw.stop()
    assert report["complete"] is False and report["imported"]["policies"] == 1, report
    refused = {m["name"]: m["reason"] for m in report["not_imported"]}
    assert refused == {p["name"]: p["rabbit_reason"] for p in policies[1:]}, (refused, policies)
    assert stored == {"good"}


# The other things a management PUT stores: RabbitMQ reads a boolean field as true, false,
# "true" or "false" and refuses any other (["not_boolean", value]); a permission is three
# regular expressions. The gateway took Python's truth ("false" made a durable queue) and
# ignored vhost fields RabbitMQ refuses. Without "durable" RabbitMQ's PUT makes a transient queue
# or exchange (the management API's default; AMQP's too), where the gateway made a durable one.
OTHER_PUTS: list[tuple[str, Any]] = [
    ("/api/queues/{v}/q-false", {"durable": "false"}), ("/api/queues/{v}/q-true", {"durable": "true"}),
    ("/api/queues/{v}/q-x", {"durable": "x"}), ("/api/queues/{v}/q-one", {"durable": 1}),
    ("/api/queues/{v}/q-null", {"durable": None}), ("/api/queues/{v}/q-ad", {"auto_delete": "yes"}),
    ("/api/queues/{v}/q-ok", {"durable": False, "auto_delete": "false"}),
    ("/api/queues/{v}/q-default", {}), ("/api/exchanges/{v}/x-default", {"type": "topic"}),
    ("/api/exchanges/{v}/x-int", {"type": "direct", "durable": True, "internal": "false"}),
    ("/api/exchanges/{v}/x-bad", {"type": "direct", "internal": 1}),
    ("/api/exchanges/{v}/x-dur", {"type": "fanout", "durable": "no"}),
    ("/api/exchanges/{v}/x-ae", {"type": "direct", "durable": True, "arguments": {"alternate-exchange": 1}}),
    ("/api/exchanges/{v}/x-ae-ok", {"type": "direct", "durable": True, "arguments": {"alternate-exchange": "a"}}),
    ("/api/queues/{v}/q-type", {"durable": True, "arguments": {"x-queue-type": "Quorum"}}),
    ("/api/queues/{v}/q-mode", {"durable": True, "arguments": {"x-queue-mode": "lazy"}}),
    ("/api/queues/{v}/q-version", {"durable": True, "arguments": {"x-queue-version": 3}}),
    ("/api/vhosts/{v}-t1", {"tracing": "x"}), ("/api/vhosts/{v}-t2", {"tracing": "true"}),
    ("/api/vhosts/{v}-t3", {"tracing": 1}),
    ("/api/permissions/{v}/guest", {"configure": "(", "write": ".*", "read": ".*"}),
    ("/api/permissions/{v}/guest", {"configure": 1, "write": ".*", "read": ".*"}),
    ("/api/permissions/{v}/guest", {"configure": "^a", "write": ".*", "read": ".*"}),
]


def _shown(base: str, path: str) -> Any:
    r = requests.get(base + path, auth=AUTH, timeout=30)
    if r.status_code != 200:
        return r.status_code
    body = r.json()
    return {k: body.get(k) for k in ("durable", "auto_delete", "internal", "type", "configure", "write", "read")}


@pytest.mark.parametrize("store", STORES)
def test_M7_SE1_booleans_and_permission_patterns_are_refused_as_rabbitmq_does(tmp_path: Path, store: str,
                                                                             rabbit_vhost: str) -> None:
    with nats_store(store if store == "jetstream" else None) as store_url:
        gw, ours = _serve(tmp_path, store_url)
        made: list[str] = []
        try:
            assert requests.put(f"{ours}/api/vhosts/{rabbit_vhost}", auth=AUTH, timeout=30).status_code == 201
            for base in (RABBIT, ours):
                assert requests.put(f"{base}/api/permissions/{rabbit_vhost}/guest", auth=AUTH, timeout=30,
                                    json={"configure": ".*", "write": ".*", "read": ".*"}).status_code in (201, 204)
            for template, body in OTHER_PUTS:
                path = template.format(v=quote(rabbit_vhost, safe=""))
                if path.startswith("/api/vhosts/"):
                    made.append(path)
                answers = []
                for base in (RABBIT, ours):
                    r = requests.put(base + path, data=json.dumps(body), auth=AUTH, timeout=30,
                                     headers={"content-type": "application/json"})
                    answers.append((r.status_code, r.json().get("reason") if r.status_code == 400 else None))
                rabbit, gateway = answers
                if rabbit[0] // 100 == 2:
                    assert gateway[0] == rabbit[0], (path, body, rabbit, gateway)
                    assert _shown(ours, path) == _shown(RABBIT, path), (path, body)
                else:
                    assert gateway[0] == 400, (path, body, rabbit, gateway)
                    if isinstance(rabbit[1], list) and rabbit[1][0] == "not_boolean":
                        assert gateway[1] == rabbit[1], (path, body)
                    if not path.startswith("/api/permissions"):
                        assert _shown(ours, path) == 404, (path, body)  # nothing stored
            # The permission a refused PUT named is the one set before, on both.
            perm = f"/api/permissions/{quote(rabbit_vhost, safe='')}/guest"
            assert _shown(ours, perm) == _shown(RABBIT, perm)
        finally:
            gw.stop()
            for path in made:
                requests.delete(RABBIT + path, auth=AUTH, timeout=30)


@pytest.mark.parametrize("store", STORES)
def test_SE1_M7_a_definitions_import_refuses_bad_permission_patterns_and_booleans(tmp_path: Path,
                                                                                  store: str) -> None:
    """RabbitMQ's import answers 400 for a permission that is not a regular expression and for
    a queue or exchange whose durable is not a JSON boolean; the gateway's report lists each,
    and stores none of them (a bad pattern stored would break that user's every check)."""
    body = {"vhosts": [{"name": "imp"}],
            "permissions": [{"user": "guest", "vhost": "imp", "configure": "(", "write": ".*", "read": ".*"},
                            {"user": "guest", "vhost": "imp", "configure": ".*", "write": None, "read": ".*"}],
            "queues": [{"name": "q-str", "vhost": "imp", "durable": "false", "auto_delete": False, "arguments": {}},
                       {"name": "q-ok", "vhost": "imp", "durable": False, "auto_delete": False, "arguments": {}}],
            "exchanges": [{"name": "x-str", "vhost": "imp", "type": "direct", "durable": True, "auto_delete": False,
                           "internal": "false", "arguments": {}}]}
    with nats_store(store if store == "jetstream" else None) as store_url:
        gw, ours = _serve(tmp_path, store_url)
        try:
            report = requests.post(f"{ours}/api/definitions", json=body, auth=AUTH, timeout=30).json()
            perm = requests.get(f"{ours}/api/permissions/imp/guest", auth=AUTH, timeout=30).status_code
            queues = {q["name"]: q["durable"] for q in requests.get(f"{ours}/api/queues/imp", auth=AUTH,
                                                                    timeout=30).json()}
            exchanges = {x["name"] for x in requests.get(f"{ours}/api/exchanges/imp", auth=AUTH, timeout=30).json()}
        finally:
            gw.stop()
    refused = sorted((m["kind"], m.get("name") or m.get("user")) for m in report["not_imported"])
    assert refused == [("exchange", "x-str"), ("permission", "guest"), ("permission", "guest"),
                       ("queue", "q-str")], report
    assert perm == 404 and queues == {"q-ok": False} and "x-str" not in exchanges


AMQP_DECLARES: list[tuple[Any, ...]] = [
    ("exchange", {"alternate-exchange": 1}), ("exchange", {"alternate-exchange": "spill"}),
    ("queue", {"x-queue-type": "Quorum"}), ("queue", {"x-queue-type": 1}), ("queue", {"x-queue-type": "stream"}),
    ("queue", {"x-queue-mode": "eager"}), ("queue", {"x-queue-mode": "lazy"}), ("queue", {"x-queue-version": 3}),
    ("queue", {"x-queue-version": "2"}), ("queue", {"x-queue-version": 2}),
    *(("queue", {"x-queue-type": t}, flags) for t in ("quorum", "stream") for flags in (
        {"durable": False}, {"exclusive": True}, {"auto_delete": True}, {"durable": False, "exclusive": True},
        {"durable": False, "exclusive": True, "auto_delete": True})),
]


@pytest.mark.parametrize("store", STORES)
def test_M16_queue_kind_and_alternate_exchange_arguments_are_406_over_amqp_as_on_rabbitmq(tmp_path: Path,
                                                                                          store: str) -> None:
    """RabbitMQ closes the channel 406 for an x-queue-type, x-queue-mode or x-queue-version it
    does not know, for a quorum queue or stream that is not durable or is exclusive or
    auto-delete, and for an alternate-exchange that is not a name, and makes nothing; the
    gateway made the object (a "Quorum" typo: a classic queue). The HTTP PUTs and the import
    go through the same checks."""

    def declare(port: int, kind: str, name: str, args: dict[str, Any], flags: dict[str, bool]) -> tuple[int, str] | None:
        with pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port)) as conn:
            ch = conn.channel()
            try:
                if kind == "queue":
                    ch.queue_declare(name, arguments=args, **{"durable": True, **flags})
                else:
                    ch.exchange_declare(name, "direct", arguments=args)
            except pika.exceptions.ChannelClosedByBroker as e:
                ch = conn.channel()
                try:
                    (ch.queue_declare if kind == "queue" else ch.exchange_declare)(name, passive=True)
                except pika.exceptions.ChannelClosedByBroker:
                    return e.reply_code, e.reply_text.replace(name, "NAME")
                return e.reply_code, "made anyway"
            ch = conn.channel()
            (ch.queue_delete if kind == "queue" else ch.exchange_delete)(name)
            return None

    with nats_store(store if store == "jetstream" else None) as store_url:
        gw, _ = _serve(tmp_path, store_url)
        try:
            for kind, args, *flags in AMQP_DECLARES:
                name = f"hpol-{uuid.uuid4().hex[:6]}"
                rabbit, ours = (declare(port, kind, name, args, flags[0] if flags else {}) for port in (5672, gw.port))
                assert ours == rabbit, (kind, args, flags, rabbit, ours)
        finally:
            gw.stop()
