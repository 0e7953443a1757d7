"""MQTT publish -> deliver throughput and latency: the gateway against Mosquitto, same run.

    .venv/bin/python scripts/bench_mqtt.py [--count 20000] [--size 64] [--window 100] [--repeat 3]
                                           [--mosquitto 1883] [--config FILE] [--json]

Starts a fresh `cmq-gateway serve` (MQTT on a free port, new data dir, fsync on, audit on as
`serve` defaults) and runs `cmq-gateway perf mqtt` (gateway/perf/mqtt.py) with the Mosquitto on
127.0.0.1:1883 as broker a and the gateway as b: QoS 0 and QoS 1, alternating, the medians of
``--repeat`` runs, with each broker's CPU time per message (the gateway with its audit writer
process; Mosquitto found by pgrep), the figure that depends least on what else the machine runs.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def mosquitto_pid() -> int | None:
    try:
        return int(subprocess.check_output(["pgrep", "-x", "mosquitto"], text=True).split()[0])
    except (OSError, subprocess.CalledProcessError, IndexError, ValueError):
        return None


def start_gateway(data_dir: str, *extra: str) -> tuple[subprocess.Popen[str], int]:
    proc = subprocess.Popen([sys.executable, "-m", "gateway", "serve", "--host", "127.0.0.1", "--port", "0",
                             "--management-port", "off", "--metrics-port", "off", "--mqtt-port", "0", "--cmq-api-port", "off",
                             "--data-dir", data_dir, *extra], cwd=ROOT, stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None
    for line in proc.stderr:
        if m := re.search(r"MQTT on 127\.0\.0\.1:(\d+)", line):
            threading.Thread(target=proc.stderr.read, daemon=True).start()
            return proc, int(m.group(1))
    raise RuntimeError("the gateway did not start its MQTT listener")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--count", type=int, default=20000)
    ap.add_argument("--size", type=int, default=64)
    ap.add_argument("--window", type=int, default=100)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--qos", default="0,1")
    ap.add_argument("--mosquitto", type=int, default=1883)
    ap.add_argument("--config", default=None, help="a gateway config file (e.g. audit events to leave out)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    data_dir = tempfile.mkdtemp(prefix="bench-mqtt-")
    proc, port = start_gateway(data_dir, *(["--config", args.config] if args.config else []))
    mosq = mosquitto_pid()
    try:
        cmd = [sys.executable, "-m", "gateway", "perf", "mqtt", "--uri-a", f"mqtt://guest:guest@127.0.0.1:{args.mosquitto}",
               "--name-a", "Mosquitto", "--uri-b", f"mqtt://guest:guest@127.0.0.1:{port}", "--name-b", "gateway",
               "--broker-pid-b", str(proc.pid), "--qos", args.qos, "--count", str(args.count), "--size", str(args.size),
               "--window", str(args.window), "--repeat", str(args.repeat)]
        if mosq is not None:
            cmd += ["--broker-pid-a", str(mosq)]
        if args.json:
            cmd.append("--json")
        code = subprocess.call(cmd, cwd=ROOT)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        shutil.rmtree(data_dir, ignore_errors=True)
    sys.exit(code)


if __name__ == "__main__":
    main()
