"""The two profiles: CMQ's size and count limits enforced, or RabbitMQ's (SPEC PF1-PF5).

A :class:`Limits` holds the size and count limits of L3, L4 and L6 as numbers; a
:class:`Profile` says which limits refuse (``enforced``) and which are only reported
(``reported``, PF4), and whether deliveries carry the CMQ receive metadata (M11, PF5).

* ``cmq`` (PF2): CMQ's limits refuse; nothing is reported; receive metadata on.
* ``compatible`` (PF3, the default): RabbitMQ's limits refuse (a short string holds 255
  bytes; counts are unbounded; bodies up to the gateway's ``max_message_size``), and a breach
  of a CMQ limit is reported instead (PF4); deliveries carry the properties as published.

Every CMQ *behaviour* (tag and key matching, L5, lifecycle and retries, the queue model, the
L7/L8 ranges) is the same in both: only the numbers here differ. Pure: no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass

from semantics import limits

__all__ = ["CMQ", "CMQ_LIMITS", "COMPATIBLE", "DEFAULT_PROFILE", "PROFILES", "RABBITMQ_LIMITS", "Limits",
           "Profile", "profile_named"]


@dataclass(frozen=True, slots=True)
class Limits:
    """Size and count limits; None is "no limit"."""

    max_tags: int | None                 # L3: filter tags per message and per subscription
    max_tag_chars: int | None            # L3: characters per tag (CMQ counts characters)
    max_tag_bytes: int | None            # a tag as RabbitMQ holds it: a short string, 255 bytes
    max_key_bytes: int                   # L4: bytes per routing or binding key
    max_key_dots: int | None             # L4: dots per key
    max_binding_keys: int | None         # L4: binding keys per subscription
    message_size: bool                   # L6: topic MaximumMessageSize / queue MaxMsgSize refuse


CMQ_LIMITS = Limits(
    max_tags=limits.MAX_TAGS, max_tag_chars=limits.MAX_TAG_CHARS, max_tag_bytes=None,
    max_key_bytes=limits.MAX_KEY_BYTES, max_key_dots=limits.MAX_KEY_DOTS,
    max_binding_keys=limits.MAX_BINDING_KEYS, message_size=True,
)
# AMQP 0-9-1 short strings (routing keys, binding keys) hold 255 bytes; RabbitMQ bounds
# neither the words of a key nor the bindings of a pair.
RABBITMQ_LIMITS = Limits(
    max_tags=None, max_tag_chars=None, max_tag_bytes=limits.AMQP_NAME_MAX_BYTES,
    max_key_bytes=limits.AMQP_NAME_MAX_BYTES, max_key_dots=None, max_binding_keys=None,
    message_size=False,
)


@dataclass(frozen=True, slots=True)
class Profile:
    """``enforced`` limits refuse (406); ``reported`` ones (None: none) are checked after the
    enforced ones and a breach is reported, never refused (PF4)."""

    name: str
    enforced: Limits
    reported: Limits | None
    receive_metadata: bool  # M11 / PF5: x-cmq-* headers and message_id on every delivery

    @property
    def refuse(self) -> bool:
        """True when every CMQ limit refuses (PF2); False when breaches are reported (PF4)."""
        return self.reported is None


CMQ = Profile("cmq", CMQ_LIMITS, None, receive_metadata=True)
COMPATIBLE = Profile("compatible", RABBITMQ_LIMITS, CMQ_LIMITS, receive_metadata=False)
PROFILES = {p.name: p for p in (CMQ, COMPATIBLE)}
DEFAULT_PROFILE = COMPATIBLE


def profile_named(name: str | Profile | None) -> Profile:
    """The profile called ``name`` (None: the default, PF1); ValueError for another name."""
    if name is None:
        return DEFAULT_PROFILE
    if isinstance(name, Profile):
        return name
    try:
        return PROFILES[str(name).strip().lower()]
    except KeyError:
        raise ValueError(f"unknown profile {name!r}: expected one of {', '.join(sorted(PROFILES))}") from None
