"""Issue 27 item 5: ``cmq-audit report`` starts its JVM from an archive of the classes an
earlier report loaded (spark.class_archive), recorded whole once, and never the reason a
report fails: a damaged archive costs one more JVM start, not the report."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.spark.test_spark_compact import _run_compactor, _without_pyspark_python, _write

KEEPING = "cmq-audit: keeping Spark's classes"


def _report(root: str, out: Path, cache: Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**_without_pyspark_python(), "XDG_CACHE_HOME": str(cache)}
    env.pop("CMQ_AUDIT_CLASS_ARCHIVE", None)
    return subprocess.run([sys.executable, "-m", "spark.cli", "report", "--audit-dir", root, "--out", str(out)],
                          env=env, cwd=cwd, capture_output=True, text=True, timeout=1400)


@pytest.mark.timeout(3000)  # a hang guard: three new JVMs on a loaded machine
def test_A7_the_report_records_its_class_archive_once_and_survives_a_damaged_one(tmp_path: Path) -> None:
    root, cache, work = str(tmp_path / "audit"), tmp_path / "cache", tmp_path / "work"
    work.mkdir()
    _write(root, 0, 120)
    assert _run_compactor(root).returncode == 0

    first = _report(root, tmp_path / "r1", cache, work)
    assert first.returncode == 0, first.stderr[-3000:]
    assert any(line.startswith(KEEPING) for line in first.stderr.splitlines())
    archives = list((cache / "cmq-audit").iterdir())
    assert [p.suffix for p in archives] == [".jsa"], archives  # renamed whole: no partial left
    archive = archives[0]
    size = archive.stat().st_size
    assert size > 0

    second = _report(root, tmp_path / "r2", cache, work)
    assert second.returncode == 0, second.stderr[-3000:]
    assert not any(line.startswith(KEEPING) for line in second.stderr.splitlines())  # started from it
    assert archive.stat().st_size == size
    assert '"records": 120' in (tmp_path / "r2" / "report.json").read_text()

    # Cut short as a full disk would: a JVM that maps it dies of SIGBUS.
    archive.chmod(0o644)
    with archive.open("r+b") as f:
        f.truncate(size // 2)
    third = _report(root, tmp_path / "r3", cache, work)
    assert third.returncode == 0, third.stderr[-3000:]
    assert '"records": 120' in (tmp_path / "r3" / "report.json").read_text()
    assert "fatal error" not in third.stdout + third.stderr  # the crash's report went to spark.log
    assert "SIGBUS" in (tmp_path / "r3" / "spark.log").read_text()
    assert not archive.exists()  # discarded: the next report records a new one
    assert list(work.iterdir()) == []  # no hs_err file in the user's working directory


_USER_SESSION = """
import sys
from spark import read_audit
from spark import session_builder

classes = sys.argv[2]
spark = (session_builder(extra_java_options=f"-Xlog:class+load=info:file={classes}")
         .master("local[1]").config("spark.ui.enabled", "false").getOrCreate())
print("records", read_audit(spark, sys.argv[1]).count())
spark.stop()
"""


def _user_session(root: str, cache: Path, classes: Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**_without_pyspark_python(), "XDG_CACHE_HOME": str(cache)}
    env.pop("CMQ_AUDIT_CLASS_ARCHIVE", None)
    cwd.mkdir(exist_ok=True)
    return subprocess.run([sys.executable, "-c", _USER_SESSION, root, str(classes)], env=env, cwd=cwd,
                          capture_output=True, text=True, timeout=1400)


@pytest.mark.timeout(3000)  # a hang guard: three new JVMs on a loaded machine
def test_A7_session_builder_records_the_archive_then_starts_user_sessions_from_it(tmp_path: Path) -> None:
    """A user's own session through ``session_builder``: the first records the class archive
    as its process ends, the next one's JVM loads classes from it (the JVM's own class-load
    log says where each class came from; the caller's JVM option is kept beside the
    archive's), and an archive cut short is recorded anew instead of killing the JVM."""
    root, cache, work = str(tmp_path / "audit"), tmp_path / "cache", tmp_path / "work"
    _write(root, 0, 120)
    assert _run_compactor(root).returncode == 0

    first = _user_session(root, cache, tmp_path / "classes1.log", work)
    assert first.returncode == 0, first.stderr[-3000:]
    assert "records 120" in first.stdout
    assert any(line.startswith(KEEPING) for line in first.stderr.splitlines())
    archives = list((cache / "cmq-audit").glob("*.jsa"))
    assert len(archives) == 1 and archives[0].stat().st_size > 0, list((cache / "cmq-audit").iterdir())
    assert "shared objects file (top)" not in (tmp_path / "classes1.log").read_text()

    second = _user_session(root, cache, tmp_path / "classes2.log", work)
    assert second.returncode == 0, second.stderr[-3000:]
    assert "records 120" in second.stdout
    assert not any(line.startswith(KEEPING) for line in second.stderr.splitlines())
    # "top": the dynamic archive recorded above, on top of the JDK's own base archive.
    assert "source: shared objects file (top)" in (tmp_path / "classes2.log").read_text()

    archive = archives[0]
    size = archive.stat().st_size
    with archive.open("r+b") as f:
        f.truncate(size // 2)
    third = _user_session(root, cache, tmp_path / "classes3.log", work)
    assert third.returncode == 0, third.stderr[-3000:]
    assert "records 120" in third.stdout
    assert any(line.startswith(KEEPING) for line in third.stderr.splitlines())  # recorded anew
    assert archive.is_file() and archive.stat().st_size > size // 2
    assert list(work.iterdir()) == []  # the check that found it cut short left no hs_err file here
