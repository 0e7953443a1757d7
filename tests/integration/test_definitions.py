"""Importing a RabbitMQ estate: a definitions file exported by the local RabbitMQ 3.10 from a
realistic topology (51 queues with mixed arguments, 50 exchanges of every type with
exchange-to-exchange bindings, ~130 bindings, five policies), imported into a real gateway
over HTTP (in-process) and with ``cmq-gateway import-definitions`` (a ``serve`` process),
then checked over AMQP against RabbitMQ itself: every probe published through every exchange
lands in the same queues (a differential check), and the policies act (dead-lettering on
reject and on TTL, max-length). Whatever is not imported is listed with its reason (M1-M8, W2).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pika
import pytest
import requests

from gateway.config import GatewayConfig
from gateway.management.testing import operator_gateway
from tests.integration.rabbit_estate import (
    LONG_KEY,
    Estate,
    policy_outcome,
    rabbit_estate,
    route_outcome,
)
from tests.integration.test_process import ROOT, serve

AUTH = {"Authorization": aiohttp.encode_basic_auth("guest", "guest")}


@pytest.fixture(scope="module")
def estate(tmp_path_factory: pytest.TempPathFactory, rabbitmq_url: str) -> Iterator[Estate]:
    with rabbit_estate(tmp_path_factory.mktemp("estate")) as e:
        e.rabbit_policy = policy_outcome(e.url(5672))  # type: ignore[attr-defined]
        # The reference itself did what the policies say (so that equality below means something).
        assert e.rabbit_policy == {  # type: ignore[attr-defined]
            "dead": [("to-expire", "expired", "ttl-0", "expired"), ("to-reject", "rejected", "work-0", "rejected")],
            "capped": ["c2", "c3", "c4"]}
        yield e


def _normal(defs: dict[str, Any]) -> dict[str, Any]:
    """Definitions modulo ordering."""
    return {k: sorted(json.dumps(x, sort_keys=True) for x in v) if isinstance(v, list) else v
            for k, v in defs.items()}


def check_report(report: dict[str, Any], estate: Estate) -> None:
    """The counts add up to the file, and what was not imported is only what may not be."""
    defs = estate.definitions
    missing = report["not_imported"]
    for kind in ("queues", "exchanges", "policies", "users", "permissions"):
        failed = [m for m in missing if m["kind"] + "s" == kind or (kind == "policies" and m["kind"] == "policy")]
        assert report["imported"][kind] + report["unchanged"][kind] + len(failed) == len(defs[kind]), kind
        assert failed == [], failed
    bindings_failed = [m for m in missing if m["kind"] == "binding"]
    assert report["imported"]["bindings"] + report["unchanged"]["bindings"] + len(bindings_failed) == \
        len(defs["bindings"])
    # The one object beyond CMQ's limits: imported, or listed with the rule; never silently lost.
    assert [(m["routing_key"], m.get("rule")) for m in bindings_failed] in ([], [(LONG_KEY, "L3")])
    kinds = sorted((m["kind"], m.get("component")) for m in missing if m["kind"] != "binding")
    assert kinds == [("parameter", "vhost-limits"), ("topic_permission", None)]
    notes = {(n["kind"], n["name"], n["key"]) for n in report["notes"]}
    assert {("policy", "cap-low", "ha-mode"), ("policy", "cap-low", "queue-mode"),
            ("queue", "q-08", "x-max-length-bytes"), ("queue", "qq-00", "x-queue-type")} <= notes
    assert ("queue", "q-04", "x-max-priority") not in notes  # applied: a priority queue
    assert report["complete"] is False


async def test_M8_rabbitmq_export_imported_over_http_routes_as_rabbitmq(estate: Estate) -> None:
    """M1-M8: the whole export is imported; the gateway routes every probe as RabbitMQ did;
    the policies (DLX, TTL, max-length) act; a second import changes nothing and fails nothing
    new; export -> fresh gateway -> export round-trips."""
    async with operator_gateway() as og, aiohttp.ClientSession(headers=AUTH) as http:
        url = f"{og.management_url}/api/definitions"
        async with http.post(url, json=estate.definitions) as r:
            assert r.status == 200, await r.text()
            report = await r.json()
        check_report(report, estate)
        assert report["imported"]["queues"] == len(estate.definitions["queues"])
        applied = {p["name"]: (p["queues"], p["exchanges"]) for p in report["policies_applied"]}
        assert applied == {"dlx": (5, 0), "ttl": (2, 0), "cap": (2, 0), "cap-low": (0, 0), "ae": (0, 1)}
        gw_url = estate.url(og.gateway.port)
        routes = await asyncio.to_thread(route_outcome, gw_url, estate.exchanges, estate.queues)
        assert routes == estate.rabbit_routes
        assert sum(len(v) for v in routes.values()) > 100  # the probe did route, through every kind
        assert await asyncio.to_thread(policy_outcome, gw_url) == estate.rabbit_policy  # type: ignore[attr-defined]
        async with http.get(f"{og.management_url}/api/policies/{estate.vhost}") as r:
            listed = await r.json()
        assert {p["name"] for p in listed} == {"dlx", "ttl", "cap", "cap-low", "ae"}
        async with http.get(f"{og.management_url}/api/queues/{estate.vhost}/work-0") as r:
            q = await r.json()
        assert (q["policy"], q["effective_policy_definition"]) == ("dlx", {"dead-letter-exchange": "dlx-ex"})

        async with http.post(url, json=estate.definitions) as r:  # idempotent
            again = await r.json()
        assert sum(again["imported"][k] for k in ("vhosts", "policies", "exchanges", "queues", "bindings")) == 0
        assert again["unchanged"]["queues"] == len(estate.definitions["queues"])
        assert again["not_imported"] == report["not_imported"]

        async with http.get(url) as r:
            exported = await r.json()
        async with operator_gateway() as fresh:
            async with http.post(f"{fresh.management_url}/api/definitions", json=exported) as r:
                assert (await r.json())["not_imported"] == []
            async with http.get(f"{fresh.management_url}/api/definitions") as r:
                assert _normal(await r.json()) == _normal(exported)


def test_M8_cli_import_into_a_serve_process(estate: Estate, tmp_path: Path) -> None:
    """`cmq-gateway import-definitions FILE` into a running `cmq-gateway serve`: the output counts
    and lists, the exit status says something was not imported, the estate routes as on
    RabbitMQ, and the imported user logs in with its RabbitMQ password (W2)."""
    path = tmp_path / "defs.json"
    path.write_text(json.dumps(estate.definitions))
    with serve(tmp_path / "data") as (proc, port):
        mgmt = f"http://127.0.0.1:{proc.operator['management API']}"  # type: ignore[attr-defined]
        run = subprocess.run([sys.executable, "-m", "gateway", "import-definitions", str(path), "--url", mgmt],
                             cwd=ROOT, capture_output=True, text=True, timeout=300)
        assert run.returncode == 1, run.stderr
        out = run.stdout
        assert f"queues {len(estate.definitions['queues'])}" in out
        assert f"parameter vhost-limits/'limits' in vhost '{estate.vhost}': vhost limits" in out
        assert f"topic permission of user '{estate.user}'" in out
        assert "ha-mode: not applied" in out
        routes = route_outcome(estate.url(port), estate.exchanges, estate.queues)
        assert routes == estate.rabbit_routes
        conn = pika.BlockingConnection(pika.URLParameters(estate.url(port, estate.user, estate.password)))
        conn.close()
        exported = tmp_path / "export.json"
        run = subprocess.run([sys.executable, "-m", "gateway", "export-definitions", str(exported), "--url", mgmt,
                              "--vhost", estate.vhost], cwd=ROOT, capture_output=True, text=True, timeout=300)
        assert run.returncode == 0, run.stderr
        got = json.loads(exported.read_text())
        assert {q["name"] for q in got["queues"]} == {q["name"] for q in estate.definitions["queues"]}
        assert {p["name"] for p in got["policies"]} == {p["name"] for p in estate.definitions["policies"]}
        again = subprocess.run([sys.executable, "-m", "gateway", "import-definitions", str(exported), "--url",
                                mgmt, "--vhost", estate.vhost, "--json"],
                               cwd=ROOT, capture_output=True, text=True, timeout=300)
        assert again.returncode == 0, again.stdout + again.stderr
        report = json.loads(again.stdout)
        assert report["unchanged"]["queues"] == len(got["queues"]) and report["imported"]["queues"] == 0
        status = requests.get(f"{mgmt}/api/policies", auth=("guest", "guest"), timeout=30)
        assert {p["name"] for p in status.json() if p["vhost"] == estate.vhost} == \
            {p["name"] for p in estate.definitions["policies"]}


async def test_M16_what_cannot_be_imported_is_listed_per_object_with_the_reason() -> None:
    """Nothing is dropped in silence: a plugin's exchange type (and the bindings that need it), a
    conflicting redeclare, an unknown hashing algorithm, a bad policy, a malformed object,
    global parameters: each listed with its reason, while everything else is imported."""
    first = {"vhosts": [{"name": "/"}],
             "queues": [{"name": "orders", "vhost": "/", "durable": True, "auto_delete": False, "arguments": {}}]}
    defs = {
        "users": [{"name": "old", "password_hash": "abc", "hashing_algorithm": "rabbit_password_hashing_bcrypt",
                   "tags": []},
                  {"name": "ok", "password_hash": "", "tags": "management,policymaker"}],
        "global_parameters": [{"name": "cluster_name", "value": "rabbit@prod"}],
        "operator_policies": [{"vhost": "/", "name": "cap", "pattern": ".", "definition": {"max-length": 9}}],
        "rabbit_version": "3.10.8",
        "policies": [{"vhost": "/", "name": "broken", "pattern": "(", "apply-to": "queues",
                      "definition": {"max-length": 1}, "priority": 0},
                     {"vhost": "/", "name": "later", "pattern": "^late-", "apply-to": "queues",
                      "definition": {"max-length": 1, "federation-upstream-set": "all"}, "priority": 0}],
        "exchanges": [{"name": "ring", "vhost": "/", "type": "x-consistent-hash", "durable": True,
                       "auto_delete": False, "internal": False, "arguments": {}},
                      {"name": "delayed", "vhost": "/", "type": "x-delayed-message", "durable": True,
                       "auto_delete": False, "internal": False, "arguments": {"x-delayed-type": "direct"}},
                      {"name": "events", "vhost": "/", "type": "topic", "durable": True, "auto_delete": False,
                       "internal": True, "arguments": {}}],
        "queues": [{"name": "orders", "vhost": "/", "durable": False, "auto_delete": False, "arguments": {}},
                   {"name": "log", "vhost": "/", "durable": True, "auto_delete": False,
                    "arguments": {"x-queue-type": "stream", "x-max-age": "7D"}},
                   {"vhost": "/", "durable": True}],
        "bindings": [{"source": "ring", "vhost": "/", "destination": "log", "destination_type": "queue",
                      "routing_key": "1", "arguments": {}},
                     {"source": "events", "vhost": "/", "destination": "log", "destination_type": "queue",
                      "routing_key": "a.#", "arguments": {}},
                     {"source": "amq.direct", "vhost": "/", "destination": "log", "destination_type": "queue",
                      "routing_key": "", "arguments": {}}],
    }
    async with operator_gateway() as og, aiohttp.ClientSession(headers=AUTH) as http:
        url = f"{og.management_url}/api/definitions"
        async with http.post(url, json=first) as r:
            assert (await r.json())["imported"]["queues"] == 1
        async with http.post(url, json=defs) as r:
            assert r.status == 200
            report = await r.json()
        missing = {(m["kind"], m.get("name") or m.get("source")): m["reason"] for m in report["not_imported"]}
        assert set(missing) == {("user", "old"), ("global_parameter", "cluster_name"), ("policy", "broken"),
                                ("exchange", "ring"), ("exchange", "delayed"), ("queue", "orders"),
                                ("queue", None), ("binding", "ring"), ("section", "operator_policies")}
        assert "x-consistent-hash" in missing["exchange", "ring"]
        assert "x-delay" in missing["exchange", "delayed"]
        assert "inequivalent arg 'durable'" in missing["queue", "orders"]
        assert missing["queue", None] == "missing key 'name'"
        assert "exchange 'ring' was not imported" in missing["binding", "ring"]
        assert "bcrypt" in missing["user", "old"] and "should be regular expression" in missing["policy", "broken"]
        assert (report["imported"]["exchanges"], report["imported"]["queues"], report["imported"]["bindings"],
                report["imported"]["users"], report["imported"]["policies"]) == (1, 1, 2, 1, 1)
        notes = {(n.get("name") or n.get("source"), n["key"]) for n in report["notes"]}
        assert {("later", "federation-upstream-set"), ("log", "x-queue-type"), ("log", "x-max-age"),
                ("ok", "password_hash"), ("amq.direct", "routing_key")} <= notes
        # The policy stored by the import shapes a queue declared later, over AMQP (M7).
        conn = await asyncio.to_thread(pika.BlockingConnection, pika.URLParameters(og.amqp_url))
        try:
            ch = await asyncio.to_thread(conn.channel)
            await asyncio.to_thread(ch.queue_declare, "late-q")
            for i in range(3):
                await asyncio.to_thread(ch.basic_publish, "", "late-q", b"m%d" % i)
            declared = await asyncio.to_thread(ch.queue_declare, "late-q", passive=True)
            assert declared.method.message_count == 1
        finally:
            await asyncio.to_thread(conn.close)
        # And a policy set over the API reshapes an existing queue at once.
        async with http.put(f"{og.management_url}/api/policies/%2F/orders-cap",
                            json={"pattern": "^orders$", "definition": {"max-length": 5}, "priority": 3}) as r:
            assert r.status == 201
        assert og.broker.vhosts["/"].queues["orders"].attrs.max_length == 5
        async with http.put(f"{og.management_url}/api/policies/%2F/bad",
                            json={"pattern": ".", "definition": {"message-ttl": -1}}) as r:
            assert r.status == 400
        async with http.delete(f"{og.management_url}/api/policies/%2F/orders-cap") as r:
            assert r.status == 204
        assert og.broker.vhosts["/"].queues["orders"].attrs.max_length is None


# The strict profile: `cmq` once profiles exist (PF2), `strict_names` before.
STRICT = ({"profile": "cmq"} if "profile" in {f.name for f in dataclasses.fields(GatewayConfig)}
          else {"strict_names": True})


async def test_L2_names_beyond_cmq_limits_are_listed_under_the_strict_profile() -> None:
    """PF2/L2: a real export's names break CMQ's limits; strictly, each such object is listed
    with the rule, and whatever depends on it says so; the rest is imported."""
    defs = {"exchanges": [{"name": "events.v1", "vhost": "/", "type": "topic", "durable": True,
                           "auto_delete": False, "internal": False, "arguments": {}}],
            "queues": [{"name": "orders.eu", "vhost": "/", "durable": True, "auto_delete": False, "arguments": {}},
                       {"name": "plain-q", "vhost": "/", "durable": True, "auto_delete": False, "arguments": {}}],
            "bindings": [{"source": "events.v1", "vhost": "/", "destination": "plain-q",
                          "destination_type": "queue", "routing_key": "a.#", "arguments": {}},
                         {"source": "amq.topic", "vhost": "/", "destination": "orders.eu",
                          "destination_type": "queue", "routing_key": "a.#", "arguments": {}},
                         {"source": "amq.topic", "vhost": "/", "destination": "plain-q",
                          "destination_type": "queue", "routing_key": "a.#", "arguments": {}}]}
    async with operator_gateway(**STRICT) as og, aiohttp.ClientSession(headers=AUTH) as http, \
            http.post(f"{og.management_url}/api/definitions", json=defs) as r:
        report = await r.json()
    missing = [(m["kind"], m.get("name") or m.get("source"), m.get("rule")) for m in report["not_imported"]]
    assert missing == [("exchange", "events.v1", "L2"), ("queue", "orders.eu", "L2"),
                       ("binding", "events.v1", None), ("binding", "amq.topic", None)]
    assert "queue 'orders.eu' was not imported" in report["not_imported"][3]["reason"]
    assert (report["imported"]["queues"], report["imported"]["bindings"]) == (1, 1)


def test_M8_serve_with_a_definitions_export_as_config_serves_the_whole_estate(estate: Estate,
                                                                              tmp_path: Path) -> None:
    """`cmq-gateway serve --config rabbit-export.json` (RabbitMQ's load_definitions): users and
    permissions, and also the exchanges, queues, bindings and policies of the file, route as on
    RabbitMQ; a restart with the same file changes nothing and loses nothing (W2, M8)."""
    path = tmp_path / "defs.json"
    path.write_text(json.dumps(estate.definitions))
    for _ in range(2):
        with serve(tmp_path / "data", "--config", str(path)) as (proc, port):
            assert route_outcome(estate.url(port), estate.exchanges, estate.queues) == estate.rabbit_routes
            conn = pika.BlockingConnection(pika.URLParameters(estate.url(port, estate.user, estate.password)))
            conn.close()
            mgmt = f"http://127.0.0.1:{proc.operator['management API']}"  # type: ignore[attr-defined]
            policies = requests.get(f"{mgmt}/api/policies", auth=("guest", "guest"), timeout=30).json()
            assert {p["name"] for p in policies if p["vhost"] == estate.vhost} == \
                {p["name"] for p in estate.definitions["policies"]}
