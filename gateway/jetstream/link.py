"""The gateway's one NATS connection, opened as nats-py takes URLs, credentials and TLS.

``open_link`` fails with :class:`NatsUnavailable` (one line: which URL, why) when no server
answers or JetStream is off, so that ``serve`` can say so and exit 2 before it listens.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
from dataclasses import dataclass
from typing import Any

import nats
from nats.aio.client import Client
from nats.js import JetStreamContext

__all__ = ["Link", "NatsUnavailable", "open_link", "replicas_for"]

log = logging.getLogger("cmq_gateway.jetstream")

CONNECT_TIMEOUT = 3.0


class NatsUnavailable(RuntimeError):
    """No NATS server could be used as the store (the text is one line for the operator)."""


@dataclass
class Link:
    nc: Client
    js: JetStreamContext
    replicas: int
    # Queue messages are written on a connection of their own (gateway.jetstream.publisher):
    # a server reads one connection's input in order, so pull requests and acks on ``nc``
    # do not wait behind thousands of publishes, nor their PubAcks behind deliveries.
    pub: Client | None = None

    @property
    def publishing(self) -> Client:
        return self.pub if self.pub is not None else self.nc

    async def close(self) -> None:
        for nc in (self.pub, self.nc):
            if nc is not None and not nc.is_closed:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(nc.flush(), 2)  # the last acks and naks go out
                await nc.close()


def servers_of(url: str) -> list[str]:
    """``nats://a:1,b:2`` -> ``["nats://a:1", "nats://b:2"]`` (user:pass@ kept on each)."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        raise NatsUnavailable(f"{url!r} is not a nats:// URL")
    userinfo = ""
    if "@" in rest:
        userinfo, _, rest = rest.rpartition("@")
        userinfo += "@"
    return [f"{scheme}://{userinfo}{hostport}" for hostport in rest.split(",") if hostport]


def replicas_for(known_servers: int) -> int:
    """R3 once the cluster has three servers (CL3), else one replica per server."""
    return max(1, min(3, known_servers))


def _tls(options: dict[str, str], url: str) -> ssl.SSLContext | None:
    if not any(options.get(k) for k in ("tls_ca", "tls_cert")) and not url.startswith("tls://"):
        return None
    ctx = ssl.create_default_context(cafile=options.get("tls_ca") or None)
    if options.get("tls_cert"):
        ctx.load_cert_chain(options["tls_cert"], options.get("tls_key") or None)
    return ctx


async def open_link(url: str, options: dict[str, str] | None = None) -> Link:
    options = options or {}
    servers = servers_of(url)
    kwargs: dict[str, Any] = {
        "servers": servers, "connect_timeout": CONNECT_TIMEOUT, "allow_reconnect": True,
        "name": "cmq-gateway",
    }
    try:
        tls = _tls(options, url)
    except (OSError, ssl.SSLError) as e:
        raise NatsUnavailable(f"cannot read the TLS files for {url}: {e}") from None
    if tls is not None:
        kwargs["tls"] = tls
    if options.get("creds"):
        kwargs["user_credentials"] = options["creds"]

    connected = False

    async def failed(e: Exception) -> None:
        if connected:  # before that, the one-line answer below says it
            log.warning("nats: %s", e)

    kwargs["error_cb"] = failed
    try:
        # The first connect must not retry forever: an operator waits on the answer (nats-py
        # reads 0 attempts as "no limit", so one retry per server).
        nc = await asyncio.wait_for(nats.connect(**kwargs | {"max_reconnect_attempts": 1,
                                                              "reconnect_time_wait": 0.1}),
                                    CONNECT_TIMEOUT * (len(servers) + 1))
    except Exception as e:  # noqa: BLE001 - nats-py raises several kinds; one line for each
        raise NatsUnavailable(f"cannot use NATS store {_safe(url)}: {_why(e)}") from None
    # Reconnect from now on, for ever (a restarted NATS cluster must not stop the gateway, CL3).
    connected = True
    nc.options["max_reconnect_attempts"] = -1
    nc.options["reconnect_time_wait"] = 0.5
    kwargs |= {"max_reconnect_attempts": -1, "reconnect_time_wait": 0.5}
    js = nc.jetstream(timeout=5.0)
    try:
        await js.account_info()
    except Exception as e:  # noqa: BLE001
        await nc.close()
        raise NatsUnavailable(f"cannot use NATS store {_safe(url)}: JetStream is not enabled there "
                              f"({type(e).__name__})") from None
    _check_version(nc)
    known = len({f"{s.hostname}:{s.port}" for s in nc.servers}) if nc.servers else 1
    info_urls = (getattr(nc, "_server_info", None) or {}).get("connect_urls") or []
    try:
        pub = await asyncio.wait_for(nats.connect(**kwargs | {"name": "cmq-gateway-publish"}),
                                     CONNECT_TIMEOUT * (len(servers) + 1))
    except Exception as e:  # noqa: BLE001 - as above
        await nc.close()
        raise NatsUnavailable(f"cannot use NATS store {_safe(url)}: {_why(e)}") from None
    return Link(nc, js, replicas_for(max(known, len(info_urls))), pub)


# nats-server before 2.10.14 can deliver a pull consumer's message twice, the second time as new
# (num_delivered 1): a message taken for redelivery (a nak, ack_wait) that meets only unusable
# waiting pull requests (expired, withdrawn) moves the consumer back instead of being kept for
# redelivery (nats-io/nats-server PR 5305; tests/cluster/test_cl4_repro.py). Q2/Q3 need 2.10.14.
FIXED_SERVER = (2, 10, 14)


def _check_version(nc: Any) -> None:
    try:
        v = nc.connected_server_version
        found = (v.major, v.minor, v.patch)
    except Exception:  # noqa: BLE001 - an unreadable version is not a reason to refuse the store
        return
    if found < FIXED_SERVER:
        log.warning("nats-server %s can deliver a message twice under load (a receive after its ack, "
                    "not flagged redelivered); use 2.10.14 or later", ".".join(map(str, found)))


def _safe(url: str) -> str:
    """The URL without a password (it goes to logs and the terminal)."""
    scheme, sep, rest = url.partition("://")
    if "@" in rest:
        userinfo, _, hosts = rest.rpartition("@")
        user = userinfo.split(":", 1)[0]
        return f"{scheme}{sep}{user}:***@{hosts}"
    return url


def _why(e: BaseException) -> str:
    text = str(e).strip().splitlines()[0] if str(e).strip() else ""
    return f"{type(e).__name__}: {text}" if text else type(e).__name__
