"""`cmq-audit report` without the Spark extra says which extra to install, in one line."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# Setting sys.modules[name] = None is how Python itself marks a module as not importable, so
# the command sees exactly what a base install (no pyspark) shows it.
_RUN = ("import sys; sys.modules['pyspark'] = None; from spark.cli import main; "
        "sys.exit(main(['report', '--audit-dir', sys.argv[1], '--out', sys.argv[2]]))")


def test_report_without_pyspark_names_the_extra(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-c", _RUN, str(tmp_path), str(tmp_path / "out")],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert "pyspark" in lines[0] and "[spark]" in lines[0]
    assert "Traceback" not in done.stderr


def _cli(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "spark.cli", *argv], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)


def test_report_refuses_a_missing_directory_and_bad_times_before_spark(tmp_path: Path) -> None:
    cases = [
        (["--audit-dir", str(tmp_path / "nope")], "no such directory"),
        (["--audit-dir", str(tmp_path), "--from", "yesterday"], "--from 'yesterday' is not a time"),
        (["--audit-dir", str(tmp_path), "--from", "2026-11-22T00:00:00Z", "--to", "2026-11-21"],
         "is not before --to"),
    ]
    for extra, expected in cases:
        done = _cli("report", "--out", str(tmp_path / "out"), *extra)
        assert done.returncode == 2, done.stderr
        assert done.stderr.count("\n") == 1 and expected in done.stderr, done.stderr


def test_demo_twice_on_one_directory_refuses_the_second(tmp_path: Path) -> None:
    first = _cli("demo", "--audit-dir", str(tmp_path), "--messages", "20")
    assert first.returncode == 0, first.stderr
    second = _cli("demo", "--audit-dir", str(tmp_path), "--messages", "20")
    assert second.returncode == 2 and "already holds an audit log" in second.stderr
