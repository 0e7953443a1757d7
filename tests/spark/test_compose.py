"""compose/: the services, ports and volumes the README promises, a gateway command the real
CLI accepts, and a configuration whose user a remote client can log in as (no Docker engine
runs here, so the files are checked as data, and the configuration on a real gateway)."""

from __future__ import annotations

import socket
from pathlib import Path

import pika
import pika.exceptions
import pytest
import yaml

from gateway.cli import build_parser  # a missing build_parser fails this module loudly
from gateway.config import load_config
from gateway.server import gateway_in_thread

COMPOSE = Path(__file__).resolve().parents[2] / "compose"


def load() -> dict:
    return yaml.safe_load((COMPOSE / "docker-compose.yml").read_text())


def test_compose_services_ports_and_volumes() -> None:
    doc = load()
    services = doc["services"]
    assert sorted(services) == ["gateway", "spark-master", "spark-worker"]
    assert services["gateway"]["ports"] == ["5672:5672", "15672:15672", "15692:15692"]
    assert services["gateway"]["volumes"] == [
        "data:/data", "audit:/audit", "./gateway.yaml:/etc/cmq-gateway/gateway.yaml:ro"]
    # Spark only ever reads the audit log.
    assert "audit:/audit:ro" in services["spark-master"]["volumes"]
    assert services["spark-worker"]["volumes"] == ["audit:/audit:ro"]
    assert sorted(doc["volumes"]) == ["audit", "data", "reports"]
    assert services["spark-worker"]["command"][2] == "spark://spark-master:7077"


def test_compose_gateway_command_parses_with_the_real_cli() -> None:
    command = load()["services"]["gateway"]["command"]
    assert command[0] == "cmq-gateway"
    args = build_parser().parse_args(command[1:])
    assert (args.command, args.config, args.host, args.port, args.data_dir, args.audit_dir) == (
        "serve", "/etc/cmq-gateway/gateway.yaml", "0.0.0.0", 5672, "/data", "/audit")


def test_dockerfile_default_command_is_the_compose_command() -> None:
    text = (COMPOSE / "Dockerfile").read_text()
    cmd = next(line for line in text.splitlines() if line.startswith("CMD "))
    assert yaml.safe_load(cmd[4:]) == load()["services"]["gateway"]["command"]


def _compose_user() -> tuple[str, str]:
    raw = yaml.safe_load((COMPOSE / "gateway.yaml").read_text())
    (user,) = raw["users"]
    return user["name"], user["password"]


def test_compose_config_has_a_remote_user_with_rights_on_the_default_vhost() -> None:
    cfg = load_config(str(COMPOSE / "gateway.yaml"))
    name, _ = _compose_user()
    assert name != "guest" and name not in cfg.users.loopback_users
    assert (cfg.data_dir, cfg.audit.dir) == ("/data", "/audit")  # the compose volumes


def _own_address() -> str:
    """This machine's address on its network (not loopback): the source address a client
    through a port mapping has, as seen by the gateway."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("192.0.2.1", 9))  # no packet is sent: this only picks the route's address
        except OSError:
            pytest.skip("this machine has no IPv4 route off loopback")
        addr = s.getsockname()[0]
    if addr.startswith("127."):
        pytest.skip("this machine has no IPv4 address off loopback")
    return str(addr)


def test_compose_user_logs_in_from_off_loopback_where_guest_cannot() -> None:
    """README (compose): guest is loopback-only, so remote clients use the configured user."""
    addr = _own_address()
    name, password = _compose_user()

    def login(user: str, pw: str, port: int) -> None:
        conn = pika.BlockingConnection(pika.URLParameters(f"amqp://{user}:{pw}@{addr}:{port}/%2F"))
        conn.channel().queue_declare("", exclusive=True)  # the user's rights on "/" too
        conn.close()

    with gateway_in_thread(port=0, hosts=("0.0.0.0",)) as gw, \
            pytest.raises(pika.exceptions.ProbableAuthenticationError):
        login("guest", "guest", gw.port)
    users = load_config(str(COMPOSE / "gateway.yaml")).users
    with gateway_in_thread(port=0, hosts=("0.0.0.0",), users=users) as gw:
        login(name, password, gw.port)
