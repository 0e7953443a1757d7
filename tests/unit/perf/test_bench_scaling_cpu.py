"""scripts/bench_scaling.py's CPU reading: a gateway's audit writer is a child process, so a
process's CPU must count its descendants' too."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[3]

# Busy until this child has used 0.3 s of CPU by its own count, then say so and wait to be
# read while still alive (a dead child's CPU leaves the tree).
_CHILD = "import sys,time\nwhile time.process_time() < 0.3: pass\nprint('done', flush=True)\nsys.stdin.read()"


def _bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_scaling", ROOT / "scripts" / "bench_scaling.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_cpu_seconds_counts_a_childs_cpu() -> None:
    bench = _bench()
    parent = subprocess.Popen([sys.executable, "-c",
                               f"import subprocess,sys\nc = subprocess.Popen([sys.executable, '-c', {_CHILD!r}], "
                               "stdin=subprocess.PIPE)\nsys.stdin.read()\nc.stdin.close()\nc.wait()"],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert parent.stdout is not None and parent.stdout.readline().strip() == "done"
        children = bench._tree(parent.pid)
        assert len(children) == 2
        child = bench.cpu_seconds(children[1])
        assert child >= 0.25  # /proc counts in clock ticks: a tick or so below the child's own count
        # The tree's figure holds the child's; the parent alone only started an interpreter.
        assert child <= bench.cpu_seconds(parent.pid) < child + 0.25
    finally:
        assert parent.stdin is not None
        parent.stdin.close()
        parent.wait(timeout=30)
