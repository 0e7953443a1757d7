"""A config file with several mistakes names them all in one line (issue 30: a start showed
only the first, and the next start the second)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.config import ConfigError, parse_config
from tests.integration.test_startup import one_line, run_serve


def test_every_mistake_of_a_config_file_in_one_line(tmp_path: Path) -> None:
    (tmp_path / "gw.yaml").write_text("listners: [{host: 127.0.0.1, port: 5999}]\n"
                                      "limits: {frame_max: big, heartbeat: 5}\n"
                                      "management: {port: x}\n"
                                      "users: [{name: a}, {password: p}]\n")
    done = run_serve("--config", str(tmp_path / "gw.yaml"))
    line = one_line(done)
    assert done.returncode == 2
    assert line.startswith("cmq-gateway: config: ")
    for part in ("unknown key 'listners' (did you mean 'listeners'?)",
                 "limits.frame_max: expected an integer 4096..2147483647, got 'big'",
                 "management.port: expected off or an integer 0..65535, got 'x'",
                 "users[1]: missing name"):
        assert part in line, (part, line)


def test_one_mistake_is_still_one_message() -> None:
    with pytest.raises(ConfigError) as e:
        parse_config({"limits": {"heartbeats": 5}})
    assert str(e.value) == "config: limits: unknown key 'heartbeats' (did you mean 'heartbeat'?)"
