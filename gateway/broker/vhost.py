"""One virtual host: its exchanges, queues and bindings, and the routing between them (M1).

Declarations follow RabbitMQ (passive 404, redeclare 406 "inequivalent arg", exclusive 405,
default exchange 403); routing follows CMQ (M2-M10).
"""

from __future__ import annotations

import base64
import os
import re
from collections.abc import Collection
from typing import TYPE_CHECKING, Any

from gateway.audit.rows import (
    ENQUEUE,
    PUBLISH_QUEUE,
    PUBLISH_QUEUE_VIA,
    PUBLISH_TOPIC,
    PUBLISH_TOPIC_VIA,
    ROUTE,
)
from gateway.broker import persistence as P
from gateway.broker.arguments import (
    EXCHANGE_EQUIVALENCE,
    QUEUE_EQUIVALENCE,
    check_exchange_args,
    check_queue_kind_args,
    check_rabbit_args,
    equivalent_args,
    parse_queue_args,
)
from gateway.broker.errors import (
    NOT_IMPLEMENTED,
    ConnectionFault,
    access_refused,
    inequivalent,
    not_found,
    precondition,
    resource_locked,
)
from gateway.broker.exchange import (
    BIND_TAGS_LISTED,
    EXCHANGE_TYPES,
    Dest,
    Exchange,
    bind_tags_count,
    message_tags,
    sub_label,
    sub_name,
)
from gateway.broker.message import NO_CYCLE, Message, init_message, new_message
from gateway.broker.policies import Policy, choose, queue_arguments
from gateway.broker.queue import BrokerQueue
from gateway.broker.reply_to import REPLY_PREFIX
from gateway.protocol.properties import EXPIRATION_FLAG, HEADERS_FLAG, Properties
from semantics.errors import CMQError, LimitError
from semantics.limits import QUEUE_MAX_MSG_SIZE_MIN
from semantics.matching import (
    binding_keys_count_breach,
    key_breach,
    tag_breach,
    tags_breach,
    tags_count_breach,
)
from semantics.message_ids import new_msg_id
from semantics.names import Kind, cmq_name, validate_amqp_name
from semantics.profile import DEFAULT_PROFILE, Profile
from semantics.queue import MaxLengthRejected
from semantics.queue_attrs import QueueAttributes
from semantics.send_rules import message_expiry
from semantics.topic import FilterType, Topic, TopicMessage

if TYPE_CHECKING:
    from gateway.broker.broker import Broker
    from gateway.broker.session import Session

__all__ = ["VHost", "PublishOutcome", "new_name"]

STANDARD_EXCHANGES = (("amq.direct", "direct"), ("amq.fanout", "fanout"), ("amq.topic", "topic"),
                      ("amq.headers", "headers"), ("amq.match", "headers"))


_HEADERS_OR_EXPIRATION = HEADERS_FLAG | EXPIRATION_FLAG
_LOCAL = ("q", "x")  # endpoints the broker delivers to itself: queues and exchanges


def new_name(prefix: str) -> str:
    """RabbitMQ-style server names: ``amq.gen-`` / ``amq.ctag-`` + 22 url-safe characters."""
    return prefix + base64.urlsafe_b64encode(os.urandom(16)).decode().rstrip("=")


class PublishOutcome:
    """What a publish did: whether anything took it, and the store LSN it must wait for.
    Defaults as class attributes, no __init__: one is made for every publish, and a Python
    __init__ was a frame of its own."""

    msg_id = ""
    routed = False
    lsn = 0
    rejected = False  # x-overflow reject-publish refused it (basic.nack under confirms)


def py_enqueue_lean(vh: VHost, subs: Any, sub_labels: list[str], msg: Message, now: float,
                    expires_at: float | None, out: PublishOutcome, ex_name: str, fresh: bool) -> list[Any] | None:
    """VHost._route's common case: each of the topic's subscriptions (all unblocked queue
    endpoints, ``sub_labels`` their labels) enqueues ``msg``, in order, the steps of _attempt
    and _enqueue for a queue endpoint (D1, D7). ``fresh``: no queue can hold its ID already.
    Returns the subscriptions whose queue did not take it (None: every one did). The
    reference of the compiled twin (gateway/broker/_queue.c enqueue_lean), which does the
    embedded store's transient enqueue itself (EmbeddedMessages.enqueue's steps) and calls
    these steps for anything else."""
    failed: list[Any] | None = None
    queues = vh.queues
    broker = vh.broker
    enqueue = broker.messages.enqueue
    for s, label in zip(subs, sub_labels, strict=True):
        q = queues.get(s.endpoint[1])  # a ("q", name): _route checked
        if q is None:
            ok = False  # D7: the endpoint queue does not exist
        elif not fresh and q.cmq.get(msg.msg_id) is not None:
            out.routed = ok = True  # reached twice (exchange bindings): once, as RabbitMQ
        elif q.durable and msg.persistent and broker.read_only:
            vh._enqueue(q, msg, now, None, out, ex_name, label)
            ok = True  # _enqueue's store_failed discard: the attempt took it
        else:
            try:
                out.lsn = enqueue(vh, q, msg, now, None, expires_at, out.lsn, ex_name, label)
            except CMQError:
                ok = False  # D7: the queue did not accept: the retry policy takes over
            else:
                out.routed = ok = True
        if not ok:
            if failed is None:
                failed = []
            failed.append(s)
    return failed


def compiled_enqueue_lean() -> Any:
    """enqueue_lean compiled (gateway/broker/_queue.c), or None under CMQ_GATEWAY_PURE_PYTHON=1
    or where the package was built without a compiler (gateway.broker.queue.COMPILED)."""
    from gateway.broker import queue as broker_queue
    from gateway.broker.storage import EmbeddedMessages

    if broker_queue.COMPILED is None:
        return None
    from gateway.broker import _queue  # type: ignore[attr-defined]

    return _queue.configure_enqueue(Message, EmbeddedMessages, ENQUEUE, CMQError, py_enqueue_lean)


class VHost:
    """What one gateway alone decides is here; what the gateways of a cluster decide together
    (shared records of transient objects, exclusive queues of other gateways, auto-delete and
    x-expires) is asked of ``broker.membership`` (gateway.broker.membership)."""

    def __init__(self, broker: Broker, name: str, profile: Profile = DEFAULT_PROFILE) -> None:
        self.broker = broker
        self.name = name
        self.profile = profile  # PF1: the limits that refuse, and those only reported
        # Routing keys of topic exchanges found within the profile's reported limits (PF4): a
        # publisher repeats a few, so each is checked once, not per message (set_profile clears).
        self.keys_within: set[str] = set()
        self.exchanges: dict[str, Exchange] = {}
        self.queues: dict[str, BrokerQueue] = {}
        self.policies: dict[str, Policy] = {}
        for xname, xtype in STANDARD_EXCHANGES:
            self.exchanges[xname] = Exchange(name, xname, xtype, durable=True, limits=profile.enforced)

    # -- profile (PF1-PF5) -------------------------------------------------------------------

    def set_profile(self, profile: Profile) -> None:
        """PF1: another profile from now on, for every exchange and queue of the vhost."""
        self.profile = profile
        self.keys_within = set()
        for ex in self.exchanges.values():
            if ex.topic is not None:
                ex.topic.set_limits(profile.enforced)
        for q in self.queues.values():
            q.cmq.refuse_size = profile.enforced.message_size
            q.receive_metadata = profile.receive_metadata or q.qargs.receive_metadata

    def breach(self, err: LimitError, object: str, user: str | None, peer: str | None) -> None:
        """A breach of a CMQ limit: refused in the cmq profile (PF2), reported in the
        compatible one (PF4)."""
        if self.profile.refuse:
            raise err
        self.broker.report_breach(self.name, err, object, user, peer)

    def _check_name(self, name: str, kind: Kind, user: str | None, peer: str | None) -> None:
        """L1/L2: a name that is not already a valid CMQ name is refused in the cmq profile
        (strict names are part of it, PF2) or with ``strict_names``, and reported in the
        compatible one (PF4): it is what a migration must rename. Not while recovering: what
        the store gives back was checked when it was declared."""
        if self.broker._recovering:
            return
        # Longer than an AMQP short string is no AMQP name in any profile: RabbitMQ can hold
        # none (only the HTTP API could ask for one), nor could a list or export show it.
        validate_amqp_name(name)
        try:
            cmq_name(name, kind, strict=True)
        except LimitError as e:
            if self.broker.strict_names:
                raise
            self.breach(e, f"{'exchange' if kind == 'topic' else 'queue'}:{name}", user, peer)

    def report_filters(self, exchange: str, topic: Topic, sub: str, filters: Collection[str],
                       new: tuple[str, ...] | list[str], user: str | None, peer: str | None) -> None:
        """PF4: a subscription's ``filters`` (distinct) past CMQ's count (L3 tags, L4 binding
        keys), and each of its ``new`` filters past CMQ's size, reported. Costs O(len(new)),
        not O(len(filters)): a pair given n keys one bind at a time is reported in O(n) (SE5)."""
        reported = self.profile.reported
        if reported is None or not filters:
            return
        tags = topic.filter_type is FilterType.TAG
        what = f"subscription {sub!r}"
        errors = [tags_count_breach(len(filters), reported, what=what) if tags
                  else binding_keys_count_breach(len(filters), reported)]
        for value in dict.fromkeys(new):
            errors.append(tag_breach(value, reported, what=what) if tags
                          else key_breach(value, reported, what="binding key"))
        for err in errors:
            if err is not None:
                self.broker.report_breach(self.name, err, f"binding:{exchange}->{sub}", user, peer)

    def _report_message(self, ex: Exchange, tags: tuple[str, ...], routing_key: str, user: str | None,
                        peer: str | None) -> None:
        """PF4: a message's tags (L3, direct) or routing key (L4, topic) past CMQ's limits."""
        reported = self.profile.reported
        assert reported is not None
        if ex.type == "direct":
            err = tags_breach(tags, reported) if tags else None
        elif ex.type == "topic":
            err = key_breach(routing_key, reported)
            if err is None:
                if len(self.keys_within) >= 4096:
                    self.keys_within.clear()
                self.keys_within.add(routing_key)
        else:
            return
        if err is not None:
            self.broker.report_breach(self.name, err, f"exchange:{ex.name}", user, peer)

    # -- helpers -----------------------------------------------------------------------------

    def _emit(self, event: str, **fields: Any) -> None:
        self.broker.emit_fields(event, self.name, fields)

    def exchange(self, name: str) -> Exchange:
        ex = self.exchanges.get(name)
        if ex is None:
            raise not_found("exchange", name, self.name)
        return ex

    def queue(self, name: str, session: Session | None = None) -> BrokerQueue:
        if session is not None and self.broker.membership.locked(self.name, name):
            raise resource_locked(name, self.name)  # CL4: exclusive to another gateway's connection
        q = self.queues.get(name)
        if q is None:
            raise not_found("queue", name, self.name)
        if session is not None and q.exclusive_owner is not None and q.exclusive_owner is not session:
            raise resource_locked(name, self.name)
        return q

    # -- exchanges (M2-M6) -------------------------------------------------------------------

    def _redeclare(self, existing: Exchange, type: str, durable: bool, auto_delete: bool,
                   internal: bool, arguments: dict[str, Any] | None) -> Exchange:
        """A declare of an exchange that exists: equivalent or 406 "inequivalent arg"."""
        args = dict(arguments or {})
        for arg, got, cur in (("type", type, existing.type), ("durable", durable, existing.durable),
                              ("auto_delete", auto_delete, existing.auto_delete),
                              ("internal", internal, existing.internal)):
            if got != cur:
                raise inequivalent(arg, "exchange", existing.name, self.name, got, cur)
        diff = equivalent_args(args, existing.arguments, EXCHANGE_EQUIVALENCE)
        if diff is not None:
            raise inequivalent(diff, "exchange", existing.name, self.name, args.get(diff),
                               existing.arguments.get(diff))
        return existing

    def declare_exchange(self, name: str, type: str, *, passive: bool, durable: bool,
                         auto_delete: bool, internal: bool, arguments: dict[str, Any] | None,
                         user: str | None = None, peer: str | None = None) -> Exchange:
        if name == "" or (name.startswith("amq.") and not passive):
            if passive and name == "":
                raise access_refused("operation not permitted on the default exchange", "M6")
            existing = self.exchanges.get(name)
            if name.startswith("amq.") and existing is not None:
                # As RabbitMQ: an existing amq.* exchange goes through the equivalence check
                # (an equivalent redeclare is fine, another type is 406); only a new amq.*
                # name is refused for its reserved prefix (403).
                return self._redeclare(existing, type, durable, auto_delete, internal, arguments)
            raise access_refused(f"exchange name '{name}' contains reserved prefix 'amq.*'"
                                 if name else "operation not permitted on the default exchange", "M6")
        if passive:
            return self.exchange(name)
        if type not in EXCHANGE_TYPES:
            # RabbitMQ closes the connection: 503 COMMAND_INVALID "unknown exchange type".
            raise ConnectionFault("M16", f"unknown exchange type '{type}'", reply_code=503, value=type)
        args = dict(arguments or {})
        check_exchange_args(args, name, self.name)
        existing = self.exchanges.get(name)
        if existing is not None:
            return self._redeclare(existing, type, durable, auto_delete, internal, args)
        self._check_name(name, "topic", user, peer)  # L2: a name CMQ could not hold
        ex = Exchange(self.name, name, type, durable=durable, auto_delete=auto_delete,
                      internal=internal, arguments=args, limits=self.profile.enforced)
        ex.policy = choose(self.policies.values(), "exchange", name)
        self.exchanges[name] = ex
        if durable or self.broker.membership.shares:
            record: dict[str, Any] = {"vhost": self.name, "name": name, "type": type, "auto_delete": auto_delete,
                                      "internal": internal, "arguments": args}
            if not durable:
                record["durable"] = False  # a cluster shares transient exchanges too (membership)
            self.broker.persist(P.exchange_key(self.name, name), P.encode_json(record))
        self._emit("exchange_declare", topic=name, user=user, policy=type)
        return ex

    def delete_exchange(self, name: str, *, if_unused: bool, user: str | None = None) -> None:
        if name == "" or name.startswith("amq."):
            raise access_refused("operation not permitted on the default exchange" if not name
                                 else f"deletion of system exchange '{name}' in vhost '{self.name}' not allowed",
                                 "M6")
        ex = self.exchanges.get(name)
        if ex is None:
            return  # RabbitMQ 3.x: deleting a missing exchange is ok
        if if_unused and ex.bindings:
            raise precondition(f"exchange '{name}' in vhost '{self.name}' in use")
        # Gone first, so that dropping its last binding does not auto-delete it a second time.
        del self.exchanges[name]
        for dest in list(ex.bindings):
            self._drop_binding(ex, dest)
        # A list: dropping a binding may auto-delete its source exchange (a cascade).
        for other in list(self.exchanges.values()):
            if ("x", name) in other.bindings:
                self._drop_binding(other, ("x", name))
        if ex.durable or self.broker.membership.shares:
            self.broker.unpersist(P.exchange_key(self.name, name), missing_ok=True)
        self._emit("exchange_delete", topic=name, user=user)

    # -- queues (M7) -------------------------------------------------------------------------

    def declare_queue(self, session: Session | None, name: str, *, passive: bool, durable: bool,
                      exclusive: bool, auto_delete: bool, arguments: dict[str, Any] | None,
                      user: str | None = None, server_name: str | None = None,
                      peer: str | None = None) -> BrokerQueue:
        """``server_name``: the amq.gen-... name to give a queue declared as "" (the session
        picks it first to check the configure permission on it, W2)."""
        membership = self.broker.membership
        if not passive and membership.locked(self.name, name):
            raise resource_locked(name, self.name)  # CL4: exclusive to another gateway's connection
        new = not passive and name not in self.queues
        q = self.declare_queue_here(session, name, passive=passive, durable=durable, exclusive=exclusive,
                                    auto_delete=auto_delete, arguments=arguments, user=user,
                                    server_name=server_name, peer=peer)
        if new and membership.shares and not (durable and not exclusive):
            # The embedded store journals durable queues only (declare_queue_here); a cluster
            # shares the others too, an exclusive one with the gateway that owns it.
            record: dict[str, Any] = {"vhost": self.name, "name": q.name, "auto_delete": auto_delete,
                                      "arguments": q.arguments, "durable": durable}
            if exclusive:
                record["exclusive_owner"] = membership.owner
            self.broker.persist(P.queue_key(self.name, q.name), P.encode_json(record))
        membership.used(q)
        return q

    def declare_queue_here(self, session: Session | None, name: str, *, passive: bool, durable: bool,
                           exclusive: bool, auto_delete: bool, arguments: dict[str, Any] | None,
                           user: str | None = None, server_name: str | None = None,
                           peer: str | None = None) -> BrokerQueue:
        """The declaration as this gateway sees it, before membership shares it: also how a
        cluster applies a queue another gateway declared (gateway.jetstream.membership)."""
        if passive:
            if not name:
                raise not_found("queue", name, self.name)
            q = self.queue(name, session)
            self.broker.touch_queue(q)
            return q
        if name.startswith("amq.") and name not in self.queues:
            raise access_refused(f"queue name '{name}' contains reserved prefix 'amq.*'")
        if not name:
            # Server-named: amq.gen-..., which clients expect; it maps to a valid CMQ name (L2)
            # and so is allowed under strict_names too.
            name = server_name or new_name("amq.gen-")
        elif name not in self.queues:
            self._check_name(name, "queue", user, peer)  # L2: a name CMQ could not hold
        args = dict(arguments or {})
        existing = self.queues.get(name)
        if existing is not None:
            self.queue(name, session)  # 405 when another connection owns it
            if exclusive != (existing.exclusive_owner is not None):
                # As RabbitMQ (checked against 3.10): a mismatched exclusive flag is 405, and
                # it is checked before durable, auto_delete and the arguments.
                raise resource_locked(name, self.name)
            for arg, got, cur in (("durable", durable, existing.durable),
                                  ("auto_delete", auto_delete, existing.auto_delete)):
                if got != cur:
                    raise inequivalent(arg, "queue", name, self.name, got, cur)
            diff = equivalent_args(args, existing.arguments, QUEUE_EQUIVALENCE)
            if diff is not None:
                raise inequivalent(diff, "queue", name, self.name, args.get(diff),
                                   existing.arguments.get(diff))
            self.broker.touch_queue(existing)
            return existing
        check_rabbit_args(args, name, self.name)
        if server_name is None:  # a stored or another gateway's queue loads as it was declared
            check_queue_kind_args(args, name, self.name, durable=durable, exclusive=exclusive, auto_delete=auto_delete)
        policy, qargs, attrs = self._queue_settings(name, args)
        q = self._make_queue(name, durable=durable, owner=session if exclusive else None,
                             auto_delete=auto_delete, arguments=args, qargs=qargs, attrs=attrs)
        q.policy = policy
        if durable and not exclusive:
            self.broker.persist(P.queue_key(self.name, name), P.encode_json(
                {"vhost": self.name, "name": name, "auto_delete": auto_delete, "arguments": args}))
        self._emit("queue_declare", queue=name, user=user)
        return q

    def _queue_settings(self, name: str, args: dict[str, Any]) -> tuple[Policy | None, Any, QueueAttributes]:
        """The policy that applies to the queue and what the queue behaves by: its arguments
        with the policy's keys resolved in. A policy whose values this queue cannot take (a
        CMQ range, L8/Q8) does not apply to it; the declare itself stands, as in RabbitMQ."""
        policy = choose(self.policies.values(), "queue", name, args)
        if policy is not None:
            try:
                qargs = parse_queue_args(queue_arguments(args, policy))
                return policy, qargs, QueueAttributes(**qargs.attrs)
            except CMQError:
                pass
        qargs = parse_queue_args(args)
        return None, qargs, QueueAttributes(**qargs.attrs)

    def set_queue_arguments(self, q: BrokerQueue, arguments: dict[str, Any], user: str | None = None) -> None:
        """CMQ SetQueueAttributes (CA2): the queue's arguments replaced and its attributes
        changed at once; a CMQError, and nothing changed, when the new ones break a range."""
        check_rabbit_args(arguments, q.name, self.name)
        policy, qargs, attrs = self._queue_settings(q.name, arguments)
        q.arguments, q.policy, q.qargs, q.attrs = dict(arguments), policy, qargs, attrs
        q.cmq.set_attributes(attrs, self.broker.now())
        if q.durable and q.exclusive_owner is None:
            self.broker.persist(P.queue_key(self.name, q.name), P.encode_json(
                {"vhost": self.name, "name": q.name, "auto_delete": q.auto_delete, "arguments": q.arguments}))
        self._emit("queue_declare", queue=q.name, user=user, reason="attributes")
        self.broker.touch_queue(q)
        self.broker.after_queue_change(self, q)

    # -- policies (M7) -----------------------------------------------------------------------

    def set_policy(self, policy: Policy) -> None:
        """Add or replace a policy; it applies at once to the objects it matches, and to
        every object declared later (as RabbitMQ's policies do)."""
        self.policies[policy.name] = policy
        self.broker.persist(P.policy_key(self.name, policy.name), P.encode_json(policy.to_json()))
        self.apply_policies()

    def delete_policy(self, name: str) -> bool:
        if self.policies.pop(name, None) is None:
            return False
        self.broker.unpersist(P.policy_key(self.name, name), missing_ok=True)
        self.apply_policies()
        return True

    def apply_policies(self) -> None:
        """Every queue and exchange again under the policy that now applies to it."""
        for ex in self.exchanges.values():
            ex.policy = choose(self.policies.values(), "exchange", ex.name)
        now = self.broker.now()
        for q in list(self.queues.values()):
            policy, qargs, attrs = self._queue_settings(q.name, q.arguments)
            if policy == q.policy and attrs == q.attrs and qargs == q.qargs:
                continue
            q.policy, q.qargs, q.attrs = policy, qargs, attrs
            q.cmq.set_attributes(attrs, now)
            self.broker.touch_queue(q)
            self.broker.after_queue_change(self, q)

    def _make_queue(self, name: str, *, durable: bool, owner: Session | None, auto_delete: bool,
                    arguments: dict[str, Any], qargs: Any, attrs: QueueAttributes) -> BrokerQueue:
        messages = self.broker.messages
        cmq = messages.new_model(name, attrs, self.profile.enforced.message_size)
        q = BrokerQueue(self.name, name, durable=durable, exclusive_owner=owner, auto_delete=auto_delete,
                        arguments=arguments, qargs=qargs, attrs=attrs, cmq=cmq)
        q.receive_metadata = self.profile.receive_metadata or qargs.receive_metadata  # M11, PF5
        q.last_used = self.broker.now()
        self.queues[name] = q
        messages.made(self, q)
        self.broker.after_queue_change(self, q)
        return q

    def delete_queue(self, session: Session | None, name: str, *, if_unused: bool, if_empty: bool,
                     user: str | None = None, reason: str = "deleted") -> int:
        q = self.queues.get(name)
        if q is None:
            return 0  # RabbitMQ 3.x: deleting a missing queue answers delete-ok 0
        if session is not None:
            self.queue(name, session)
        if if_unused and q.consumers:
            raise precondition(f"queue '{name}' in vhost '{self.name}' in use")
        count = q.message_count
        if if_empty and count:
            raise precondition(f"queue '{name}' in vhost '{self.name}' not empty")
        self._remove_queue(q, user=user, reason=reason)
        return count

    def _remove_queue(self, q: BrokerQueue, *, user: str | None, reason: str) -> None:
        q.deleted = True
        del self.queues[q.name]
        for ex in list(self.exchanges.values()):
            if ("q", q.name) in ex.bindings:
                self._drop_binding(ex, ("q", q.name))
        for consumer in list(q.consumers):
            consumer.channel.server_cancel(consumer)
        q.consumers.clear()
        self.broker.forget_queue(self, q)
        self._emit("queue_delete", queue=q.name, user=user, reason=reason)

    def purge_queue(self, session: Session | None, name: str, user: str | None = None) -> int:
        q = self.queue(name, session)
        count = self.broker.messages.purge(self, q)
        self._emit("queue_purge", queue=name, user=user, size=count)
        return count

    # -- bindings (M8) -----------------------------------------------------------------------

    def bind(self, session: Session | None, source: str, dest: Dest, key: str,
             arguments: dict[str, Any] | None, user: str | None = None, peer: str | None = None) -> None:
        if source == "" or (dest[0] == "x" and dest[1] == ""):
            raise access_refused("operation not permitted on the default exchange", "M6")
        ex = self.exchange(source)
        if dest[0] == "q":
            q = self.queue(dest[1], session)
            durable = ex.durable and q.durable
        else:
            durable = ex.durable and self.exchange(dest[1]).durable
        binding, changed = ex.bind(dest, key, arguments)
        # A cluster shares transient bindings too (membership), and writes one's record again
        # when it is bound again.
        if durable and changed or not durable and self.broker.membership.shares:
            self.broker.persist(P.binding_key(self.name, source, dest[0], dest[1], key), P.encode_json(
                {"vhost": self.name, "source": source, "kind": dest[0], "dest": dest[1], "key": key,
                 "arguments": dict(arguments or {})}))
        if not changed:
            return
        if ex.topic is not None and ex.type != "fanout" and self.profile.reported is not None:
            self.report_filters(ex.name, ex.topic, sub_name(dest), binding.key_view, (key,), user, peer)
        self._emit("bind", topic=source, queue=dest[1], subscription=binding.name,
                   routing_key=key, tags=binding.first_keys(BIND_TAGS_LISTED), user=user,
                   policy=binding.notify_strategy, **bind_tags_count(binding.key_count))

    def unbind(self, session: Session | None, source: str, dest: Dest, key: str,
               user: str | None = None) -> None:
        if source == "" or (dest[0] == "x" and dest[1] == ""):
            raise access_refused("operation not permitted on the default exchange", "M6")
        ex = self.exchanges.get(source)
        binding = ex.bindings.get(dest) if ex is not None else None
        if ex is None or binding is None or not binding.has_key(key):
            # RabbitMQ 3.x: unbinding a binding that is not there is ok, even when its
            # exchange or queue is gone (aio-pika's RPC unbinds after the auto-delete).
            return
        if dest[0] == "q":
            self.queue(dest[1], session)  # 405 when another connection owns it
        ex.unbind(dest, key)
        self.broker.unpersist(P.binding_key(self.name, source, dest[0], dest[1], key), missing_ok=True)
        self._emit("unbind", topic=source, queue=dest[1], subscription=binding.name, routing_key=key,
                   user=user)
        self._maybe_auto_delete_exchange(ex)

    def _drop_binding(self, ex: Exchange, dest: Dest) -> None:
        binding = ex.unbind_dest(dest)
        if binding is None:
            return
        for key in binding.keys:
            self.broker.unpersist(P.binding_key(self.name, ex.name, dest[0], dest[1], key), missing_ok=True)
        self._maybe_auto_delete_exchange(ex)

    def _maybe_auto_delete_exchange(self, ex: Exchange) -> None:
        if ex.auto_delete and not ex.bindings and ex.name in self.exchanges:
            self.delete_exchange(ex.name, if_unused=False, user=None)

    # -- publish (M9, M10) -------------------------------------------------------------------

    def publish(self, exchange: str, routing_key: str, properties: Any, body: bytes,
                immediate: bool = False, user: str | None = None,
                peer: str | None = None, cycle: frozenset[str] = NO_CYCLE,
                protocol: str | None = None, msg_id: str | None = None) -> PublishOutcome:
        """One basic.publish. Every record it leaves in the audit log (publish, route, enqueue,
        discard) carries the one CMQ message ID it gets here (A2), or ``msg_id`` (a resend
        that must be stored once, MQ8). ``protocol``: the API that carried it when not AMQP
        (CA4), written in its publish record. Every argument may be passed by position
        (Session.on_event's publish does: a call by keyword costs ~40 % more)."""
        if immediate:
            # RabbitMQ 3.x dropped immediate: connection error 540.
            raise ConnectionFault("M16", "immediate=true", reply_code=NOT_IMPLEMENTED)
        broker = self.broker
        clock_now = broker.clock_now  # Broker.clock_now says why through a local
        now = clock_now()
        out = PublishOutcome()
        if type(properties) is Properties and not properties._flags & _HEADERS_OR_EXPIRATION:
            headers = ttl = None  # the common property list: neither is there to read
        else:
            headers = properties.headers
            ttl = None if properties.expiration is None else _ttl_of(properties)
        if exchange == "":
            # M10: CMQ SendMessage straight to the queue named by the routing key. In this
            # function, not a method of its own: it is most publishes (a frame each).
            size = len(body)
            msg_id = out.msg_id = msg_id or new_msg_id()
            if protocol is None:
                emit_values = broker.emit_values  # an instance attribute: called through a local, specialized
                emit_values(PUBLISH_QUEUE, self.name, routing_key, routing_key, msg_id, size, user, peer)
            else:
                broker.emit_row(PUBLISH_QUEUE_VIA, self.name,
                                (routing_key, routing_key, msg_id, size, user, peer, protocol))
            q = self.queues.get(routing_key)
            if q is None:
                if routing_key.startswith(REPLY_PREFIX) and broker.replies.deliver(routing_key, properties, body):
                    out.routed = True  # direct reply-to: straight to the waiting consumer
                    return out
                self._emit("discard", queue=routing_key, routing_key=routing_key, msg_id=msg_id, size=size,
                           reason="no_match", user=user, peer=peer)
                return out
            delay = _delay_of(headers) if headers else None
            if size > q.attrs.max_msg_size and not self.profile.refuse:
                # L6 in compatible (PF3/PF4): the queue takes it; the cmq profile's refusal is
                # CmqQueue.send's, below.
                self.breach(LimitError("L6", f"message of {size:,} bytes is larger than queue '{q.name}' "
                                       f"max_msg_size {q.attrs.max_msg_size:,} bytes", value=size,
                                       limit=q.attrs.max_msg_size), f"queue:{q.name}", user, peer)
            msg = new_message(Message)  # Message(...) without type_call's C frame (message.py)
            init_message(msg, body, properties, "", routing_key, now, (), msg_id, ttl)
            try:
                if cycle or (q.durable and msg.persistent):
                    msg.cycle = cycle
                    self._enqueue(q, msg, now, delay, out, None, None)
                else:  # the common case: none of _enqueue's refusals can apply
                    out.lsn = broker.messages.enqueue(self, q, msg, now, delay,
                                                           None if ttl is None else message_expiry(now, delay, ttl),
                                                           out.lsn, None, None)
                    out.routed = True
            except MaxLengthRejected:
                # x-overflow reject-publish: RabbitMQ nacks a confirming publisher, no channel error;
                # reject-publish-dlx also dead-letters the refused message (reason maxlen).
                out.rejected = True
                out.routed = True
                if q.attrs.overflow == "reject-publish-dlx" and broker.dead_letter(
                        self, q, msg, msg_id, size, "maxlen"):
                    return out
                self._emit("discard", queue=q.name, routing_key=routing_key, msg_id=msg_id, size=size,
                           reason="max_length", user=user, peer=peer)
                return out
            except LimitError as e:
                if e.rule == "L6":
                    self._emit("discard", queue=q.name, routing_key=routing_key, msg_id=msg_id, size=size,
                               reason="too_large", user=user, peer=peer)
                raise
            return out
        ex = self.exchanges.get(exchange) or self.exchange(exchange)  # the 404 is exchange()'s
        if ex.internal:
            raise access_refused(f"cannot publish to internal exchange '{exchange}' in vhost '{self.name}'")
        profile = self.profile
        tags = message_tags(routing_key, headers, profile.enforced) if ex.type == "direct" else ()
        if profile.reported is not None and (ex.type != "topic" or routing_key not in self.keys_within):
            self._report_message(ex, tags, routing_key, user, peer)
        size = len(body)
        fresh = not msg_id
        msg_id = out.msg_id = msg_id or new_msg_id()
        values = (exchange, routing_key, msg_id, list(tags) or None, size, user, peer)
        if protocol is None:
            self.broker.emit_row(PUBLISH_TOPIC, self.name, values)
        else:
            self.broker.emit_row(PUBLISH_TOPIC_VIA, self.name, (*values, protocol))
        emit = self.broker.audit.emit
        if headers and ("x-delay" in headers or "x-cmq-delay-seconds" in headers):
            raise precondition(f"message delay is a queue feature; it is not available through "
                               f"topic '{exchange}' (CMQ rule Q4)", rule="Q4")
        topic = ex.topic
        # Topic.max_message_size without its two property frames (Exchange's and Topic's)
        max_size = topic._max_size if topic is not None else ex.max_message_size
        if size > max_size:
            if profile.refuse:
                emit("discard", self.name, topic=exchange, routing_key=routing_key, msg_id=msg_id, size=size,
                     reason="too_large", user=user, peer=peer)
            self.breach(LimitError("L6", f"message of {size} bytes is larger than topic '{exchange}' "
                                   f"MaximumMessageSize {max_size}", value=size, limit=max_size),
                        f"exchange:{exchange}", user, peer)
        msg = new_message(Message)  # Message(...) without type_call's C frame (message.py)
        init_message(msg, body, properties, exchange, routing_key, now, tags, msg_id, ttl)
        msg.cycle = cycle
        if size > QUEUE_MAX_MSG_SIZE_MIN:  # no queue refuses a body this small (L6)
            self._check_sizes(ex, msg, headers, user, peer)
        self._route(ex, msg, headers, now, out, {exchange}, fresh)
        if not out.routed:
            emit("discard", self.name, topic=exchange, routing_key=routing_key, msg_id=msg_id, size=size,
                 reason="no_match", user=user, peer=peer)
        return out

    def _dests(self, ex: Exchange, msg: Message, headers: Any) -> tuple[Dest, ...]:
        if ex.topic is None:
            return ex.headers_route(headers)
        return tuple(s.endpoint for s in ex.topic.match(msg.tags, msg.routing_key)  # type: ignore[misc]
                     if isinstance(s.endpoint, tuple))

    def _check_sizes(self, ex: Exchange, msg: Message, headers: Any, user: str | None,
                     peer: str | None) -> None:
        """L6: refuse before anything is enqueued when a queue it reaches would refuse it."""
        size = len(msg.body)
        for kind, name in self._dests(ex, msg, headers):
            if kind == "q":
                q = self.queues.get(name)
                if q is not None and size > q.attrs.max_msg_size:
                    if self.profile.refuse:
                        self._emit("discard", topic=ex.name, queue=q.name, routing_key=msg.routing_key,
                                   msg_id=msg.msg_id, size=size, reason="too_large", user=user, peer=peer)
                    self.breach(LimitError("L6", f"message of {size} bytes is larger than queue '{q.name}' "
                                           f"MaxMsgSize {q.attrs.max_msg_size}", value=size,
                                           limit=q.attrs.max_msg_size), f"queue:{q.name}", user, peer)

    def _route(self, ex: Exchange, msg: Message, headers: Any, now: float, out: PublishOutcome,
               seen: set[str], fresh: bool = False) -> None:
        """Route through ``ex`` (its topic, M9) and onward through exchange bindings, each once.
        ``fresh``: the message ID was made by this publish and nothing was routed yet, so no
        queue can hold it already (a resend's given ID, MQ8, or a second exchange may)."""
        tags = list(msg.tags) or None
        size = len(msg.body)
        if ex.topic is None:
            dests = ex.headers_route(headers)
            for dest in dests:
                sub = sub_label(ex.name, sub_name(dest))
                self.broker.emit_row(ROUTE, self.name, (ex.name, msg.msg_id, msg.routing_key, sub,
                                                        dest[1] if dest[0] == "q" else None, tags, size))
                self._attempt(dest, msg, headers, now, out, seen, ex.name, sub)
            matched = len(dests)
        else:
            topic = ex.topic
            # A1: one route record per subscription that takes it, before its enqueue records
            # (the lookup is the topic's cached one, done again inside publish).
            # Topic.match's cache read here (its two frames), match itself on a miss (which
            # validates, L3/L4, and fills the cache; a cached () is looked up again there).
            subs = topic._cache.get(msg.routing_key if topic._tags is None else msg.tags) \
                or topic.match(msg.tags, msg.routing_key)
            emit_values = self.broker.emit_values  # (row, vhost, *values): no tuple a record
            vhost_name, ex_name, msg_id, routing_key = self.name, ex.name, msg.msg_id, msg.routing_key
            labels = ex.labels
            lean = True  # every subscription an unblocked queue endpoint (below)
            sub_labels = []  # each subscription's label, read once for its route and its enqueue
            for s in subs:
                endpoint = s.endpoint
                if type(endpoint) is tuple and endpoint[0] == "q":
                    queue = endpoint[1]
                    if s._blocker is not None:
                        lean = False
                else:
                    queue = None
                    lean = False
                label = labels.get(s.name) or ex.label_of(s.name)
                sub_labels.append(label)
                emit_values(ROUTE, vhost_name, ex_name, msg_id, routing_key, label, queue, tags, size)
            matched = len(subs)
            if lean and matched and not (size > topic._max_size and topic.limits.message_size) \
                    and not msg.cycle:
                # The common case, without Topic.publish's attempt callback and the frames of
                # _attempt and _enqueue: each subscription's queue is enqueued here, in order,
                # the steps of those two for a queue endpoint (D1, D7). Topic.publish would
                # raise L6 before any attempt, and a blocked subscription waits (D6): neither
                # comes here; nor does a dead-letter cycle (_enqueue's discard).
                ttl = msg.ttl
                expires_at = None if ttl is None else message_expiry(now, None, ttl)
                # Compiled where it can be (gateway/broker/_queue.c enqueue_lean).
                failed = enqueue_lean(self, subs, sub_labels, msg, now, expires_at, out, ex_name, fresh)
                if failed is None:
                    result = None  # D2: all delivered, nothing kept
                else:
                    result = topic.retain_failed(TopicMessage(msg.msg_id, now, msg.tags, msg.routing_key, msg, size),
                                                 now, subs, failed)
            else:
                def attempt(sub: Any, tmsg: Any) -> bool | None:
                    endpoint = sub.endpoint
                    if endpoint[0] not in _LOCAL:
                        return self.broker.attempt_endpoint(topic, sub, tmsg)
                    return self._attempt(endpoint, msg, headers, now, out, seen, ex.name,
                                         labels.get(sub.name) or ex.label_of(sub.name))

                tmsg = TopicMessage(msg.msg_id, now, msg.tags, msg.routing_key, msg, size)
                result = topic.publish(tmsg, now, attempt)
            if result is not None and result.retained:
                self._retained(ex, msg, out, result)
        if not matched and ex.alternate and ex.alternate not in seen:
            alt = self.exchanges.get(ex.alternate)
            if alt is not None:
                seen.add(alt.name)
                self._route(alt, msg, headers, now, out, seen)

    def _retained(self, ex: Exchange, msg: Message, out: PublishOutcome, result: Any) -> None:
        """D2: the topic of ``ex`` kept ``msg`` (``result``: its PublishResult) for retries."""
        msg.key = ""  # the topic holds it too: its body stays in memory
        out.routed = True  # kept by the topic until its subscriptions settle
        if self.broker.read_only and ex.durable and msg.persistent:
            out.rejected = True  # not journalled while the store fails: not confirmed
        lsn = self.broker.journal_retained(self, ex, msg)
        if lsn > out.lsn:
            out.lsn = lsn
        self.broker.topic_events(self, ex, result.events)
        self.broker.reschedule_exchange(self, ex)

    def _attempt(self, dest: Dest, msg: Message, headers: Any, now: float, out: PublishOutcome,
                 seen: set[str], via: str, subscription: str | None = None) -> bool:
        """One delivery of a topic to a subscription's endpoint (D7): True when it took it."""
        kind, name = dest
        if kind == "q":
            q = self.queues.get(name)
            if q is None:
                return False  # D7: the endpoint queue does not exist
            if q.cmq.get(msg.msg_id) is not None:
                out.routed = True
                return True  # reached twice (exchange-to-exchange bindings): once, as RabbitMQ
            try:
                self._enqueue(q, msg, now, None, out, via, subscription)
            except CMQError:
                return False  # D7: the queue did not accept: the retry policy takes over
            return True
        if name not in seen:
            sub = self.exchanges.get(name)
            if sub is None:
                return False
            seen.add(name)
            self._route(sub, msg, headers, now, out, seen)
        return True

    def _enqueue(self, q: BrokerQueue, msg: Message, now: float, delay: float | None,
                 out: PublishOutcome, via: str | None, subscription: str | None) -> None:
        if msg.cycle and q.name in msg.cycle:
            # A dead-letter cycle with no rejection in it: dropped here, as RabbitMQ does
            # (routed: this one discard record is the message's end, not a no_match too).
            out.routed = True
            self._emit("discard", queue=q.name, msg_id=msg.msg_id, size=len(msg.body), reason="expired",
                       policy="dead_letter_cycle")
            return
        persist = q.durable and msg.persistent
        if persist and self.broker.read_only:
            # W5/M14: the store cannot write (disk full or read-only): the gateway does not
            # take a message it would have to keep on disk; never enqueued, so never stored
            # later behind the basic.nack the publisher gets under confirms.
            out.routed = True
            out.rejected = True
            self._emit("discard", queue=q.name, msg_id=msg.msg_id, size=len(msg.body), reason="rejected",
                       policy="store_failed")
            return
        lsn = self.broker.messages.enqueue(self, q, msg, now, delay, message_expiry(now, delay, msg.ttl), out.lsn,
                                           via, subscription)
        out.routed = True
        out.lsn = lsn

    # -- deletions caused by sessions --------------------------------------------------------

    def drop_exclusive(self, session: Session) -> None:
        for q in [q for q in self.queues.values() if q.exclusive_owner is session]:
            self._remove_queue(q, user=None, reason="owner_closed")

    def consumer_gone(self, q: BrokerQueue) -> None:
        membership = self.broker.membership
        if q.auto_delete and not q.consumers and not q.deleted and membership.hold_auto_delete(self, q):
            return
        self.last_consumer_left(q)
        if not q.consumers and not q.deleted:
            membership.used(q)

    def last_consumer_left(self, q: BrokerQueue) -> None:
        """What a consumer's leaving does to ``q`` once no other may come (membership)."""
        if q.auto_delete and q.had_consumer and not q.consumers and not q.deleted:
            self._remove_queue(q, user=None, reason="auto_delete")
        elif not q.consumers and not q.deleted:
            self.broker.touch_queue(q)  # x-expires counts from when the last consumer left

    def expire_queue(self, q: BrokerQueue) -> None:
        """x-expires: the queue was unused for that long; deleted as RabbitMQ deletes it
        (in a cluster, once no gateway used it since: membership)."""
        if not q.deleted and not q.consumers and not self.broker.membership.hold_expiry(self, q):
            self._remove_queue(q, user=None, reason="expired")

    def remove_expired(self, q: BrokerQueue) -> None:
        """x-expires, decided by membership: deleted unless used again meanwhile."""
        if not q.deleted and not q.consumers:
            self._remove_queue(q, user=None, reason="expired")


def _ttl_of(properties: Any) -> float | None:
    """RabbitMQ's per-message TTL: the ``expiration`` property, in ms as a decimal string.
    CMQ has none; RabbitMQ's meaning is kept (SPEC: where CMQ is silent, behave like RabbitMQ),
    and so are its refusals, word for word."""
    exp = properties.expiration
    if exp is None:
        return None
    text = exp.decode("latin-1") if isinstance(exp, bytes) else exp
    if text.isdigit():
        return int(text) / 1000.0
    m = re.match(r"-?\d+", text)
    if m is None:
        why = "no_integer"
    elif m.end() < len(text):
        why = f'{{leftover_string,"{text[m.end():]}"}}'
    else:
        why = f"{{value_negative,{text}}}"
    raise precondition(f"invalid expiration '{text}': {why}", rule="M16", value=text)


def _delay_of(headers: Any) -> float | None:
    """M10/Q4: ``x-delay`` in ms (the delayed-message plugin's header) or x-cmq-delay-seconds."""
    if not headers:
        return None
    if "x-cmq-delay-seconds" in headers:
        value = headers["x-cmq-delay-seconds"]
        scale = 1.0
    elif "x-delay" in headers:
        value = headers["x-delay"]
        scale = 0.001
    else:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise CMQError("Q4", f"message delay {value!r} is not a number", value=value)
    seconds = max(0.0, value * scale)
    from semantics.queue_attrs import check_delay
    check_delay(seconds)
    return seconds


enqueue_lean = compiled_enqueue_lean() or py_enqueue_lean
