"""Scenario programs in other languages' AMQP clients (tests/clients/*), run against RabbitMQ
and the gateway: each prints one ``<scenario>\\t<outcome>`` line per scenario, made only of
what the broker answered, so that the two runs compare line by line.

A program runs once against RabbitMQ, whose lines are checked against known values (so the
scenario itself is right), and once against the gateway, whose lines must equal RabbitMQ's
with the name prefix of each run put back to ``{p}``.
"""

from __future__ import annotations

import subprocess
import uuid
from collections.abc import Mapping, Sequence

__all__ = ["FAULTS", "assert_same_as_rabbitmq", "run_program"]

# The reply code and reply-text class RabbitMQ gives each fault the programs provoke, in their
# order (a program in a client that reports these as "<code> <class>").
FAULTS = {
    "passive missing queue": "404 NOT_FOUND", "passive missing exchange": "404 NOT_FOUND",
    "publish to missing exchange": "404 NOT_FOUND", "redeclare with other durable": "406 PRECONDITION_FAILED",
    "redeclare with other arguments": "406 PRECONDITION_FAILED",
    "redeclare exchange other type": "406 PRECONDITION_FAILED", "consume missing queue": "404 NOT_FOUND",
    "unknown delivery tag": "406 PRECONDITION_FAILED", "exclusive elsewhere": "405 RESOURCE_LOCKED",
    "bind missing exchange": "404 NOT_FOUND", "declare amq. name": "403 ACCESS_REFUSED",
    "delete amq.direct": "403 ACCESS_REFUSED",
}


def run_program(command: Sequence[str], url: str, names: Sequence[str], cwd: str | None = None
                ) -> tuple[str, dict[str, str]]:
    """The program's lines by scenario, run with ``url`` and a fresh name prefix."""
    prefix = f"c{uuid.uuid4().hex[:10]}"
    done = subprocess.run([*command, url, prefix], capture_output=True, text=True, timeout=300, cwd=cwd)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = dict(line.split("\t", 1) for line in done.stdout.splitlines() if "\t" in line)
    assert sorted(lines) == sorted(names), done.stdout + done.stderr
    return prefix, lines


def assert_same_as_rabbitmq(expected: Mapping[str, str], rabbitmq: tuple[str, dict[str, str]],
                            gateway: tuple[str, dict[str, str]]) -> None:
    rprefix, rabbit = rabbitmq
    gprefix, got = gateway
    for name, want in expected.items():
        assert rabbit[name] == want.replace("{p}", rprefix), f"RabbitMQ, scenario {name}: {rabbit[name]!r}"
    for name in expected:
        assert got[name].replace(gprefix, "{p}") == rabbit[name].replace(rprefix, "{p}"), (
            f"scenario {name}: gateway {got[name]!r}, RabbitMQ {rabbit[name]!r}")
