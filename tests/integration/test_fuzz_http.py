"""scripts/fuzz_http.py --requests, small (SE5, CA1): well-formed requests with hostile
contents (management JSON bodies and query strings, CMQ API actions) against a gateway on each
store are never an HTTP 500, never CMQ's 6000, never a traceback in its log, and leave nothing
behind that breaks a restart, an export/import round trip or a list."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.cmq_gateway import STORES

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("store", STORES)
def test_SE5_CA1_fuzzed_requests_are_never_a_500_on_either_store(store: str) -> None:
    # A nats-server of the run's own: the after phase's restarts and exports see only what
    # this fuzz made, not the objects other tests' gateways leave on the session's server.
    nats = ["--nats", "jetstream"] if store == "jetstream" else []
    done = subprocess.run([sys.executable, "scripts/fuzz_http.py", "--seconds", "0", "--requests", "1200",
                           "--seed", "7", *nats], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-5000:] + done.stderr[-3000:]
    report = json.loads(done.stdout[done.stdout.index("{\n"):])
    fuzzed = report["fuzzed_requests"]
    assert fuzzed["by_kind"] == {"body": 400, "query": 400, "cmq": 400}, fuzzed
    assert (fuzzed["internal_errors"], report["tracebacks_in_log"]) == (0, 0), fuzzed["first_internal_errors"]
    # What the requests left behind breaks nothing later: a stop and a kill -9 keep every
    # durable object, the export is imported whole by a fresh gateway and exported back equal,
    # and every list (management, CMQ API, AMQP passive declares) answers (the after phase).
    after = report["after"]
    assert after["problems"] == 0, after["first_problems"]
    assert after["import"]["complete"] is True and sum(after["objects"].values()) >= 10, after
    # The requests reached the handlers, not only the login: successes and refusals of each kind.
    status = fuzzed["status"]
    assert status.get("body 400") and status.get("query 200") and fuzzed["cmq_codes"].get("0"), fuzzed
