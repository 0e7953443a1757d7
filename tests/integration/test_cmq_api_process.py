"""`cmq-gateway serve` and CMQ's HTTP API: the port, the config keys, TLS, restarts (CA1, SE2).

Real `python -m gateway serve` processes (tests/integration/test_process.py's helper).
"""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from gateway.cli import build_parser
from gateway.config import DEFAULT_CMQ_API_PORT, ConfigError, load_config
from tests.integration.cmq_client import CmqClient
from tests.integration.test_process import ROOT, serve
from tests.integration.tls_certs import Certs, make_certs

KEY_ID, SECRET = "AKIDprocess00000000000000000000000000", "process-secret-0123456789abcdef0"


def _config(tmp_path: Path, **extra: object) -> Path:
    path = tmp_path / "gateway.yaml"
    path.write_text(yaml.safe_dump({
        "users": [{"name": "guest", "password": "guest", "tags": ["administrator"],
                   "cmq_keys": [{"secret_id": KEY_ID, "secret_key": SECRET}]}],
        "permissions": [{"user": "guest", "vhost": "/", "configure": ".*", "write": ".*", "read": ".*"}],
        **extra}))
    return path


def test_CA1_default_port_collides_with_nothing_rabbitmq_spark_mqtt_nats_use() -> None:
    taken = {5672, 5671, 15672, 15692, 25672, 4369, 7077, 8080, 4040, 1883, 8883, 4222, 8222}
    assert DEFAULT_CMQ_API_PORT == 15680 and DEFAULT_CMQ_API_PORT not in taken
    serve_help = build_parser()._subparsers._group_actions[0].choices["serve"]  # type: ignore[union-attr]
    assert "--cmq-api-port" in serve_help.format_help() and "15680" in serve_help.format_help()


def test_CA1_on_by_default_with_serve(tmp_path: Path) -> None:
    """Without --cmq-api-port, `serve` serves the API on 15680 and says so; when something
    else holds 15680 it says that, in one line naming the option that moves it."""
    proc = subprocess.Popen([sys.executable, "-m", "gateway", "serve", "--host", "127.0.0.1", "--port", "0",
                             "--data-dir", str(tmp_path), "--management-port", "off", "--metrics-port", "off",
                             "--mqtt-port", "off"],
                            cwd=ROOT, stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None
    try:
        lines = []
        for line in proc.stderr:
            lines.append(line)
            if "CMQ API on" in line or "cannot listen" in line:
                break
    finally:
        proc.kill()
        proc.wait(timeout=30)
    said = lines[-1]
    assert said in (f"cmq-gateway: CMQ API on http://127.0.0.1:{DEFAULT_CMQ_API_PORT}/\n",
                    f"cmq-gateway: cannot listen on 127.0.0.1:{DEFAULT_CMQ_API_PORT} (CMQ API): port "
                    f"{DEFAULT_CMQ_API_PORT} is in use (another cmq-gateway?): choose another with "
                    "--cmq-api-port, or --cmq-api-port off\n"), lines


def test_CA1_taken_port_is_one_line_and_off_turns_it_off(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run([sys.executable, "-m", "gateway", "serve", "--host", "127.0.0.1", "--port", "0",
                               "--data-dir", str(tmp_path), "--management-port", "off", "--metrics-port", "off",
                               "--cmq-api-port", str(port)], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 1
    assert done.stderr == (f"cmq-gateway: cannot listen on 127.0.0.1:{port} (CMQ API): port {port} is in use "
                           "(another cmq-gateway?): choose another with --cmq-api-port, or --cmq-api-port off\n")
    with serve(tmp_path, "--cmq-api-port", "off") as (proc, _port):
        assert "CMQ API" not in proc.operator  # type: ignore[attr-defined]


def test_CA1_config_keys_and_messages_survive_a_restart(tmp_path: Path, unique: str) -> None:
    """Keys from ``users[].cmq_keys``, the port from ``cmq_api: {port}``; a queue made and a
    message sent through the API are durable (M14): both are there after a restart."""
    config = _config(tmp_path, cmq_api={"port": 0, "host": "127.0.0.1"})
    data = tmp_path / "data"
    with serve(data, "--config", str(config), "--cmq-api-port", "0") as (proc, _port):
        cmq = CmqClient(f"http://127.0.0.1:{proc.operator['CMQ API']}", KEY_ID, SECRET)  # type: ignore[attr-defined]
        cmq.ok("CreateQueue", queueName=unique)
        sent = cmq.ok("SendMessage", queueName=unique, msgBody="kept")
        cmq.ok("SetQueueAttributes", queueName=unique, visibilityTimeout=77)
        cmq.ok("CreateTopic", topicName=unique + "t")
        cmq.ok("SetTopicAttributes", topicName=unique + "t", maxMsgSize=4096)
        cmq.ok("Subscribe", topicName=unique + "t", subscriptionName="kept-sub", protocol="queue",
               endpoint=unique, filterTag=["a"])
        cmq.ok("SetSubscriptionAttributes", topicName=unique + "t", subscriptionName="kept-sub",
               notifyStrategy="BACKOFF_RETRY")
        proc.kill()  # no graceful stop: what the API answered must be on disk
    with serve(data, "--config", str(config), "--cmq-api-port", "0") as (proc, _port):
        cmq = CmqClient(f"http://127.0.0.1:{proc.operator['CMQ API']}", KEY_ID, SECRET)  # type: ignore[attr-defined]
        got = cmq.ok("ReceiveMessage", queueName=unique)
        assert (got["msgId"], got["msgBody"]) == (sent["msgId"], "kept")
        assert cmq.ok("GetQueueAttributes", queueName=unique)["visibilityTimeout"] == 77
        assert cmq.ok("GetTopicAttributes", topicName=unique + "t")["maxMsgSize"] == 4096
        sub = cmq.ok("GetSubscriptionAttributes", topicName=unique + "t", subscriptionName="kept-sub")
        assert (sub["endpoint"], sub["filterTag"], sub["notifyStrategy"]) == (unique, ["a"], "BACKOFF_RETRY")


def test_CA1_config_rejects_a_secret_id_given_twice(tmp_path: Path) -> None:
    path = tmp_path / "gateway.yaml"
    path.write_text(yaml.safe_dump({"users": [
        {"name": "a", "password": "a", "cmq_keys": [{"secret_id": "AKID1", "secret_key": "x"}]},
        {"name": "b", "password": "b", "cmq_keys": [{"secret_id": "AKID1", "secret_key": "y"}]}]}))
    with pytest.raises(ConfigError, match=r"users\[1\]\.cmq_keys\[0\]\.secret_id: 'AKID1' is already the key"):
        load_config(str(path))
    path.write_text(yaml.safe_dump({"users": [{"name": "a", "password": "a", "cmq_keys": [{"secret_id": "AKID1"}]}]}))
    with pytest.raises(ConfigError, match="secret_key"):
        load_config(str(path))
    path.write_text(yaml.safe_dump({"cmq_api": {"port": "x"}}))
    with pytest.raises(ConfigError, match="cmq_api"):
        load_config(str(path))


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    return make_certs(tmp_path_factory.mktemp("cmq-api-tls"))


def test_CA1_SE2_https_when_the_config_has_tls(tmp_path: Path, certs: Certs, unique: str) -> None:
    tls = {"certfile": str(certs.server_cert), "keyfile": str(certs.server_key)}
    config = _config(tmp_path, tls=tls)
    with serve(tmp_path / "data", "--config", str(config), "--management-port", "off", "--metrics-port", "off",
               "--cmq-api-port", "0") as (proc, _port):
        port = proc.operator["CMQ API"]  # type: ignore[attr-defined]
        cmq = CmqClient(f"https://localhost:{port}", KEY_ID, SECRET, verify=str(certs.ca))
        cmq.ok("CreateQueue", queueName=unique)
        assert cmq.ok("ListQueue", searchWord=unique)["totalCount"] == 1


def test_Q5_stopping_gateway_answers_waiting_long_polls(tmp_path: Path, unique: str) -> None:
    """A gateway that stops does not hold a 30 s long poll open: it is answered 7000 at once."""
    import threading
    import time

    from tests.integration.cmq_gateway import admin, cmq_gateway

    box: dict[str, object] = {}
    with cmq_gateway(str(tmp_path)) as (_gw, url):
        cmq = admin(url)
        cmq.ok("CreateQueue", queueName=unique)
        def poll() -> None:
            box["asked"] = time.monotonic()
            box["answer"] = admin(url).call("ReceiveMessage", queueName=unique, pollingWaitSeconds=30)
            box["answered"] = time.monotonic()
        poller = threading.Thread(target=poll)
        poller.start()
        time.sleep(0.5)  # the poll waits (if not yet, the stop refuses it and the test fails)
    poller.join(60)
    assert box["answer"]["code"] == 7000  # type: ignore[index]
    # Answered by the stop, before its own 30 s wait ended (the order, not a speed).
    assert box["answered"] - box["asked"] < 30  # type: ignore[operator]


def test_CA1_config_section_cmq_api(tmp_path: Path) -> None:
    from gateway.config import OFF, CmqKey

    path = tmp_path / "gateway.yaml"
    path.write_text(yaml.safe_dump({"cmq_api": {"port": 15999, "host": "127.0.0.1"}, "tls": {
        "certfile": "c.pem", "cmq_api": False}, "users": [
        {"name": "a", "password": "a", "cmq_keys": [{"secret_id": "AKID1", "secret_key": "x", "vhost": "orders"}]}]}))
    cfg = load_config(str(path))
    assert (cfg.cmq_api_port, cfg.cmq_api_host) == (15999, "127.0.0.1")
    assert cfg.cmq_keys == {"AKID1": CmqKey("a", "x", "orders")}
    assert cfg.tls is not None and cfg.tls.cmq_api is False
    path.write_text("cmq_api: off\n")
    assert load_config(str(path)).cmq_api_port == OFF


def test_CA1_M1_vhost_from_the_key_or_the_request(unique: str) -> None:
    """M1: a request acts in its ``vhost`` parameter, else its key's vhost, else ``/``."""
    from gateway.auth import Permission, User, UserDB, hash_password
    from gateway.config import CmqKey
    from tests.integration.cmq_gateway import cmq_gateway

    users = UserDB({"ops": User("ops", hash_password("ops"))},
                   {("ops", "/"): Permission(), ("ops", "orders"): Permission()}, ["/", "orders"], frozenset())
    keys = {"AKIDorders": CmqKey("ops", "k1", "orders"), "AKIDroot": CmqKey("ops", "k2")}
    with cmq_gateway(None, users=users, cmq_keys=keys) as (gw, url):
        CmqClient(url, "AKIDorders", "k1").ok("CreateQueue", queueName=unique)
        assert unique in gw.broker.vhosts["orders"].queues and unique not in gw.broker.vhosts["/"].queues
        root = CmqClient(url, "AKIDroot", "k2")
        assert root.ok("ListQueue", searchWord=unique)["totalCount"] == 0
        assert CmqClient(url, "AKIDroot", "k2", vhost="orders").ok("ListQueue", searchWord=unique)["totalCount"] == 1
