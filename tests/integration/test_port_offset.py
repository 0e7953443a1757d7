"""Running beside RabbitMQ, Mosquitto or another gateway (issue 30): `--port-offset N` moves
every listener still on its default port by N; an offset that would land a listener on another's
default port is refused in one line; a start that finds several ports taken names them all in
one line, and a port given to two of the gateway's own listeners says so; the start-up lines
name the data and audit directories, and a config without guest says so."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pika

from tests.integration.test_startup import ROOT, one_line, run_serve

DEFAULTS = (5672, 15672, 15692, 1883, 15680)  # no tls section: no AMQPS, no MQTTS


def _free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False


def _free_offset(start: int, avoid: int = 0) -> int:
    """An offset under which every default port, and each 10 above it, is free on loopback."""
    for n in range(start, start + 4000, 37):
        if all(_free(d + n) and _free(d + n + 10) for d in DEFAULTS) and n != avoid:
            return n
    raise RuntimeError("no free offset")


@contextlib.contextmanager
def _serve(data_dir: Path, *args: str) -> Iterator[tuple[subprocess.Popen[str], list[str]]]:
    proc = subprocess.Popen([sys.executable, "-m", "gateway", "serve", "--host", "127.0.0.1", "--data-dir",
                             str(data_dir), *args], cwd=ROOT, stderr=subprocess.PIPE, text=True)
    lines: list[str] = []
    try:
        assert proc.stderr is not None
        deadline = time.monotonic() + 60
        while not any(line.startswith("cmq-gateway: CMQ API on") for line in lines):
            assert time.monotonic() < deadline and proc.poll() is None, lines
            line = proc.stderr.readline()
            if "cmq-gateway:" in line:
                lines.append(line.strip())
        yield proc, lines
    finally:
        proc.terminate()
        proc.wait(timeout=60)


def test_port_offset_runs_two_gateways_side_by_side(tmp_path: Path) -> None:
    n = _free_offset(21000)
    with _serve(tmp_path / "gw1", "--port-offset", str(n)) as (_p1, one), \
            _serve(tmp_path / "gw2", "--port-offset", str(n + 10)) as (_p2, two):
        for lines, offset in ((one, n), (two, n + 10)):
            said = "\n".join(lines)
            assert f"listening on 127.0.0.1:{5672 + offset} (data dir " in said
            assert f"MQTT on 127.0.0.1:{1883 + offset}" in said
            assert f"management API on http://127.0.0.1:{15672 + offset}/" in said
            assert f"metrics on http://127.0.0.1:{15692 + offset}/" in said
            assert f"CMQ API on http://127.0.0.1:{15680 + offset}/" in said
            conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", 5672 + offset))
            assert conn.channel().is_open
            conn.close()
        assert f"audit dir {tmp_path / 'gw1' / 'audit'})" in one[0]


def test_explicit_ports_win_over_the_offset(tmp_path: Path) -> None:
    n = _free_offset(23000)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with _serve(tmp_path / "gw", "--port-offset", str(n), "--port", str(port), "--mqtt-port", "off") as (_p, lines):
        said = "\n".join(lines)
        assert f"listening on 127.0.0.1:{port} " in said
        assert f"management API on http://127.0.0.1:{15672 + n}/" in said
        assert "MQTT on" not in said


def test_an_offset_onto_another_listener_s_default_is_refused() -> None:
    done = run_serve("--port-offset", "1")
    assert (done.returncode, one_line(done)) == (
        2, "cmq-gateway: --port-offset 1: puts AMQPS on port 5672, the default port of AMQP: "
           "choose an offset that moves no listener onto another's default")


def test_every_taken_port_is_named_in_one_line() -> None:
    with socket.socket() as a, socket.socket() as b:
        for s in (a, b):
            s.bind(("127.0.0.1", 0))
            s.listen()
        pa, pb = a.getsockname()[1], b.getsockname()[1]
        done = run_serve("--port", str(pa), "--management-port", str(pb))
    line = one_line(done)
    assert done.returncode == 1
    assert f"cannot listen on 127.0.0.1:{pa}: port {pa} is in use" in line
    assert f"cannot listen on 127.0.0.1:{pb} (management API): port {pb} is in use" in line
    assert line.endswith("or move every listener at once with --port-offset N")


def test_a_port_given_to_two_own_listeners_names_them() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    done = run_serve("--port", str(port), "--management-port", str(port))
    assert (done.returncode, one_line(done)) == (
        1, f"cmq-gateway: port {port} is given to both AMQP (--port) and the management API "
           "(--management-port): choose another for one of them")


def test_a_config_without_guest_says_so(tmp_path: Path) -> None:
    (tmp_path / "gw.yaml").write_text('users: [{name: app, password: pw, tags: [administrator]}]\n'
                                      'permissions: [{user: app, vhost: "/", configure: ".*", write: ".*", read: ".*"}]\n')
    n = _free_offset(25000)
    with _serve(tmp_path / "gw", "--config", str(tmp_path / "gw.yaml"), "--port-offset", str(n)) as (_p, lines):
        assert "cmq-gateway: no guest user: the config's users replace the default guest/guest" in lines
