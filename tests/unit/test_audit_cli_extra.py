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
