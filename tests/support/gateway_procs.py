"""``cmq-gateway serve`` as a real subprocess, for the multi-gateway and fault tests: several
gateways on one NATS JetStream store (``--store nats://...``), each with its own data and
audit directories, on free ports it prints, killed with SIGKILL and started again.

    gw = GatewayProcess(tmp_path, "gw1", store=cluster.store_url).start()
    gw.url            # amqp://guest:guest@127.0.0.1:<port>/%2F
    gw.kill9(); gw.start()   # same AMQP port again, so a client's URL stays valid

stderr goes to ``<dir>/gateway.log`` (appended over restarts, each start marked) so a failing
test can show what the gateway said; ``log_tail()`` returns its end.
"""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import TracebackType

from tests.support.natsd import die_with_parent

ROOT = Path(__file__).resolve().parents[2]
LISTENING = re.compile(r"listening on (?:127\.0\.0\.1|0\.0\.0\.0):(\d+)")
MANAGEMENT = re.compile(r"management API on https?://(?:127\.0\.0\.1|0\.0\.0\.0):(\d+)/")
# Starting includes connecting to JetStream and loading the metadata: slower than a disk store
# on a loaded two-core machine, but two minutes means it is stuck.
START_TIMEOUT = 120.0


class GatewayProcess:
    """One gateway process; ``store=None`` runs the embedded store (the default)."""

    def __init__(self, root: Path | str, name: str, store: str | None = None, *,
                 management: bool = True, extra: tuple[str, ...] = ()) -> None:
        self.name = name
        self.dir = Path(root) / name
        self.data_dir = self.dir / "data"
        self.audit_dir = self.dir / "audit"
        for d in (self.data_dir, self.audit_dir):
            d.mkdir(parents=True, exist_ok=True)
        self.log = self.dir / "gateway.log"
        self.store = store
        self.management = management
        self.extra = extra
        self.port = 0
        self.management_port: int | None = None
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0

    def command(self) -> list[str]:
        cmd = [sys.executable, "-m", "gateway", "serve", "--host", "127.0.0.1", "--port", str(self.port),
               "--management-port", "0" if self.management else "off", "--metrics-port", "off",
               "--mqtt-port", "off", "--cmq-api-port", "off",
               "--data-dir", str(self.data_dir), "--audit-dir", str(self.audit_dir)]
        if self.store is not None:
            cmd += ["--store", self.store]
        return [*cmd, *self.extra]

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    @property
    def url(self) -> str:
        return f"amqp://guest:guest@127.0.0.1:{self.port}/%2F"

    @property
    def management_url(self) -> str:
        assert self.management_port is not None, f"{self.name} runs without its management API"
        return f"http://127.0.0.1:{self.management_port}"

    def start(self, timeout: float = START_TIMEOUT) -> GatewayProcess:
        """Start and wait for the listening line (and the management one). After the first
        start the AMQP port is kept, so clients reconnect to the same URL."""
        if self.running:
            raise RuntimeError(f"{self.name} is already running")
        self.starts += 1
        with open(self.log, "ab") as log:
            offset = log.tell()
            log.write(f"--- start {self.starts}: {' '.join(self.command())}\n".encode())
            log.flush()
            self.proc = subprocess.Popen(self.command(), cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, preexec_fn=die_with_parent)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            text = self._log_since(offset)
            port = LISTENING.search(text)
            mgmt = MANAGEMENT.search(text)
            if port and (mgmt or not self.management):
                self.port = int(port.group(1))
                self.management_port = int(mgmt.group(1)) if mgmt else None
                return self
            if self.proc.poll() is not None:
                raise RuntimeError(f"gateway {self.name} exited with {self.proc.returncode}:\n{text[-3000:]}")
            time.sleep(0.05)
        self.kill9()
        raise TimeoutError(f"gateway {self.name} did not start in {timeout:.0f}s:\n{self.log_tail()}")

    def _log_since(self, offset: int) -> str:
        with open(self.log, "rb") as f:
            f.seek(offset)
            return f.read().decode(errors="replace")

    def kill9(self) -> None:
        """SIGKILL: no connection.close, no flush; what it held is left to JetStream's timers."""
        if self.running:
            assert self.proc is not None
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=30)

    def stop(self) -> None:
        """SIGTERM (the operator's clean stop), SIGKILL after 30 s."""
        if self.running:
            assert self.proc is not None
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.kill9()

    def restart(self, *, kill: bool = True) -> GatewayProcess:
        self.kill9() if kill else self.stop()
        return self.start()

    def log_tail(self, chars: int = 3000) -> str:
        try:
            return self.log.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def __enter__(self) -> GatewayProcess:
        return self.start()

    def __exit__(self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()


class GatewayGroup:
    """Several gateways on one store, started together, stopped together."""

    def __init__(self, root: Path | str, store: str | None, count: int, *, prefix: str = "gw",
                 management: bool = True, extra: tuple[str, ...] = ()) -> None:
        self.gateways = [GatewayProcess(root, f"{prefix}{i + 1}", store, management=management, extra=extra)
                         for i in range(count)]

    def __getitem__(self, i: int) -> GatewayProcess:
        return self.gateways[i]

    def __len__(self) -> int:
        return len(self.gateways)

    def __iter__(self):  # type: ignore[no-untyped-def]
        return iter(self.gateways)

    @property
    def urls(self) -> list[str]:
        return [g.url for g in self.gateways]

    def start(self) -> GatewayGroup:
        # One after the other: the first creates the buckets; the next ones find them.
        for g in self.gateways:
            if not g.running:
                g.start()
        return self

    def stop(self) -> None:
        for g in self.gateways:
            g.stop()

    def logs(self, chars: int = 2000) -> str:
        return "\n".join(f"== {g.name} ==\n{g.log_tail(chars)}" for g in self.gateways)

    def __enter__(self) -> GatewayGroup:
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()
