"""CMQ views and operations under ``/api/cmq`` (SPEC D7, D9, L6, Q6, M1, M8).

Field names follow CMQ's own API (``msgCount``, ``maxMsgSize``, ``activeMsgNum``,
``notifyStrategy``, ...), so an operator who knows the CMQ console reads them directly. The
AMQP exchange and queue names (URL-encoded, vhost first) address the objects; the CMQ names
they map to (L2) are shown beside them.

* ``GET  /api/cmq/topics[/{vhost}[/{exchange}]]``: retained count (D9), max message size,
  filter type, subscriptions.
* ``PUT  /api/cmq/topics/{vhost}/{exchange}/attributes``: ``{"maxMsgSize": n}`` (L6).
* ``GET  /api/cmq/topics/{vhost}/{exchange}/subscriptions``: endpoint, tags or binding keys,
  notify strategy, messages waiting or retrying (D9), the head message's attempts and next
  retry time (D4).
* ``POST /api/cmq/topics/{vhost}/{exchange}/subscriptions``: create an HTTP(S) subscription (D7).
* ``DELETE /api/cmq/topics/{vhost}/{exchange}/subscriptions/{name}``: remove an HTTP one.
* ``GET  /api/cmq/queues[/{vhost}[/{queue}]]``: active, inactive, delayed, rewindable counts
  and attributes (Q1, Q4, Q6, L6-L8).
* ``POST /api/cmq/queues/{vhost}/{queue}/rewind``: ``{"rewindTo": unix seconds}`` (Q6).
* ``DELETE /api/cmq/queues/{vhost}/{queue}/messages``: purge.
* ``GET  /api/cmq/openapi.json``: the OpenAPI 3 description of these routes (no login).
* ``/api/cmq/limits`` and ``/api/cmq/vhosts/{vhost}/profile``: gateway.management.limits_api.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from gateway.cmqapi.topics import subscription_name
from gateway.management.app import (
    USER,
    ApiError,
    Management,
    bad_request,
    cmq_queue_name,
    jsonable,
    not_found,
    read_json,
)
from gateway.management.openapi import openapi_document
from gateway.push_policy import PushRefused
from semantics.errors import CMQError
from semantics.limits import TOPIC_LIFECYCLE_SECONDS
from semantics.topic import FilterType

__all__ = ["add_routes", "queue_view", "subscription_view", "topic_view"]


def subscription_view(mgmt: Management, vhost: str, ex: Any, sub: Any) -> dict[str, Any]:
    topic = ex.topic
    kind, dest = sub.endpoint
    http = mgmt.pusher.subscriptions.get((vhost, ex.name, sub.name))
    protocol = "http" if kind == "http" else "queue" if kind == "q" else "exchange"
    binding = ex.bindings.get(sub.endpoint) if kind == "q" else None
    out: dict[str, Any] = {
        # CA4: a subscription made through CMQ's API shows under the name it was given there
        "subscriptionName": sub.name if binding is None else subscription_name(binding),
        "protocol": protocol,
        "endpoint": dest,
        "notifyStrategy": sub.strategy.value,
        "notifyContentFormat": http.content_format if http is not None else "SIMPLIFIED",
        "msgCount": topic.waiting(sub.name),  # D9: waiting for or in retry of delivery
        "blockedBy": topic.blocker(sub.name),  # D6: the failing head, if any
        "head": _head(topic, sub),
    }
    if http is not None:  # UI3: the endpoint's last failed push (time, msgId, error), or None
        out["lastError"] = mgmt.pusher.last_errors.get((vhost, ex.name, sub.name))
    if topic.filter_type is FilterType.TAG:
        out["filterTag"] = list(sub.filters)
    else:
        out["bindingKey"] = list(sub.filters)
    return out


def _head(topic: Any, sub: Any) -> dict[str, Any] | None:
    """The subscription's oldest unresolved message: its attempts and next retry time (D4).
    The blocker when there is one, else the oldest waiting message."""
    head = topic.head(sub.name)
    if head is None:
        return None
    msg_id, state = head
    return {"msgId": msg_id, "status": state.status.value, "attempts": state.attempts,
            "nextRetryTime": state.next_at, "inFlight": state.in_flight}


def topic_view(mgmt: Management, vhost: str, ex: Any, *, subscriptions: bool = True) -> dict[str, Any]:
    topic = ex.topic
    out: dict[str, Any] = {
        "vhost": vhost,
        "exchange": ex.name,
        "exchangeType": ex.type,
        "topicName": topic.name,
        "filterType": topic.filter_type.value,
        "maxMsgSize": topic.max_message_size,
        "msgRetentionSeconds": TOPIC_LIFECYCLE_SECONDS,
        "msgCount": topic.retained_count,  # D9: retained messages
        "subscriptionCount": len(topic.subscriptions),
    }
    if subscriptions:
        out["subscriptions"] = [subscription_view(mgmt, vhost, ex, s) for s in topic.subscriptions]
    return out


def queue_view(vhost: str, q: Any) -> dict[str, Any]:
    cmq = q.cmq
    a = q.attrs
    return {
        "vhost": vhost,
        "queue": q.name,
        "queueName": cmq_queue_name(q.name),
        "activeMsgNum": cmq.active,
        "inactiveMsgNum": cmq.inactive,
        "delayMsgNum": cmq.delayed,
        "rewindMsgNum": cmq.rewindable,
        "attributes": {
            "visibilityTimeout": a.visibility_timeout,
            "msgRetentionSeconds": a.msg_retention_seconds,
            "maxMsgSize": a.max_msg_size,
            "maxMsgHeapNum": a.max_msg_heap_num,
            "rewindSeconds": a.rewind_seconds,
            "pollingWaitSeconds": a.polling_wait_seconds,
            "delaySeconds": a.delay_seconds,
            "deadLetterPolicy": None if a.dead_letter_queue is None else {
                "deadLetterQueue": a.dead_letter_queue, "maxReceiveCount": a.max_receive_count,
                "maxTimeToLive": a.max_time_to_live},
        },
        "arguments": jsonable(q.arguments),
    }


def add_routes(app: web.Application, mgmt: Management) -> None:
    r = app.router

    def topic_of(request: web.Request) -> tuple[Any, Any]:
        vh = mgmt.check_vhost(request, request.match_info["vhost"])
        ex = vh.exchanges.get(request.match_info["exchange"])
        if ex is None or ex.topic is None:
            raise not_found()
        return vh, ex

    def queue_of(request: web.Request) -> tuple[Any, Any]:
        vh = mgmt.check_vhost(request, request.match_info["vhost"])
        q = vh.queues.get(request.match_info["queue"])
        if q is None:
            raise not_found()
        return vh, q

    async def topics(request: web.Request) -> web.Response:
        out = []
        for v in mgmt.vhosts_in(request):
            for ex in list(mgmt.vhost(v).exchanges.values()):
                if ex.topic is not None:
                    out.append(topic_view(mgmt, v, ex, subscriptions=False))
        return web.json_response(out)

    async def topic(request: web.Request) -> web.Response:
        vh, ex = topic_of(request)
        return web.json_response(topic_view(mgmt, vh.name, ex))

    async def topic_attributes(request: web.Request) -> web.Response:
        vh, ex = topic_of(request)
        body = await read_json(request)
        size = body.get("maxMsgSize")
        if isinstance(size, bool) or not isinstance(size, int):
            raise bad_request("maxMsgSize must be an integer number of bytes (L6)")
        ex.topic.max_message_size = size  # LimitError L6 outside 1 KB-1024 KB: 400
        mgmt.broker.audit.emit("exchange_declare", vh.name, topic=ex.name, size=size,
                               user=request[USER].name, reason="max_msg_size")
        return web.json_response(topic_view(mgmt, vh.name, ex, subscriptions=False))

    async def subscriptions(request: web.Request) -> web.Response:
        vh, ex = topic_of(request)
        return web.json_response([subscription_view(mgmt, vh.name, ex, s) for s in ex.topic.subscriptions])

    async def subscription_post(request: web.Request) -> web.Response:
        vh, ex = topic_of(request)
        body = await read_json(request)
        protocol = str(body.get("protocol", "http")).lower()
        if protocol not in ("http", "https"):
            raise bad_request("only HTTP(S) subscriptions are created here; a queue subscription is an "
                              "AMQP queue.bind (M8)")
        name, endpoint = body.get("subscriptionName"), body.get("endpoint")
        if not isinstance(name, str) or not isinstance(endpoint, str):
            raise bad_request("subscriptionName and endpoint are required strings")
        filters = body.get("filterTag") if ex.topic.filter_type is FilterType.TAG else body.get("bindingKey")
        if filters is not None and (not isinstance(filters, list) or not all(isinstance(f, str) for f in filters)):
            raise bad_request("filterTag / bindingKey must be a list of strings")
        try:
            await mgmt.pusher.check_endpoint(endpoint)  # SE3: the URL and its addresses
            mgmt.pusher.subscribe(vh.name, ex.name, name, endpoint,
                                  notify_strategy=str(body.get("notifyStrategy", "EXPONENTIAL_DECAY_RETRY")),
                                  content_format=str(body.get("notifyContentFormat", "JSON")),
                                  filters=filters or [], owner=str(body.get("topicOwner", "")))
        except CMQError:
            raise
        except PushRefused as e:
            raise ApiError(403, "access_refused", str(e))
        except ValueError as e:
            raise bad_request(str(e))
        sub = ex.topic.subscription(name)
        return web.json_response(subscription_view(mgmt, vh.name, ex, sub), status=201)

    async def subscription_delete(request: web.Request) -> web.Response:
        vh, ex = topic_of(request)
        if not mgmt.pusher.unsubscribe(vh.name, ex.name, request.match_info["name"]):
            raise not_found()
        return web.Response(status=204)

    async def queues(request: web.Request) -> web.Response:
        out: list[dict[str, Any]] = []
        for v in mgmt.vhosts_in(request):
            out.extend(queue_view(v, q) for q in list(mgmt.vhost(v).queues.values()))
        return web.json_response(out)

    async def queue(request: web.Request) -> web.Response:
        vh, q = queue_of(request)
        return web.json_response(queue_view(vh.name, q))

    async def rewind(request: web.Request) -> web.Response:
        vh, q = queue_of(request)
        body = await read_json(request)
        to = body.get("rewindTo")
        if isinstance(to, bool) or not isinstance(to, int | float):
            raise bad_request("rewindTo must be a Unix time in seconds (Q6)")
        broker = mgmt.broker
        count = q.cmq.rewind(float(to), broker.now())  # CMQError Q6: 400 naming the rule
        broker.audit.emit("rewind", vh.name, queue=q.name, next_at=float(to), size=count,
                          user=request[USER].name)
        broker.after_queue_change(vh, q)
        return web.json_response({"rewound": count, **queue_view(vh.name, q)})

    async def purge(request: web.Request) -> web.Response:
        vh, q = queue_of(request)
        count = vh.purge_queue(None, q.name, request[USER].name)
        return web.json_response({"purged": count})

    async def openapi(request: web.Request) -> web.Response:
        return web.json_response(openapi_document())

    r.add_get("/api/cmq/openapi.json", openapi)
    r.add_get("/api/cmq/topics", topics)
    r.add_get("/api/cmq/topics/{vhost}", topics)
    r.add_get("/api/cmq/topics/{vhost}/{exchange}", topic)
    r.add_put("/api/cmq/topics/{vhost}/{exchange}/attributes", topic_attributes)
    r.add_get("/api/cmq/topics/{vhost}/{exchange}/subscriptions", subscriptions)
    r.add_post("/api/cmq/topics/{vhost}/{exchange}/subscriptions", subscription_post)
    r.add_delete("/api/cmq/topics/{vhost}/{exchange}/subscriptions/{name}", subscription_delete)
    r.add_get("/api/cmq/queues", queues)
    r.add_get("/api/cmq/queues/{vhost}", queues)
    r.add_get("/api/cmq/queues/{vhost}/{queue}", queue)
    r.add_post("/api/cmq/queues/{vhost}/{queue}/rewind", rewind)
    r.add_delete("/api/cmq/queues/{vhost}/{queue}/messages", purge)
    from gateway.management import limits_api
    limits_api.add_routes(app, mgmt)  # PF1, PF4
