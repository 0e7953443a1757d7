"""CMQ's request signature, and the checks of SecretId, Timestamp and Nonce (CA1). Pure.

The algorithm of CMQ's public API pages ("Signature method", Tencent Cloud API v2) and of its
SDKs (``cmq/sign.py`` of the Python SDK):

1. every request parameter but ``Signature``, sorted by name (byte order);
2. each as ``name=value``, the value as sent (not URL-encoded), ``_`` in a name written ``.``;
   in a POST, a value starting with ``@`` is left out (the SDKs' file-upload convention);
3. joined with ``&``;
4. the string to sign: ``METHOD + host + path + "?" + that``, the method upper case, the host
   as the client addressed it (with ``:port`` when it gave one, as in the Host header), the
   path ``/v2/index.php``;
5. HMAC over it with the SecretKey, SHA-1 (``SignatureMethod=HmacSHA1``, the default) or
   SHA-256 (``HmacSHA256``), then base64.

The documented example (SecretKey ``Gu5t9xGARNpq86cd98joQYCN3Cozk1qA``, ``GETcvm.api.qcloud.com
/v2/index.php?Action=DescribeInstances&...``) signs to ``NSI3UqqD99b/UJb4tbG/xZpRW64=``;
tests/unit/cmqapi checks it and others computed by hand.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from collections import OrderedDict
from collections.abc import Iterable, Mapping

from gateway.cmqapi.errors import AUTH, CmqApiError

__all__ = ["METHODS", "NonceCache", "check_timestamp", "signature", "string_to_sign", "verify_signature"]

METHODS = {"HmacSHA1": hashlib.sha1, "HmacSHA256": hashlib.sha256}
# How far a request's Timestamp may be from the gateway's clock, either way: the window in
# which a captured request could be replayed, so the one in which its Nonce is remembered.
TIMESTAMP_WINDOW = 300.0


def string_to_sign(method: str, host: str, path: str, params: Mapping[str, str]) -> str:
    method = method.upper()
    parts = [f"{name.replace('_', '.')}={value}" for name, value in sorted(params.items())
             if name != "Signature" and not (method == "POST" and value.startswith("@"))]
    return f"{method}{host}{path}?{'&'.join(parts)}"


def signature(secret_key: str, text: str, method: str = "HmacSHA1") -> str:
    digest = hmac.new(secret_key.encode(), text.encode(), METHODS[method]).digest()
    return base64.b64encode(digest).decode()


def verify_signature(secret_key: str, method: str, hosts: Iterable[str], path: str,
                     params: Mapping[str, str]) -> bool:
    """Whether ``params["Signature"]`` signs the request for one of the ``hosts`` the client
    may have addressed (the Host header, and without its port)."""
    given = params.get("Signature", "")
    sig_method = params.get("SignatureMethod") or "HmacSHA1"
    for host in hosts:
        expected = signature(secret_key, string_to_sign(method, host, path, params), sig_method)
        if hmac.compare_digest(expected.encode(), given.encode()):
            return True
    return False


def check_timestamp(value: str, now: float, window: float = TIMESTAMP_WINDOW) -> None:
    try:
        ts = int(value)
    except ValueError:
        raise CmqApiError.param(f"parameter Timestamp is not a Unix time in seconds: {value!r}", 10360) from None
    if abs(now - ts) > window:
        raise CmqApiError(AUTH, f"authentication failed: Timestamp {ts} is more than {int(window)} s away from "
                          f"the server's time {int(now)} (request expired)")


class NonceCache:
    """The Nonces each SecretId used within the timestamp window: a second use is a replay.
    Older entries go once they are out of the window (a replay of such a request fails the
    Timestamp check instead)."""

    def __init__(self, window: float = TIMESTAMP_WINDOW) -> None:
        self.window = window
        self._seen: OrderedDict[tuple[str, str], float] = OrderedDict()

    def __len__(self) -> int:
        return len(self._seen)

    def use(self, secret_id: str, nonce: str, now: float) -> None:
        """Record the nonce; CmqApiError (4100) when it was used already."""
        seen = self._seen
        while seen:
            key, at = next(iter(seen.items()))
            if at >= now - 2 * self.window:
                break
            del seen[key]
        if (secret_id, nonce) in seen:
            raise CmqApiError(AUTH, f"authentication failed: Nonce {nonce} was already used by this SecretId "
                              "(replayed request)")
        seen[secret_id, nonce] = now
