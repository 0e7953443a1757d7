"""Where HTTP subscriptions may push to (SPEC SE3).

An HTTP(S) subscription makes the gateway POST message bodies to a URL. Without a limit,
anyone allowed to create one could make the gateway call its own loopback services, the
cloud metadata address or the private network behind it. So:

* the URL must match one of the ``push.allow`` patterns an administrator put in the config
  (shell-style globs on the whole URL, e.g. ``https://hooks.example.com/*``); with none,
  no HTTP subscription can be created;
* every address the host resolves to must be public: loopback, link-local (169.254.0.0/16,
  the metadata service), private, unique-local, unspecified, multicast and reserved
  addresses are refused unless inside one of the ``push.allow_addresses`` networks.

The addresses are checked when the subscription is created and again by the resolver of
the pusher's HTTP client at each delivery, on the very addresses it then connects to, so a
name that resolves to a public address first and to a private one later (DNS rebinding)
is refused at delivery. Redirects are not followed (gateway.push).

Config::

    push:
      allow: ["https://hooks.example.com/*"]
      allow_addresses: ["10.1.2.0/24"]     # optional: private networks allowed anyway
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import Any
from urllib.parse import urlsplit

from aiohttp.abc import AbstractResolver, ResolveResult
from aiohttp.resolver import DefaultResolver

__all__ = ["PolicyResolver", "PushPolicy", "PushRefused"]

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


class PushRefused(ValueError):
    """An HTTP subscription endpoint SE3 does not allow. ``str()`` names the rule."""


@dataclass(frozen=True, slots=True)
class PushPolicy:
    allow: tuple[str, ...] = ()
    allow_addresses: tuple[str, ...] = ()

    @classmethod
    def parse(cls, raw: Mapping[str, Any]) -> PushPolicy:
        allow = raw.get("allow") or []
        nets = raw.get("allow_addresses") or []
        if not isinstance(allow, list) or not isinstance(nets, list):
            raise ValueError("push.allow and push.allow_addresses must be lists")
        policy = cls(tuple(str(p) for p in allow), tuple(str(n) for n in nets))
        policy.networks()  # a bad network fails at load, not at the first push
        return policy

    def networks(self) -> list[ipaddress.IPv4Network | ipaddress.IPv6Network]:
        return [ipaddress.ip_network(n, strict=False) for n in self.allow_addresses]

    def check_url(self, url: str) -> str:
        """The URL's host; ValueError for what is no HTTP URL (D7), PushRefused for a URL
        not allowed or an address literal refused (SE3)."""
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"endpoint {url!r} is not an http:// or https:// URL with a host (D7)")
        if not any(fnmatchcase(url, pattern) for pattern in self.allow):
            raise PushRefused(f"endpoint {url!r} matches no push.allow pattern of the gateway's config (SE3)")
        host = parts.hostname
        address = _address(host)
        if address is not None:
            self.check_address(address, host)
        return host

    def check_address(self, address: IPAddress, host: str) -> None:
        if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
            address = address.ipv4_mapped
        if _public(address) or any(address in net for net in self.networks()):
            return
        raise PushRefused(f"endpoint host {host!r} is at {address}, a loopback, link-local, private or "
                          "unspecified address not in push.allow_addresses (SE3)")

    async def check(self, url: str) -> None:
        """check_url, then every address the host resolves to (at subscription time)."""
        host = self.check_url(url)
        if _address(host) is not None:
            return
        try:
            infos = await asyncio.get_running_loop().getaddrinfo(host, None, type=socket.SOCK_STREAM)
        except OSError as e:
            raise PushRefused(f"endpoint host {host!r} does not resolve: {e} (SE3)") from None
        for info in infos:
            self.check_addresses([str(info[4][0])], host)

    def check_addresses(self, addresses: Iterable[str], host: str) -> None:
        for a in addresses:
            self.check_address(ipaddress.ip_address(a.split("%", 1)[0]), host)


def _address(host: str) -> IPAddress | None:
    try:
        return ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return None


def _public(a: IPAddress) -> bool:
    return not (a.is_loopback or a.is_link_local or a.is_private or a.is_unspecified or a.is_multicast
                or a.is_reserved)


class PolicyResolver(AbstractResolver):
    """aiohttp's resolver, refusing a host any of whose addresses the policy refuses: the
    check is on the addresses the client connects to (DNS rebinding, SE3). ``policy`` is
    asked at each resolution (the pusher's current one)."""

    def __init__(self, policy: Callable[[], PushPolicy | None]) -> None:
        self.policy = policy
        self._inner = DefaultResolver()

    async def resolve(self, host: str, port: int = 0,
                      family: socket.AddressFamily = socket.AF_INET) -> list[ResolveResult]:
        results = await self._inner.resolve(host, port, family)
        policy = self.policy()
        try:
            if policy is not None:
                policy.check_addresses([r["host"] for r in results], host)
        except PushRefused as e:
            raise OSError(str(e)) from None
        return results

    async def close(self) -> None:
        await self._inner.close()
