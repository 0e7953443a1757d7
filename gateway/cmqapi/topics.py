"""CMQ's topic and subscription actions (CA3) over the broker's exchanges (M2-M9, T1-T5, D1-D9).

A CMQ topic is the AMQP exchange of the same name: ``filterType`` 1 (tags) is a ``direct``
exchange, 2 (routing keys) a ``topic`` exchange (T5, M2, M3); AMQP exchanges of every type but
``headers`` are listed as topics too (fanout: a tag topic whose subscriptions have no tags).
A message's first tag is its routing key, the others ride in ``x-cmq-tags`` (M2).

A subscription whose endpoint is a queue is the binding of that (exchange, queue) pair (M8):
one binding key per filter tag or binding key, ``""`` for a subscription without tags; its
CMQ name and notify strategy are binding arguments (``x-cmq-subscription-name``,
``x-cmq-notify-strategy``), so they survive restarts with the binding. A binding made over
AMQP shows as the subscription ``q:<queue>``. An HTTP(S) endpoint is an HTTP subscription of
gateway.push, refused unless the push policy allows its URL and addresses (SE3).
"""

from __future__ import annotations

import re
from dataclasses import asdict, replace
from functools import partial
from typing import Any

from gateway.broker import persistence as P
from gateway.broker.exchange import X_MAX_MESSAGE_SIZE, sub_name
from gateway.cmqapi.core import Action, Caller, CmqApi, object_id, sent
from gateway.cmqapi.errors import SUBSCRIPTION_EXISTS, SUBSCRIPTIONS_FULL, TOPIC_EXISTS, CmqApiError
from gateway.cmqapi.params import Params
from gateway.protocol.properties import Properties
from gateway.push import FORMATS, HttpSubscription
from gateway.push_policy import PushRefused
from semantics import limits
from semantics.names import is_valid_name
from semantics.retry import DEFAULT_STRATEGY, NotifyStrategy
from semantics.topic import FilterType

__all__ = ["TOPIC_ACTIONS", "subscription_name"]

# Subscribe's page: "a string of at most 64 characters, starting with a letter; the rest
# letters, digits and hyphens" (``s1`` included); ``_`` is taken too, as in queue names.
SUBSCRIPTION_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_-]{0,63}\Z")
SUB_NAME_ARG = "x-cmq-subscription-name"
STRATEGY_ARG = "x-cmq-notify-strategy"
BIG = 2**62


def _filter_type(ex: Any) -> int:
    return 2 if ex.topic.filter_type is FilterType.ROUTING_KEY else 1


# -- topics --------------------------------------------------------------------------------


async def create_topic(api: CmqApi, caller: Caller, p: Params) -> dict[str, Any]:
    name = p.text("topicName")
    if not is_valid_name(name, "topic"):
        raise CmqApiError.param(f"topic name format error: {name!r} (3-64 letters, digits, - and _; "
                                "CMQ rule L1)", 10590)
    filter_type = p.number("filterType", 1, 2, 1)
    size = p.opt_number("maxMsgSize", -BIG, BIG)
    caller.require("configure", name)
    vh = api.vhost(caller)
    if name in vh.exchanges:
        raise CmqApiError(TOPIC_EXISTS, f"topic is already existed: {name}", 10550)
    error = None if size is None else _check_topic_size(size)
    if error is not None:
        raise error
    args: dict[str, Any] = {} if size is None or size == limits.TOPIC_MAX_MSG_SIZE_DEFAULT else {
        X_MAX_MESSAGE_SIZE: size}
    vh.declare_exchange(name, "topic" if filter_type == 2 else "direct", passive=False, durable=True,
                        auto_delete=False, internal=False, arguments=args, user=caller.user)
    api.touch("topic", vh.name, name, created=True)
    await api.durable()
    return {"topicId": object_id("topic", vh.name, name)}


def _check_topic_size(size: int) -> CmqApiError | None:
    if limits.TOPIC_MAX_MSG_SIZE_MIN <= size <= limits.TOPIC_MAX_MSG_SIZE_MAX:
        return None
    return CmqApiError.out_of_range("maxMsgSize", f"{size} is not in {limits.TOPIC_MAX_MSG_SIZE_MIN}-"
                                    f"{limits.TOPIC_MAX_MSG_SIZE_MAX} (CMQ rule L6)")


async def list_topic(api: CmqApi, caller: Caller, p: Params) -> dict[str, Any]:
    vh = api.vhost(caller)
    total, names = p.page(n for n, ex in vh.exchanges.items() if ex.topic is not None and n and caller.sees(n))
    return {"totalCount": total, "topicList": [{"topicId": object_id("topic", vh.name, n), "topicName": n}
                                               for n in names]}


async def get_topic_attributes(api: CmqApi, caller: Caller, p: Params) -> dict[str, Any]:
    vh, ex = api.exchange(caller, p.text("topicName"))
    caller.require_any(ex.name)
    return {"topicId": object_id("topic", vh.name, ex.name), "topicName": ex.name,
            "msgCount": ex.topic.retained_count, "maxMsgSize": ex.topic.max_message_size,
            "msgRetentionSeconds": limits.TOPIC_LIFECYCLE_SECONDS, "filterType": _filter_type(ex),
            **api.times("topic", vh.name, ex.name)}


async def set_topic_attributes(api: CmqApi, caller: Caller, p: Params) -> dict[str, Any]:
    vh, ex = api.exchange(caller, p.text("topicName"))
    caller.require("configure", ex.name)
    size = p.opt_number("maxMsgSize", -BIG, BIG)
    if size is not None:
        error = _check_topic_size(size)
        if error is not None:
            raise error
        ex.topic.max_message_size = size  # L6
        ex.arguments[X_MAX_MESSAGE_SIZE] = size
        if ex.durable:
            api.broker.persist(P.exchange_key(vh.name, ex.name), P.encode_json(
                {"vhost": vh.name, "name": ex.name, "type": ex.type, "auto_delete": ex.auto_delete,
                 "internal": ex.internal, "arguments": ex.arguments}))
        api.emit("exchange_declare", caller, topic=ex.name, size=size, reason="max_msg_size")
    api.touch("topic", vh.name, ex.name)
    await api.durable()
    return {}


async def delete_topic(api: CmqApi, caller: Caller, p: Params) -> dict[str, Any]:
    vh, ex = api.exchange(caller, p.text("topicName"))
    caller.require("configure", ex.name)
    for (vhost, exchange, name) in list(api.pusher.subscriptions):
        if (vhost, exchange) == (vh.name, ex.name):
            api.pusher.unsubscribe(vhost, exchange, name)
    vh.delete_exchange(ex.name, if_unused=False, user=caller.user)
    api.forget("topic", vh.name, ex.name)
    await api.durable()
    return {}


# -- publishing ----------------------------------------------------------------------------


async def _publish(api: CmqApi, caller: Caller, p: Params, batch: bool) -> dict[str, Any]:
    vh, ex = api.exchange(caller, p.text("topicName"))
    caller.require("write", ex.name)
    tags = p.indexed("msgTag")
    if ex.topic.filter_type is FilterType.TAG and ex.type != "headers":
        key = tags[0] if tags else ""
        props = Properties.build(delivery_mode=2, headers={"x-cmq-tags": tags[1:]} if len(tags) > 1 else None)
    else:
        key = p.opt("routingKey") or ""
        props = Properties.build(delivery_mode=2)
    return sent(await api.publish(caller, vh, ex.name, key, props, p.bodies(batch)), batch)




# -- subscriptions -------------------------------------------------------------------------


def subscription_name(binding: Any) -> str:
    """The CMQ name of a queue subscription (its binding): the one Subscribe gave it, or
    ``q:<queue>`` for a binding made over AMQP."""
    for args in binding.arguments.values():
        name = args.get(SUB_NAME_ARG)
        if name:
            return name.decode() if isinstance(name, bytes) else str(name)
    return sub_name(binding.dest)


def _subscriptions(api: CmqApi, vh: Any, ex: Any) -> dict[str, tuple[str, Any]]:
    """CMQ name -> ("http", HttpSubscription) or ("queue", Binding), in creation order."""
    out: dict[str, tuple[str, Any]] = {}
    for dest, binding in ex.bindings.items():
        if dest[0] == "q":
            out[subscription_name(binding)] = ("queue", binding)
    for (vhost, exchange, name), record in api.pusher.subscriptions.items():
        if (vhost, exchange) == (vh.name, ex.name):
            out[name] = ("http", record)
    return out


def _subscription(api: CmqApi, caller: Caller, p: Params) -> tuple[Any, Any, str, str, Any]:
    vh, ex = api.exchange(caller, p.text("topicName"))
    caller.require_any(ex.name)
    name = p.text("subscriptionName")
    found = _subscriptions(api, vh, ex).get(name)
    if found is None:
        raise CmqApiError.subscription_not_exist(ex.name, name)
    return vh, ex, name, found[0], found[1]


def _filters(ex: Any, p: Params) -> list[str] | None:
    """The request's filter tags (tag topic) or binding keys (routing-key topic); None when
    it gives none."""
    if ex.type == "fanout":
        return None
    name = "bindingKey" if ex.topic.filter_type is FilterType.ROUTING_KEY else "filterTag"
    values = p.indexed(name)
    return values or None


def _strategy(p: Params, default: str | None) -> str | None:
    value = p.opt("notifyStrategy")
    if value is None:
        return default
    if value not in NotifyStrategy.__members__:
        raise CmqApiError.param(f"undefined notify retry stragety: {value}", 10520)
    return value


def _format(p: Params, protocol: str, default: str | None) -> str | None:
    value = p.opt("notifyContentFormat")
    if value is None:
        return default
    if value not in FORMATS:
        raise CmqApiError.param(f"undefined notify content format: {value}", 10530)
    if protocol == "queue" and value != "SIMPLIFIED":
        raise CmqApiError.param("notifyContentFormat of protocol queue must be SIMPLIFIED", 10640)
    return value


async def subscribe(api: CmqApi, caller: Caller, p: Params) -> dict[str, Any]:
    vh, ex = api.exchange(caller, p.text("topicName"))
    name = p.text("subscriptionName")
    if not SUBSCRIPTION_NAME.match(name):
        raise CmqApiError.param(f"subscription name format error: {name[:80]!r} (at most 64 letters, digits, - and _, "
                                "starting with a letter)", 10580)
    protocol = p.text("protocol").lower()
    endpoint = p.text("endpoint")
    if protocol not in ("queue", "http", "https"):
        raise CmqApiError.param(f"undefined protocol: {protocol}", 10510)
    strategy = _strategy(p, DEFAULT_STRATEGY.value)
    content_format = _format(p, protocol, "SIMPLIFIED" if protocol == "queue" else "JSON")
    caller.require("read", ex.name)
    subs = _subscriptions(api, vh, ex)
    if name in subs:
        raise CmqApiError(SUBSCRIPTION_EXISTS, f"subscribtion is already existed: {name}", 10470)
    if len(ex.topic.subscriptions) >= limits.MAX_SUBSCRIPTIONS:
        raise CmqApiError(SUBSCRIPTIONS_FULL, f"number of subscription has reached the limit "
                          f"({limits.MAX_SUBSCRIPTIONS}, CMQ rule L5)", 10480)
    filters = _filters(ex, p)
    if protocol == "queue":
        q = vh.queues.get(endpoint)
        if q is None:
            raise CmqApiError.queue_not_exist(f"{endpoint} (endpoint)")
        caller.require("write", q.name)
        if ("q", q.name) in ex.bindings:
            raise CmqApiError(SUBSCRIPTION_EXISTS, f"subscribtion is already existed: topic {ex.name} already "
                              f"delivers to queue {q.name} (one subscription per topic and queue, CMQ rule M8)",
                              10470)
        if ex.topic.filter_type is FilterType.ROUTING_KEY and not filters:
            raise CmqApiError.param("parameters lack of bindingKey", 10710)
        for key in filters or [""]:
            vh.bind(None, ex.name, ("q", q.name), key, {SUB_NAME_ARG: name, STRATEGY_ARG: strategy},
                    user=caller.user)
    else:
        caller.require("configure", ex.name)
        if not endpoint.lower().startswith(f"{protocol}://"):
            raise CmqApiError.param(f"endpoint format error: {endpoint!r} does not start with {protocol}://", 10500)
        try:
            await api.pusher.check_endpoint(endpoint)  # SE3: the URL and its addresses
            api.pusher.subscribe(vh.name, ex.name, name, endpoint, notify_strategy=strategy or "",
                                 content_format=content_format or "JSON", filters=filters or [],
                                 owner=caller.user)
        except PushRefused as e:
            raise CmqApiError.param(f"illegal endpoint: {e} (CMQ rule SE3)", 10630) from None
        except ValueError as e:
            raise CmqApiError.param(f"endpoint format error: {e}", 10500) from None
    api.touch("subscription", vh.name, f"{ex.name}/{name}", created=True)
    await api.durable()
    return {"subscriptionId": object_id("subscription", vh.name, f"{ex.name}/{name}")}


async def unsubscribe(api: CmqApi, caller: Caller, p: Params) -> dict[str, Any]:
    vh, ex, name, kind, sub = _subscription(api, caller, p)
    caller.require("read", ex.name)
    if kind == "http":
        caller.require("configure", ex.name)
        api.pusher.unsubscribe(vh.name, ex.name, name)
    else:
        caller.require("write", sub.dest[1])
        for key in list(sub.keys):
            vh.unbind(None, ex.name, sub.dest, key, user=caller.user)
    api.forget("subscription", vh.name, f"{ex.name}/{name}")
    await api.durable()
    return {}


def _view(api: CmqApi, vh: Any, ex: Any, name: str, kind: str, sub: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"subscriptionId": object_id("subscription", vh.name, f"{ex.name}/{name}"),
                           "subscriptionName": name}
    if kind == "http":
        out.update(protocol="https" if sub.url.lower().startswith("https") else "http", endpoint=sub.url,
                   notifyStrategy=sub.notify_strategy, notifyContentFormat=sub.content_format,
                   filters=list(sub.filters), topicOwner=sub.owner, msgCount=ex.topic.waiting(name))
    else:
        out.update(protocol="queue", endpoint=sub.dest[1], notifyStrategy=sub.notify_strategy,
                   notifyContentFormat="SIMPLIFIED", filters=[k for k in sub.keys if k != ""],
                   topicOwner="", msgCount=ex.topic.waiting(sub_name(sub.dest)))
    return out


async def list_subscription_by_topic(api: CmqApi, caller: Caller, p: Params) -> dict[str, Any]:
    vh, ex = api.exchange(caller, p.text("topicName"))
    caller.require_any(ex.name)
    subs = _subscriptions(api, vh, ex)
    total, names = p.page(subs)
    out = []
    for name in names:
        view = _view(api, vh, ex, name, *subs[name])
        out.append({k: view[k] for k in ("subscriptionId", "subscriptionName", "protocol", "endpoint")})
    return {"totalCount": total, "subscriptionList": out}


async def get_subscription_attributes(api: CmqApi, caller: Caller, p: Params) -> dict[str, Any]:
    vh, ex, name, kind, sub = _subscription(api, caller, p)
    view = _view(api, vh, ex, name, kind, sub)
    filters = view.pop("filters")
    if ex.topic.filter_type is FilterType.ROUTING_KEY:
        view["bindingKey"] = filters
    else:  # the Subscribe parameter's name, and the one Tencent's SDKs read back
        view["filterTag"] = view["filterTags"] = filters
    return {**view, **api.times("subscription", vh.name, f"{ex.name}/{name}")}


def _persist_binding(api: CmqApi, vh: Any, ex: Any, binding: Any, key: str) -> None:
    """The binding record vhost.bind writes, again, after its arguments changed."""
    q = vh.queues.get(binding.dest[1])
    if ex.durable and q is not None and q.durable:
        api.broker.persist(P.binding_key(vh.name, ex.name, "q", q.name, key), P.encode_json(
            {"vhost": vh.name, "source": ex.name, "kind": "q", "dest": q.name, "key": key,
             "arguments": binding.arguments.get(key, {})}))


def _set_queue_subscription(api: CmqApi, caller: Caller, vh: Any, ex: Any, name: str, binding: Any,
                            strategy: str | None, filters: list[str] | None) -> None:
    caller.require("write", binding.dest[1])
    if strategy is not None:
        binding.notify_strategy = strategy
        ex.topic.subscription(sub_name(binding.dest)).strategy = NotifyStrategy(strategy)
        for key in binding.keys:
            binding.arguments.setdefault(key, {})[STRATEGY_ARG] = strategy
            _persist_binding(api, vh, ex, binding, key)
    if filters is None:
        return
    keys = filters or [""]
    args = {SUB_NAME_ARG: name, STRATEGY_ARG: binding.notify_strategy}
    old = list(binding.keys)
    for key in keys:  # the new keys first: the pair's subscription (and what it holds) stays
        if key not in old:
            vh.bind(None, ex.name, binding.dest, key, args, user=caller.user)
    for key in old:
        if key not in keys:
            vh.unbind(None, ex.name, binding.dest, key, user=caller.user)


def _set_http_subscription(api: CmqApi, vh: Any, ex: Any, record: HttpSubscription, strategy: str | None,
                           content_format: str | None, filters: list[str] | None) -> None:
    topic = ex.topic
    if filters is not None:
        sub = topic.subscription(record.name)
        for value in [f for f in sub.filters if f not in filters]:
            topic.remove_filter(record.name, value)
        for value in [f for f in filters if f not in sub.filters]:
            topic.add_filter(record.name, value)  # L3/L4: refused before a sixth
        record = replace(record, filters=tuple(topic.subscription(record.name).filters))
    if strategy is not None:
        topic.subscription(record.name).strategy = NotifyStrategy(strategy)
        record = replace(record, notify_strategy=strategy)
    if content_format is not None:
        record = replace(record, content_format=content_format)
    api.pusher.subscriptions[vh.name, ex.name, record.name] = record
    if ex.durable:
        data = asdict(record)
        data["filters"] = list(record.filters)
        api.broker.persist(record.key, P.encode_json(data))


async def set_subscription_attributes(api: CmqApi, caller: Caller, p: Params) -> dict[str, Any]:
    vh, ex, name, kind, sub = _subscription(api, caller, p)
    caller.require("read", ex.name)
    strategy = _strategy(p, None)
    content_format = _format(p, "queue" if kind == "queue" else "http", None)
    filters = _filters(ex, p)
    if kind == "http":
        caller.require("configure", ex.name)
        _set_http_subscription(api, vh, ex, sub, strategy, content_format, filters)
    else:
        _set_queue_subscription(api, caller, vh, ex, name, sub, strategy, filters)
    api.emit("bind", caller, topic=ex.name, subscription=name, policy=strategy, tags=filters)
    api.touch("subscription", vh.name, f"{ex.name}/{name}")
    await api.durable()
    return {}


async def clear_subscription_filter_tags(api: CmqApi, caller: Caller, p: Params) -> dict[str, Any]:
    vh, ex, name, kind, sub = _subscription(api, caller, p)
    caller.require("read", ex.name)
    if ex.topic.filter_type is FilterType.TAG and ex.type != "fanout":
        if kind == "http":
            caller.require("configure", ex.name)
            _set_http_subscription(api, vh, ex, sub, None, None, [])
        else:
            _set_queue_subscription(api, caller, vh, ex, name, sub, None, [])
    api.touch("subscription", vh.name, f"{ex.name}/{name}")
    await api.durable()
    return {}


TOPIC_ACTIONS: dict[str, Action] = {
    "CreateTopic": create_topic,
    "ListTopic": list_topic,
    "GetTopicAttributes": get_topic_attributes,
    "SetTopicAttributes": set_topic_attributes,
    "DeleteTopic": delete_topic,
    "PublishMessage": partial(_publish, batch=False),
    "BatchPublishMessage": partial(_publish, batch=True),
    "Subscribe": subscribe,
    "Unsubscribe": unsubscribe,
    "ListSubscriptionByTopic": list_subscription_by_topic,
    "GetSubscriptionAttributes": get_subscription_attributes,
    "SetSubscriptionAttributes": set_subscription_attributes,
    "ClearSubscriptionFilterTags": clear_subscription_filter_tags,
}
