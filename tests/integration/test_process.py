"""The real `cmq-gateway serve` process: restart durability, SIGTERM, a taken port, --help."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pika
import pika.exceptions
import pytest

from tests.integration.differential import blocking

ROOT = Path(__file__).resolve().parents[2]
# The first address of a line: loopback with --host 127.0.0.1, 0.0.0.0 without a --host.
LISTENING = re.compile(r"listening on (?:127\.0\.0\.1|0\.0\.0\.0):(\d+)")
OPERATOR = re.compile(r"(management API|metrics|CMQ API) on https?://(?:127\.0\.0\.1|0\.0\.0\.0):(\d+)/")
AMQPS = re.compile(r"AMQPS \(TLS\) on (?:127\.0\.0\.1|0\.0\.0\.0):(\d+)")
MQTT = re.compile(r"MQTT on (?:127\.0\.0\.1|0\.0\.0\.0):(\d+)")


@contextmanager
def serve(data_dir: Path, *extra: str, host: str | None = "127.0.0.1",
          niceness: int = 0) -> Iterator[tuple[subprocess.Popen[str], int]]:
    """`cmq-gateway serve --port 0` on loopback (every address with ``host=None``); yields the
    process and its port (and sets ``proc.operator``, {name: port}, ``proc.tls_port``, None
    without a TLS listener, and ``proc.lines``, what it said while starting). ``niceness``
    lowers the priority of the gateway and of the processes it starts."""
    # The management and metrics ports default to RabbitMQ's 15672/15692 (which the local
    # RabbitMQ's management plugin may hold): free ports here, unless the test names them.
    ports = [] if "--management-port" in extra else ["--management-port", "0", "--metrics-port", "0"]
    if "--cmq-api-port" not in extra:  # its default 15680 may be another gateway's
        ports += ["--cmq-api-port", "0"]
    if "--mqtt-port" not in extra:
        ports += ["--mqtt-port", "0"]  # 1883 is Mosquitto's (MQ1); ``proc.mqtt_port``
    hosts = [] if host is None else ["--host", host]
    proc = subprocess.Popen([sys.executable, "-m", "gateway", "serve", *hosts, "--port", "0",
                             "--data-dir", str(data_dir), *ports, *extra],
                            cwd=ROOT, stderr=subprocess.PIPE, text=True,
                            preexec_fn=(lambda: os.nice(niceness)) if niceness else None)
    assert proc.stderr is not None
    port = None
    proc.operator = {}  # type: ignore[attr-defined]
    proc.tls_port = None  # type: ignore[attr-defined]
    proc.lines = []  # type: ignore[attr-defined]
    proc.mqtt_port = None  # type: ignore[attr-defined]
    args = [*ports, *extra]
    # How many "<name> on http://…" lines to wait for: management, metrics and the CMQ API
    # unless "off".
    expect_operator = sum(1 for flag in ("--management-port", "--metrics-port", "--cmq-api-port")
                          if flag not in args or args[args.index(flag) + 1] != "off")
    for line in proc.stderr:
        proc.lines.append(line)  # type: ignore[attr-defined]
        if m := LISTENING.search(line):
            port = int(m.group(1))
        elif m := MQTT.search(line):
            proc.mqtt_port = int(m.group(1))  # type: ignore[attr-defined]
        elif m := AMQPS.search(line):
            proc.tls_port = int(m.group(1))  # type: ignore[attr-defined]
        elif m := OPERATOR.search(line):
            proc.operator[m.group(1)] = int(m.group(2))  # type: ignore[attr-defined]
        if port is not None and len(proc.operator) == expect_operator:  # type: ignore[attr-defined]
            break
    assert port is not None, "the gateway never said where it listens"
    # Keep draining stderr so the child never blocks on a full pipe; what it says after the
    # start joins ``proc.lines`` once it exits (``proc.drain``, the thread, ends then).
    stderr = proc.stderr
    proc.drain = threading.Thread(target=lambda: proc.lines.append(stderr.read()), daemon=True)  # type: ignore[attr-defined]
    proc.drain.start()  # type: ignore[attr-defined]
    try:
        yield proc, port
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=30)


def _url(port: int) -> str:
    return f"amqp://guest:guest@127.0.0.1:{port}/%2F"


def test_restart_keeps_durable_state_and_sigterm_is_320(tmp_path: Path, unique: str) -> None:
    """M14 + store: durable exchange, queue, binding and persistent messages survive a
    restart; transient ones do not. SIGTERM closes clients with 320 CONNECTION_FORCED."""
    with serve(tmp_path) as (proc, port), blocking(_url(port)) as conn:
        ch = conn.channel()
        ch.confirm_delivery()
        ch.exchange_declare("dx", "direct", durable=True)
        ch.exchange_declare("tx", "direct", durable=False)
        ch.queue_declare("dq", durable=True)
        ch.queue_declare("tq", durable=False)
        ch.queue_bind("dq", "dx", "k")
        ch.basic_publish("dx", "k", b"persistent", pika.BasicProperties(delivery_mode=2))
        ch.basic_publish("dx", "k", b"transient", pika.BasicProperties(delivery_mode=1))
        ch.basic_publish("", "tq", b"in transient queue", pika.BasicProperties(delivery_mode=2))
        proc.send_signal(signal.SIGTERM)
        with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as closed:
            conn.process_data_events(time_limit=10)
        assert proc.wait(timeout=30) == 0
    assert closed.value.reply_code == 320
    assert closed.value.reply_text.startswith("CONNECTION_FORCED")

    with serve(tmp_path) as (_proc, port), blocking(_url(port)) as conn:
        ch = conn.channel()
        ch.exchange_declare("dx", "direct", durable=True, passive=True)
        ch.basic_publish("dx", "k", b"routed after restart", pika.BasicProperties(delivery_mode=2))
        bodies = []
        while (m := ch.basic_get("dq", auto_ack=True))[0] is not None:
            bodies.append(m[2])
        assert bodies == [b"persistent", b"routed after restart"]
        faults = []
        for name, declare in (("tx", lambda c: c.exchange_declare("tx", passive=True)),
                              ("tq", lambda c: c.queue_declare("tq", passive=True))):
            c = conn.channel()
            with pytest.raises(pika.exceptions.ChannelClosedByBroker) as e:
                declare(c)
            faults.append((name, e.value.reply_code))
        assert faults == [("tx", 404), ("tq", 404)]


def test_taken_port_is_one_line_exit_1(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run([sys.executable, "-m", "gateway", "serve", "--host", "127.0.0.1", "--port",
                               str(port), "--data-dir", str(tmp_path), "--management-port", "off",
                               "--metrics-port", "off"],
                              cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 1
    # Beside a RabbitMQ the first thing a user meets: the message names the options that move.
    assert done.stderr == (f"cmq-gateway: cannot listen on 127.0.0.1:{port}: port {port} is in use "
                           "(another AMQP broker?): choose another with --port, "
                           "or --management-port/--metrics-port for 15672/15692\n")


def test_help_explains_every_option() -> None:
    from gateway.cli import build_parser

    serve = build_parser()._subparsers._group_actions[0].choices["serve"]  # type: ignore[union-attr]
    text = serve.format_help()
    for option in ("--host", "--port", "--data-dir", "--config", "--audit-dir"):
        assert option in text
    assert "~/.local/share" in text or os.path.join(".local", "share", "cmq-gateway") in text
    done = subprocess.run([sys.executable, "-m", "gateway", "--help"], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0 and "serve" in done.stdout


def test_serve_starts_the_management_api_and_metrics(tmp_path: Path) -> None:
    """`cmq-gateway serve` serves the management API and /metrics beside AMQP (as RabbitMQ's
    15672 and 15692; free ports here), and says where."""
    import requests

    with serve(tmp_path) as (proc, port):
        mgmt, metrics = proc.operator["management API"], proc.operator["metrics"]  # type: ignore[attr-defined]
        overview = requests.get(f"http://127.0.0.1:{mgmt}/api/overview", auth=("guest", "guest"), timeout=10)
        assert overview.status_code == 200
        assert overview.json()["product_name"] == "cmq-gateway"
        assert requests.get(f"http://127.0.0.1:{mgmt}/api/overview", timeout=10).status_code == 401
        scrape = requests.get(f"http://127.0.0.1:{metrics}/metrics", timeout=10)
        assert scrape.status_code == 200
        assert "cmq_gateway_connections" in scrape.text


def test_taken_management_port_is_one_line_exit_1(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run([sys.executable, "-m", "gateway", "serve", "--host", "127.0.0.1", "--port", "0",
                               "--data-dir", str(tmp_path), "--management-port", str(port),
                               "--metrics-port", "off", "--mqtt-port", "off"],
                              cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 1
    # One line: what the start had opened (the store's recovery summary) is not logged.
    assert done.stderr == (
        f"cmq-gateway: cannot listen on 127.0.0.1:{port} (management API): port {port} is in use "
        "(RabbitMQ's management plugin?): choose another with --management-port, or --management-port off\n")


def test_operator_ports_default_to_rabbitmq_s_and_can_be_turned_off() -> None:
    from gateway.cli import _operator_port, build_parser
    from gateway.config import OFF, parse_config

    args = build_parser().parse_args(["serve"])
    assert (args.management_port, args.metrics_port) == (None, None)
    assert _operator_port(None, None, 15672) == 15672  # nothing said: RabbitMQ's port
    assert _operator_port(None, 18000, 15672) == 18000  # the config file
    assert _operator_port(0, 18000, 15672) == 0  # the command line wins; 0 = a free port
    off = build_parser().parse_args(["serve", "--management-port", "off"]).management_port
    assert off == OFF and _operator_port(off, 18000, 15672) is None
    assert parse_config({"management": "off"}).management_port == OFF
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--metrics-port", "nope"])
