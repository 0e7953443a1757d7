"""`cmq-gateway perf mqtt` (issue 13): the publish -> deliver measurement runs against the
gateway's MQTT listener, and against the gateway and Mosquitto in one run with ratios.
No thresholds: these prove the tool measures, not how fast anything is."""

from __future__ import annotations

import json
from typing import Any

import pytest

from gateway.perf.cli import main
from tests.integration.mqtt_fixtures import MOSQUITTO, _mosquitto_up, gw_fixture  # noqa: F401


def test_perf_mqtt_measures_both_qos_levels_on_the_gateway(gw: Any, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["mqtt", "--uri-a", f"mqtt://guest:guest@127.0.0.1:{gw.mqtt.port}", "--name-a", "gateway",
                 "--count", "300", "--size", "32", "--window", "20", "--json", "--quiet"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0
    assert out["config"]["brokers"] == ["gateway"]
    for qos in ("0", "1"):
        r = out["medians"][qos]["gateway"]
        assert r["received"] == 300
        assert r["rate"] > 0
        assert 0 <= r["p50_ms"] <= r["p99_ms"]


def test_perf_mqtt_ratio_table_against_mosquitto(gw: Any, capsys: pytest.CaptureFixture[str]) -> None:
    """Mosquitto is a, the gateway b, alternating, medians of two runs: the table has b / a."""
    assert _mosquitto_up(), "Mosquitto is expected on 127.0.0.1:1883"
    code = main(["mqtt", "--uri-b", f"mqtt://guest:guest@127.0.0.1:{gw.mqtt.port}", "--qos", "1",
                 "--count", "200", "--window", "10", "--repeat", "2", "--quiet"])
    text = capsys.readouterr().out
    assert code == 0
    assert "| QoS | figure | Mosquitto | cmq-gateway | cmq-gateway / Mosquitto |" in text
    rate_row = next(line for line in text.splitlines() if line.startswith("| 1 | msg/s |"))
    assert rate_row.rstrip(" |").endswith("x")
    assert f"127.0.0.1:{MOSQUITTO}" not in text  # names, not addresses


def test_perf_mqtt_refuses_a_non_mqtt_uri(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["mqtt", "--uri-a", "amqp://guest:guest@127.0.0.1:5999/", "--name-a", "x"]) == 2
    assert "mqtt://" in capsys.readouterr().err


def test_perf_mqtt_persistent_session_leaves_no_queue_behind(gw: Any, capsys: pytest.CaptureFixture[str]) -> None:
    """--persistent-session: the subscriber's queue is durable (PUBACK after the fsync, MQ4)
    while it runs, and the run ends the session, so no amq.mqtt-subscription-perf-* queue stays."""
    code = main(["mqtt", "--uri-a", f"mqtt://guest:guest@127.0.0.1:{gw.mqtt.port}", "--name-a", "gateway",
                 "--qos", "1", "--count", "200", "--window", "20", "--persistent-session", "--json", "--quiet"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0
    assert out["config"]["persistent"] is True
    assert out["medians"]["1"]["gateway"]["received"] == 200
    left = [q for q in gw.broker.vhost("/").queues if q.startswith("amq.mqtt-subscription-perf-sub-")]
    assert left == []
