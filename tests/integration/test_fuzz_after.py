"""What clients leave behind must not break the gateway later (the fuzz scripts' after phase,
scripts/fuzz_requests.after_phase): a restart (stop, kill -9) keeps every durable object, the
definitions export is imported whole by a fresh gateway and exported back equal, and every
list (management, CMQ API, AMQP passive declares) answers. On both stores (M1, M6, MQ3, L2),
JetStream on a nats-server of the test's own: the after phase compares whole exports."""

from __future__ import annotations

import sys
import threading
from pathlib import Path

import paho.mqtt.client as paho
import pika
import pytest
import requests
from paho.mqtt.enums import CallbackAPIVersion

from tests.integration.cmq_gateway import STORES

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))

from fuzz_requests import after_phase, write_config  # noqa: E402
from serve_process import Served, nats_store  # noqa: E402


@pytest.mark.parametrize("store", STORES)
def test_M6_MQ3_durable_server_named_and_mqtt_session_queues_survive_the_export_import_round_trip(
        tmp_path: Path, store: str) -> None:
    """Found by the after phase of scripts/fuzz_mqtt.py (seed 11): a persistent MQTT session's
    queue is named amq.mqtt-subscription-... (MQ8), and a durable server-named AMQP queue
    amq.gen-...; the export held them, and POST /api/definitions refused both ("contains
    reserved prefix 'amq.*'"), and their bindings, so no export of such a gateway was
    imported whole. RabbitMQ imports a queue of any name: the prefix is the clients' rule."""
    with nats_store(store if store == "jetstream" else None) as store_url:
        _round_trip(tmp_path, store, store_url)


def _round_trip(tmp_path: Path, store: str, store_url: str | None) -> None:
    config = write_config(tmp_path / "gateway.yaml")
    gw = Served(tmp_path / "data", tmp_path / "gateway.log", store=store_url, config=config, management_port=0,
                cmq_api_port=0, mqtt_port=0)
    try:
        with pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", gw.port)) as conn:
            ch = conn.channel()
            server_named = ch.queue_declare("", durable=True).method.queue
            ch.queue_bind(server_named, "amq.topic", "after.#")
        client = paho.Client(CallbackAPIVersion.VERSION2, client_id=f"after-{store}", clean_session=False)
        client.username_pw_set("guest", "guest")
        client.connect("127.0.0.1", gw.ports["mqtt_port"])
        subacked = threading.Event()
        client.on_subscribe = lambda *_: subacked.set()
        client.loop_start()
        subscribed = client.subscribe("after/mqtt", qos=1)
        assert subscribed[0] == 0 and subacked.wait(30)
        client.disconnect()
        client.loop_stop()
        # The prefix is no way around L2: a 300-byte amq.* name is refused by the import too.
        mgmt = f"http://127.0.0.1:{gw.ports['management_port']}"
        long_name = {"queues": [{"name": "amq." + "x" * 300, "vhost": "/", "durable": True}]}
        answer = requests.post(f"{mgmt}/api/definitions", json=long_name, auth=("guest", "guest"), timeout=30).json()
        assert answer["complete"] is False and answer["not_imported"][0]["rule"] == "L2", answer
        problems: list[str] = []
        gw, report = after_phase(gw, config, problems)
    finally:
        gw.stop()
    assert server_named.startswith("amq.gen-")
    assert report["objects"]["queues"] >= 2 and report["objects"]["bindings"] >= 2, report
    assert problems == [], problems
    assert report["import"]["complete"] is True, report


@pytest.mark.parametrize("store", STORES)
def test_M1_a_deleted_vhost_stays_deleted_across_a_restart(tmp_path: Path, store: str) -> None:
    """Found by the after phase: DELETE /api/vhosts/{vhost} left the vhost's policies in the
    store (p/<vhost>/<policy>), and the next start recovered them, and with them the vhost:
    the deleted vhost, its policy applying again to whatever a client declared in it next.
    A queue with a name CMQ could not hold (a PF4 report entry, l/<vhost>/...) is there too."""
    with nats_store(store if store == "jetstream" else None) as store_url:
        _vhost_deleted(tmp_path, store, store_url)


def _vhost_deleted(tmp_path: Path, store: str, store_url: str | None) -> None:
    config = write_config(tmp_path / "gateway.yaml")
    vhost = f"gone-{store}"
    gw = Served(tmp_path / "data", tmp_path / "gateway.log", store=store_url, config=config, management_port=0,
                cmq_api_port=0)
    try:
        mgmt = f"http://127.0.0.1:{gw.ports['management_port']}"
        with requests.Session() as s:
            s.auth = ("guest", "guest")
            for method, path, body in (
                    ("PUT", f"/api/vhosts/{vhost}", None),
                    ("PUT", f"/api/permissions/{vhost}/guest", {"configure": ".*", "write": ".*", "read": ".*"}),
                    ("PUT", f"/api/policies/{vhost}/p", {"pattern": ".*", "definition": {"max-length": 5}}),
                    ("PUT", f"/api/queues/{vhost}/a%20b", {"durable": True})):
                assert s.request(method, mgmt + path, json=body, timeout=30).status_code == 201, path
            assert s.delete(f"{mgmt}/api/vhosts/{vhost}", timeout=30).status_code == 204
        problems: list[str] = []
        gw, report = after_phase(gw, config, problems)
        mgmt = f"http://127.0.0.1:{gw.ports['management_port']}"
        vhosts = [v["name"] for v in requests.get(f"{mgmt}/api/vhosts", auth=("guest", "guest"), timeout=30).json()]
        policies = requests.get(f"{mgmt}/api/policies", auth=("guest", "guest"), timeout=30).json()
    finally:
        gw.stop()
    assert vhost not in vhosts and not [p for p in policies if p["vhost"] == vhost], (vhosts, policies)
    assert problems == [], problems
