"""The compose path without Docker (issue 12 item 8): a Spark standalone master and worker from
pyspark's own launcher, a real ``cmq-gateway serve`` with compose/gateway.yaml, and the report
through ``spark-submit --master spark://…`` with compose/submit_report.py; the counts are exact.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests
import yaml

from tests.integration.test_process import serve
from tests.spark import real_log as W
from tests.spark.standalone import HANG, ROOT, SPARK_HOME, spark_env, standalone

pytestmark = [pytest.mark.spark, pytest.mark.slow]

@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """``spark://127.0.0.1:PORT`` of a master with one registered worker, and the worker's
    work directory (where each application's executors leave their logs)."""
    tmp = tmp_path_factory.mktemp("spark-cluster")
    with standalone(tmp, memory="1536m") as url:
        yield url, tmp / "work"


def test_report_through_spark_submit_on_a_standalone_cluster(cluster: tuple[str, Path], tmp_path: Path) -> None:
    url, work = cluster
    audit_dir, out = tmp_path / "audit", tmp_path / "report"
    config = ROOT / "compose" / "gateway.yaml"
    (user,) = yaml.safe_load(config.read_text())["users"]
    with serve(tmp_path / "data", "--config", str(config), "--audit-dir", str(audit_dir)) as (proc, port):
        W.run_workload(port, user["name"], user["password"])
        # compose/README.md: the management API takes the same user.
        api = f"http://127.0.0.1:{proc.operator['management API']}/api/whoami"  # type: ignore[attr-defined]
        whoami = requests.get(api, auth=(user["name"], user["password"]), timeout=30)
        assert (whoami.status_code, whoami.json()["name"]) == (200, user["name"])
        proc.send_signal(signal.SIGTERM)  # a clean stop: every record written, the file closed
        assert proc.wait(timeout=HANG) == 0
    submit = subprocess.run(
        [str(SPARK_HOME / "bin" / "spark-submit"), "--master", url,
         "--conf", "spark.ui.enabled=false", "--conf", "spark.driver.host=127.0.0.1",
         "--conf", "spark.executor.memory=768m", "--conf", "spark.sql.shuffle.partitions=4",
         str(ROOT / "compose" / "submit_report.py"), "report", "--audit-dir", str(audit_dir), "--out", str(out)],
        capture_output=True, text=True, timeout=2 * HANG, env=spark_env(), cwd=tmp_path)
    assert submit.returncode == 0, submit.stderr[-5000:]
    # The job ran on the cluster: an application with executors on this worker.
    (app,) = [p for p in work.iterdir() if re.fullmatch(r"app-[\d-]+", p.name)]
    assert list(app.glob("*/stderr")), f"no executor ran in {app}"

    got = json.loads((out / "report.json").read_text())
    events: dict[str, int] = {}
    for row in got["sections"]["timeline"]["rows"]:
        events[row["event"]] = events.get(row["event"], 0) + row["count"]
    # The whoami call above is one HTTP connection, audited as the AMQP ones are (A1).
    expected = {**W.EVENTS, "connection_open": W.EVENTS["connection_open"] + 1,
                "connection_close": W.EVENTS["connection_close"] + 1}
    assert events == expected
    assert (got["records"], got["records_from_open_files"], got["skipped_lines"]) == (sum(expected.values()), 0, 0)
    s = got["sections"]
    funnel = {(r["topic"], r["subscription"]): tuple(r[c] for c in W.FUNNEL_COLUMNS) for r in s["funnel"]["rows"]}
    assert funnel == W.FUNNEL
    assert [(r["user"], r["host"], r["failures"]) for r in s["auth_failures"]["rows"]] == [
        (user["name"], "127.0.0.1", 1)]
    assert [(r["user"], r["messages"], r["bytes"]) for r in s["publishers"]["rows"]] == [
        (user["name"], W.PUBLISHED, W.BYTES)]
    assert {r["topic"]: r["acks"] for r in s["latency"]["rows"]} == W.LATENCY_ACKS
    assert (out / "index.html").is_file()
