"""scripts/fuzz_mqtt.py, small (SPEC MQ7, issue 26 "fuzzers per front end"): random MQTT
sessions of every packet type and property, malformed lengths and trickled bytes never get an
internal error, never kill the gateway, never leave a traceback in its log, and the canary
paho-mqtt client loses nothing; on both stores."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.cmq_gateway import STORES

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("store", STORES)
def test_MQ7_fuzzed_mqtt_sessions_never_an_internal_error_nor_a_crash(tmp_path: Path, store: str) -> None:
    """And what the sessions left behind (persistent sessions' amq.mqtt-... queues) survives a
    stop, a kill -9 and an export/import round trip, every list answering (the after phase)."""
    # A nats-server of the run's own: the after phase's restarts and exports see only what
    # this fuzz made, not the objects other tests' gateways leave on the session's server.
    nats = ["--nats", "jetstream"] if store == "jetstream" else []
    done = subprocess.run([sys.executable, "scripts/fuzz_mqtt.py", "--sessions", "60", "--seed", "11",
                           "--canary-seconds", "1", "--keep", str(tmp_path / "failed"), *nats],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert re.search(r"^sessions 60,", done.stdout, re.M), done.stdout
    assert "internal errors: 0, failed sessions: 0, tracebacks in the gateway log: 0, crashes: 0" in done.stdout
    assert re.search(r"lost 0, disconnects 0$", done.stdout, re.M), done.stdout
    assert re.search(r"^after problems: 0$", done.stdout, re.M), done.stdout
    assert "'complete': True" in done.stdout, done.stdout
    # The sessions reached the decoder's refusals and the session's answers, not only CONNECT.
    answers = re.search(r"^answers by code: (.*)$", done.stdout, re.M)
    assert answers is not None and "0x81" in answers.group(1), done.stdout
