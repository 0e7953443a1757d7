"""The gateway process of the crash-trial and fuzz scripts, on either store.

``Served`` is crash_trials' gateway process (launch, kill9, stop) started from one command
line: every listener off but those asked for (``port=0``, ``cmq_api_port=0``...), and
``--store URL`` when the run is on JetStream. ``nats_store`` turns a script's ``--nats``
argument into that URL: a ``nats://`` URL as given, ``jetstream`` a one-node nats-server of
the run's own (tests/support/natsd.py), nothing the embedded store.
"""

from __future__ import annotations

import contextlib
import re
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

import crash_trials  # noqa: E402

# serve's listener options, by keyword; the AMQP port cannot be off.
LISTENERS = {"port": "--port", "management_port": "--management-port", "metrics_port": "--metrics-port",
             "cmq_api_port": "--cmq-api-port", "mqtt_port": "--mqtt-port"}
# The line serve prints for each (all in one burst once it is up).
ANNOUNCED = {"port": re.compile(r"listening on 127\.0\.0\.1:(\d+)"),
             "mqtt_port": re.compile(r"MQTT on 127\.0\.0\.1:(\d+)"),
             "management_port": re.compile(r"management API on https?://127\.0\.0\.1:(\d+)/"),
             "metrics_port": re.compile(r"metrics on https?://127\.0\.0\.1:(\d+)/"),
             "cmq_api_port": re.compile(r"CMQ API on https?://127\.0\.0\.1:(\d+)/")}
# The store's recovery line when it found a torn or damaged record (its counts are 0 else).
DAMAGED = re.compile(r"damaged=[1-9]|set_aside_bytes=[1-9]|set aside")
NATS_HELP = "--store URL: the JetStream store (nats://HOST:PORT, or 'jetstream' for a nats-server of the run's own)"


def serve_command(data_dir: Path, *, store: str | None = None, config: Path | None = None,
                  **ports: int | str) -> list[str]:
    """``python -m gateway serve`` with the listeners in ``ports`` (0: a free port) and no other."""
    unknown = set(ports) - set(LISTENERS)
    if unknown:
        raise TypeError(f"not a listener: {sorted(unknown)}")
    cmd = [sys.executable, "-m", "gateway", "serve", "--host", "127.0.0.1"]
    for name, option in LISTENERS.items():
        cmd += [option, str(ports.get(name, 0 if name == "port" else "off"))]
    cmd += ["--data-dir", str(data_dir)]
    if config is not None:
        cmd += ["--config", str(config)]
    if store:
        cmd += ["--store", store]
    return cmd


class Served(crash_trials.Gateway):
    """A gateway subprocess; ``ports`` holds the port of each listener asked for (``port`` the
    AMQP one, also ``self.port``). ``prefix`` goes before the command (say a ``prlimit``)."""

    def __init__(self, data_dir: Path, log: Path, *, store: str | None = None, config: Path | None = None,
                 append: bool = False, header: str = "", prefix: tuple[str, ...] = (), **ports: int | str) -> None:
        self.data_dir = data_dir
        self.store = store
        self._relaunch = {"store": store, "config": config, "prefix": prefix, **ports}
        start = (log.stat().st_size if append and log.exists() else 0) + len(header.encode())
        self.launch([*prefix, *serve_command(data_dir, store=store, config=config, **ports)], log,
                    ANNOUNCED["port"], append=append, header=header)
        wanted = ["port", *(name for name, value in ports.items() if name != "port" and value != "off")]
        self.ports: dict[str, int] = {}
        deadline = time.monotonic() + 30  # printed in the same burst as the listening line
        while True:
            text = log.read_bytes()[start:].decode(errors="replace")
            self.ports = {name: int(m.group(1)) for name in wanted if (m := ANNOUNCED[name].search(text))}
            if len(self.ports) == len(wanted) or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        if len(self.ports) != len(wanted):
            self.stop()
            raise RuntimeError(f"the gateway did not announce {sorted(set(wanted) - set(self.ports))} (see {log})")
        self.port = self.ports["port"]
        self.started_at = start  # where this start's lines begin in the log

    def restarted(self, *, kill: bool) -> Served:
        """Stopped (SIGTERM, or SIGKILL when ``kill``), then started again on the same data
        dir and store, its lines appended to the same log (``started_at`` says where)."""
        if kill:
            self.kill9()
        else:
            self.stop()
        how = "kill -9" if kill else "stop"
        return Served(self.data_dir, self.log, append=True, header=f"\n--- restart after a {how} ---\n",
                      **self._relaunch)  # type: ignore[arg-type]

    def start_problems(self) -> list[str]:
        """The lines of this start that say something went wrong: a traceback, an ERROR, a
        record the store found damaged or set aside."""
        text = self.log.read_bytes()[self.started_at:].decode(errors="replace")
        return [line for line in text.splitlines() if line.startswith("Traceback") or " ERROR " in line
                or DAMAGED.search(line)]


def log_errors(log: Path) -> int:
    """Tracebacks and ERROR lines in a gateway's log: internal errors, whatever the clients saw."""
    if not log.exists():
        return 0
    lines = log.read_text(errors="replace").splitlines()
    return sum(line.startswith("Traceback") or " ERROR " in line for line in lines)


@contextlib.contextmanager
def nats_store(nats: str | None) -> Iterator[str | None]:
    """The ``--store`` URL for a script's ``--nats`` argument (see the module's docstring)."""
    if nats != "jetstream":
        yield nats or None
        return
    from tests.support.natsd import NatsCluster

    cluster = NatsCluster(tempfile.mkdtemp(prefix="serve-nats-"), size=1).start()
    try:
        yield cluster.store_url
    finally:
        cluster.stop()
