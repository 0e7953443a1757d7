"""What the callgrind harnesses share (scripts/callgrind_amqp.py, callgrind_jetstream.py,
callgrind_mqtt.py, and bench_mqtt.py's listener wait): the gateway's entry point under cProfile
switched by signals, the wait for its listener, counting switched on and off in a running
callgrind, the instruction totals of its dumps, and the measured run of either kind."""

from __future__ import annotations

import glob
import os
import re
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from typing import Any

# The gateway's entry point under cProfile (``python -c PROFILED OUT serve ...``): on at SIGUSR1,
# off and written to OUT at SIGUSR2 (the handlers run on the event loop's thread, the one profiled).
PROFILED = """import cProfile, runpy, signal, sys
p = cProfile.Profile()
out = sys.argv.pop(1)
signal.signal(signal.SIGUSR1, lambda *_: p.enable())
signal.signal(signal.SIGUSR2, lambda *_: (p.disable(), p.dump_stats(out)))
sys.argv[0] = "cmq-gateway"
runpy.run_module("gateway", run_name="__main__")
"""


def control(*args: str) -> None:
    subprocess.run(["callgrind_control", *args], check=True, capture_output=True)


def count_on(pid: int | str, zero: bool = True) -> None:
    """Counting on in process ``pid`` (from zero unless ``zero`` is false)."""
    if zero:
        control("-z", str(pid))
    control("-i", "on", str(pid))


def count_off(pid: int | str) -> None:
    """Counting off, and what was counted dumped to a file of its own."""
    control("-i", "off", str(pid))
    control("-d", str(pid))


def totals(pattern: str) -> list[int]:
    """The instructions of each dump matching ``pattern``, in the order dumped (the files'
    numeric suffix; a file's ``totals:`` line, as its ``summary:`` is written before the counts)."""
    out = []
    for f in sorted(glob.glob(pattern), key=lambda f: int(f.rpartition(".")[2])):
        with open(f, errors="replace") as fh:
            out += [int(line.split()[1]) for line in fh if line.startswith("totals:")]
    return out


def child_pids(pid: int) -> list[int]:
    """The child processes of ``pid`` (the audit writer of a gateway)."""
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(x) for x in f.read().split()]
    except OSError:
        return []


def counted(work: str, pids: list[str], code: str, keep: str) -> dict[str, float]:
    """Instructions of each counted process (``main`` the first, ``child`` the next) from its
    dumps in ``work``; the last dump of each kept in ``keep`` for callgrind_annotate."""
    out: dict[str, float] = {}
    for i, p in enumerate(pids):
        role = "main" if i == 0 else "child"
        files = sorted(glob.glob(f"{work}/callgrind.out.{p}.*"))
        out[role] = sum(totals(f"{work}/callgrind.out.{p}.*"))
        if files:
            os.makedirs(keep, exist_ok=True)
            name = f"callgrind-{role}-{os.path.basename(os.path.abspath(code))}-{time.time():.0f}.out"
            shutil.copy(files[-1], os.path.join(keep, name))
    return out


def wait_listening(proc: subprocess.Popen[str], pattern: str, what: str) -> tuple[subprocess.Popen[str], int]:
    """(proc, the port its stderr names in the first line matching ``pattern``, group 1): the
    gateway says where it listens once it does; the rest of stderr is read (and dropped) on a
    thread of its own, else a full pipe would stop the gateway."""
    assert proc.stderr is not None
    for line in proc.stderr:
        if m := re.search(pattern, line):
            threading.Thread(target=proc.stderr.read, daemon=True).start()
            return proc, int(m.group(1))
    raise RuntimeError(f"the gateway did not start its {what} listener")


Drive = Callable[[Callable[[], None], Callable[[], None]], int]


def run_counted(proc: subprocess.Popen[str], drive: Drive, children: bool, work: str, code: str,
                keep: str, settle: float = 0.0) -> dict[str, float]:
    """``drive(on, off)`` against a gateway started under callgrind (``proc``), counting on and
    off in it (and in its audit writer with ``children``); its messages received and the counts
    (``counted``). The gateway is stopped at the end."""
    pids: list[str] = []

    def on() -> None:
        pids[:] = [str(proc.pid), *(str(c) for c in child_pids(proc.pid) if children)]
        for p in pids:
            count_on(p)

    def off() -> None:
        for p in pids:
            count_off(p)

    try:
        received = drive(on, off)
        time.sleep(settle)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=600)
    return {"received": received, **counted(work, pids, code, keep)}


def run_profiled(proc: subprocess.Popen[str], drive: Drive, out: str) -> tuple[int, dict[Any, Any]]:
    """``drive(on, off)`` against a gateway started as ``PROFILED`` writing to ``out`` (cProfile on
    at ``on``, off and written at ``off``); (its messages received, the pstats entries)."""
    import pstats

    try:
        received = drive(lambda: proc.send_signal(signal.SIGUSR1), lambda: proc.send_signal(signal.SIGUSR2))
        time.sleep(2.0)  # the profile written
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=120)
    return received, pstats.Stats(out).stats  # type: ignore[attr-defined]


def print_profile(code: str, received: int, stats: dict[Any, Any], top: int, per: str = "message") -> None:
    """Python calls a ``per`` over the measured messages: by module, then the ``top`` functions
    by calls and by self time."""
    by_mod: dict[str, int] = {}
    rows = []
    for (file, line, fn), (_cc, nc, tt, _ct, _callers) in stats.items():
        mod = "C builtins" if file == "~" else re.sub(r".*?/(gateway|semantics|asyncio|uvloop|pamqp)/", r"\1/",
                                                       file).rsplit("/", 1)[0]
        by_mod[mod] = by_mod.get(mod, 0) + nc
        rows.append((nc, tt, f"{os.path.basename(file)}:{line}:{fn}"))
    n = received or float("nan")
    total = sum(r[0] for r in rows)
    python = sum(r[0] for r in rows if not r[2].startswith("~"))
    print(f"{code}: {received} received, {total / n:.1f} calls a {per}, {python / n:.1f} of them Python functions")
    for mod, c in sorted(by_mod.items(), key=lambda kv: -kv[1]):
        print(f"  {c / n:7.2f}  {mod}")
    print(f"  self time a {per} {sum(r[1] for r in rows) / n * 1e6:.2f} us (under cProfile); most called:")
    for nc, tt, name in sorted(rows, key=lambda r: -r[0])[:top]:
        print(f"  {nc / n:7.2f} calls  {tt / n * 1e6:6.2f} us self  {name}")
    print("  most self time:")
    for nc, tt, name in sorted(rows, key=lambda r: -r[1])[:top]:
        print(f"  {nc / n:7.2f} calls  {tt / n * 1e6:6.2f} us self  {name}")


def add_run_arguments(ap: Any, name: str, top: int) -> None:
    """The options every AMQP/MQTT harness takes: the codes, rounds, audit child, cProfile
    mode, how many functions it prints, and where callgrind files are kept."""
    ap.add_argument("--code", action="append", help="a checkout to measure (repeatable; default this one)")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--children", action="store_true", help="count the audit writer process too")
    ap.add_argument("--profile", action="store_true", help="cProfile call counts instead of valgrind")
    ap.add_argument("--top", type=int, default=top)
    ap.add_argument("--keep", default=os.path.join(tempfile.gettempdir(), f"callgrind-{name}"),
                    help="where the measured run's callgrind file is kept (for callgrind_annotate)")


def print_counted(r: int, code: str, res: dict[str, float], fanout: int = 0) -> None:
    """One round's line: the instructions, the messages, and a message (a delivery at fanout)."""
    n = res["received"] or float("nan")
    line = f"round {r + 1} {code}: {res['main']:,.0f} Ir main, {res['received']:,.0f} received, " \
           f"{res['main'] / n:,.0f} a message"
    if fanout:
        line += f", {res['main'] / n / fanout:,.0f} a delivery"
    if "child" in res:
        line += f"; audit child {res['child'] / n:,.0f} a message"
    print(line, flush=True)
