"""What RabbitMQ refuses in a policy, refused with RabbitMQ's reason (SPEC M7, M16).

The management API (``PUT /api/policies``) and a definitions import take a policy only if
RabbitMQ 3.10 (COMPAT_VERSION) would: every definition key is one RabbitMQ's validators know
(``rabbit_policies``, ``rabbit_mirror_queue_misc``, ``rabbit_queue_location_validator``, the
quorum queues' ``dead-letter-strategy``) with a value they take, even the keys the gateway keeps
without applying them; an unknown key is refused ("... are not recognised policy settings"),
not stored. The reason is RabbitMQ's text, the value written as Erlang's ``~p`` writes it.

Three deliberate supersets, for exports of RabbitMQ estates to import whole: ``apply-to``
takes 3.12's ``classic_queues``, ``quorum_queues`` and ``streams`` (the gateway applies them
by ``x-queue-type``); the federation plugin's ``federation-upstream`` and
``federation-upstream-set`` (a RabbitMQ with the plugin takes them; kept, noted, not applied);
3.13's ``target-group-size``.

Where RabbitMQ 3.10.8 fails with 500 or drops the connection (``max-age`` that is not a text
starting with digits, ``ha-mode`` that is not a text, ``apply-to`` that is not a text, a
definition that is not an object, ``queue-master-locator`` 1.5), the gateway answers 400 with
the reason RabbitMQ's validator means to give.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

__all__ = ["KNOWN_KEYS", "erl", "refusal"]

_EXTRA_APPLY_TO = ("classic_queues", "quorum_queues", "streams")
_HA = ("ha-mode", "ha-params", "ha-sync-mode", "ha-sync-batch-size", "ha-promote-on-shutdown",
       "ha-promote-on-failure")
_MAX_SEGMENT = 3_000_000_000  # RabbitMQ 3.10.8 refuses stream-max-segment-size-bytes above it


def erl(v: Any) -> str:
    """``v`` (a JSON value) as Erlang's ``io_lib:format("~p")`` writes the term RabbitMQ decodes."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if v is None:
        return "null"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        r = repr(v)
        if "e" in r:
            mantissa, exp = r.split("e")
            return f"{mantissa if '.' in mantissa else mantissa + '.0'}e{int(exp)}"
        return r
    if isinstance(v, str):
        if not v:
            return "<<>>"
        return '<<"' + v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '">>'
    if isinstance(v, list | tuple):
        return "[" + ",".join(erl(x) for x in v) + "]"
    if isinstance(v, Mapping):
        return "#{" + ",".join(f"{erl(k)} => {erl(x)}" for k, x in v.items()) + "}"
    return repr(v)


def _int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _at_least(low: int, what: str) -> Any:
    return lambda v: None if _int(v) and v >= low else f"{erl(v)} is not a valid {what}"


def _one_of(values: tuple[Any, ...], what: str) -> Any:
    return lambda v: None if isinstance(v, str) and v in values else f"{erl(v)} is not a valid {what}"


def _text(what: str) -> Any:
    return lambda v: None if isinstance(v, str) else f"{erl(v)} is not a valid {what}"


def _max_age(v: Any) -> str | None:
    # rabbit_amqqueue:check_max_age: re "(^[0-9]*)(.*)" ('.' stops at a newline), digits > 0,
    # unit one of Y M D h m s. No digits (or not a text) crashes RabbitMQ 3.10.8 (500): refused.
    m = re.match(r"([0-9]*)([^\n]*)", v) if isinstance(v, str) else None
    if m is None or not m.group(1) or int(m.group(1)) <= 0 or m.group(2) not in ("Y", "M", "D", "h", "m", "s"):
        return f"{erl(v)} is not a valid max age"
    return None


def _queue_version(v: Any) -> str | None:
    return None if _int(v) and v in (1, 2) else f"{erl(v)} is not a valid queue-version value"


def _segment(v: Any) -> str | None:
    return None if _int(v) and 0 <= v <= _MAX_SEGMENT else f"{erl(v)} is not a valid segment size"


def _master_locator(v: Any) -> str | None:
    ok = isinstance(v, str) and v in ("client-local", "random", "min-masters")
    return None if ok else f"{erl(v)} invalid queue-master-locator value"


def _federation(v: Any) -> str | None:
    return None if isinstance(v, str) else f"{erl(v)} is not a valid federation upstream name"


# rabbit_policies:validate_policy0 and its neighbours, key by key (RabbitMQ 3.10.8's wording).
_VALUE: dict[str, Any] = {
    "alternate-exchange": _text("alternate exchange name"),
    "dead-letter-exchange": _text("dead letter exchange name"),
    "dead-letter-routing-key": _text("dead letter routing key"),
    "message-ttl": _at_least(0, "message TTL"),
    "expires": _at_least(1, "queue expiry"),
    "max-length": _at_least(0, "maximum length"),
    "max-length-bytes": _at_least(0, "maximum length in bytes"),
    "max-in-memory-length": _at_least(0, "maximum memory in bytes"),
    "max-in-memory-bytes": _at_least(0, "maximum memory in bytes"),
    "queue-mode": _one_of(("default", "lazy"), "queue-mode value"),
    "queue-version": _queue_version,
    "overflow": _one_of(("drop-head", "reject-publish", "reject-publish-dlx"), "overflow value"),
    "delivery-limit": _at_least(0, "delivery limit"),
    "max-age": _max_age,
    "stream-max-segment-size-bytes": _segment,
    "queue-leader-locator": _one_of(("client-local", "random", "least-leaders", "balanced"),
                                    "queue leader locator value"),
    "initial-cluster-size": _at_least(0, "cluster size"),
    "queue-master-locator": _master_locator,
    "dead-letter-strategy": _one_of(("at-most-once", "at-least-once"), "dead letter strategy"),
    "federation-upstream": _federation,
    "federation-upstream-set": _federation,
    "target-group-size": _at_least(0, "target group size"),
}
KNOWN_KEYS = frozenset((*_VALUE, *_HA))


def _ha(d: Mapping[str, Any]) -> str | None:
    """rabbit_mirror_queue_misc:validate_policy."""
    if not any(k in d for k in _HA):
        return None
    if "ha-mode" not in d:
        return "ha-mode must be specified to specify ha-params, ha-sync-mode or ha-promote-on-shutdown"
    mode, params = d["ha-mode"], d.get("ha-params")
    given = erl(params) if "ha-params" in d else "none"
    if mode == "all":
        if "ha-params" in d:
            return 'ha-mode="all" does not take parameters'
    elif mode == "exactly":
        if not (isinstance(params, int) and not isinstance(params, bool) and params > 0):
            return f'ha-mode="exactly" takes an integer, {given} given'
    elif mode == "nodes":
        if not isinstance(params, list) or "ha-params" not in d:
            return f'ha-mode="nodes" takes a list, {given} given'
        if not params:
            return 'ha-mode="nodes" list must be non-empty'
        bad = [n for n in params if not isinstance(n, str)]
        if bad:
            return f'ha-mode="nodes" takes a list of strings, {erl(bad)} was not a string'
    else:
        return f"{erl(mode)} is not a valid ha-mode value"
    sync = d.get("ha-sync-mode", "manual")
    if sync not in ("manual", "automatic") or not isinstance(sync, str):
        return f'ha-sync-mode must be "manual" or "automatic", got {erl(sync)}'
    if "ha-sync-batch-size" in d and not (_int(d["ha-sync-batch-size"]) and d["ha-sync-batch-size"] > 0):
        return f"ha-sync-batch-size takes an integer greater than 0, {erl(d['ha-sync-batch-size'])} given"
    for key in ("ha-promote-on-shutdown", "ha-promote-on-failure"):
        v = d.get(key, "always")
        if not isinstance(v, str) or v not in ("always", "when-synced"):
            return f'{key} must be "always" or "when-synced", got {erl(v)}'
    return None


def _definition(d: Any) -> str | None:
    if not isinstance(d, Mapping):
        return f"definition must be a dictionary: {erl(d)}"
    if not d:
        return "no policy provided"
    # RabbitMQ reads the definition as an Erlang map: its keys in byte order.
    keys = sorted(d, key=lambda k: str(k).encode("utf-8", "surrogatepass"))
    for key in keys:
        check = _VALUE.get(key)
        why = check(d[key]) if check is not None else None
        if why is not None:
            return str(why)
    why = _ha(d)
    if why is not None:
        return why
    unknown = [k for k in keys if k not in KNOWN_KEYS]
    if unknown:
        return "[" + ",".join("{" + erl(k) + "," + erl(d[k]) + "}" for k in unknown) + \
            "] are not recognised policy settings"
    return None


def refusal(raw: Any) -> str | None:
    """RabbitMQ's reason for refusing the policy ``raw`` (a PUT body or a definitions entry), or
    None when it would take it. Checked in RabbitMQ's order: the missing keys, then priority,
    pattern, apply-to, definition (rabbit_policy:policy_validation)."""
    if not isinstance(raw, Mapping):
        return f"definition must be a dictionary: {erl(raw)}"
    missing = [k for k in ("pattern", "definition") if k not in raw]
    if missing:
        return "[" + ",".join("{key_missing," + k + "}" for k in missing) + "]"
    why: str | None = None
    priority = raw.get("priority", 0)
    pattern = raw["pattern"]
    target = raw.get("apply-to", "all")
    if isinstance(priority, bool) or not isinstance(priority, int | float) or not math.isfinite(priority):
        why = f"priority should be a number, actually was {erl(priority)}"
    elif not isinstance(pattern, str):
        why = f"pattern should be a binary but was {erl(pattern)}"
    else:
        try:
            re.compile(pattern)
        except (re.error, OverflowError, RecursionError) as e:
            why = f"pattern should be regular expression but is invalid: {e}"
    if why is None and (not isinstance(target, str) or target not in ("queues", "exchanges", "all", *_EXTRA_APPLY_TO)):
        shown = target if isinstance(target, str) else erl(target)
        why = f"apply-to '{shown}' unrecognised; should be 'queues', 'exchanges' or 'all'"
    if why is None:
        why = _definition(raw["definition"])
    if why is None:
        return None
    return f"Validation failed\n\n{why}\n"
