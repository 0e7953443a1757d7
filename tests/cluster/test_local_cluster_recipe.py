"""docs/CLUSTER.md's one-machine recipe, as written: scripts/local_cluster.py starts three
NATS JetStream nodes and two gateways (each its own data directory) on free ports, a
message published through one gateway is consumed through the other, and everything stops
(CL1, issue 30). Two gateways starting at once on a new cluster used to lose a race for the
lease bucket's first write and exit."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_CL1_the_one_machine_recipe_runs_as_written(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "local_cluster.py"), "--check",
                           "--dir", str(tmp_path)], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "check: a message published through gw1 was consumed through gw2" in done.stdout
    assert done.stdout.rstrip().endswith("stopped")
    for log in ("gw1.log", "gw2.log"):
        text = (tmp_path / log).read_text()
        assert "Traceback" not in text, text
        assert "cmq-gateway: stopped" in text
    assert done.stdout.count("amqp://guest:guest@127.0.0.1:") == 2
