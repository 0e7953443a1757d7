"""Store keys built from names: ``<kind>/<c1>/<c2>/...`` with each component escaped.

The store maps text keys to bytes and finds records of one object with a prefix scan
(``items(prefix)``), so a key encoding must give two guarantees for *any* names (AMQP names
hold up to 255 bytes of UTF-8, ``/`` and ``%`` included; the default vhost *is* ``/``):

* injective: two distinct name tuples never make the same key (vhost ``a`` + queue ``b/c``
  and vhost ``a/b`` + queue ``c`` did, so one of them overwrote the other);
* prefix-safe: the prefix of one object's components matches only keys whose leading
  components are exactly those (the scan ``m/<vhost>/orders/`` matched queue
  ``orders/archive``'s messages, so deleting ``orders`` erased them).

Why percent-escaping of ``%`` and ``/`` (``%`` -> ``%25`` first, then ``/`` -> ``%2F``):
an escaped component never contains ``/``, so ``/`` separates components unambiguously and
every prefix built by :func:`key_prefix` ends at a component boundary; the escaping itself is
reversible (``%`` always starts an escape), so distinct components stay distinct. Against
length-prefixing (also injective and prefix-safe): keys of ordinary names are unchanged and
readable in a journal dump, the common case costs two substring tests and no allocation, and
keys stay valid UTF-8 text as the store requires. A key never grows more than threefold,
far inside the store's 64 KiB key limit (five 255-byte names: under 4 KiB).

:func:`make_key` is the one place keys are built and :func:`parse_key` the one place they
are taken apart; callers scan with :func:`key_prefix` only.
"""

from __future__ import annotations

import re

__all__ = ["escape", "key_prefix", "make_key", "parse_key", "unescape"]

SEP = "/"
_ESCAPES = re.compile("%25|%2F")
_UNESCAPED = {"%25": "%", "%2F": "/"}


def escape(component: str) -> str:
    """``component`` with ``%`` and ``/`` percent-escaped (no copy when neither occurs)."""
    if "%" in component or "/" in component:
        return component.replace("%", "%25").replace("/", "%2F")
    return component


def unescape(text: str) -> str:
    """The inverse of :func:`escape`; ValueError for text :func:`escape` cannot produce."""
    if "/" in text or text.count("%") != len(_ESCAPES.findall(text)):
        raise ValueError(f"{text!r} is not an escaped key component")
    return _ESCAPES.sub(lambda m: _UNESCAPED[m.group()], text)


def _check_kind(kind: str) -> None:
    if not kind or "/" in kind or "%" in kind:
        raise ValueError(f"key kind {kind!r} must be non-empty without '/' or '%'")


def make_key(kind: str, *components: str) -> str:
    """The key of the object named by ``components`` among records of ``kind``."""
    _check_kind(kind)
    return SEP.join([kind, *map(escape, components)])


def key_prefix(kind: str, *components: str) -> str:
    """The scan prefix of every key of ``kind`` whose leading components are ``components``
    (``key_prefix("m", vhost, queue)``: the messages of one queue; ``key_prefix("q")``:
    every queue). It ends with the separator, so it never matches a longer component."""
    return make_key(kind, *components) + SEP


def parse_key(key: str) -> tuple[str, tuple[str, ...]]:
    """``(kind, components)`` of a key made by :func:`make_key`; ValueError otherwise."""
    kind, *parts = key.split(SEP)
    _check_kind(kind)
    return kind, tuple(unescape(p) for p in parts)
