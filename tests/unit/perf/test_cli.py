"""The `cmq-gateway perf` option parser."""

from __future__ import annotations

import argparse

import pytest

from gateway.perf.cli import build_parser, config_from_args, register
from gateway.perf.config import RunConfig


def test_defaults_are_scenario_1() -> None:
    args = build_parser().parse_args([])
    cfg = config_from_args(args)
    assert args.mode == "run"
    assert cfg == RunConfig(json=False, progress=True)
    assert (cfg.producers, cfg.consumers, cfg.size, cfg.pattern, cfg.queues, cfg.confirm) == (
        1,
        1,
        16,
        "queue",
        1,
        0,
    )
    assert cfg.durable_queues is False


def test_every_run_option() -> None:
    args = build_parser().parse_args(
        [
            "run",
            "--uri",
            "amqp://u:p@127.0.0.1:5673/v",
            "--producers",
            "3",
            "--consumers",
            "2",
            "--size",
            "1024",
            "--persistent",
            "--confirm",
            "256",
            "--rate",
            "500",
            "--duration",
            "1.5",
            "--pattern",
            "topic",
            "--queues",
            "20",
            "--tag-fanout",
            "4",
            "--prefetch",
            "50",
            "--multi-ack",
            "10",
            "--producer-processes",
            "1",
            "--consumer-processes",
            "2",
            "--json",
            "--quiet",
        ]
    )
    cfg = config_from_args(args)
    assert cfg == RunConfig(
        uri="amqp://u:p@127.0.0.1:5673/v",
        producers=3,
        consumers=2,
        size=1024,
        persistent=True,
        durable=None,
        confirm=256,
        rate=500.0,
        duration=1.5,
        pattern="topic",
        queues=20,
        tag_fanout=4,
        prefetch=50,
        multi_ack=10,
        producer_processes=1,
        consumer_processes=2,
        json=True,
        progress=False,
    )
    assert cfg.durable_queues is True
    assert cfg.public()["uri"] == "amqp://u@127.0.0.1:5673/v"


def test_multi_queue_patterns_default_to_ten_queues_and_transient_queues_override() -> None:
    cfg = config_from_args(
        build_parser().parse_args(["--pattern", "fanout", "--persistent", "--transient-queues"])
    )
    assert (cfg.queues, cfg.persistent, cfg.durable_queues) == (10, True, False)


@pytest.mark.parametrize(
    "argv",
    [
        ["--size", "7"],
        ["--producers", "-1"],
        ["--rate", "-5"],
        ["--pattern", "headers"],
        ["--queues", "0"],
        ["compare", "--scenarios", "1,9"],
        ["compare", "--scenarios", "x"],
        ["walk"],
    ],
)
def test_bad_values_are_refused(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        build_parser().parse_args(argv)
    assert exc.value.code == 2
    assert "error:" in capsys.readouterr().err


def test_compare_options() -> None:
    args = build_parser().parse_args(
        [
            "compare",
            "--uri-b",
            "amqp://guest:guest@127.0.0.1:5673/",
            "--scenarios",
            "1,4,7",
            "--repeat",
            "2",
            "--markdown",
            "out.md",
            "--tags-b",
            "--backlog",
            "1000",
            "--broker-pid-b",
            "42",
            "--rabbitmqctl-a",
            "--restart-b",
            "true",
        ]
    )
    assert (args.mode, args.scenarios, args.repeat, args.markdown) == ("compare", [1, 4, 7], 2, "out.md")
    assert (args.tags_b, args.backlog, args.broker_pid_b, args.rabbitmqctl_a, args.restart_b) == (
        True,
        1000,
        42,
        True,
        "true",
    )


def test_register_adds_perf_to_a_parent_parser() -> None:
    parent = argparse.ArgumentParser(prog="cmq-gateway")
    register(parent.add_subparsers(dest="command"))
    args = parent.parse_args(["perf", "--producers", "4", "--rate", "10"])
    assert (args.command, args.mode, args.producers, args.rate) == ("perf", "run", 4, 10.0)
    assert callable(args.func)
