"""What the callgrind harnesses share (scripts/callgrind_jetstream.py, scripts/callgrind_mqtt.py):
the gateway's entry point under cProfile switched by signals, counting switched on and off in a
running callgrind, and the instruction totals of its dumps."""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import time

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
