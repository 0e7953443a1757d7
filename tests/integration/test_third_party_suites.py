"""Other projects' own integration suites, unchanged, against RabbitMQ and the gateway.

kombu's ``t/integration/test_py_amqp.py`` and py-amqp's ``t/integration/test_rmq.py`` (from
the source distributions of the versions installed here; scripts/test.sh fetches them with
``pip download`` into .venv/third-party) are written for a RabbitMQ on RABBITMQ_HOST and
RABBITMQ_5672_TCP. Each runs once against RabbitMQ (where every test must pass, so the suite
itself works here) and once against the gateway on each store, where every test must pass
except those the README lists as not supported: on the JetStream store, kombu's four
priority-queue tests (priorities there order only what a gateway has pulled from the stream).
py-amqp's TLS tests are left out (``-k "not tls"``): they need RabbitMQ's own TLS port and
certificates; the gateway's TLS is tested in test_tls.py.
kombu's suite uses fixed queue names and leaves its queues behind (it expects a throwaway
broker): on the machine's shared RabbitMQ it runs in a vhost of its own, made for the run
through the management API and deleted after.
"""

from __future__ import annotations

import importlib.metadata
import os
import re
import subprocess
import sys
import uuid
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import requests

pytestmark = [pytest.mark.rabbitmq, pytest.mark.both_stores]

ROOT = Path(__file__).resolve().parents[2]
SUITES = ROOT / ".venv" / "third-party"

# The suite's tests the gateway on JetStream does not pass, by design (README, "Not supported").
NOT_SUPPORTED_ON_JETSTREAM = {
    "kombu": frozenset({f"t/integration/test_py_amqp.py::test_PyAMQPPriority::{name}" for name in (
        "test_publish_consume", "test_publish_requeue_consume", "test_simple_queue_publish_consume",
        "test_simple_buffer_publish_consume")}),
    "amqp": frozenset(),
}
SUITE = {"kombu": ["t/integration/test_py_amqp.py"], "amqp": ["t/integration/test_rmq.py", "-k", "not tls"]}


RABBIT_HTTP = "http://127.0.0.1:15672"


def run_suite(project: str, url: str, vhost: str | None = None,
              deselect: frozenset[str] = frozenset()) -> tuple[int, set[str]]:
    """(tests passed, ids of the tests that failed or errored) of ``project``'s suite on ``url``."""
    version = importlib.metadata.version(project)
    where = SUITES / f"{project}-{version}"
    if not (where / "t" / "integration").is_dir():
        pytest.fail(f"{where} is missing: scripts/test.sh fetches it "
                    f"(pip download --no-deps --no-binary :all: {project}=={version})")
    address = urlsplit(url)
    port = str(address.port)
    if vhost is not None:  # kombu's suite makes its URL as f"pyamqp://{host}:{port}": the vhost goes there
        assert project == "kombu"
        port += "/" + vhost
    env = {**os.environ, "RABBITMQ_HOST": address.hostname or "127.0.0.1", "RABBITMQ_5672_TCP": port}
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rfE",
                           "-W", "ignore", *SUITE[project],
                           *(arg for test in sorted(deselect) for arg in ("--deselect", test))],
                          cwd=where, env=env, capture_output=True, text=True, timeout=900)
    failed = set(re.findall(r"^(?:FAILED|ERROR) (\S+)", done.stdout, re.M))
    passed = re.search(r"(\d+) passed", done.stdout)
    assert passed is not None, done.stdout + done.stderr
    return int(passed.group(1)), failed


@pytest.fixture(scope="module")
def on_rabbitmq(rabbitmq_url: str) -> dict[str, int]:
    vhost = f"kombu-suite-{uuid.uuid4().hex[:10]}"
    api = requests.Session()
    api.auth = ("guest", "guest")
    try:
        api.put(f"{RABBIT_HTTP}/api/vhosts/{vhost}", timeout=30).raise_for_status()
    except requests.RequestException as e:
        pytest.fail(f"RabbitMQ's management API on {RABBIT_HTTP} is needed for a vhost of the suite's own: {e}")
    try:
        api.put(f"{RABBIT_HTTP}/api/permissions/{vhost}/guest", json={"configure": ".*", "write": ".*", "read": ".*"},
                timeout=30).raise_for_status()
        counts = {}
        for project in SUITE:
            passed, failed = run_suite(project, rabbitmq_url, vhost if project == "kombu" else None)
            assert failed == set(), f"{project}'s suite fails on RabbitMQ itself: {sorted(failed)}"
            counts[project] = passed
        return counts
    finally:
        api.delete(f"{RABBIT_HTTP}/api/vhosts/{vhost}", timeout=30)


@pytest.mark.parametrize("project", sorted(SUITE))
def test_M16_W4_M14_their_own_integration_suites_pass_on_the_gateway(on_rabbitmq: dict[str, int], gateway_url: str,
                                                                      project: str, request: pytest.FixtureRequest
                                                                      ) -> None:
    """The same tests pass as on RabbitMQ, but for what the README lists as not supported
    (left out by name: the suite reruns a failing test five times, two seconds apart)."""
    left_out = NOT_SUPPORTED_ON_JETSTREAM[project] if "jetstream" in request.node.name else frozenset()
    passed, failed = run_suite(project, gateway_url, deselect=left_out)
    assert failed == set()
    assert passed == on_rabbitmq[project] - len(left_out)
