"""compose/: the services, ports and volumes the README promises, and a gateway command the
real CLI accepts (no Docker engine runs here, so the files are checked as data)."""

from __future__ import annotations

from pathlib import Path

import yaml

from gateway.cli import build_parser  # a missing build_parser fails this module loudly

COMPOSE = Path(__file__).resolve().parents[2] / "compose"


def load() -> dict:
    return yaml.safe_load((COMPOSE / "docker-compose.yml").read_text())


def test_compose_services_ports_and_volumes() -> None:
    doc = load()
    services = doc["services"]
    assert sorted(services) == ["gateway", "spark-master", "spark-worker"]
    assert services["gateway"]["ports"] == ["5672:5672", "15672:15672", "15692:15692"]
    assert services["gateway"]["volumes"] == ["data:/data", "audit:/audit"]
    # Spark only ever reads the audit log.
    assert "audit:/audit:ro" in services["spark-master"]["volumes"]
    assert services["spark-worker"]["volumes"] == ["audit:/audit:ro"]
    assert sorted(doc["volumes"]) == ["audit", "data", "reports"]
    assert services["spark-worker"]["command"][2] == "spark://spark-master:7077"


def test_compose_gateway_command_parses_with_the_real_cli() -> None:
    command = load()["services"]["gateway"]["command"]
    assert command[0] == "cmq-gateway"
    args = build_parser().parse_args(command[1:])
    assert (args.command, args.host, args.port, args.data_dir, args.audit_dir) == (
        "serve", "0.0.0.0", 5672, "/data", "/audit")


def test_dockerfile_default_command_is_the_compose_command() -> None:
    text = (COMPOSE / "Dockerfile").read_text()
    cmd = next(line for line in text.splitlines() if line.startswith("CMD "))
    assert yaml.safe_load(cmd[4:]) == load()["services"]["gateway"]["command"]
