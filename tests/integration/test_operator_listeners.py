"""Where `cmq-gateway serve` listens for the management API and /metrics, and what a taken
port says (issue 12): by default on every IPv4 and IPv6 address, as the AMQP listeners; a
--host or a configured host keeps one; a taken AMQP, AMQPS, management or metrics port is
one line naming the option that moves it."""

from __future__ import annotations

import random
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import requests
import yaml

from tests.integration.test_process import ROOT, serve
from tests.integration.tls_certs import Certs, make_certs

HANG_PROTECTION = 30.0


def _answers(url: str) -> int:
    return requests.get(url, auth=("guest", "guest"), timeout=HANG_PROTECTION).status_code


def _refused(host: str, port: int) -> bool:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family) as s:
        s.settimeout(HANG_PROTECTION)
        return s.connect_ex((host, port)) != 0


def test_management_and_metrics_listen_on_ipv4_and_ipv6_by_default(tmp_path: Path) -> None:
    with serve(tmp_path, host=None) as (proc, port):
        mgmt, metrics = proc.operator["management API"], proc.operator["metrics"]  # type: ignore[attr-defined]
        for host in ("127.0.0.1", "[::1]"):
            assert _answers(f"http://{host}:{mgmt}/api/overview") == 200
            assert _answers(f"http://{host}:{metrics}/metrics") == 200
        said = "".join(proc.lines)  # type: ignore[attr-defined]
        # One line each, every address (one port), as the AMQP line has them.
        assert f"listening on 0.0.0.0:{port}, [::]:{port}" in said
        assert f"management API on http://0.0.0.0:{mgmt}/, http://[::]:{mgmt}/\n" in said
        assert f"metrics on http://0.0.0.0:{metrics}/, http://[::]:{metrics}/\n" in said


def test_host_option_keeps_one_address(tmp_path: Path) -> None:
    with serve(tmp_path) as (proc, port):  # --host 127.0.0.1
        mgmt, metrics = proc.operator["management API"], proc.operator["metrics"]  # type: ignore[attr-defined]
        assert _answers(f"http://127.0.0.1:{mgmt}/api/overview") == 200
        assert _refused("::1", mgmt) and _refused("::1", metrics) and _refused("::1", port)


def test_configured_host_keeps_one_address(tmp_path: Path) -> None:
    config = tmp_path / "gateway.yaml"
    config.write_text(yaml.safe_dump({"management": {"host": "127.0.0.1", "port": 0},
                                      "metrics": {"host": "127.0.0.1", "port": 0}}))
    with serve(tmp_path / "data", "--config", str(config), host=None) as (proc, port):
        mgmt, metrics = proc.operator["management API"], proc.operator["metrics"]  # type: ignore[attr-defined]
        assert _answers(f"http://127.0.0.1:{metrics}/metrics") == 200
        assert _refused("::1", mgmt) and _refused("::1", metrics)
        assert not _refused("::1", port)  # the AMQP listeners keep their default, both


def _taken(family: socket.AddressFamily, host: str) -> socket.socket:
    if family == socket.AF_INET6:
        return _taken_on_ipv6_only(host)
    sock = socket.socket(family)
    sock.bind((host, 0))
    sock.listen()
    return sock


def _taken_on_ipv6_only(host: str) -> socket.socket:
    """A port listened on over IPv6 only, and free over IPv4. An ephemeral IPv6 port could be
    some other connection's local port over IPv4 at that moment (the CI saw the gateway find
    0.0.0.0:P taken too, once in a full run); so the port comes from below the kernel's
    ephemeral range, where no connect() takes one, and is checked free on IPv4 first."""
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    rng = random.Random()
    while True:
        port = rng.randrange(max(1024, low // 2), low)
        probe, sock = socket.socket(socket.AF_INET), socket.socket(socket.AF_INET6)
        try:
            probe.bind(("0.0.0.0", port))
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            sock.bind((host, port))
        except OSError:
            sock.close()
            continue
        finally:
            probe.close()
        sock.listen()
        return sock


MOVES = {
    "--port": "(another AMQP broker?): choose another with --port, "
              "or --management-port/--metrics-port for 15672/15692",
    "--management-port": "(RabbitMQ's management plugin?): choose another with --management-port, "
                         "or --management-port off",
    "--metrics-port": "(RabbitMQ's Prometheus plugin?): choose another with --metrics-port, or --metrics-port off",
    "--tls-port": "(another AMQPS broker?): choose another with --tls-port, or --tls-port off",
}
WHAT = {"--port": "", "--management-port": " (management API)", "--metrics-port": " (metrics)",
        "--tls-port": " (AMQPS)"}


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    return make_certs(tmp_path_factory.mktemp("tls"))


@pytest.mark.parametrize("option", list(MOVES))
@pytest.mark.parametrize("host", ["127.0.0.1", "::"])
def test_taken_port_names_the_option_that_moves_it(tmp_path: Path, certs: Certs, option: str, host: str) -> None:
    """Each port the gateway serves, taken before it starts (on IPv4 with --host, or only on
    IPv6 with the default every-address listeners): exit 1, one line naming its option."""
    config = tmp_path / "gateway.yaml"
    config.write_text(yaml.safe_dump({"tls": {"certfile": str(certs.server_cert), "keyfile": str(certs.server_key),
                                              "cacertfile": str(certs.ca)}}))
    v6 = ":" in host
    with _taken(socket.AF_INET6 if v6 else socket.AF_INET, host) as taken:
        port = taken.getsockname()[1]
        ports = {"--port": "0", "--management-port": "0", "--metrics-port": "0", "--tls-port": "0", option: str(port)}
        where = ["--host", host] if not v6 else []
        done = subprocess.run([sys.executable, "-m", "gateway", "serve", *where, "--data-dir", str(tmp_path / "data"),
                               "--config", str(config), *(x for kv in ports.items() for x in kv)],
                              cwd=ROOT, capture_output=True, text=True, timeout=60)
    address = f"[::]:{port}" if v6 else f"{host}:{port}"
    assert (done.returncode, done.stderr) == (
        1, f"cmq-gateway: cannot listen on {address}{WHAT[option]}: port {port} is in use {MOVES[option]}\n")
