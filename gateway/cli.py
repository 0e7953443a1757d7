"""The ``cmq-gateway`` command: ``serve`` runs the gateway; ``perf`` (gateway.perf) loads it;
``import-definitions`` / ``export-definitions`` (gateway.management.cli) move a RabbitMQ estate."""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

from gateway import version
from gateway.config import (
    DEFAULT_CMQ_API_PORT,
    DEFAULT_MANAGEMENT_PORT,
    DEFAULT_METRICS_PORT,
    DEFAULT_MQTT_PORT,
    DEFAULT_MQTTS_PORT,
    DEFAULT_PORT,
    DEFAULT_TLS_PORT,
    OFF,
    ConfigError,
    Listener,
    default_data_dir,
    load_config,
)
from semantics.store import StoreCorruptError, StoreFormatError, StoreLockedError

__all__ = ["build_parser", "main"]

_SERVE_EPILOG = f"""\
Data directory: without --data-dir (or data_dir in the config file) the gateway keeps its
store in {default_data_dir()} (XDG_DATA_HOME/cmq-gateway). A per-user directory is the
default rather than ./data because durable queues and persistent messages must be found
again whatever directory the gateway is started from; pass --data-dir ./data to keep them
beside a project instead.

Stop with SIGTERM or Ctrl-C: the gateway stops accepting, closes every connection with
320 CONNECTION_FORCED, flushes the store and exits; confirmed messages are never lost.
"""


class _Parser(argparse.ArgumentParser):
    """argparse whose usage errors are one line, like every other start-up error."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="cmq-gateway",
        description="A RabbitMQ-compatible AMQP 0-9-1 gateway with Tencent Cloud CMQ semantics.",
    )
    parser.add_argument("--version", action="version", version=f"cmq-gateway {version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    serve = sub.add_parser(
        "serve", help="run the AMQP gateway", epilog=_SERVE_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Serve AMQP 0-9-1 clients (pika, aio-pika, kombu/Celery, ...) with CMQ semantics.",
    )
    serve.add_argument("--host", default=None,
                       help="address to listen on, for AMQP and the management and metrics "
                            "ports (default: every IPv4 and IPv6 address, 0.0.0.0 and ::, or the "
                            "config file's listeners)")
    serve.add_argument("--port", type=_port, default=None,
                       help=f"TCP port to listen on (default: {DEFAULT_PORT}, or the config file's "
                            "listeners; 0 picks a free port and prints it)")
    serve.add_argument("--data-dir", default=None, metavar="DIR",
                       help="where durable exchanges, queues, bindings and persistent messages "
                            f"are stored (default: {default_data_dir()}; see below)")
    serve.add_argument("--config", default=None, metavar="FILE",
                       help="YAML (or JSON) configuration: listeners, data_dir, users, vhosts, "
                            "permissions (a RabbitMQ definitions export works), strict_names, "
                            "limits, audit, tls, push (the URLs HTTP subscriptions may reach); "
                            "command-line options override it")
    serve.add_argument("--audit-dir", default=None, metavar="DIR",
                       help="directory of the JSON-lines audit log (default: the config's audit.dir, "
                            "else DATA_DIR/audit)")
    serve.add_argument("--management-port", type=_port_or_off, default=None, metavar="PORT|off",
                       help="RabbitMQ-compatible management HTTP API and the CMQ views "
                            f"(default: {DEFAULT_MANAGEMENT_PORT}, as RabbitMQ; 0 picks a free port; "
                            "off turns it off)")
    serve.add_argument("--metrics-port", type=_port_or_off, default=None, metavar="PORT|off",
                       help=f"Prometheus /metrics (default: {DEFAULT_METRICS_PORT}, as RabbitMQ; "
                            "0 picks a free port; off turns it off)")
    serve.add_argument("--cmq-api-port", type=_port_or_off, default=None, metavar="PORT|off",
                       help=f"CMQ's HTTP API, /v2/index.php (default: {DEFAULT_CMQ_API_PORT}; "
                            "0 picks a free port; off turns it off)")
    serve.add_argument("--mqtt-port", type=_port_or_off, default=None, metavar="PORT|off",
                       help=f"MQTT 3.1.1 and 5.0 on the CMQ topics of amq.topic (default: {DEFAULT_MQTT_PORT}, "
                            "as RabbitMQ's MQTT plugin; 0 picks a free port; off turns it off)")
    serve.add_argument("--mqtts-port", type=_port_or_off, default=None, metavar="PORT|off",
                       help=f"MQTT over TLS, on the MQTT hosts (default: {DEFAULT_MQTTS_PORT}, as RabbitMQ, "
                            "when the config has a tls section; a verified client certificate logs in "
                            "without a password; 0 picks a free port; off turns it off)")
    serve.add_argument("--tls-port", type=_port_or_off, default=None, metavar="PORT|off",
                       help=f"AMQPS (AMQP over TLS) port, on the AMQP hosts (default: {DEFAULT_TLS_PORT}, "
                            "as RabbitMQ, when the config has a tls section with certfile, keyfile and "
                            "cafile; 0 picks a free port; off turns it off)")
    serve.add_argument("--port-offset", type=int, default=0, metavar="N",
                       help="add N to every default port (AMQP 5672, AMQPS 5671, management 15672, "
                            "metrics 15692, MQTT 1883, MQTTS 8883, CMQ API 15680), to run beside RabbitMQ, "
                            "Mosquitto or another gateway: --port-offset 100 --data-dir ./gw1; "
                            "ports given explicitly still win")
    serve.add_argument("--profile", choices=("compatible", "cmq"), default=None,
                       help="compatible (default): RabbitMQ's size and count limits, every breach of a "
                            "CMQ limit reported (audit limit_exceeded, /metrics, GET /api/cmq/limits); "
                            "cmq: every CMQ limit refuses and deliveries carry the x-cmq-* receive "
                            "metadata (config: profile:; per vhost: vhosts: [{name, profile}])")
    serve.add_argument("--salvage", action="store_true", default=None,
                       help="open a store whose confirmed data is damaged: keep every record that "
                            "verifies and copy the damaged bytes aside (config: salvage: true)")
    serve.add_argument("--store", default=None, metavar="nats://HOST:PORT[,...]",
                       help="keep all state in NATS JetStream instead of the embedded store, shared "
                            "by every gateway on that NATS cluster (docs/CLUSTER.md; config: store:)")
    for opt, key, what in (("--nats-creds", "creds", "a NATS .creds file (JWT and nkey)"),
                           ("--nats-tls-ca", "tls_ca", "CA file to verify the NATS servers"),
                           ("--nats-tls-cert", "tls_cert", "client certificate for NATS"),
                           ("--nats-tls-key", "tls_key", "client key for NATS")):
        serve.add_argument(opt, dest=f"nats_{key}", default=None, metavar="FILE",
                           help=f"{what} (config: nats: {{{key}: FILE}})")
    serve.add_argument("--no-direct-delivery", dest="direct_delivery", action="store_false", default=None,
                       help="with --store: every message goes through JetStream, even a transient one on "
                            "a non-durable queue whose consumer is on this gateway (by default it is "
                            "delivered directly, and lost if this gateway is killed before the ack; "
                            "config: cluster: {direct_delivery: false})")
    _register_perf(sub)
    from gateway.management.cli import register as register_definitions
    register_definitions(sub)  # import-definitions, export-definitions
    return parser


def _port_or_off(value: str) -> int:
    return OFF if value.lower() == "off" else _port(value, "neither a port number nor 'off'")


def _port(value: str, what: str = "not a port number") -> int:
    try:
        port = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is {what}") from None
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"port {port} is out of range 0-65535")
    return port


def _operator_port(cli: int | None, configured: int | None, default: int) -> int | None:
    """The command line wins, then the config file, then RabbitMQ's default port; OFF is None."""
    port = cli if cli is not None else configured if configured is not None else default
    return None if port == OFF else port


# Each listener's default port, by the name the --port-offset errors use.
_DEFAULT_PORTS = {"AMQP": DEFAULT_PORT, "AMQPS": DEFAULT_TLS_PORT, "the management API": DEFAULT_MANAGEMENT_PORT,
                  "/metrics": DEFAULT_METRICS_PORT, "MQTT": DEFAULT_MQTT_PORT, "MQTTS": DEFAULT_MQTTS_PORT,
                  "the CMQ API": DEFAULT_CMQ_API_PORT}


def _apply_port_offset(config: Any, args: argparse.Namespace) -> str:
    """Issue 30: ``--port-offset N`` moves every listener still on its default port by N
    (those given a port on the command line or in the config keep it). "" when done, else why
    the offset cannot be used (it would land a listener on another's default port, or past
    65535): the gateway then does not start."""
    n = args.port_offset
    moved: dict[str, int] = {}
    for name, default in _DEFAULT_PORTS.items():
        port = default + n
        if not 1 <= port <= 65535:
            return f"puts {name} on port {port}, outside 1-65535"
        other = next((o for o, d in _DEFAULT_PORTS.items() if d == port and o != name), None)
        if other is not None:
            return (f"puts {name} on port {port}, the default port of {other}: choose an offset that moves "
                    "no listener onto another's default")
        moved[name] = port
    if args.port is None:
        config.listeners = [Listener(lst.host, moved["AMQP"]) if lst.port == DEFAULT_PORT else lst
                            for lst in config.listeners]
    if config.tls is not None and args.tls_port is None and config.tls.port == DEFAULT_TLS_PORT:
        config.tls = dataclasses.replace(config.tls, port=moved["AMQPS"])
    for attr, name, default in (("management_port", "the management API", DEFAULT_MANAGEMENT_PORT),
                                ("metrics_port", "/metrics", DEFAULT_METRICS_PORT),
                                ("cmq_api_port", "the CMQ API", DEFAULT_CMQ_API_PORT),
                                ("mqtt_port", "MQTT", DEFAULT_MQTT_PORT),
                                ("mqtt_tls_port", "MQTTS", DEFAULT_MQTTS_PORT)):
        if getattr(config, attr) == default and getattr(args, attr.replace("_tls", "s"), None) is None:
            setattr(config, attr, moved[name])
    # A port asked for by offset is a port asked for: taken, it stops the start (MQTT too).
    config.mqtt_port_defaulted = config.mqtt_tls_port_defaulted = False
    return ""


def _register_perf(sub: Any) -> None:
    try:
        from gateway.perf.cli import register  # type: ignore[import-not-found,unused-ignore]
    except ImportError:  # the perf tool is optional and may not be installed
        return
    register(sub)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "serve":
        return _serve(args)
    handler = getattr(args, "func", None)
    if handler is None:
        parser.error(f"unknown command {args.command}")
    return int(handler(args) or 0)


def _serve(args: argparse.Namespace) -> int:
    from gateway.jetstream.link import NatsUnavailable
    from gateway.server import ListenError, StartupError, run

    try:
        config = load_config(args.config).with_listen(args.host, args.port)
    except ConfigError as e:
        print(f"cmq-gateway: {e}", file=sys.stderr)
        return 2
    if args.data_dir is not None:
        config.data_dir = args.data_dir
    elif config.data_dir is None:
        config.data_dir = default_data_dir()
    if args.audit_dir is not None:
        config.audit = dataclasses.replace(config.audit, dir=args.audit_dir)
    elif config.audit.dir is None:
        # A1: the audit trail is on unless configured away; beside the data by default.
        config.audit = dataclasses.replace(config.audit, dir=os.path.join(config.data_dir, "audit"))
    if args.salvage:
        config.salvage = True
    if args.store is not None:
        if not args.store.startswith(("nats://", "tls://")):
            print(f"cmq-gateway: --store {args.store}: give nats://HOST:PORT[,HOST:PORT...]", file=sys.stderr)
            return 2
        config.store = args.store
    if args.direct_delivery is not None:
        config.direct_delivery = args.direct_delivery
    for key in ("creds", "tls_ca", "tls_cert", "tls_key"):
        if getattr(args, f"nats_{key}") is not None:
            config.nats[key] = getattr(args, f"nats_{key}")
    if args.tls_port is not None:
        if config.tls is None:
            print("cmq-gateway: --tls-port needs a tls section (certfile, keyfile, ...) in the config",
                  file=sys.stderr)
            return 2
        config.tls = dataclasses.replace(config.tls, port=args.tls_port)
    if args.mqtts_port is not None and args.mqtts_port != OFF and config.tls is None:
        print("cmq-gateway: --mqtts-port needs a tls section (certfile, keyfile, ...) in the config",
              file=sys.stderr)
        return 2
    if config.tls is not None:
        config.mqtt_tls_port_defaulted = args.mqtts_port is None and config.mqtt_tls_port is None
        config.mqtt_tls_port = _operator_port(args.mqtts_port, config.mqtt_tls_port, DEFAULT_MQTTS_PORT)
    else:
        config.mqtt_tls_port = None
    if args.profile is not None:
        config.profile = args.profile
    config.management_port = _operator_port(args.management_port, config.management_port,
                                            DEFAULT_MANAGEMENT_PORT)
    config.metrics_port = _operator_port(args.metrics_port, config.metrics_port, DEFAULT_METRICS_PORT)
    config.cmq_api_port = _operator_port(args.cmq_api_port, config.cmq_api_port, DEFAULT_CMQ_API_PORT)
    config.mqtt_port_defaulted = args.mqtt_port is None and config.mqtt_port is None
    config.mqtt_port = _operator_port(args.mqtt_port, config.mqtt_port, DEFAULT_MQTT_PORT)
    if args.port_offset:
        problem = _apply_port_offset(config, args)
        if problem:
            print(f"cmq-gateway: --port-offset {args.port_offset}: {problem}", file=sys.stderr)
            return 2
    if args.host is not None:
        # One --host for everything the gateway serves, as an operator reading --help expects.
        config.management_host = config.metrics_host = config.cmq_api_host = config.mqtt_host = args.host
    try:
        run(config)
    except (ListenError, StartupError) as e:
        # A taken port or an unusable directory is an operator's mistake, not a crash: one
        # line saying which option fixes it, exit 1 (2: an audit dir in use, A7).
        print(f"cmq-gateway: {e}", file=sys.stderr)
        return int(getattr(e, "exit_code", 1))
    except ConfigError as e:  # found at start, e.g. a TLS certificate that cannot be read
        print(f"cmq-gateway: {e}", file=sys.stderr)
        return 2
    except NatsUnavailable as e:  # CL1: no NATS, or NATS without JetStream
        print(f"cmq-gateway: {e}", file=sys.stderr)
        return 2
    except StoreCorruptError as e:
        # Confirmed data is damaged: nothing was changed on disk. One line naming the file
        # and the way out, never a traceback.
        where = str(e).split(";", 1)[0]
        print(f"cmq-gateway: store damaged: {where}; nothing was changed on disk; restart with "
              "--salvage (or salvage: true in the config) to keep every record that verifies "
              "and set the damaged bytes aside", file=sys.stderr)
        return 3
    except (StoreLockedError, StoreFormatError) as e:
        print(f"cmq-gateway: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
