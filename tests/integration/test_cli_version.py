"""`cmq-gateway --version` and `cmq-audit --version`: the installed package's version, exit 0
(issue 12: a newcomer's first check of what is installed)."""

from __future__ import annotations

import subprocess
import sys
from importlib import metadata

import pytest

from tests.integration.test_process import ROOT


@pytest.mark.parametrize(("command", "module"), [("cmq-gateway", "gateway"), ("cmq-audit", "spark.cli")])
def test_version_flag_prints_the_package_version(command: str, module: str) -> None:
    done = subprocess.run([sys.executable, "-m", module, "--version"], cwd=ROOT, capture_output=True, text=True,
                          timeout=60)
    assert (done.returncode, done.stdout, done.stderr) == (0, f"{command} {metadata.version('cmq-gateway')}\n", "")
