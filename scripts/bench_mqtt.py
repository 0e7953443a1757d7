"""MQTT publish -> deliver throughput and latency: the gateway against Mosquitto, same run.

    .venv/bin/python scripts/bench_mqtt.py [--count 20000] [--size 64] [--window 100] [--repeat 3]
                                           [--qos 0,1,2] [--client raw|paho] [--mosquitto 1883 | --own-mosquitto]
                                           [--before REV] [--config FILE] [--json]

Starts a fresh `cmq-gateway serve` (MQTT on a free port, new data dir, fsync on, audit on as
`serve` defaults) and runs `cmq-gateway perf mqtt` (gateway/perf/mqtt.py) with the Mosquitto on
127.0.0.1:1883 as broker a and the gateway as b: QoS 0, 1 and 2, alternating, the medians of
``--repeat`` runs, with each broker's CPU time per message (the gateway with its audit writer
process; Mosquitto found by pgrep), the figure that depends least on what else the machine runs.

``--before REV``: a second gateway, of that commit (a git worktree, the compiled modules
copied in), measured in the same run as a third broker: before/after ratios in one run.
``--after REV``: the first gateway from a worktree of that commit too, not from this checkout's
files (which, shared with other sessions, may hold their uncommitted changes).

``--own-mosquitto``: a Mosquitto of its own on a free port, with ``max_queued_messages
1000000`` and ``max_inflight_messages 100`` (the gateway's in-flight default). The system one's
defaults drop messages: past 1000 queued for a subscriber (QoS 1/2, most of a run at a window
of 65,535, where the gateway holds the publisher instead: flow control, docs/MQTT.md), and
incoming QoS 2 PUBLISHes past 20 in flight (PUBRECed, never delivered). (``max_queued_messages
0``, "no limit", makes Mosquitto 2.0.11 drop a QoS 2 publisher's connection.)
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from scripts.callgrind_common import wait_listening  # noqa: E402


def mosquitto_pid() -> int | None:
    try:
        return int(subprocess.check_output(["pgrep", "-x", "mosquitto"], text=True).split()[0])
    except (OSError, subprocess.CalledProcessError, IndexError, ValueError):
        return None


def start_mosquitto(work: str) -> tuple[subprocess.Popen[str], int]:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    conf = os.path.join(work, "mosquitto.conf")
    with open(conf, "w") as f:
        f.write(f"listener {port} 127.0.0.1\nallow_anonymous true\nmax_queued_messages 1000000\n"
                "max_inflight_messages 100\npersistence false\n")
    proc = subprocess.Popen(["mosquitto", "-c", conf], stderr=subprocess.DEVNULL, stdout=subprocess.DEVNULL, text=True)
    for _ in range(100):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.1).close()
            return proc, port
        except OSError:
            time.sleep(0.05)
    proc.kill()
    raise RuntimeError("mosquitto did not start")


def worktree(rev: str, work: str, name: str = "before") -> str:
    """A git worktree of ``rev`` with this checkout's compiled modules copied in: every one
    (the frame codec and the audit rows), else that gateway would run the pure-Python twin of
    a module the other runs compiled, and the comparison would measure that."""
    path = os.path.join(work, name)
    subprocess.check_call(["git", "worktree", "add", "--detach", path, rev], cwd=ROOT, stdout=subprocess.DEVNULL,
                          stderr=subprocess.DEVNULL)
    for folder, _dirs, files in os.walk(os.path.join(ROOT, "gateway")):
        for so in files:
            if so.endswith(".so"):
                target = os.path.join(path, os.path.relpath(folder, ROOT))
                if os.path.isdir(target):
                    shutil.copy(os.path.join(folder, so), os.path.join(target, so))
    return path


def start_gateway(data_dir: str, *extra: str, root: str = ROOT,
                  command: tuple[str, ...] = (sys.executable, "-m", "gateway"),
                  env: dict[str, str] | None = None) -> tuple[subprocess.Popen[str], int]:
    """A ``serve`` of the code in ``root`` (``command``: what runs ``cmq-gateway``, e.g. under
    valgrind, scripts/callgrind_mqtt.py); (process, its MQTT port)."""
    proc = subprocess.Popen([*command, "serve", "--host", "127.0.0.1", "--port", "0",
                             "--management-port", "off", "--metrics-port", "off", "--mqtt-port", "0", "--cmq-api-port", "off",
                             "--data-dir", data_dir, *extra], cwd=root, stderr=subprocess.PIPE, text=True, env=env)
    return wait_listening(proc, r"MQTT on 127\.0\.0\.1:(\d+)", "MQTT")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--count", type=int, default=20000)
    ap.add_argument("--size", type=int, default=64)
    ap.add_argument("--window", type=int, default=100)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--qos", default="0,1,2")
    ap.add_argument("--client", choices=("raw", "paho"), default="raw")
    ap.add_argument("--mosquitto", type=int, default=1883)
    ap.add_argument("--own-mosquitto", action="store_true", help="a Mosquitto of its own that drops nothing")
    ap.add_argument("--config", default=None, help="a gateway config file (e.g. audit events to leave out)")
    ap.add_argument("--before", metavar="REV", help="also a gateway of this commit, in the same run")
    ap.add_argument("--after", metavar="REV", help="the gateway measured is this commit's (a worktree), not the "
                    "checkout's files: others' uncommitted changes in a shared checkout stay out")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    data_dir = tempfile.mkdtemp(prefix="bench-mqtt-")
    extra = ["--config", args.config] if args.config else []
    trees = []
    if args.after:
        trees.append(worktree(args.after, data_dir, "after"))
    proc, port = start_gateway(data_dir, *extra, root=trees[0] if trees else ROOT)
    before = None
    if args.before:
        os.makedirs(os.path.join(data_dir, "before-data"))
        tree = worktree(args.before, data_dir)
        trees.append(tree)
        before = start_gateway(os.path.join(data_dir, "before-data"), *extra, root=tree)
    own = start_mosquitto(data_dir) if args.own_mosquitto else None
    mosq = own[0].pid if own is not None else mosquitto_pid()
    mosquitto_port = own[1] if own is not None else args.mosquitto
    try:
        cmd = [sys.executable, "-m", "gateway", "perf", "mqtt", "--uri-a", f"mqtt://guest:guest@127.0.0.1:{mosquitto_port}",
               "--name-a", "Mosquitto", "--uri-b", f"mqtt://guest:guest@127.0.0.1:{port}", "--name-b",
               f"gateway {args.after}" if args.after else "gateway",
               "--broker-pid-b", str(proc.pid), "--qos", args.qos, "--count", str(args.count), "--size", str(args.size),
               "--window", str(args.window), "--repeat", str(args.repeat),
               "--client", args.client]
        if mosq is not None:
            cmd += ["--broker-pid-a", str(mosq)]
        if before is not None:
            cmd += ["--uri-c", f"mqtt://guest:guest@127.0.0.1:{before[1]}", "--name-c", f"gateway {args.before}",
                    "--broker-pid-c", str(before[0].pid)]
        if args.json:
            cmd.append("--json")
        code = subprocess.call(cmd, cwd=ROOT)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        for other in (own, before):
            if other is not None:
                other[0].terminate()
                other[0].wait(timeout=30)
        for tree in trees:
            subprocess.call(["git", "worktree", "remove", "--force", tree], cwd=ROOT)
        shutil.rmtree(data_dir, ignore_errors=True)
    sys.exit(code)


if __name__ == "__main__":
    main()
