"""The `cmq-gateway perf` option parser."""

from __future__ import annotations

import argparse

import pytest

from gateway.perf.cli import build_parser, config_from_args, register
from gateway.perf.config import RunConfig
from gateway.perf.scenarios import scenario_config


def test_defaults_are_scenario_1_at_a_sustainable_rate() -> None:
    """A plain run is scenario 1's shape at a fixed 1,000 msg/s per producer (issue 12: an
    unlimited default was an overload test, p50 latency 1.6 s); --rate 0 is scenario 1."""
    args = build_parser().parse_args([])
    cfg = config_from_args(args)
    assert args.mode == "run"
    assert cfg == RunConfig(json=False, progress=True)
    assert (cfg.producers, cfg.consumers, cfg.size, cfg.pattern, cfg.queues, cfg.confirm, cfg.rate) == (
        1,
        1,
        16,
        "queue",
        1,
        0,
        1000.0,
    )
    assert cfg.durable_queues is False
    unlimited = config_from_args(build_parser().parse_args(["--rate", "0"]))
    assert unlimited == scenario_config(1, cfg.uri, cfg.duration)


def test_help_shows_every_default_and_what_rate_0_means() -> None:
    parent = argparse.ArgumentParser(prog="cmq-gateway")
    text = register(parent.add_subparsers(dest="command")).format_help()
    flat = " ".join(text.split())
    for shown in ("--rate RATE msg/s PER PRODUCER", "(default: 1000.0)", "0: as fast as possible",
                  "--size SIZE message body bytes, at least 8 (default: 16)", "(default: 10.0)",
                  "(default: amqp://guest:guest@127.0.0.1:5672/)", "(default: queue)", "--rate 0"):
        assert shown in flat, shown
    assert build_parser().format_help().replace("cmq-gateway perf", "") == text.replace("cmq-gateway perf", "")


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
