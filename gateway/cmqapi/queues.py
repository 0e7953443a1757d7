"""CMQ's queue actions (CA2) over the broker's queues (M7, M10-M13, Q1-Q8).

A CMQ queue is the AMQP queue of the same name in the request's vhost: durable, its CMQ
attributes held as ``x-cmq-*`` arguments (M7). Only attributes that differ from CMQ's
defaults become arguments, so that an AMQP client declaring the same queue without arguments
is not refused with 406 "inequivalent arg" (the SDKs send every default explicitly).

A receipt handle is ``<msgId>.<hex>`` (semantics.message_ids): each receive makes a new one
and only the latest deletes the message (Q3). An older one deletes nothing and is answered
4430 "invalid receiptHandle", as CMQ's DeleteMessage page says of a handle whose
NextVisibleTime has passed.

Long polling (Q5): a receive with ``pollingWaitSeconds`` > 0 (or the queue's own) looks again
every POLL_INTERVAL until a message is Active or the wait ends, then answers 7000 (at once
when the queue is deleted or the gateway stops).
"""

from __future__ import annotations

import asyncio
import json
import time
from functools import partial
from typing import Any

from gateway.cmqapi.core import Action, Caller, CmqApi, object_id, sent, stopping
from gateway.cmqapi.errors import (
    BATCH_DELETE_FAILED,
    BATCH_DELETE_PARTIAL,
    INVALID_HANDLE,
    NO_MESSAGE,
    QUEUE_EXISTS,
    CmqApiError,
)
from gateway.cmqapi.params import BATCH_MAX, Params
from gateway.handout import put_back
from gateway.jetstream.api_receive import counts, demand_for
from gateway.protocol.properties import Properties
from semantics import limits
from semantics.message_ids import format_handle, parse_handle
from semantics.names import is_valid_name
from semantics.queue import Receipt
from semantics.queue_attrs import QueueAttributes

__all__ = ["POLL_INTERVAL", "QUEUE_ACTIONS"]

POLL_INTERVAL = 0.02  # seconds between two looks of a long poll (Q5)
JETSTREAM_ANSWER_WAIT = 10.0  # a receive without a wait waits this long at most for JetStream's answer
BIG = 2**62  # integer parameters whose range the CMQ model checks (L6-L8, Q8)

# CMQ parameter -> (x-cmq-* argument, QueueAttributes field) (M7).
ATTRIBUTES = {
    "maxMsgHeapNum": ("x-cmq-max-msg-heap-num", "max_msg_heap_num"),
    "pollingWaitSeconds": ("x-cmq-polling-wait-seconds", "polling_wait_seconds"),
    "visibilityTimeout": ("x-cmq-visibility-timeout", "visibility_timeout"),
    "maxMsgSize": ("x-cmq-max-msg-size", "max_msg_size"),
    "msgRetentionSeconds": ("x-cmq-msg-retention-seconds", "msg_retention_seconds"),
    "rewindSeconds": ("x-cmq-rewind-seconds", "rewind_seconds"),
}
DEAD_LETTER_ARGS = ("x-cmq-dead-letter-queue", "x-cmq-max-receive-count", "x-cmq-max-time-to-live")
_DEFAULTS = QueueAttributes()


def _arguments(api: CmqApi, caller: Caller, p: Params, current: dict[str, Any]) -> dict[str, Any]:
    """The queue's arguments with the request's attributes applied (defaults left out)."""
    args = dict(current)
    for param, (arg, field) in ATTRIBUTES.items():
        value = p.opt_number(param, -BIG, BIG)
        if value is None:
            continue
        if value == getattr(_DEFAULTS, field):
            args.pop(arg, None)
        else:
            args[arg] = value
    policy = p.opt("deadLetterPolicy")
    if policy is not None:
        for arg in DEAD_LETTER_ARGS:
            args.pop(arg, None)
        args.update(_dead_letter(api, caller, policy))
    return args


def _dead_letter(api: CmqApi, caller: Caller, text: str) -> dict[str, Any]:
    """Q8 from CMQ's ``deadLetterPolicy`` JSON: deadLetterQueue, policy (0: maxReceiveCount,
    1: maxTimeToLive). ``{}`` (or no deadLetterQueue) turns the policy off."""
    try:
        policy = json.loads(text)
    except (ValueError, RecursionError):  # RecursionError: nested past Python's limit
        raise CmqApiError.param(f"parameter deadLetterPolicy is not JSON: {text!r}", 10360) from None
    if not isinstance(policy, dict):
        raise CmqApiError.param("parameter deadLetterPolicy must be a JSON object", 10360)
    queue = policy.get("deadLetterQueue")
    if not queue:
        return {}
    if not isinstance(queue, str) or queue not in api.vhost(caller).queues:
        raise CmqApiError.queue_not_exist(f"{queue} (deadLetterPolicy.deadLetterQueue)")
    kind = policy.get("policy", 0)
    field = "maxReceiveCount" if kind in (0, "0") else "maxTimeToLive" if kind in (1, "1") else None
    if field is None:
        raise CmqApiError.out_of_range("deadLetterPolicy.policy", f"{kind!r} is not 0 or 1")
    value = policy.get(field)
    if isinstance(value, str) and value.isdigit():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise CmqApiError.missing(f"deadLetterPolicy.{field}")
    arg = "x-cmq-max-receive-count" if field == "maxReceiveCount" else "x-cmq-max-time-to-live"
    return {"x-cmq-dead-letter-queue": queue, arg: value}


def _dead_letter_view(q: Any) -> dict[str, Any] | None:
    a = q.attrs
    if a.dead_letter_queue is None:
        return None
    out: dict[str, Any] = {"deadLetterQueue": a.dead_letter_queue,
                           "policy": 0 if a.max_receive_count is not None else 1}
    if a.max_receive_count is not None:
        out["maxReceiveCount"] = a.max_receive_count
    if a.max_time_to_live is not None:
        out["maxTimeToLive"] = int(a.max_time_to_live)
    return out


def _attributes(q: Any) -> dict[str, Any]:
    a = q.attrs
    return {"maxMsgHeapNum": int(a.max_msg_heap_num), "pollingWaitSeconds": int(a.polling_wait_seconds),
            "visibilityTimeout": int(a.visibility_timeout), "maxMsgSize": int(a.max_msg_size),
            "msgRetentionSeconds": int(a.msg_retention_seconds), "rewindSeconds": int(a.rewind_seconds),
            "deadLetterPolicy": _dead_letter_view(q)}


# -- queue management ----------------------------------------------------------------------


async def create_queue(api: CmqApi, caller: Caller, p: Params) -> dict[str, Any]:
    name = p.text("queueName")
    if not is_valid_name(name, "queue"):
        raise CmqApiError.param(f"queue name format error: {name!r} (3-64 letters, digits, - and _, "
                                "starting with a letter; CMQ rule L1)", 10020)
    caller.require("configure", name)
    vh = api.vhost(caller)
    if name in vh.queues:
        raise CmqApiError(QUEUE_EXISTS, f"queue is already existed: {name}")
    args = _arguments(api, caller, p, {})
    vh.declare_queue(None, name, passive=False, durable=True, exclusive=False, auto_delete=False,
                     arguments=args, user=caller.user)
    api.touch("queue", vh.name, name, created=True)
    await api.durable()
    return {"queueId": object_id("queue", vh.name, name)}


async def list_queue(api: CmqApi, caller: Caller, p: Params) -> dict[str, Any]:
    vh = api.vhost(caller)
    total, names = p.page(n for n in vh.queues if caller.sees(n))  # as permitted (issue 26)
    return {"totalCount": total, "queueList": [{"queueId": object_id("queue", vh.name, n), "queueName": n}
                                               for n in names]}


async def get_queue_attributes(api: CmqApi, caller: Caller, p: Params) -> dict[str, Any]:
    vh, q = api.queue(caller, p.text("queueName"))
    caller.require_any(q.name)
    cmq = q.cmq
    oldest = cmq.oldest_enqueue_time() or 0  # a folded backlog stays folded
    active, inactive, delayed, rewindable = (await counts(api.broker, q)
                                             or (cmq.active, cmq.inactive, cmq.delayed, cmq.rewindable))
    return {**_attributes(q), **api.times("queue", vh.name, q.name),
            "queueId": object_id("queue", vh.name, q.name), "queueName": q.name,
            "activeMsgNum": active, "inactiveMsgNum": inactive, "delayMsgNum": delayed,
            "rewindMsgNum": rewindable, "minMsgTime": int(oldest)}


async def set_queue_attributes(api: CmqApi, caller: Caller, p: Params) -> dict[str, Any]:
    vh, q = api.queue(caller, p.text("queueName"))
    caller.require("configure", q.name)
    vh.set_queue_arguments(q, _arguments(api, caller, p, q.arguments), caller.user)
    api.touch("queue", vh.name, q.name)
    await api.durable()
    return {"queueId": object_id("queue", vh.name, q.name), **_attributes(q)}


async def delete_queue(api: CmqApi, caller: Caller, p: Params) -> dict[str, Any]:
    vh, q = api.queue(caller, p.text("queueName"))
    caller.require("configure", q.name)
    vh.delete_queue(None, q.name, if_unused=False, if_empty=False, user=caller.user)
    api.forget("queue", vh.name, q.name)
    await api.durable()
    return {}


async def rewind_queue(api: CmqApi, caller: Caller, p: Params) -> dict[str, Any]:
    vh, q = api.queue(caller, p.text("queueName"))
    caller.require("read", q.name)
    to = p.number("startConsumeTime", 0, BIG)
    count = q.cmq.rewind(float(to), api.broker.now())  # CMQError Q6: 4000 naming the rule
    api.emit("rewind", caller, queue=q.name, next_at=float(to), size=count)
    api.broker.after_queue_change(vh, q)
    return {}


# -- messages ------------------------------------------------------------------------------


def _properties(delay: int | None) -> Properties:
    """CMQ messages are persistent (delivery_mode 2); a delay rides as x-cmq-delay-seconds (M10)."""
    if delay is None:
        return Properties.build(delivery_mode=2)
    return Properties.build(delivery_mode=2, headers={"x-cmq-delay-seconds": delay})


async def _send(api: CmqApi, caller: Caller, p: Params, batch: bool) -> dict[str, Any]:
    vh, q = api.queue(caller, p.text("queueName"))
    caller.require("write", "")  # SendMessage is a publish to the default exchange (M10)
    delay = p.opt_number("delaySeconds", limits.DELAY_SECONDS_MIN, limits.DELAY_SECONDS_MAX)
    outs = await api.publish(caller, vh, "", q.name, _properties(delay or None), p.bodies(batch), queue=True)
    if any(out.rejected for out in outs):
        raise CmqApiError.param(f"queue {q.name} is full: x-overflow reject-publish refused a message", 10350)
    return sent(outs, batch)




def _receive_now(api: CmqApi, vh: Any, q: Any, count: int) -> list[Receipt]:
    broker = api.broker
    now = broker.now()
    q.last_used = now
    out: list[Receipt] = []
    while len(out) < count:
        receipt = broker.receive(q, now)  # the broker's own receive: x-delivery-limit too (M7)
        if receipt is None:
            break
        out.append(receipt)
    broker.after_queue_change(vh, q, dispatch=False)  # timers (Q1 visibility), events (Q8)
    return out


async def _receive(api: CmqApi, caller: Caller, p: Params, count: int) -> list[dict[str, Any]]:
    vh, q = api.queue(caller, p.text("queueName"))
    caller.require("read", q.name)
    wait = p.opt_number("pollingWaitSeconds", limits.POLLING_WAIT_MIN, limits.POLLING_WAIT_MAX)
    seconds = q.attrs.polling_wait_seconds if wait is None else wait
    deadline = time.monotonic() + seconds
    demand = demand_for(api.broker, q, count, seconds > 0)
    if demand is None:  # the embedded store: every message is in the local model
        while True:
            receipts = _receive_now(api, vh, q, count)
            if receipts or q.deleted or api.closing or time.monotonic() >= deadline:
                break
            await asyncio.sleep(POLL_INTERVAL)
    else:
        with demand:  # JetStream: pulled for this receive (gateway.jetstream.api_receive)
            while True:
                receipts = _receive_now(api, vh, q, count)
                if receipts or q.deleted or api.closing:
                    break
                left = deadline - time.monotonic()
                answered = await demand.pulled(left if seconds > 0 else JETSTREAM_ANSWER_WAIT)
                if seconds <= 0 and answered:
                    receipts = _receive_now(api, vh, q, count)  # what that pull brought, or none
                    break
                if not answered and time.monotonic() >= deadline:
                    break
    if not receipts:
        raise CmqApiError(NO_MESSAGE, "no message", 10200)
    broker = api.broker
    # A5: the records of what the answer carries out of this process first; a stop on a
    # full disk gets the messages back unseen, before any deliver record says otherwise.
    if not broker.audit_handoff():
        put_back(receipts, partial(broker.messages.release, q), broker.now())
        broker.after_queue_change(vh, q)
        raise stopping()
    out = []
    for r in receipts:
        m = r.message
        body = getattr(m.payload, "body", b"")
        api.emit("deliver", caller, queue=q.name, msg_id=m.msg_id, attempt=m.receive_count, size=m.size)
        out.append({"msgBody": body.decode("utf-8", errors="replace"), "msgId": m.msg_id,
                    "receiptHandle": format_handle(m.msg_id, r.handle), "enqueueTime": int(m.enqueue_time),
                    "firstDequeueTime": int(m.first_receive_time or m.enqueue_time),
                    "nextVisibleTime": int(m.next_visible_time), "dequeueCount": m.receive_count})
    if not broker.audit_handoff():  # the deliver records: taken back as AMQP's aborted deliveries are
        now = broker.now()
        for r in receipts:
            if broker.messages.release(q, r, now):
                api.emit("requeue", caller, queue=q.name, msg_id=r.message.msg_id)
        broker.after_queue_change(vh, q)
        raise stopping()
    return out


async def receive_message(api: CmqApi, caller: Caller, p: Params) -> dict[str, Any]:
    (msg,) = await _receive(api, caller, p, 1)
    return msg


async def batch_receive_message(api: CmqApi, caller: Caller, p: Params) -> dict[str, Any]:
    count = p.number("numOfMsg", 1, BATCH_MAX)
    return {"msgInfoList": await _receive(api, caller, p, count)}


def _delete(api: CmqApi, caller: Caller, vh: Any, q: Any, handle: str) -> CmqApiError | None:
    """DeleteMessage with one receipt handle (Q3, M12): None when it deleted the message."""
    invalid = CmqApiError(INVALID_HANDLE, "invalid receiptHandle", receiptHandle=handle)
    try:
        msg_id, number = parse_handle(handle)
    except ValueError:
        return invalid
    m = q.cmq.get(msg_id)
    broker = api.broker
    now = broker.now()
    if m is None or not q.cmq.delete(Receipt(m, number), now):
        api.emit("stale_ack", caller, queue=q.name, msg_id=msg_id)
        return invalid
    broker.unpersist_message(q, m, body_needed=False)
    published = getattr(m.payload, "published_at", None)
    latency = round((now - published) * 1000.0, 3) if published is not None else None
    api.emit("ack", caller, queue=q.name, msg_id=msg_id, latency_ms=latency)
    return None


async def delete_message(api: CmqApi, caller: Caller, p: Params) -> dict[str, Any]:
    vh, q = api.queue(caller, p.text("queueName"))
    caller.require("read", q.name)
    error = _delete(api, caller, vh, q, p.text("receiptHandle"))
    api.broker.after_queue_change(vh, q)
    if error is not None:
        error.extra.clear()
        raise error
    return {}


async def batch_delete_message(api: CmqApi, caller: Caller, p: Params) -> dict[str, Any]:
    vh, q = api.queue(caller, p.text("queueName"))
    caller.require("read", q.name)
    handles = p.indexed("receiptHandle", BATCH_MAX)
    if not handles:
        raise CmqApiError.missing("receiptHandle.n")
    errors = [e for e in (_delete(api, caller, vh, q, h) for h in handles) if e is not None]
    api.broker.after_queue_change(vh, q)
    if not errors:
        return {}
    error_list = [{"code": e.code, "message": e.message, **e.extra} for e in errors]
    if len(errors) == len(handles):
        raise CmqApiError(BATCH_DELETE_FAILED, "delete message all failed", errorList=error_list)
    raise CmqApiError(BATCH_DELETE_PARTIAL, "delete message partially failed", errorList=error_list)


QUEUE_ACTIONS: dict[str, Action] = {
    "CreateQueue": create_queue,
    "ListQueue": list_queue,
    "GetQueueAttributes": get_queue_attributes,
    "SetQueueAttributes": set_queue_attributes,
    "DeleteQueue": delete_queue,
    "RewindQueue": rewind_queue,
    "SendMessage": partial(_send, batch=False),
    "BatchSendMessage": partial(_send, batch=True),
    "ReceiveMessage": receive_message,
    "BatchReceiveMessage": batch_receive_message,
    "DeleteMessage": delete_message,
    "BatchDeleteMessage": batch_delete_message,
}
