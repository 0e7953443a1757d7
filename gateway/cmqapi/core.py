"""The request -> answer core of CMQ's HTTP API (CA1-CA4): parsed parameters in, the JSON
answer (a dict) out. No HTTP here (gateway/cmqapi/app.py serves it).

Each request is checked as CMQ checks it: ``Action`` first, then the signature of its
``SecretId`` (gateway.cmqapi.signing), the ``Timestamp`` window and the ``Nonce`` (a replay is
refused), then the permissions of the key's user on the vhost, as RabbitMQ checks the same
operation made over AMQP (declare and delete: configure; publish: write on the exchange,
``amq.default`` for SendMessage; receive, delete and rewind: read on the queue; a
subscription: read on the topic and write on its queue).

The vhost of a request (M1, a CMQ region) is its ``vhost`` parameter (a gateway extension;
CMQ's region is in the host name), else the one configured with the key, else ``/``.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from gateway.admission import publishers_held
from gateway.auth import Access, Permission
from gateway.broker.errors import resource_locked
from gateway.cmqapi.errors import AUTH, DENIED, INTERNAL, QUEUE_FULL, TOO_LARGE, CmqApiError, from_cmq_error
from gateway.cmqapi.nonces import NonceStore
from gateway.cmqapi.params import Params
from gateway.cmqapi.signing import METHODS, check_timestamp, verify_signature
from gateway.handout import STOPPING
from gateway.push import HttpPusher
from gateway.transport import is_loopback
from semantics.errors import CMQError, LimitError

__all__ = ["PROTOCOL", "Action", "Caller", "CmqApi"]

log = logging.getLogger("cmq_gateway.cmqapi")

PROTOCOL = "cmq-api"  # CA4: the audit records of what this API carried say so
PATH = "/v2/index.php"

Action = Callable[["CmqApi", "Caller", Params], Awaitable[dict[str, Any]]]


@dataclass(frozen=True, slots=True)
class Caller:
    """Who a verified request acts as."""

    user: str
    vhost: str
    permission: Permission
    peer: str
    secret_id: str

    def sees(self, resource: str) -> bool:
        """Whether a listing shows the queue or topic ``resource``: the caller holds one of the
        three permissions on it (a name it may do nothing with is not told, nor its counts)."""
        return any(self.permission.allows(a, resource) for a in ("configure", "write", "read"))

    def require_any(self, resource: str) -> None:
        if not self.sees(resource):
            raise CmqApiError(DENIED, f"access to '{resource}' in vhost '{self.vhost}' refused for user "
                              f"'{self.user}' (no permission on it)")

    def require(self, access: Access, resource: str) -> None:
        if not self.permission.allows(access, resource):
            what = "the default exchange" if resource == "" else f"'{resource}'"
            raise CmqApiError(DENIED, f"access to {what} in vhost '{self.vhost}' refused for user "
                              f"'{self.user}' ({access} permission)")


class CmqApi:
    """CMQ's classic API over one gateway's broker and configuration."""

    def __init__(self, broker: Any, config: Any, *, pusher: HttpPusher | None = None,
                 wall_clock: Callable[[], float] = time.time, gateway: Any = None) -> None:
        from gateway.cmqapi.queues import QUEUE_ACTIONS
        from gateway.cmqapi.topics import TOPIC_ACTIONS

        self.broker = broker
        self.config = config
        self.gateway = gateway  # its resource alarms (SE6), when served by a Gateway
        self.pusher = pusher if pusher is not None else HttpPusher.of(broker)
        self.wall_clock = wall_clock  # Timestamp and Nonce checks: the caller's real time
        self.nonces = NonceStore(broker)  # SE6: across restarts and the gateways of a cluster
        self.actions: dict[str, Action] = {**QUEUE_ACTIONS, **TOPIC_ACTIONS}
        self.started = int(wall_clock())
        self.closing = False  # the server stops: long polls answer now (7000) instead of waiting
        # createTime / lastModifyTime of what this API made or changed (kind, vhost, name);
        # objects made otherwise show the time this API started.
        self._times: dict[tuple[str, str, str], tuple[int, int]] = {}

    # -- one request -------------------------------------------------------------------------

    async def call(self, values: Mapping[str, str], *, method: str = "POST", host: str = "",
                   path: str = PATH, peer: str = "",
                   on_login: Callable[[Caller], None] | None = None) -> dict[str, Any]:
        """The answer to one request. ``on_login`` is told the verified caller (the HTTP
        server audits the login once per connection, gateway.admission.audit_http_login)."""
        request_id = f"{int(self.wall_clock() * 1000)}{os.urandom(4).hex()}"
        try:
            params = Params(values)
            name = params.text("Action")
            caller = await self.authenticate(params, method, host, path, peer)
            if on_login is not None:
                on_login(caller)
            action = self.actions.get(name)
            if action is None:
                raise CmqApiError.param(f"action name {name} is not existed", 10430)
            answer = await action(self, caller, params)
            # A5: what the answer tells (a send stored, a queue made) has its records out of
            # this process before the client reads it, as AMQP hands off before any bytes go
            # out. On the embedded store a send's confirm waited for the audit fsync already;
            # on JetStream a PubAck does not, and a kill -9 between the answer and the next
            # hand-off took the records of answered sends (5-9 in a 5 s crash trial).
            if not self.broker.audit_handoff():
                raise stopping()
        except CmqApiError as e:
            if e.code in (AUTH, DENIED):
                self._audit_refusal(e, values, peer)
            return e.answer(request_id)
        except web.HTTPException:  # an answer that is not CMQ's 200 (a stopping server's 503)
            raise
        except CMQError as e:
            refusal = from_cmq_error(e)
            if refusal.code == DENIED:
                self._audit_refusal(refusal, values, peer)
            return refusal.answer(request_id)
        except Exception:  # a fault of ours: CMQ's answer for it, never a bare HTTP 500 (issue 26)
            log.exception("CMQ API %s failed", values.get("Action"))
            return CmqApiError(INTERNAL, "server internal error").answer(request_id)
        return {"code": 0, "message": "", "requestId": request_id, **answer}

    def _audit_refusal(self, e: CmqApiError, values: Mapping[str, str], peer: str) -> None:
        """A1/W2: a refused signature, key, timestamp or nonce, and a refusal of a verified
        caller (its permissions), audited as AMQP's refused logins: ``auth_failure`` with the
        key's user (or none: an unknown key), the peer, the action and why."""
        key = self.config.cmq_keys.get(str(values.get("SecretId", "")))
        vhost = str(values.get("vhost") or (key.vhost if key is not None else "") or "/")
        action = str(values.get("Action", ""))[:64]
        self.broker.audit.emit("auth_failure", vhost, user=key.user if key is not None else None, peer=peer,
                               reason=f"{e.message} (Action {action})"[:512], protocol=PROTOCOL)

    async def authenticate(self, params: Params, method: str, host: str, path: str, peer: str) -> Caller:
        secret_id = params.text("SecretId")
        params.text("Signature")
        nonce = params.text("Nonce")
        timestamp = params.text("Timestamp")
        sig_method = params.opt("SignatureMethod") or "HmacSHA1"
        if sig_method not in METHODS:
            raise CmqApiError.param(f"SignatureMethod {sig_method} is not HmacSHA1 or HmacSHA256")
        key = self.config.cmq_keys.get(secret_id)
        if key is None:
            raise CmqApiError(AUTH, f"authentication failed: secretId {secret_id} is not existed")
        now = self.wall_clock()
        check_timestamp(timestamp, now)
        hosts = [host] if _without_port(host) == host else [host, _without_port(host)]
        if not verify_signature(key.secret_key, method, hosts, path, params.values):
            raise CmqApiError(AUTH, "authentication failed: the signature is not correct")
        await self.nonces.use(secret_id, nonce, now)
        users = self.config.users
        if key.user not in users.users:
            raise CmqApiError(AUTH, f"authentication failed: user '{key.user}' of secretId {secret_id} does not exist")
        if key.user in users.loopback_users and not is_loopback(peer.rsplit(":", 1)[0].strip("[]")):
            raise CmqApiError(AUTH, f"authentication failed: user '{key.user}' can only connect via localhost")
        vhost = params.opt("vhost") or key.vhost
        perm = users.vhost_permission(key.user, vhost)
        if perm is None:
            raise CmqApiError(DENIED, f"user '{key.user}' has no access to vhost '{vhost}'")
        return Caller(key.user, vhost, perm, peer, secret_id)

    # -- what the actions share --------------------------------------------------------------

    def vhost(self, caller: Caller) -> Any:
        return self.broker.vhost(caller.vhost)

    def queue(self, caller: Caller, name: str) -> tuple[Any, Any]:
        vh = self.vhost(caller)
        q = vh.queues.get(name)
        if q is None:
            raise CmqApiError.queue_not_exist(name)
        if q.exclusive_owner is not None:
            raise from_cmq_error(resource_locked(name, vh.name))
        return vh, q

    def exchange(self, caller: Caller, name: str) -> tuple[Any, Any]:
        vh = self.vhost(caller)
        ex = vh.exchanges.get(name)
        if ex is None or ex.topic is None:
            raise CmqApiError.topic_not_exist(name)
        return vh, ex

    def emit(self, event: str, caller: Caller, **fields: Any) -> None:
        self.broker.audit.emit(event, caller.vhost, user=caller.user, peer=caller.peer, protocol=PROTOCOL,
                               **fields)

    def alarm(self) -> str:
        """The resource alarm in effect ("" when none): W5's memory or disk alarm, or the
        memory mark passed since the last tick, as the AMQP transport checks it."""
        return publishers_held(self.gateway)

    async def publish(self, caller: Caller, vh: Any, exchange: str, key: str, properties: Any,
                      bodies: list[str], *, queue: bool = False) -> list[Any]:
        """(Batch)SendMessage / (Batch)PublishMessage: each body published as AMQP would
        (M9, M10), answered once stored durably (M14). The PublishOutcomes. A ``queue``
        send (SendMessage) whose write the store refused is 4410 (a topic's refusal is the
        subscription's to retry, D2).

        SE6: while a resource alarm holds AMQP and MQTT publishers, a publish here is refused
        with 4410, CMQ's answer for a queue that takes no more for now (the SDKs' "queue
        full"; CMQ's API pages give no code of their own for a throttled or paused server);
        the caller retries later, as a blocked AMQP publisher waits."""
        reason = self.alarm()
        if reason:
            raise CmqApiError(QUEUE_FULL, f"the gateway is {reason} (resource alarm, CMQ rule SE6): "
                              "nothing was stored, send again later")
        try:
            outs = [vh.publish(exchange, key, properties, body.encode(), user=caller.user, peer=caller.peer,
                               protocol=PROTOCOL) for body in bodies]
        except LimitError as e:  # the body's size (L6) or the queue's maxMsgHeapNum (L8): CMQ's own codes
            if e.rule == "L6":
                raise CmqApiError(TOO_LARGE, f"{e.text}") from None
            if e.rule == "L8":
                raise CmqApiError(QUEUE_FULL, f"{e.text}") from None
            raise
        lsn = max(out.lsn for out in outs)
        messages = self.broker.messages  # a write the store refuses after taking it (JetStream's L8)
        watched = messages.watch_refusals([out.lsn for out in outs if out.lsn]) if queue else None
        if lsn:
            await self.durable(lsn)
        if watched is not None and messages.refusals_seen(watched):
            raise CmqApiError(QUEUE_FULL, "the queue already retains maxMsgHeapNum messages (CMQ rule L8): "
                              "refused by the store; messages of this request before it may have been kept")
        return outs

    async def durable(self, lsn: int = -1) -> None:
        """Answer only once what the request stored would survive a crash (M14, SE4):
        ``lsn`` the store position it must reach (-1: everything so far)."""
        if lsn < 0 or lsn > self.broker.durable_lsn:
            await self.broker.flush()

    def touch(self, kind: str, vhost: str, name: str, *, created: bool = False) -> None:
        now = int(self.wall_clock())
        old = self._times.get((kind, vhost, name))
        self._times[kind, vhost, name] = (now if created or old is None else old[0], now)

    def forget(self, kind: str, vhost: str, name: str) -> None:
        self._times.pop((kind, vhost, name), None)

    def times(self, kind: str, vhost: str, name: str) -> dict[str, int]:
        created, modified = self._times.get((kind, vhost, name), (self.started, self.started))
        return {"createTime": created, "lastModifyTime": modified}


def stopping() -> web.HTTPServiceUnavailable:
    """A stopping server's answer (A5), in CMQ's shape with an HTTP status CMQ's SDKs retry."""
    return web.HTTPServiceUnavailable(text=json.dumps({"code": INTERNAL, "message": STOPPING}),
                                      content_type="application/json")


def sent(outs: list[Any], batch: bool) -> dict[str, Any]:
    """The answer of a send or publish: ``msgId``, or ``msgList`` for a batch."""
    return {"msgList": [{"msgId": o.msg_id} for o in outs]} if batch else {"msgId": outs[0].msg_id}


def _without_port(host: str) -> str:
    """The Host header without its port: a client may sign the host name alone."""
    if host.startswith("["):
        return host[:host.index("]") + 1] if "]" in host else host
    return host.split(":", 1)[0] if host.count(":") == 1 else host


def object_id(kind: str, vhost: str, name: str) -> str:
    """CMQ's queueId / topicId / subscriptionId: stable for the same object."""
    return f"{kind}-{hashlib.sha1(f'{vhost}/{name}'.encode()).hexdigest()[:8]}"
