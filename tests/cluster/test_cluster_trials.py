"""scripts/cluster_trials.py, small: kill -9 of a gateway among two on a three-node JetStream
cluster, while publishers confirm and consumers ack through both, loses no confirmed message
(CL3); and the script's verdict counts what it should."""

from __future__ import annotations

import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

from tests.support import cluster_load

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "cluster_trials.py"
TOTAL = re.compile(r"^total: (\d+) trials, published (\d+), confirmed (\d+), acked (\d+), recovered (\d+), "
                   r"lost (\d+), duplicates (\d+), phantoms (\d+); failed trials (\d+)", re.M)


def test_CL3_kill_9_of_a_gateway_loses_no_confirmed_message(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, str(SCRIPT), "--trials", "2", "--seconds", "5", "--seed", "7",
                           "--keep", str(tmp_path / "failed")], cwd=ROOT, capture_output=True, text=True,
                          timeout=600)
    m = TOTAL.search(done.stdout)
    assert m is not None, done.stdout + done.stderr[-3000:]
    trials, published, confirmed, acked, recovered, lost, duplicates, phantoms, failed = map(int, m.groups())
    assert done.returncode == 0, done.stdout
    assert trials == 2 and confirmed > 0 and acked > 0, done.stdout
    assert (lost, phantoms, failed) == (0, 0, 0), done.stdout
    assert "(3 nats servers, 2 gateways)" in done.stdout


def test_the_verdict_counts_lost_duplicated_and_phantom_messages() -> None:
    ledger = cluster_load.Ledger()
    ledger.published = {"a", "b", "c", "d", "e"}
    ledger.confirmed = {"a": "q", "b": "q", "c": "q", "d": "q"}
    ledger.acked = {"b"}  # acked before the crash: may be gone
    found = Counter({"a": 2, "e": 1, "zz": 1})  # e: unconfirmed but stored, fine
    v = cluster_load.verdict(ledger, found)
    assert (v.confirmed, v.acked, v.recovered, v.lost, v.duplicates, v.phantoms) == (4, 1, 1, 2, 1, 1)
    assert v.lost_ids == ["c", "d"] and not v.ok
