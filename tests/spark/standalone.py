"""A Spark standalone master and worker from pyspark's own launcher, for the cluster test and
``scripts/bench_spark.py --cluster``."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import pyspark

ROOT = Path(__file__).resolve().parents[2]
SPARK_HOME = Path(pyspark.__file__).resolve().parent
HANG = 300  # seconds: guards a hang only

__all__ = ["HANG", "ROOT", "SPARK_HOME", "spark_env", "standalone"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def spark_env(code: Path = ROOT) -> dict[str, str]:
    # Executors run the reader's Python code: this interpreter (pyarrow and the project) and
    # this checkout's packages ahead of any installed copy.
    return {**os.environ, "SPARK_HOME": str(SPARK_HOME), "SPARK_LOCAL_IP": "127.0.0.1",
            "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable,
            "PYTHONPATH": os.pathsep.join(filter(None, [str(code), os.environ.get("PYTHONPATH")]))}


@contextmanager
def _daemon(log: Path, *args: str, ready: str) -> Iterator[subprocess.Popen[bytes]]:
    """``spark-class ARGS`` until the log shows ``ready``; stopped (its own process group) after."""
    with open(log, "wb") as out:
        proc = subprocess.Popen([str(SPARK_HOME / "bin" / "spark-class"), *args], stdout=out,
                                stderr=subprocess.STDOUT, env=spark_env(), start_new_session=True)
    try:
        deadline = time.monotonic() + HANG
        while ready not in log.read_text(errors="replace"):
            assert proc.poll() is None, f"{args[0]} exited: {log.read_text(errors='replace')[-3000:]}"
            assert time.monotonic() < deadline, f"{args[0]} not ready: {log.read_text(errors='replace')[-3000:]}"
            time.sleep(0.2)
        yield proc
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)  # the group holds only this daemon and its children
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=30)


@contextmanager
def standalone(tmp: Path, *, memory: str = "1536m") -> Iterator[str]:
    """``spark://127.0.0.1:PORT`` of a master with one registered 2-core worker whose work
    directory (each application's executor logs) is ``tmp/work``."""
    port = _free_port()
    url = f"spark://127.0.0.1:{port}"
    with ExitStack() as stack:
        stack.enter_context(_daemon(
            tmp / "master.log", "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
            "--port", str(port), "--webui-port", str(_free_port()), ready=f"Starting Spark master at {url}"))
        stack.enter_context(_daemon(
            tmp / "worker.log", "org.apache.spark.deploy.worker.Worker", url, "--host", "127.0.0.1",
            "--port", str(_free_port()), "--webui-port", str(_free_port()), "--cores", "2",
            "--memory", memory, "--work-dir", str(tmp / "work"), ready="Successfully registered with master"))
        yield url
