"""HTTP(S) subscription endpoints: CMQ's push to a URL (SPEC D7, D5, D6, D9).

Theory of operation
-------------------
An HTTP subscription is an ordinary subscription of the exchange's ``semantics.topic.Topic``
whose endpoint is ``("http", url)``. The topic calls an *attempt* callback for each delivery;
for an HTTP endpoint this module answers None ("pending", D7) and starts one POST on a pooled
aiohttp session. When the POST ends, the outcome goes back to the topic with
``Topic.report(msg_id, subscription, ok, now)``: success only on HTTP status 200 (the seed:
"Retry verification: if the HTTP return code is 200, it is successful"); any other status, a
connection error or the per-request timeout is a failure, and the topic's retry policy takes
over (BACKOFF_RETRY D5, EXPONENTIAL_DECAY_RETRY D6). The topic's retries come back through the
same attempt callback when the broker's scheduler runs them, so one code path serves both.

The request is CMQ's notify format (Tencent Cloud API 406/7420, "Delivering Message"):

* JSON (default): ``Content-Type: text/plain``, a body
  ``{"TopicOwner", "topicName", "subscriptionName", "msgId", "msgBody", "publishTime"}``
  plus ``msgTag`` (tag topics) or ``bindingKey`` (routing-key topics);
* SIMPLIFIED: the body is the message body as published;
* both: headers ``x-cmq-request-id``, ``x-cmq-message-id``, ``x-cmq-message-tag`` and the
  user agent ``Qcloud Notification Service Agent``.

Wiring: the broker asks ``broker.endpoint_hooks[kind]`` for every endpoint it does not serve
itself (docs/ARCHITECTURE.md); an :class:`HttpPusher` registers :meth:`HttpPusher.push` there
for ``"http"`` when it is created, and is the broker's ``http_pusher`` from then on (a later
pusher for the same broker takes over its subscriptions).

SE3: a subscription's URL must match the config's ``push.allow`` and its host's addresses be
public (or in ``push.allow_addresses``), checked when it is created and again at every
delivery by the client's resolver, on the addresses it connects to (gateway.push_policy).

HTTP subscriptions of durable exchanges are kept in the broker's store under
``s/<vhost>/<exchange>/<subscription>`` and come back with :meth:`HttpPusher.recover`, which
the broker runs while it recovers, before the topic-retained messages, so that a retained
message still owed to an HTTP subscription is pushed again after a restart (D2, D7).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any

import aiohttp

from gateway.broker import persistence as P
from gateway.push_policy import PolicyResolver, PushPolicy, PushRefused
from semantics.names import validate_topic_name
from semantics.retry import DEFAULT_STRATEGY, NotifyStrategy
from semantics.topic import FilterType, Subscription, Topic, TopicMessage

__all__ = ["HttpPusher", "HttpSubscription", "PUSH_TIMEOUT", "USER_AGENT", "notify_request"]

log = logging.getLogger("cmq_gateway.push")

# CMQ: "The detection timeout period is about 15 seconds."
PUSH_TIMEOUT = 15.0
# D7: the answer's status decides; of its body at most this much is read (a small one whole, so
# that the connection is kept), and an endpoint that answers 200 with an endless or huge body
# neither holds the push until the timeout nor fills the gateway's memory.
ANSWER_BYTES = 64 * 1024
USER_AGENT = "Qcloud Notification Service Agent"
FORMATS = ("JSON", "SIMPLIFIED")


@dataclass(frozen=True, slots=True)
class HttpSubscription:
    """One HTTP(S) endpoint subscription, as created and as persisted."""

    vhost: str
    exchange: str
    name: str
    url: str
    notify_strategy: str = DEFAULT_STRATEGY.value
    content_format: str = "JSON"
    filters: tuple[str, ...] = ()
    owner: str = ""

    @property
    def key(self) -> str:
        return P.subscription_key(self.vhost, self.exchange, self.name)


def _body_text(body: bytes) -> str:
    return body.decode("utf-8", errors="replace")


def notify_request(sub: HttpSubscription, topic: Topic, tmsg: TopicMessage) -> tuple[bytes, dict[str, str]]:
    """The POST body and headers CMQ sends for one message (module doc)."""
    msg = tmsg.payload
    body: bytes = getattr(msg, "body", b"") if msg is not None else b""
    tags = list(tmsg.tags)
    headers = {
        "User-Agent": USER_AGENT,
        "x-cmq-request-id": os.urandom(8).hex(),
        "x-cmq-message-id": tmsg.msg_id,
        "x-cmq-message-tag": ", ".join(tags),
    }
    if sub.content_format == "SIMPLIFIED":
        headers["Content-Type"] = "application/octet-stream"
        return body, headers
    notice: dict[str, Any] = {
        "TopicOwner": sub.owner,
        "topicName": topic.name,
        "subscriptionName": sub.name,
        "msgId": tmsg.msg_id,
        "msgBody": _body_text(body),
        "publishTime": int(tmsg.published_at),  # Unix seconds, as CMQ's APIs
    }
    if topic.filter_type is FilterType.TAG:
        notice["msgTag"] = tags
    else:
        notice["bindingKey"] = tmsg.routing_key
    headers["Content-Type"] = "text/plain"
    return json.dumps(notice, ensure_ascii=False).encode(), headers


class HttpPusher:
    """Pushes topic messages to HTTP(S) subscriptions of one broker."""

    def __init__(self, broker: Any, *, timeout: float = PUSH_TIMEOUT, pool_size: int = 100,
                 policy: PushPolicy | None = None) -> None:
        self.broker = broker
        # SE3: where pushes may go, from the gateway's config. A broker without one (embedded,
        # unit tests) restricts nothing, as it checks no AMQP permissions either.
        self.policy = policy if policy is not None else getattr(getattr(broker, "config", None), "push", None)
        self.timeout = timeout
        self._pool_size = pool_size
        self._session: aiohttp.ClientSession | None = None
        self.subscriptions: dict[tuple[str, str, str], HttpSubscription] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._idle = asyncio.Event()
        self._idle.set()
        self.sent = 0
        self.succeeded = 0
        self.failed = 0
        self.withheld = 0  # pushes not sent: a stop gave up their audit records (A5)
        # (vhost, exchange, subscription) -> the last failed push: unix time, message ID and
        # why (the HTTP status or the error); the management API shows it (UI3).
        self.last_errors: dict[tuple[str, str, str], dict[str, Any]] = {}
        previous = getattr(broker, "http_pusher", None)
        if previous is not None:
            self.subscriptions = previous.subscriptions  # the same topics' subscriptions
            self.last_errors = previous.last_errors
        broker.http_pusher = self
        broker.endpoint_hooks["http"] = self.push  # D7: the broker asks here for ("http", url)

    @classmethod
    def of(cls, broker: Any) -> HttpPusher:
        """The broker's pusher (the one its recovery created, if any), or a new one."""
        pusher = getattr(broker, "http_pusher", None)
        return pusher if isinstance(pusher, HttpPusher) else cls(broker)

    # -- lifecycle ---------------------------------------------------------------------------

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=self._pool_size, resolver=PolicyResolver(lambda: self.policy)),
                timeout=aiohttp.ClientTimeout(total=self.timeout))
        return self._session

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._session is not None:
            await self._session.close()

    async def idle(self) -> None:
        """Wait until no push is in flight and every outcome has been reported."""
        await self._idle.wait()

    @property
    def in_flight(self) -> int:
        return len(self._tasks)

    # -- subscriptions -----------------------------------------------------------------------

    def subscribe(self, vhost: str, exchange: str, name: str, url: str, *,
                  notify_strategy: str = DEFAULT_STRATEGY.value, content_format: str = "JSON",
                  filters: Iterable[str] = (), owner: str = "", persist: bool = True) -> HttpSubscription:
        """Create an HTTP subscription on the exchange's topic. Raises CMQError (L1 name, L3/L4
        filters, L5 the 501st subscription, M8 a duplicate), KeyError for a missing exchange,
        ValueError for a bad URL, strategy or format, PushRefused (a ValueError) for a URL
        the push policy does not allow (SE3; its host's addresses are checked by
        :meth:`check_endpoint` and at each delivery). A restored subscription (``persist``
        False) is not refused here: delivery checks it."""
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"endpoint {url!r} is not an http:// or https:// URL (D7)")
        if persist and self.policy is not None:
            self.policy.check_url(url)
        strategy = NotifyStrategy(notify_strategy)
        if content_format not in FORMATS:
            raise ValueError(f"notifyContentFormat {content_format!r} is not JSON or SIMPLIFIED")
        validate_topic_name(name)  # L1: a subscription name follows the topic-name rule
        vh = self.broker.vhosts[vhost]
        ex = vh.exchanges[exchange]
        topic: Topic | None = ex.topic
        if topic is None:
            raise ValueError(f"exchange {exchange!r} is of type headers: not a CMQ topic (M5)")
        sub = topic.subscribe(name, ("http", url), tuple(filters), strategy)
        vh.report_filters(exchange, topic, name, sub.filters, sub.filters, owner or None, None)  # PF4
        record = HttpSubscription(vhost, exchange, name, url, strategy.value, content_format,
                                  sub.filters, owner)
        self.subscriptions[vhost, exchange, name] = record
        if persist and ex.durable:
            data = asdict(record)
            data["filters"] = list(record.filters)
            self.broker.persist(record.key, json.dumps(data).encode())
        self.broker.audit.emit("bind", vhost, topic=exchange, subscription=name, routing_key=url,
                               tags=list(sub.filters), policy=strategy.value)
        return record

    async def check_endpoint(self, url: str) -> None:
        """SE3 before a subscription is created: the URL and every address of its host."""
        if self.policy is not None:
            await self.policy.check(url)

    def unsubscribe(self, vhost: str, exchange: str, name: str) -> bool:
        record = self.subscriptions.pop((vhost, exchange, name), None)
        self.last_errors.pop((vhost, exchange, name), None)
        if record is None:
            return False
        vh = self.broker.vhosts.get(vhost)
        ex = vh.exchanges.get(exchange) if vh is not None else None
        if ex is not None and ex.topic is not None:
            ex.topic.unsubscribe(name)
        self.broker.unpersist(record.key, missing_ok=True)
        self.broker.audit.emit("unbind", vhost, topic=exchange, subscription=name, routing_key=record.url)
        return True

    def recover(self) -> int:
        """Re-create the persisted HTTP subscriptions (after the broker recovered its exchanges)."""
        count = 0
        for key, raw in list(self.broker.store.items(P.SUBSCRIPTIONS_PREFIX)):
            r = json.loads(raw)
            if (r["vhost"], r["exchange"], r["name"]) in self.subscriptions:
                continue
            try:
                self.subscribe(r["vhost"], r["exchange"], r["name"], r["url"],
                               notify_strategy=r["notify_strategy"], content_format=r["content_format"],
                               filters=r["filters"], owner=r.get("owner", ""), persist=False)
                count += 1
            except (KeyError, ValueError, Exception):
                log.warning("cannot restore HTTP subscription %s", key, exc_info=True)
        return count

    # -- delivery (D7) ------------------------------------------------------------------

    def _locate(self, topic: Topic, sub_name: str) -> tuple[Any, Any, HttpSubscription] | None:
        for (vhost, exchange, name), record in self.subscriptions.items():
            if name != sub_name:
                continue
            vh = self.broker.vhosts.get(vhost)
            ex = vh.exchanges.get(exchange) if vh is not None else None
            if ex is not None and ex.topic is topic:
                return vh, ex, record
        return None

    def push(self, topic: Topic, sub: Subscription, tmsg: TopicMessage) -> bool | None:
        """The attempt for an HTTP endpoint: start the POST, answer None (pending, D7)."""
        where = self._locate(topic, sub.name)
        if where is None:
            return False
        vh, ex, record = where
        body, headers = notify_request(record, topic, tmsg)
        task = asyncio.get_running_loop().create_task(self._post(vh, ex, topic, record, tmsg, body, headers))
        self._tasks.add(task)
        self._idle.clear()
        task.add_done_callback(self._done)
        return None

    def _done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not self._tasks:
            self._idle.set()

    async def _post(self, vh: Any, ex: Any, topic: Topic, record: HttpSubscription, tmsg: TopicMessage,
                    body: bytes, headers: dict[str, str]) -> None:
        started = time.perf_counter()
        status: int | None = None
        error = ""
        # A5: the message's records out of this process before it leaves. A stop on a full
        # disk keeps them here: the message is not sent and no outcome is reported, so it
        # stays owed to the subscription (journaled, D7) and is pushed again after the restart.
        if not self.broker.audit_handoff():
            self.withheld += 1
            return
        self.sent += 1
        try:
            if self.policy is not None:
                self.policy.check_url(record.url)  # the config may have changed; names: PolicyResolver
            async with self._client().post(record.url, data=body, headers=headers,
                                           allow_redirects=False) as resp:
                status = resp.status
                seen = 0
                while seen <= ANSWER_BYTES:  # more: the connection is closed, not reused
                    chunk = await resp.content.readany()
                    if not chunk:
                        break
                    seen += len(chunk)
        except (TimeoutError, aiohttp.ClientError, OSError, PushRefused) as e:
            log.info("push of %s to %s failed: %s", tmsg.msg_id, record.url, e)
            error = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
        ok = status == 200  # D7: success only on HTTP status 200
        if ok:
            self.succeeded += 1
        else:
            self.failed += 1
            self.last_errors[(record.vhost, record.exchange, record.name)] = {
                "time": time.time(), "msgId": tmsg.msg_id, "error": error or f"HTTP status {status}"}
        self._report(vh, ex, topic, record, tmsg, ok, status, started)

    def _report(self, vh: Any, ex: Any, topic: Topic, record: HttpSubscription, tmsg: TopicMessage,
                ok: bool, status: int | None, started: float) -> None:
        broker = self.broker
        now = broker.clock.now()
        state = topic.state(tmsg.msg_id).get(record.name)
        events = topic.report(tmsg.msg_id, record.name, ok, now)
        if ok and events:
            broker.audit.emit("deliver", vh.name, topic=ex.name, subscription=record.name,
                              msg_id=tmsg.msg_id, attempt=state.attempts if state else None,
                              size=tmsg.size, latency_ms=round((time.perf_counter() - started) * 1000, 3))
        broker.topic_events(vh, ex, events)
        broker.reschedule_exchange(vh, ex)
