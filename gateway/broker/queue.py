"""AMQP queues served by CMQ queues (SPEC M7, M11-M13, M15, Q1-Q8).

A :class:`BrokerQueue` owns one ``semantics.queue.CmqQueue`` (``cmq``) and the consumers
attached to it. The message storages send into the model directly (``cmq.send``: a wrapper
here was a frame on every publish); receives go through ``receive`` below.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from gateway.broker.arguments import QueueArgs
from gateway.broker.consumers import Consumer
from gateway.broker.policies import Policy
from gateway.protocol import fastpath
from gateway.purepython import pure_python
from semantics import queue as _model
from semantics.queue import CmqQueue, Receipt, use_makers
from semantics.queue_attrs import QueueAttributes
from semantics.waiters import Waiters

# The model's QueueMessage (a message a queue) and Receipt (a delivery) made by the compiled
# object.__new__ / tuple.__new__ where the package was built (fastpath says why).
use_makers(fastpath.object_new, fastpath.tuple_new, fastpath.slots_new)


def compiled_methods() -> dict[str, Any] | None:
    """CmqQueue's send / receive / delete with their common case compiled
    (gateway/broker/_queue.c: a fanout delivery is one of each, and they were the largest part
    of its interpreter loop) and restore_plain (a JetStream pull's one model call a message),
    or None where the package was built without a compiler or
    ``CMQ_GATEWAY_PURE_PYTHON=1`` is set: the model's Python methods then, as they are the
    compiled ones' fallback for every other case."""
    if pure_python():
        return None
    try:
        from gateway.broker import _queue  # type: ignore[attr-defined]
    except ImportError:
        return None
    made: dict[str, Any] = _queue.configure(
        CmqQueue, _model.QueueMessage, Receipt, _model.py_send, _model.py_receive, _model.py_delete,
        (_model.ACTIVE, _model.INACTIVE, _model.DELETED, _model.REMOVED), (_model._VISIBLE, _model._DEADLINE),
        _model.py_restore_plain, _model._MIN_COMPACT)
    return made


COMPILED = compiled_methods()
if COMPILED is not None:
    _model.use_compiled(COMPILED["send"], COMPILED["receive"], COMPILED["delete"], COMPILED["restore_plain"])

if TYPE_CHECKING:
    from gateway.broker.session import Session

__all__ = ["BrokerQueue", "message_priority"]


def message_priority(msg: Any) -> int:
    """A message's AMQP priority, 0 when it has none (as RabbitMQ reads it)."""
    priority = getattr(msg.properties, "priority", None)
    return priority if isinstance(priority, int) else 0


class BrokerQueue:
    """One AMQP queue in one vhost."""

    # Slots: the compiled ack and enqueue (gateway/broker/_queue.c) read a queue's attributes
    # once or twice a delivery, a slot's member read instead of an instance dict's lookup.
    __slots__ = ("vhost", "name", "durable", "exclusive_owner", "auto_delete", "arguments", "qargs", "attrs",
                 "policy", "cmq", "receive", "receive_metadata", "consumers", "_rr", "had_consumer", "deleted",
                 "last_used", "on_tick", "waiters", "stored", "remote_ready", "on_consumers")

    def __init__(self, vhost: str, name: str, *, durable: bool, exclusive_owner: Session | None,
                 auto_delete: bool, arguments: dict[str, Any], qargs: QueueArgs,
                 attrs: QueueAttributes, cmq: CmqQueue) -> None:
        self.vhost = vhost
        self.name = name
        self.durable = durable
        self.exclusive_owner = exclusive_owner
        self.auto_delete = auto_delete
        self.arguments = arguments
        self.qargs = qargs
        self.attrs = attrs
        if qargs.max_priority > 0:
            cmq.set_priorities(qargs.max_priority, message_priority)
        self.policy: Policy | None = None  # the RabbitMQ policy applied (VHost._queue_settings)
        self.cmq = cmq
        # receive(now) without a frame of its own: every delivery takes one (CMQ model, below).
        self.receive: Callable[[float], Receipt | None] = cmq.receive
        # M11 / PF5: deliveries carry the CMQ receive metadata (the cmq profile, or the
        # queue's x-cmq-receive-metadata); otherwise the properties go out as published.
        self.receive_metadata = qargs.receive_metadata
        self.consumers: list[Consumer] = []
        self._rr = 0              # round-robin position among consumers (M11)
        self.had_consumer = False  # auto-delete only once a consumer came and went
        self.deleted = False
        self.last_used = 0.0       # x-expires
        # Set by the broker: what the scheduler runs when the queue's next deadline comes.
        self.on_tick: Callable[[BrokerQueue, float], None] | None = None
        # Q5: the channels whose basic.get long-polls this queue; None while none waits.
        self.waiters: Waiters | None = None
        # The message storage's own state of this queue, set by its ``made`` (JetStream's pulls,
        # leases and writes under way: gateway.jetstream.queues.QueueStream; None on the embedded
        # store), and the ready messages it holds outside the local model (JetStream's not yet
        # pulled; 0 on the embedded store, whose model holds every message).
        self.stored: Any = None
        self.remote_ready = 0
        # Told when the consumers here change (set by the store: a cluster's presence counts
        # every gateway's consumers, gateway.jetstream.presence).
        self.on_consumers: Callable[[BrokerQueue], None] | None = None

    def __repr__(self) -> str:
        return f"BrokerQueue({self.vhost!r}, {self.name!r})"

    # -- CMQ model ---------------------------------------------------------------------------
    # receive(now): CMQ ReceiveMessage, an Active message turns Inactive (Q1), or None: the
    # model's own method, kept in the ``receive`` slot by __init__.

    @property
    def message_count(self) -> int:
        """Ready messages, as queue.declare-ok and basic.get-ok count them: those of the local
        model and those the store holds outside it."""
        return self.cmq.active + self.remote_ready

    def expires_at(self) -> float | None:
        """x-expires (M7, RabbitMQ's meaning): when the queue is deleted if it stays unused
        (no consumer, no basic.get, no redeclare); None while it has consumers."""
        ms = self.qargs.expires_ms
        if ms is None or self.consumers or self.deleted:
            return None
        return self.last_used + ms / 1000.0

    def next_wakeup(self) -> float | None:
        if self.deleted:
            return None
        when = self.cmq.next_wakeup()
        if self.waiters is not None:
            end = self.waiters.next_deadline()  # Q5: a long poll's wait ends
            if end is not None and (when is None or end < when):
                when = end
        if self.qargs.expires_ms is None:
            return when
        expiry = self.expires_at()
        if expiry is None:
            return when
        return expiry if when is None or expiry < when else when

    def run_due(self, now: float) -> None:
        if self.on_tick is not None:
            self.on_tick(self, now)

    # -- consumers ---------------------------------------------------------------------------

    def add_consumer(self, consumer: Consumer) -> None:
        self.consumers.append(consumer)
        self.had_consumer = True
        if self.on_consumers is not None:
            self.on_consumers(self)

    def remove_consumer(self, consumer: Consumer) -> None:
        try:
            i = self.consumers.index(consumer)
        except ValueError:
            return
        del self.consumers[i]
        if i < self._rr:
            self._rr -= 1
        if self.on_consumers is not None:
            self.on_consumers(self)

    def keep_turn(self) -> None:
        """The consumer next_consumer just gave found no message: it is the next one again."""
        if self._rr > 0:
            self._rr -= 1

    def next_consumer(self) -> Consumer | None:
        """The next consumer with credit, round-robin (M11, W4)."""
        consumers = self.consumers
        if self.qargs.single_active_consumer:
            # x-single-active-consumer: only the oldest consumer receives; the next one takes
            # over when it goes (RabbitMQ's meaning; CMQ has none).
            first = consumers[0] if consumers else None
            return first if first is not None and first.has_credit() else None
        n = len(consumers)
        for _ in range(n):
            if self._rr >= n:
                self._rr = 0
            c = consumers[self._rr]
            self._rr += 1
            if c.has_credit():
                return c
        return None
