"""A `cmq-gateway perf` killed with SIGKILL leaves no worker behind: each worker winds down
when its pipe to the main process closes (before, a worker read the closed pipe in a loop
and spun on a core of the machine under test until someone killed it)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.gateway_procs import GatewayProcess

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def gateway(tmp_path: Path) -> Iterator[GatewayProcess]:
    with GatewayProcess(tmp_path, "gw", management=False) as gw:
        yield gw


def _children(pid: int) -> list[int]:
    with open(f"/proc/{pid}/task/{pid}/children") as f:
        return [int(c) for c in f.read().split()]


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _workers(pid: int) -> list[int]:
    """The perf process's worker processes (spawned: their command line says spawn_main)."""
    found = []
    for child in _children(pid):
        try:
            with open(f"/proc/{child}/cmdline", "rb") as f:
                if b"spawn_main" in f.read():
                    found.append(child)
        except OSError:
            pass
    return found


@pytest.mark.parametrize("when", ["before go", "during the window"])
def test_perf_workers_end_when_the_main_process_is_killed(gateway: GatewayProcess, when: str) -> None:
    perf = subprocess.Popen([sys.executable, "-m", "gateway.perf", "--uri", gateway.url, "--rate", "50",
                             "--duration", "600", "--producers", "1", "--consumers", "1"],
                            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        workers: list[int] = []
        deadline = time.monotonic() + 120
        while len(workers) < 2 and time.monotonic() < deadline:
            workers = _workers(perf.pid)
            time.sleep(0.05)
        assert len(workers) == 2, "the perf run never started its two workers"
        if when == "during the window":
            assert perf.stderr is not None
            line = perf.stderr.readline()  # the first progress line: the window has begun
            assert line.startswith("time"), line
        os.kill(perf.pid, signal.SIGKILL)
        perf.wait(timeout=30)
        deadline = time.monotonic() + 60
        while any(_alive(w) for w in workers) and time.monotonic() < deadline:
            time.sleep(0.1)
        left = [w for w in workers if _alive(w)]
        for w in left:  # do not leave them spinning if the test fails
            os.kill(w, signal.SIGKILL)
        assert left == []
    finally:
        if perf.poll() is None:
            perf.kill()
            perf.wait()
