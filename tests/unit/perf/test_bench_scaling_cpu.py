"""scripts/bench_scaling.py's CPU reading: a gateway's audit writer is a child process, and
it starts compactions that end within a run, so a process's CPU must count its descendants',
live or ended."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[3]

# Busy until this child has used 0.3 s of CPU by its own count, then say so and wait to be
# read while still alive.
_CHILD = "import sys,time\nwhile time.process_time() < 0.3: pass\nprint('done', flush=True)\nsys.stdin.read()"
# Starts the child; on a line from the test, ends it and waits for it (its CPU moves to this
# process's cutime), says so, and waits to be read.
_PARENT = (f"import subprocess,sys\nc = subprocess.Popen([sys.executable, '-c', {_CHILD!r}], stdin=subprocess.PIPE)\n"
           "sys.stdin.readline()\nc.stdin.close()\nc.wait()\nprint('reaped', flush=True)\nsys.stdin.read()")


def _bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_scaling", ROOT / "scripts" / "bench_scaling.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_cpu_seconds_counts_a_childs_cpu_while_it_runs_and_after_it_ended() -> None:
    bench = _bench()
    parent = subprocess.Popen([sys.executable, "-c", _PARENT], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True)
    assert parent.stdin is not None and parent.stdout is not None
    try:
        assert parent.stdout.readline().strip() == "done"
        children = bench._tree(parent.pid)
        assert len(children) == 2
        child = bench.cpu_seconds(children[1])
        assert child >= 0.25  # /proc counts in clock ticks: a tick or so below the child's own count
        # The tree's figure holds the child's; the parent alone only started an interpreter.
        assert child <= bench.cpu_seconds(parent.pid) < child + 0.25
        assert bench.cpu_seconds(parent.pid, tree=False) < 0.25
        parent.stdin.write("end it\n")
        parent.stdin.flush()
        assert parent.stdout.readline().strip() == "reaped"
        assert bench._tree(parent.pid) == [parent.pid]
        assert child <= bench.cpu_seconds(parent.pid) < child + 0.25
    finally:
        parent.stdin.close()
        parent.wait(timeout=30)
