"""CMQ queue attributes and their ranges (SPEC L6, L7, L8, Q8, M7).

A :class:`QueueAttributes` is validated when built, so a queue never holds an out-of-range
value: every refusal is a :class:`~semantics.errors.LimitError` naming the rule, the
attribute, the value and the allowed range (SPEC "Breaking a limit is never silent").

The RabbitMQ arguments that are timed state of a queue (``x-message-ttl``, ``x-max-length``
with ``x-overflow``) live here too, because :class:`semantics.queue.CmqQueue` applies them;
where CMQ defines nothing they keep RabbitMQ's meaning (SPEC M7).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from semantics import limits
from semantics.errors import CMQError, LimitError

__all__ = [
    "OVERFLOW_DROP_HEAD",
    "OVERFLOW_MODES",
    "OVERFLOW_REJECT_PUBLISH",
    "OVERFLOW_REJECT_PUBLISH_DLX",
    "QueueAttributes",
    "check_delay",
]

# RabbitMQ's x-overflow values. reject-publish-dlx behaves like reject-publish inside the
# queue; dead-lettering the refused message is the gateway's job.
OVERFLOW_DROP_HEAD = "drop-head"
OVERFLOW_REJECT_PUBLISH = "reject-publish"
OVERFLOW_REJECT_PUBLISH_DLX = "reject-publish-dlx"
OVERFLOW_MODES = (OVERFLOW_DROP_HEAD, OVERFLOW_REJECT_PUBLISH, OVERFLOW_REJECT_PUBLISH_DLX)


def _check_range(rule: str, name: str, value: float, low: float, high: float, unit: str = "") -> None:
    # bool is an int subclass; True as a timeout is a client bug, not 1 second.
    if isinstance(value, bool) or not isinstance(value, int | float) or not low <= value <= high:
        suffix = f" {unit}" if unit else ""
        raise LimitError(
            rule,
            f"queue attribute {name}={value!r} is out of range {low:,}-{high:,}{suffix}",
            value=value,
            limit=(low, high),
        )


def check_delay(delay: float) -> None:
    """SPEC Q4/L8: a message delay is 0-3,600 s."""
    _check_range("L8", "delay_seconds", delay, limits.DELAY_SECONDS_MIN, limits.DELAY_SECONDS_MAX, "s")


@dataclass(frozen=True, slots=True)
class QueueAttributes:
    """The attributes of one CMQ queue; defaults are CMQ's (SPEC L6-L8)."""

    visibility_timeout: float = limits.VISIBILITY_TIMEOUT_DEFAULT  # L8, Q1
    msg_retention_seconds: float = limits.QUEUE_RETENTION_DEFAULT  # L7, Q1
    max_msg_size: int = limits.QUEUE_MAX_MSG_SIZE_DEFAULT  # L6
    max_msg_heap_num: int = limits.MAX_MSG_HEAP_NUM_DEFAULT  # L8
    rewind_seconds: float = 0  # L8, Q6 (0: rewind off)
    polling_wait_seconds: float = 0  # L8, Q5
    delay_seconds: float = 0  # L8, Q4: the queue's default delay for new messages
    # Q8: the dead-letter policy. Either bound (or both) may be set, with the queue name.
    dead_letter_queue: str | None = None
    max_receive_count: int | None = None
    max_time_to_live: float | None = None
    # RabbitMQ extensions (M7): per-queue TTL in ms, x-max-length and x-overflow.
    message_ttl_ms: int | None = None
    max_length: int | None = None
    overflow: str = OVERFLOW_DROP_HEAD

    def __post_init__(self) -> None:
        _check_range("L8", "visibility_timeout", self.visibility_timeout,
                     limits.VISIBILITY_TIMEOUT_MIN, limits.VISIBILITY_TIMEOUT_MAX, "s")
        _check_range("L7", "msg_retention_seconds", self.msg_retention_seconds,
                     limits.QUEUE_RETENTION_MIN, limits.QUEUE_RETENTION_MAX, "s")
        _check_range("L6", "max_msg_size", self.max_msg_size,
                     limits.QUEUE_MAX_MSG_SIZE_MIN, limits.QUEUE_MAX_MSG_SIZE_MAX, "bytes")
        _check_range("L8", "max_msg_heap_num", self.max_msg_heap_num,
                     limits.MAX_MSG_HEAP_NUM_MIN, float("inf"))
        _check_range("L8", "rewind_seconds", self.rewind_seconds,
                     limits.REWIND_SECONDS_MIN, limits.REWIND_SECONDS_MAX, "s")
        if self.rewind_seconds > self.msg_retention_seconds:
            # Q6 / L8: the rewind range must be equal to or shorter than the lifecycle.
            raise LimitError(
                "L8",
                f"queue attribute rewind_seconds={self.rewind_seconds!r} is above "
                f"msg_retention_seconds={self.msg_retention_seconds!r}",
                value=self.rewind_seconds,
                limit=self.msg_retention_seconds,
            )
        _check_range("L8", "polling_wait_seconds", self.polling_wait_seconds,
                     limits.POLLING_WAIT_MIN, limits.POLLING_WAIT_MAX, "s")
        _check_range("L8", "delay_seconds", self.delay_seconds,
                     limits.DELAY_SECONDS_MIN, limits.DELAY_SECONDS_MAX, "s")
        self._check_dead_letter_policy()
        if self.message_ttl_ms is not None:
            _check_range("M7", "message_ttl_ms", self.message_ttl_ms, 0, 2**32 - 1, "ms")
        if self.max_length is not None:
            _check_range("M7", "max_length", self.max_length, 0, 2**63 - 1)
        if self.overflow not in OVERFLOW_MODES:
            raise CMQError("M7", f"queue attribute overflow={self.overflow!r} is not one of "
                           f"{', '.join(OVERFLOW_MODES)}", value=self.overflow)

    def _check_dead_letter_policy(self) -> None:
        if self.max_receive_count is not None:
            _check_range("Q8", "max_receive_count", self.max_receive_count,
                         limits.MAX_RECEIVE_COUNT_MIN, limits.MAX_RECEIVE_COUNT_MAX)
        if self.max_time_to_live is not None:
            _check_range("Q8", "max_time_to_live", self.max_time_to_live,
                         limits.MAX_TIME_TO_LIVE_MIN, limits.MAX_TIME_TO_LIVE_MAX, "s")
        has_bound = self.max_receive_count is not None or self.max_time_to_live is not None
        if self.dead_letter_queue is not None and not has_bound:
            raise CMQError("Q8", "a dead-letter queue needs max_receive_count or max_time_to_live",
                           value=self.dead_letter_queue)
        if has_bound and not self.dead_letter_queue:
            raise CMQError("Q8", "max_receive_count / max_time_to_live need a dead-letter queue",
                           value=self.max_receive_count or self.max_time_to_live)

    @property
    def message_ttl(self) -> float | None:
        """The per-queue TTL in seconds (x-message-ttl is in ms), or None."""
        return None if self.message_ttl_ms is None else self.message_ttl_ms / 1000.0

    def replace(self, **changes: Any) -> QueueAttributes:
        """A copy with ``changes`` applied and validated again (CMQ SetQueueAttributes)."""
        return dataclasses.replace(self, **changes)
