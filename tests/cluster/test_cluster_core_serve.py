"""CL1: `serve --store nats://...` refuses, in one line and exit 2, a NATS it cannot use."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.support.natsd import NATS_SERVER, free_ports

SERVE = [sys.executable, "-m", "gateway", "serve", "--port", "0", "--mqtt-port", "off",
         "--cmq-api-port", "off", "--management-port", "off", "--metrics-port", "off"]


def _serve(store: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*SERVE, "--data-dir", str(tmp_path / "d"), "--store", store],
                          capture_output=True, text=True, timeout=60)


def test_CL1_unreachable_nats_is_one_line_and_exit_2(tmp_path: Path) -> None:
    (port,) = free_ports(1)
    done = _serve(f"nats://user:secret@127.0.0.1:{port}", tmp_path)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("cmq-gateway: cannot use NATS store nats://user:***@127.0.0.1:")
    assert "secret" not in done.stderr


def test_CL1_nats_without_jetstream_is_refused(tmp_path: Path) -> None:
    (port,) = free_ports(1)
    server = subprocess.Popen([NATS_SERVER, "-a", "127.0.0.1", "-p", str(port)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        import socket
        import time
        deadline = time.monotonic() + 10
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), 0.2).close()
                break
            except OSError:
                assert time.monotonic() < deadline
                time.sleep(0.05)
        done = _serve(f"nats://127.0.0.1:{port}", tmp_path)
    finally:
        server.kill()
        server.wait()
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        f"cmq-gateway: cannot use NATS store nats://127.0.0.1:{port}: JetStream is not enabled there "
        "(ServiceUnavailableError)"]


def test_CL1_store_must_be_a_nats_url(tmp_path: Path) -> None:
    done = _serve("redis://127.0.0.1:1", tmp_path)
    assert done.returncode == 2
    assert "nats://HOST:PORT" in done.stderr
