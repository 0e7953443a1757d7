"""W2/SE1 and issue 30: a refused login is written to the gateway's log (user, mechanism, peer
address and why: unknown user, wrong password, a loopback-only user from elsewhere), never the
password, and the audit record tells the causes apart. The client still gets RabbitMQ's words,
the same for an unknown user and a wrong password, so it cannot probe user names."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import paho.mqtt.client as paho
import pika
import pytest

from gateway.config import AuditSettings
from gateway.server import gateway_in_thread

SECRET = "s3cret-never-logged"


def _audit(dir_: Path) -> list[dict]:
    return [json.loads(line) for f in sorted(dir_.rglob("*.jsonl*")) for line in f.read_text().splitlines()]


def _amqp_login(port: int, user: str, password: str) -> str:
    with pytest.raises(pika.exceptions.ProbableAuthenticationError) as refused:
        pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port, "/", pika.PlainCredentials(user, password)))
    return str(refused.value)


def _mqtt_login(port: int, user: str, password: str) -> int:
    c = paho.Client(paho.CallbackAPIVersion.VERSION2, protocol=paho.MQTTv311)
    c.username_pw_set(user, password)
    codes: list[int] = []
    c.on_connect = lambda _c, _u, _f, rc, _p: codes.append(int(rc.value if hasattr(rc, "value") else rc))
    c.connect("127.0.0.1", port)
    while not codes:
        c.loop(0.1)
    c.disconnect()
    return codes[0]


def test_W2_refused_logins_are_logged_and_told_apart(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="cmq_gateway")
    with gateway_in_thread(hosts=("127.0.0.1",), data_dir=None, audit=AuditSettings(dir=str(tmp_path)),
                           mqtt_port=0, mqtt_host="127.0.0.1") as gw:
        wrong = _amqp_login(gw.port, "guest", SECRET)
        unknown = _amqp_login(gw.port, "nobody", SECRET)
        # The client is told the same for both, as RabbitMQ does.
        assert wrong == unknown
        assert "Login was refused using authentication mechanism PLAIN" in wrong
        assert _mqtt_login(gw.mqtt.port, "guest", SECRET) != 0
        assert _mqtt_login(gw.mqtt.port, "ghost", SECRET) != 0
        gw.audit.flush(10)
    lines = [r.getMessage() for r in caplog.records if "login refused" in r.getMessage()]
    assert len(lines) == 4, lines
    assert "user 'guest', mechanism PLAIN, from 127.0.0.1:" in lines[0] and lines[0].endswith("wrong password")
    assert "user 'nobody'" in lines[1] and lines[1].endswith("unknown user")
    assert lines[2].startswith("MQTT login refused: user 'guest'") and lines[2].endswith("wrong password")
    assert "user 'ghost'" in lines[3] and lines[3].endswith("unknown user")
    assert all(SECRET not in r.getMessage() for r in caplog.records)
    failures = [(r["user"], r["reason"].split(":")[0], r.get("protocol")) for r in _audit(tmp_path)
                if r["event"] == "auth_failure"]
    assert failures == [("guest", "wrong password", None), ("nobody", "unknown user", None),
                        ("guest", "wrong password", "mqtt"), ("ghost", "unknown user", "mqtt")]
    assert SECRET not in "".join(f.read_text() for f in tmp_path.rglob("*.jsonl*"))
