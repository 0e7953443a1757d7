"""Users PUT with a password hash as RabbitMQ takes them (SPEC M1, SE1): the same bodies sent to
RabbitMQ's management API on this machine (127.0.0.1:15672, guest/guest) and to the gateway's,
on both stores, then a login over AMQP with the password on each. A user exported from a
RabbitMQ that hashed with sha512 or md5, or made without a password (EXTERNAL only), must come
across by ``PUT /api/users`` as it does by a definitions import; the gateway refused them."""

from __future__ import annotations

import base64
import hashlib
import os
import sys
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

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
PASSWORD = "s3cret"


def _hash(digest: Callable[[bytes], Any], password: str = PASSWORD) -> str:
    salt = os.urandom(4)
    return base64.b64encode(salt + digest(salt + password.encode()).digest()).decode()


# (body, whether RabbitMQ 3.10.8 lets PASSWORD log in): taken alike by both.
TAKEN: list[tuple[dict[str, Any], bool]] = [
    ({"password_hash": _hash(hashlib.sha512), "hashing_algorithm": "rabbit_password_hashing_sha512"}, True),
    ({"password_hash": _hash(hashlib.md5), "hashing_algorithm": "rabbit_password_hashing_md5"}, True),
    ({"password_hash": _hash(hashlib.sha256), "hashing_algorithm": "rabbit_password_hashing_sha256"}, True),
    ({"password_hash": _hash(hashlib.sha256)}, True),
    ({"password_hash": ""}, False),
    ({}, False),
    ({"password": PASSWORD}, True),
]
# RabbitMQ refuses these too (400 ["not_base64", value]).
NOT_BASE64: list[dict[str, Any]] = [{"password_hash": "!!!"}, {"password_hash": 5}]
# RabbitMQ stores these, and the user can never log in there: the gateway refuses them (400).
NEVER_LOGS_IN: list[dict[str, Any]] = [
    {"password_hash": _hash(hashlib.sha256), "hashing_algorithm": "rabbit_password_hashing_sha512"},
    {"password_hash": _hash(hashlib.sha512), "hashing_algorithm": "rabbit_password_hashing_foo"},
]


def _logs_in(port: int, user: str) -> bool:
    try:
        pika.BlockingConnection(pika.ConnectionParameters(
            "127.0.0.1", port, "/", pika.PlainCredentials(user, PASSWORD), connection_attempts=1)).close()
        return True
    except pika.exceptions.AMQPConnectionError:
        return False


def _put(base: str, user: str, body: dict[str, Any]) -> requests.Response:
    r = requests.put(f"{base}/api/users/{user}", json={"tags": "", **body}, auth=AUTH, timeout=30)
    if r.status_code in (201, 204):
        assert requests.put(f"{base}/api/permissions/%2F/{user}", auth=AUTH, timeout=30,
                            json={"configure": ".*", "write": ".*", "read": ".*"}).status_code in (201, 204)
    return r


@pytest.mark.parametrize("store", STORES)
def test_M1_SE1_users_put_with_rabbitmq_s_hashes_log_in_as_on_rabbitmq(tmp_path: Path, store: str) -> None:
    made: list[str] = []
    with nats_store(store if store == "jetstream" else None) as store_url:
        gw = Served(tmp_path / "data", tmp_path / "gateway.log", store=store_url,
                    config=write_config(tmp_path / "gateway.yaml"), management_port=0)
        ours = f"http://127.0.0.1:{gw.ports['management_port']}"
        try:
            for i, (body, logs_in) in enumerate(TAKEN):
                user = f"lead-{uuid.uuid4().hex[:8]}-{i}"
                made.append(user)
                rabbit, gateway = _put(RABBIT, user, body), _put(ours, user, body)
                assert (gateway.status_code, rabbit.status_code) == (201, 201), (body, gateway.text)
                assert (_logs_in(gw.port, user), _logs_in(5672, user)) == (logs_in, logs_in), body
                shown = [requests.get(f"{b}/api/users/{user}", auth=AUTH, timeout=30).json() for b in (ours, RABBIT)]
                assert shown[0]["hashing_algorithm"] == shown[1]["hashing_algorithm"], body
                if "password_hash" in body:
                    assert shown[0]["password_hash"] == shown[1]["password_hash"] == body["password_hash"]
            for body in NOT_BASE64:
                user = f"lead-{uuid.uuid4().hex[:8]}-b64"
                made.append(user)
                rabbit, gateway = _put(RABBIT, user, body), _put(ours, user, body)
                assert gateway.status_code == rabbit.status_code == 400, body
                assert gateway.json()["reason"] == rabbit.json()["reason"], body
                assert requests.get(f"{ours}/api/users/{user}", auth=AUTH, timeout=30).status_code == 404
            for body in NEVER_LOGS_IN:
                user = f"lead-{uuid.uuid4().hex[:8]}-never"
                made.append(user)
                rabbit, gateway = _put(RABBIT, user, body), _put(ours, user, body)
                assert (gateway.status_code, rabbit.status_code) == (400, 201), body
                assert not _logs_in(5672, user)
                assert requests.get(f"{ours}/api/users/{user}", auth=AUTH, timeout=30).status_code == 404
            # Each user taken is the same after a restart (SE4), and logs in as before.
            gw = gw.restarted(kill=False)
            for i, (_, logs_in) in enumerate(TAKEN):
                assert _logs_in(gw.port, made[i]) == logs_in
        finally:
            gw.stop()
            for user in made:
                requests.delete(f"{RABBIT}/api/users/{user}", auth=AUTH, timeout=30)
