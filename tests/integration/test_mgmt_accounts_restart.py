"""SE4: users, vhosts and permissions made over the management API survive a restart of the
real `cmq-gateway serve` process (killed, and stopped), and so do deletions of users the
config file names."""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import pika
import pika.exceptions
import pytest
import requests

from tests.integration.test_process import serve

GUEST = ("guest", "guest")


def api(proc: Any, method: str, path: str, auth: tuple[str, str] = GUEST, body: Any = None) -> requests.Response:
    url = f"http://127.0.0.1:{proc.operator['management API']}{path}"
    return requests.request(method, url, json=body, auth=auth, timeout=30)


def amqp_login(port: int, user: str, password: str, vhost: str) -> None:
    params = pika.ConnectionParameters("127.0.0.1", port, vhost, pika.PlainCredentials(user, password),
                                       connection_attempts=1, blocked_connection_timeout=30)
    pika.BlockingConnection(params).close()


def stop(proc: Any) -> None:
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=30)


def test_SE4_users_vhosts_permissions_made_over_http_survive_a_restart(tmp_path: Path) -> None:
    config = tmp_path / "gateway.yaml"
    config.write_text("users:\n"
                      "  - {name: guest, password: guest, tags: [administrator]}\n"
                      "  - {name: bob, password: bobpw, tags: [management]}\n"
                      "vhosts: [\"/\"]\n"
                      "permissions:\n"
                      "  - {user: guest, vhost: \"/\", configure: \".*\", write: \".*\", read: \".*\"}\n"
                      "  - {user: bob, vhost: \"/\", configure: \".*\", write: \".*\", read: \".*\"}\n")
    data = tmp_path / "data"
    with serve(data, "--config", str(config)) as (proc, port):
        assert api(proc, "PUT", "/api/vhosts/orders").status_code == 201
        assert api(proc, "PUT", "/api/users/alice", body={"password": "alicepw", "tags": "monitoring"}).status_code == 201
        assert api(proc, "PUT", "/api/permissions/orders/alice",
                   body={"configure": "^alice-", "write": ".*", "read": ".*"}).status_code == 201
        assert api(proc, "DELETE", "/api/users/bob").status_code == 204
        amqp_login(port, "alice", "alicepw", "orders")
        proc.kill()  # a crash: every change was durable when it was answered
        proc.wait(timeout=30)
    with serve(data, "--config", str(config)) as (proc, port):
        amqp_login(port, "alice", "alicepw", "orders")  # user, vhost and permission are back
        who = api(proc, "GET", "/api/whoami", ("alice", "alicepw"))
        assert (who.status_code, who.json()["tags"]) == (200, ["monitoring"])
        perm = api(proc, "GET", "/api/permissions/orders/alice").json()
        assert (perm["configure"], perm["write"], perm["read"]) == ("^alice-", ".*", ".*")
        # The config names bob, but his deletion over HTTP stands.
        assert api(proc, "GET", "/api/users/bob").status_code == 404
        with pytest.raises(pika.exceptions.ProbableAuthenticationError):
            amqp_login(port, "bob", "bobpw", "/")
        # The permission's pattern is enforced after the restart too (SE1 over HTTP).
        assert api(proc, "PUT", "/api/queues/orders/alice-q", ("alice", "alicepw"), {}).status_code == 201
        assert api(proc, "PUT", "/api/queues/orders/other", ("alice", "alicepw"), {}).status_code == 401
        assert api(proc, "DELETE", "/api/vhosts/orders").status_code == 204
        assert api(proc, "PUT", "/api/users/alice", body={"password": "new", "tags": ""}).status_code == 204
        stop(proc)
    with serve(data, "--config", str(config)) as (proc, port):
        assert api(proc, "GET", "/api/vhosts/orders").status_code == 404
        assert api(proc, "GET", "/api/users/alice").json()["tags"] == []
        assert api(proc, "GET", "/api/whoami", ("alice", "new")).status_code == 401  # no tags: no API
        with pytest.raises(pika.exceptions.ProbableAccessDeniedError):
            amqp_login(port, "alice", "new", "orders")
        amqp_login(port, "guest", "guest", "/")
