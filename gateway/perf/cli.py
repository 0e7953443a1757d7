"""`cmq-gateway perf`: the load generator's command line.

    cmq-gateway perf [run] --uri amqp://... --producers 1 --consumers 1 --size 16 --rate 1000 ...
    cmq-gateway perf --rate 0 ...      # as fast as the broker takes: an overload test
    cmq-gateway perf compare --uri-a amqp://rabbit --uri-b amqp://gateway --scenarios 1,2,3
    cmq-gateway perf mqtt --uri-b mqtt://guest:guest@127.0.0.1:1884 --repeat 3   # vs Mosquitto

`register(subparsers)` adds the `perf` subcommand to the `cmq-gateway` parser and sets
`func` (args -> exit code) as its default; `main(argv)` runs it standalone
(`python -m gateway.perf`).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from gateway.perf.config import RunConfig
from gateway.perf.topology import PATTERNS

__all__ = ["build_parser", "config_from_args", "main", "register"]

_DEFAULT_URI = "amqp://guest:guest@127.0.0.1:5672/"

_EPILOG = """\
A plain run publishes at a fixed --rate (1,000 msg/s per producer by default), a load a broker
sustains, so its latencies are end-to-end delivery times. --rate 0 publishes as fast as the
broker takes (its flow control decides): an overload test, whose latencies are mostly time
spent queued. `perf compare` runs its own scenarios (1-6 and 8 at --rate 0, 7 at 1,000 msg/s),
whatever --rate says.
"""


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """Each option's default in its help, except where there is none to show (flags, and
    options whose default depends on others: their help says it)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.default is None or action.default is False:
            return action.help
        return super()._get_help_string(action)


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {value}")
    return value


def _non_negative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, not {value}")
    return value


def _non_negative_float(text: str) -> float:
    value = float(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, not {value}")
    return value


def _size(text: str) -> int:
    value = int(text)
    if value < 8:
        raise argparse.ArgumentTypeError(
            "must be at least 8 bytes: the body carries an 8-byte send timestamp"
        )
    return value


def _scenarios(text: str) -> list[int]:
    from gateway.perf.scenarios import SCENARIOS

    try:
        ids = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"a comma-separated list of scenario numbers, not {text!r}")
    unknown = [i for i in ids if i not in SCENARIOS]
    if unknown or not ids:
        raise argparse.ArgumentTypeError(f"unknown scenario(s) {unknown}; known: {sorted(SCENARIOS)}")
    return ids


def _add_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "mode", nargs="?", choices=("run", "compare", "mqtt"), default="run",
        help="run one load, compare two brokers, or measure MQTT brokers (gateway/perf/mqtt.py)",
    )
    r = p.add_argument_group("run")
    r.add_argument("--uri", action="append", default=None,
                   help=f"any AMQP 0-9-1 broker (default {_DEFAULT_URI}). Several gateways of one cluster: "
                        "repeat --uri or separate them with commas; connection k (producers numbered first, "
                        "then consumers) uses URI k mod N, so each role is spread over the gateways and "
                        "with one producer and one consumer on two gateways every message crosses. "
                        "The queues are declared through every URI")
    r.add_argument("--producers", type=_non_negative_int, default=1, help="producer connections")
    r.add_argument("--consumers", type=_non_negative_int, default=1, help="consumer connections")
    r.add_argument("--size", type=_size, default=16, help="message body bytes, at least 8")
    r.add_argument(
        "--persistent", action="store_true", help="delivery_mode 2 (durable queues unless --transient-queues)"
    )
    r.add_argument(
        "--transient-queues", action="store_true", help="non-durable queues even with --persistent"
    )
    r.add_argument(
        "--confirm",
        type=_non_negative_int,
        default=0,
        metavar="N",
        help="publisher confirms with at most N unconfirmed messages per producer (0: off)",
    )
    r.add_argument(
        "--rate",
        type=_non_negative_float,
        default=RunConfig.rate,
        help="msg/s PER PRODUCER (total = rate x producers), a sustainable load; "
        "0: as fast as possible (an overload test)",
    )
    r.add_argument("--duration", type=float, default=10.0, help="seconds of publishing")
    r.add_argument(
        "--pattern",
        choices=PATTERNS,
        default="queue",
        help="queue: default exchange; fanout: N queues; direct: tag groups with RabbitMQ keys; "
        "tags: CMQ x-cmq-tags (gateway only); topic: * and # bindings",
    )
    r.add_argument(
        "--queues",
        type=_positive_int,
        default=None,
        help="queues (= bindings/subscriptions); default 1, or 10 for fanout/direct/tags/topic",
    )
    r.add_argument(
        "--tag-fanout",
        type=_positive_int,
        default=5,
        metavar="K",
        help="direct/tags/topic: each message reaches K queues (1-5, divides --queues)",
    )
    r.add_argument(
        "--prefetch", type=_non_negative_int, default=1000, help="basic.qos per consumer (0: none)"
    )
    r.add_argument(
        "--multi-ack",
        type=_non_negative_int,
        default=1,
        metavar="N",
        help="ack every N deliveries with multiple=true (1: each; 0: no-ack consume)",
    )
    r.add_argument(
        "--producer-processes", type=_non_negative_int, default=0, help="0: one per producer, <= CPUs"
    )
    r.add_argument(
        "--consumer-processes", type=_non_negative_int, default=0, help="0: one per consumer, <= CPUs"
    )
    r.add_argument(
        "--drain-timeout",
        type=_non_negative_float,
        default=10.0,
        help="seconds to wait for the deliveries still in flight after the window",
    )
    r.add_argument(
        "--slow-ack-ms",
        type=_non_negative_float,
        default=0.0,
        metavar="MS",
        help="also a prefetch-1 consumer of a queue of its own, acking each delivery MS after it (0: none)",
    )
    r.add_argument("--json", action="store_true", help="print the result as JSON on stdout")
    r.add_argument("--quiet", action="store_true", help="no progress line on stderr")
    c = p.add_argument_group("compare")
    c.add_argument("--uri-a", default=_DEFAULT_URI, help="the reference broker (ratios are b / a)")
    c.add_argument("--uri-b", default=None, help="the broker compared with it")
    c.add_argument("--name-a", default="RabbitMQ", help="broker a's name in the table")
    c.add_argument("--name-b", default="cmq-gateway", help="broker b's name in the table")
    c.add_argument("--scenarios", type=_scenarios, default=None, help="comma-separated, default all: 1-8")
    c.add_argument(
        "--repeat", type=_positive_int, default=1, help="runs per scenario and broker, alternating"
    )
    c.add_argument("--markdown", default=None, metavar="FILE", help="also write the table as Markdown")
    c.add_argument(
        "--tags-b",
        action="store_true",
        help="scenario 4 on b uses x-cmq-tags (pattern tags) instead of shared binding keys",
    )
    c.add_argument("--backlog", type=_positive_int, default=1_000_000, help="scenario 6 message count")
    c.add_argument(
        "--broker-pid-a", type=int, default=None, help="scenario 6: read broker a's RSS from /proc"
    )
    c.add_argument("--broker-pid-b", type=int, default=None, help="the same for broker b")
    c.add_argument(
        "--rabbitmqctl-a",
        action="store_true",
        help="scenario 6: broker a's memory from `rabbitmqctl status` (its total, not RSS)",
    )
    c.add_argument("--rabbitmqctl-b", action="store_true", help="the same for broker b")
    c.add_argument(
        "--restart-a", default=None, metavar="CMD", help="scenario 6: shell command restarting broker a"
    )
    c.add_argument("--restart-b", default=None, metavar="CMD", help="the same for broker b")
    c.add_argument(
        "--recover-timeout",
        type=_non_negative_float,
        default=600.0,
        help="scenario 6: give up after this many s",
    )


def _add_all(p: argparse.ArgumentParser) -> None:
    from gateway.perf.mqtt import add_options

    _add_options(p)
    add_options(p)


def build_parser(prog: str = "cmq-gateway perf") -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog, description="AMQP 0-9-1 load generator (PerfTest-like), and an MQTT publish -> deliver measurement",
                                epilog=_EPILOG, formatter_class=_HelpFormatter)
    _add_all(p)
    p.set_defaults(func=run_from_args)
    return p


def register(subparsers: Any) -> argparse.ArgumentParser:
    """Add `perf` to the `cmq-gateway` command; its `func` default runs it (args -> int)."""
    p: argparse.ArgumentParser = subparsers.add_parser(
        "perf",
        help="load generator: run one load, or compare two brokers",
        description=build_parser().description,
        epilog=_EPILOG,
        formatter_class=_HelpFormatter,
    )
    _add_all(p)
    p.set_defaults(func=run_from_args)
    return p


def config_from_args(args: argparse.Namespace) -> RunConfig:
    queues = args.queues if args.queues is not None else (1 if args.pattern == "queue" else 10)
    return RunConfig(
        uri=",".join(args.uri) if args.uri else _DEFAULT_URI,
        producers=args.producers,
        consumers=args.consumers,
        size=args.size,
        persistent=args.persistent,
        durable=False if args.transient_queues else None,
        confirm=args.confirm,
        rate=args.rate,
        duration=args.duration,
        pattern=args.pattern,
        queues=queues,
        tag_fanout=args.tag_fanout,
        prefetch=args.prefetch,
        multi_ack=args.multi_ack,
        producer_processes=args.producer_processes,
        consumer_processes=args.consumer_processes,
        drain_timeout=args.drain_timeout,
        slow_ack_ms=args.slow_ack_ms,
        json=args.json,
        progress=not args.quiet,
    )


def _print_summary(result: dict[str, Any]) -> None:
    r = result["rates"]
    print(
        f"sent {r['sent']:.0f} msg/s, confirmed {r['confirmed']:.0f} msg/s, received {r['received']:.0f} msg/s"
    )
    print(
        f"totals: sent {result['sent']}, confirmed {result['confirmed']}, nacked {result['nacked']}, "
        f"received {result['received']} of {result['expected_deliveries']} expected"
    )
    lat = result["latency_us"]
    if lat:
        print(
            f"latency (ms): p50 {lat['p50'] / 1000:.3f}  p95 {lat['p95'] / 1000:.3f}  "
            f"p99 {lat['p99'] / 1000:.3f}  max {lat['max'] / 1000:.3f}  ({lat['count']} samples)"
        )
    g = result["generator"]
    print(
        f"generator: max worker CPU {g['max_worker_cpu_percent']:.0f}% of wall time, "
        f"host CPU busy {g['host_cpu_busy_percent']}% of {g['cpu_count']} cores"
    )
    if g["saturated"]:
        print("WARNING: the generator itself is the limit (a worker process used >= 90% of a core)")
    slow = result.get("slow")
    if slow is not None:
        turn = slow["turnaround_us"]
        print(
            f"slow consumer: {slow['rate']:.1f} deliveries/s"
            + (f", ack -> next delivery p50 {turn['p50'] / 1000:.2f} ms p99 {turn['p99'] / 1000:.2f} ms" if turn else "")
        )
    for err in result["errors"]:
        print(f"error: {err}")


def run_from_args(args: argparse.Namespace) -> int:
    if args.mode == "mqtt":
        from gateway.perf.mqtt import mqtt_from_args

        return mqtt_from_args(args, _DEFAULT_URI)
    if args.mode == "compare":
        from gateway.perf.compare import compare_from_args

        return compare_from_args(args)
    from gateway.perf.runner import run

    cfg = config_from_args(args)
    result = run(cfg, sys.stderr)
    if cfg.json:
        print(json.dumps(result, indent=2))
    else:
        _print_summary(result)
    return 1 if result["errors"] else 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args))
