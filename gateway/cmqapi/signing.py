"""CMQ's request signature, and the checks of SecretId, Timestamp and Nonce (CA1). Pure.

The algorithm of CMQ's public API pages ("Signature method", Tencent Cloud API v2) and of its
SDKs (``cmq/sign.py`` of the Python SDK):

1. every request parameter but ``Signature``, sorted by name (byte order);
2. each as ``name=value``, the value as sent (not URL-encoded), ``_`` in a name written ``.``;
   in a POST, the SDKs leave out a value starting with ``@`` (their file-upload convention):
   the gateway takes such a value only when it is signed all the same (verify_signature);
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
from collections.abc import Callable, Iterable, Mapping

from gateway.cmqapi.errors import AUTH, CmqApiError

__all__ = ["METHODS", "NonceCache", "check_timestamp", "nonce_key", "replayed", "signature", "string_to_sign",
           "verify_signature"]

METHODS = {"HmacSHA1": hashlib.sha1, "HmacSHA256": hashlib.sha256}
# How far a request's Timestamp may be from the gateway's clock, either way: the window in
# which a captured request could be replayed, so the one in which its Nonce is remembered.
TIMESTAMP_WINDOW = 300.0


def string_to_sign(method: str, host: str, path: str, params: Mapping[str, str], *, skip_at: bool = True) -> str:
    method = method.upper()
    parts = [f"{name.replace('_', '.')}={value}" for name, value in sorted(params.items())
             if name != "Signature" and not (skip_at and method == "POST" and value.startswith("@"))]
    return f"{method}{host}{path}?{'&'.join(parts)}"


def signature(secret_key: str, text: str, method: str = "HmacSHA1") -> str:
    digest = hmac.new(secret_key.encode(), text.encode(), METHODS[method]).digest()
    return base64.b64encode(digest).decode()


def verify_signature(secret_key: str, method: str, hosts: Iterable[str], path: str,
                     params: Mapping[str, str]) -> bool:
    """Whether ``params["Signature"]`` signs the request for one of the ``hosts`` the client
    may have addressed (the Host header, and without its port).

    A POST value starting with ``@`` (which the SDKs leave out of the signature, step 2) must
    be signed all the same: CMQ's actions take no file, so such a value is a message body or
    a name, and one nobody signed could be added to, or swapped into, a captured request
    (issue 26). A request signed over every value passes; one whose signature holds only
    without its ``@`` values is refused (4000, 10110), naming them."""
    given = params.get("Signature", "")
    sig_method = params.get("SignatureMethod") or "HmacSHA1"
    unsigned = sorted(n for n, v in params.items() if n != "Signature" and method.upper() == "POST"
                      and v.startswith("@"))
    for skip_at in ((False, True) if unsigned else (True,)):
        for host in hosts:
            expected = signature(secret_key, string_to_sign(method, host, path, params, skip_at=skip_at), sig_method)
            if hmac.compare_digest(expected.encode(), given.encode()):
                if skip_at and unsigned:
                    raise CmqApiError.param(f"parameters {', '.join(unsigned)} start with '@' and are not covered "
                                            "by the signature: sign every value (issue 26)", 10110)
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


def nonce_key(secret_id: str, nonce: str) -> str:
    """The name a (SecretId, Nonce) pair is remembered under: a digest, so that any Nonce a
    client sends makes a valid store key and a valid JetStream KV key."""
    return hashlib.sha256(f"{secret_id}\0{nonce}".encode()).hexdigest()[:40]


class NonceCache:
    """The Nonces each SecretId used within the timestamp window: a second use is a replay.
    Older entries go once they are out of the window (a replay of such a request fails the
    Timestamp check instead): ``forget`` is told their keys (the store drops their records)."""

    def __init__(self, window: float = TIMESTAMP_WINDOW,
                 forget: Callable[[str], None] | None = None) -> None:
        self.window = window
        self.forget = forget
        self._seen: OrderedDict[str, float] = OrderedDict()

    def __len__(self) -> int:
        return len(self._seen)

    def __contains__(self, key: str) -> bool:
        return key in self._seen

    def expired(self, at: float, now: float) -> bool:
        """Whether a nonce used at ``at`` is past the window (a request signed then can no
        longer pass the Timestamp check): 2 windows, as a Timestamp may be ahead by one."""
        return at < now - 2 * self.window

    def drop(self, key: str) -> None:
        """Forget a use that did not count (its record could not be written)."""
        self._seen.pop(key, None)

    def remember(self, key: str, at: float) -> None:
        """A use read back from the store (in time order)."""
        self._seen[key] = at

    def use(self, secret_id: str, nonce: str, now: float) -> str:
        """Record the nonce, and return its key; CmqApiError (4100) when it was used already."""
        seen = self._seen
        while seen:
            key, at = next(iter(seen.items()))
            if not self.expired(at, now):
                break
            del seen[key]
            if self.forget is not None:
                self.forget(key)
        key = nonce_key(secret_id, nonce)
        if key in seen:
            raise replayed(nonce)
        seen[key] = now
        return key


def replayed(nonce: str) -> CmqApiError:
    return CmqApiError(AUTH, f"authentication failed: Nonce {nonce} was already used by this SecretId "
                       "(replayed request)")
