"""RabbitMQ's headers-exchange matching (SPEC M5, a gateway extension: CMQ has no such type).

``x-match`` is ``all`` (default) or ``any``; RabbitMQ 3.10+ also knows ``all-with-x`` and
``any-with-x``, which count ``x-``-prefixed arguments too. A binding argument with a void
(None) value matches on presence only, as in RabbitMQ.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gateway.broker.arguments import text

__all__ = ["headers_match", "valid_x_match"]

_MODES = ("all", "any", "all-with-x", "any-with-x")


def valid_x_match(binding_args: Mapping[str, Any]) -> bool:
    mode = binding_args.get("x-match", "all")
    return isinstance(mode, str | bytes) and text(mode) in _MODES


def headers_match(binding_args: Mapping[str, Any], headers: Mapping[str, Any] | None) -> bool:
    mode = text(binding_args.get("x-match", "all"))  # valid_x_match() checked it at bind
    with_x = mode.endswith("-with-x")
    want_all = mode.startswith("all")
    headers = headers or {}
    for key, want in binding_args.items():
        if key == "x-match" or (not with_x and key.startswith("x-")):
            continue
        hit = key in headers and (want is None or headers[key] == want)
        if want_all and not hit:
            return False
        if not want_all and hit:
            return True
    # "all" with nothing to check matches everything, "any" with nothing matches nothing.
    return want_all
