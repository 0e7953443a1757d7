"""A CMQ HTTP API client written from CMQ's public API pages, not from the gateway's code.

Common parameters (Tencent Cloud API v2, "公共请求参数"): ``Action``, ``Region``,
``Timestamp``, ``Nonce``, ``SecretId``, ``SignatureMethod``, ``Signature``. The signature
("签名方法"): the parameters sorted by name, ``name=value`` with the raw (not URL-encoded)
value and ``_`` in names written ``.``, joined by ``&``; prefixed with the upper-case method,
the request host and ``/v2/index.php?``; HMAC-SHA1 (or SHA-256) with the SecretKey, base64.
Lists are ``name.1``, ``name.2``... Every answer is JSON with ``code`` (0: success),
``message`` and ``requestId``.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import random
import time
from typing import Any
from urllib.parse import urlsplit

import requests

__all__ = ["CmqClient", "sign"]


def sign(secret_key: str, method: str, host: str, path: str, params: dict[str, Any],
         sign_method: str = "HmacSHA1") -> str:
    query = "&".join(f"{k.replace('_', '.')}={params[k]}" for k in sorted(params))
    text = f"{method.upper()}{host}{path}?{query}"
    digest = hashlib.sha256 if sign_method == "HmacSHA256" else hashlib.sha1
    return base64.b64encode(hmac.new(secret_key.encode(), text.encode(), digest).digest()).decode()


class CmqClient:
    def __init__(self, endpoint: str, secret_id: str, secret_key: str, *, method: str = "POST",
                 sign_method: str = "HmacSHA1", vhost: str | None = None, verify: Any = True) -> None:
        self.endpoint = endpoint.rstrip("/")
        self.host = urlsplit(self.endpoint).netloc
        self.secret_id = secret_id
        self.secret_key = secret_key
        self.method = method
        self.sign_method = sign_method
        self.vhost = vhost
        self.verify = verify
        self.session = requests.Session()
        self.last_params: dict[str, Any] = {}

    def signed(self, action: str, params: dict[str, Any], *, nonce: int | None = None,
               timestamp: int | None = None) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, value in params.items():
            if isinstance(value, list | tuple):
                for i, v in enumerate(value, 1):
                    out[f"{key}.{i}"] = v
            elif value is not None:
                out[key] = value
        out.update(Action=action, Region="gz", SecretId=self.secret_id,
                   Nonce=nonce if nonce is not None else random.randint(1, 2**31),
                   Timestamp=timestamp if timestamp is not None else int(time.time()),
                   SignatureMethod=self.sign_method, RequestClient="tests-cmq-client")
        if self.vhost is not None:
            out["vhost"] = self.vhost
        out["Signature"] = sign(self.secret_key, self.method, self.host, "/v2/index.php", out, self.sign_method)
        return out

    def send(self, params: dict[str, Any], timeout: float = 40.0) -> dict[str, Any]:
        self.last_params = params
        url = f"{self.endpoint}/v2/index.php"
        if self.method == "GET":
            resp = self.session.get(url, params=params, timeout=timeout, verify=self.verify)
        else:
            resp = self.session.post(url, data=params, timeout=timeout, verify=self.verify)
        assert resp.status_code == 200, resp.text
        answer: dict[str, Any] = resp.json()
        assert {"code", "message", "requestId"} <= set(answer), answer
        return answer

    def call(self, action: str, **params: Any) -> dict[str, Any]:
        return self.send(self.signed(action, params))

    def ok(self, action: str, **params: Any) -> dict[str, Any]:
        """The answer of an action that must succeed."""
        answer = self.call(action, **params)
        assert answer["code"] == 0, (action, answer)
        return answer
