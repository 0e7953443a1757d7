"""Well-formed HTTP requests with hostile contents, for scripts/fuzz_http.py's ``--requests``:
never an HTTP 500, never a traceback (SE5; CA1-CA3 answer CMQ codes).

Three kinds, in turn:

* ``body``: a PUT or POST route of the management API (every one authz.RULES lists) with a
  JSON body of the route's shape holding hostile values, or a random one, or (DELETES of
  them) a DELETE route; the random bodies: objects with the routes' own keys holding wrong types, huge and negative
  numbers, NaN, NUL, deep nesting; non-objects, truncated JSON, bytes that are not UTF-8;
* ``query``: a GET route with a random query string (pagination, columns, sort, rates,
  regexes that do not compile, repeated and empty keys);
* ``cmq``: a signed CMQ API action (every one, and unknown ones) with random parameters, each
  holding one of the HOSTILE values (or a list of them as ``name.n``), and now and then a
  request badly signed, unsigned, or sent by GET.

Path parameters and CMQ names come from a small pool, mostly of things that exist (a queue,
an exchange, a CMQ queue and topic made first), so that requests reach the handlers. Nothing
names the user the canary logs in as, nor the default vhost in a DELETE. After them, the
after phase (:func:`after_phase`) looks at what they left behind.
"""

from __future__ import annotations

import json
import math
import random
import sys
import tempfile
import threading
import time
import urllib.parse
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import requests

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gateway.management.authz import RULES  # noqa: E402
from tests.integration.cmq_client import CmqClient  # noqa: E402

AUTH = ("guest", "guest")
CONFIG_USERS = ("guest",)  # the users the fuzz scripts' configuration files (or the default) define
KEY_ID, SECRET = "AKIDfuzz00000000000000000000000000000", "fuzz-secret-key-0123456789abcdef0"
NAMES = ["fz-q", "fz-x", "fzq", "fzt", "fzs", "amq.direct", "amq.topic", "", "nope", "é", "a b", "a/b", "%2F",
         "x" * 300, "..", "fz-q\x00", "*"]
USERS = ["fzuser", "nobody", "é", ""]  # never guest: the canary logs in as guest
VHOSTS = ["%2F"] * 6 + ["nope", "fz-vhost", "%2Fx", "%252F", "%00"]
BODY_KEYS = ["arguments", "durable", "auto_delete", "type", "internal", "routing_key", "payload", "payload_encoding",
             "properties", "count", "ackmode", "encoding", "truncate", "requeue", "password", "password_hash",
             "hashing_algorithm", "tags", "configure", "write", "read", "pattern", "definition", "priority",
             "apply-to", "queues", "exchanges", "bindings", "policies", "vhosts", "permissions", "users", "name",
             "vhost", "destination", "destination_type", "source", "endpoint", "protocol", "profile",
             "rabbit_version", "delivery_mode", "headers", "x-message-ttl", "max-length", "description"]
QUERY_KEYS = ["page", "page_size", "name", "use_regex", "pagination", "columns", "sort", "sort_reverse",
              "lengths_age", "lengths_incr", "msg_rates_age", "msg_rates_incr", "data_rates_age",
              "data_rates_incr", "disable_stats", "enable_queue_totals", "if-unused", "if-empty", "hours",
              "download", "auth", "vhost"]
QUERY_VALUES = ["", "0", "1", "-1", "2", "100", "500", "501", "99999999999999999999999", "1e3", "abc", "true",
                "false", "name", "messages", "name,messages", "x.y.z", "(", "[", "*", ".*", "^fz", "\\", "é",
                "%00", "1,2", "NaN", "-0", " 1", "a" * 5000, "[" * 10_000]
# CMQ API parameter names (the actions' own, and the common ones).
CMQ_PARAMS = ["queueName", "topicName", "subscriptionName", "msgBody", "delaySeconds", "receiptHandle",
              "pollingWaitSeconds", "numOfMsg", "visibilityTimeout", "maxMsgHeapNum", "maxMsgSize",
              "msgRetentionSeconds", "rewindSeconds", "maxTimeToLive", "maxReceiveCount", "deadLetterPolicy",
              "deadLetterQueue", "policy", "startConsumeTime", "searchWord", "offset", "limit", "msgTag",
              "routingKey", "endpoint", "protocol", "notifyStrategy", "notifyContentFormat", "filterTag",
              "bindingKey", "filterType", "queueId", "topicId", "vhost", "Region", "Timestamp", "Nonce",
              "deadLetterPolicy", "deadLetterPolicy"]  # twice: JSON read from a parameter
CMQ_LISTS = ["msgBody", "receiptHandle", "filterTag", "bindingKey", "msgTag"]
ACTIONS = ["CreateQueue", "ListQueue", "GetQueueAttributes", "SetQueueAttributes", "DeleteQueue", "RewindQueue",
           "SendMessage", "BatchSendMessage", "ReceiveMessage", "BatchReceiveMessage", "DeleteMessage",
           "BatchDeleteMessage", "CreateTopic", "ListTopic", "GetTopicAttributes", "SetTopicAttributes",
           "DeleteTopic", "PublishMessage", "BatchPublishMessage", "Subscribe", "Unsubscribe",
           "ListSubscriptionByTopic", "GetSubscriptionAttributes", "SetSubscriptionAttributes",
           "ClearSubscriptionFilterTags", "NoSuchAction", "", "createqueue"]
# 46 values a parameter gets: empty, spaces, signs, huge and long numbers, non-ASCII digits,
# NUL, separators, '@' (a file upload in Tencent's SDK), JSON, names that exist and do not.
HOSTILE = ["", " ", "0", "1", "-1", "2", "15", "16", "17", "30", "65536", "99999999999999999999999",
           "9" * 5000, "1.5", "1e9", "0x10", "+1", " 1 ", "１", "²", "\x00", "a\x00b", "é", "设备", "%", "&", "=",
           "@/etc/passwd", "@", "a" * 70_000, "[]", "{}", "null", "true", "fzq", "fzt", "fzs", "nope", "-",
           "\n", "../", "*", "#", "<script>", "[" * 10_000, '{"deadLetterQueue": "fzq", "policy": "9"}']
WORKERS = 6
# The share of the body kind that are DELETEs of what the pool names: what a deletion leaves
# behind (a vhost's policies once) is for the after phase to find.
DELETES = 0.15
TIMEOUT = 60.0


class Requests:
    """What the requests got: counts by kind and status, HTTP 500s with what caused them."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.sent: Counter[str] = Counter()
        self.status: Counter[str] = Counter()
        self.cmq_codes: Counter[int] = Counter()
        self.failed: Counter[str] = Counter()  # no answer: exceptions by type
        self.server_errors: list[str] = []  # each HTTP 5xx but 503, and each CMQ code 6000

    def note(self, kind: str, what: str, resp: requests.Response | None, error: Exception | None = None) -> None:
        with self.lock:
            self.sent[kind] += 1
            if resp is None:
                self.failed[f"{kind}: {type(error).__name__}"] += 1
                return
            self.status[f"{kind} {resp.status_code}"] += 1
            if resp.status_code >= 500 and resp.status_code != 503:
                self.server_errors.append(f"{resp.status_code} {what[:300]} -> {resp.text[:300]}")
            if kind == "cmq" and resp.status_code == 200:
                try:
                    code = int(resp.json()["code"])
                except (ValueError, KeyError, TypeError):
                    code = -1  # not a CMQ answer
                self.cmq_codes[code] += 1
                if code in (6000, -1):  # CMQ's internal error: a fault of the gateway's
                    self.server_errors.append(f"code {code} {what[:300]} -> {resp.text[:300]}")

    def report(self) -> dict[str, Any]:
        return {"requests": sum(self.sent.values()), "by_kind": dict(self.sent),
                "status": dict(sorted(self.status.items())),
                "cmq_codes": {str(k): v for k, v in sorted(self.cmq_codes.items())},
                "no_answer": dict(self.failed), "internal_errors": len(self.server_errors),
                "first_internal_errors": self.server_errors[:10]}


def _value(r: random.Random, depth: int = 0) -> Any:
    choices: list[Callable[[], Any]] = [
        lambda: r.choice((0, 1, -1, 2**31, 2**63, -(2**64), 10**400, r.randint(-1000, 10**6))),
        lambda: r.choice((0.5, -1e308, 1e308, math.inf, math.nan)),
        lambda: r.choice((True, False, None)),
        lambda: r.choice(NAMES + ["", "\x00", "é" * 300, "a" * 100_000, "base64", "string", "auto", "ack_requeue_true",
                                  "reject_requeue_false", "direct", "topic", "fanout", "x-delayed-message", "all",
                                  "queues", "exchanges", "administrator", "=", "{", "[]"]),
    ]
    if depth < 4:
        choices += [lambda: {r.choice(BODY_KEYS + [""]): _value(r, depth + 1) for _ in range(r.randint(0, 4))},
                    lambda: [_value(r, depth + 1) for _ in range(r.randint(0, 4))]]
    return r.choice(choices)()


# What the templates put in a field: mostly of the right kind, sometimes not.
SCALARS: list[Any] = [0, 1, -1, 2, 2**31, 2**63, 10**30, 0.5, 1e308, -1e308, True, False, None, "", "1", "-1", "é",
                      "\x00", "a\x00b", "x" * 300, "inf", "NaN", [], {}, ["a"], {"a": 1}]
REGEXES = [".*", "", "^fz", "fz.*", "é", "^$", "(?i)FZ", "[a-z]+", "\\d", "a" * 1000, "(", "\x00", ".*" * 50]
POLICY_KEYS = ["max-length", "max-length-bytes", "message-ttl", "expires", "dead-letter-exchange",
               "dead-letter-routing-key", "overflow", "delivery-limit", "queue-mode", "ha-mode", "alternate-exchange",
               "max-priority", "queue-master-locator", "x-cmq-visibility-timeout", "federation-upstream-set", "", "é",
               # Keys the gateway keeps without applying, each with RabbitMQ's own validation.
               "max-age", "queue-version", "dead-letter-strategy", "ha-params", "ha-sync-mode",
               "stream-max-segment-size-bytes", "queue-leader-locator", "initial-cluster-size"]
# Key and value pairs RabbitMQ takes: the definition keys' validation refuses most random
# pairs, and a policy that is stored is what the after phase can find broken.
GOOD_DEFINITIONS: list[tuple[str, Any]] = [
    ("max-length", 10), ("message-ttl", 60000), ("expires", 3_600_000), ("overflow", "reject-publish"),
    ("dead-letter-exchange", "fz-x"), ("max-length-bytes", 10**20), ("queue-mode", "lazy"), ("max-age", "7D"),
    ("queue-version", 2), ("ha-mode", "all"), ("dead-letter-strategy", "at-least-once"), ("delivery-limit", 0),
    ("queue-leader-locator", "balanced"), ("alternate-exchange", "é")]
QUEUE_ARGS = ["x-message-ttl", "x-expires", "x-max-length", "x-max-length-bytes", "x-overflow", "x-dead-letter-exchange",
              "x-dead-letter-routing-key", "x-single-active-consumer", "x-delivery-limit", "x-queue-type",
              "x-max-priority", "x-cmq-dead-letter-queue", "x-cmq-visibility-timeout", "x-cmq-rewind-seconds",
              "x-cmq-msg-retention-seconds", "x-cmq-max-receive-count", "x-cmq-max-msg-size", "x-cmq-receive-metadata",
              "x-quorum-initial-group-size", "x-other", "", "é"]


def _scalar(r: random.Random, good: list[Any]) -> Any:
    """Mostly one of ``good``, else any of SCALARS."""
    return r.choice(good) if r.random() < 0.6 else r.choice(SCALARS)


def templated_body(r: random.Random, pattern: str) -> Any:
    """A body of the route's own shape with a hostile value or two in it: such bodies make
    objects (the bare random ones are mostly refused), and objects are what can break later."""
    name = lambda: _scalar(r, NAMES)  # noqa: E731
    if pattern.startswith("/api/policies"):
        return {"pattern": _scalar(r, REGEXES), "apply-to": _scalar(r, ["all", "queues", "exchanges", "bogus"]),
                "priority": _scalar(r, [0, 1, 10, -1]),
                "definition": dict(r.choice(GOOD_DEFINITIONS) if r.random() < 0.5 else
                                   (r.choice(POLICY_KEYS), _scalar(r, [1, 0, 100, "fz-x", "reject-publish", "lazy",
                                                                       "all", "7D", "exactly", ["rabbit@a"]]))
                                   for _ in range(r.randint(1, 3)))}
    if pattern.startswith("/api/users"):
        body: dict[str, Any] = {"tags": _scalar(r, ["", "administrator", "management", "a,b", "monitoring,policymaker",
                                                    ["management", "x"], "é" * 50])}
        if r.random() < 0.8:
            body["password"] = _scalar(r, ["pw", "", "é" * 100])
        else:
            body["password_hash"] = _scalar(r, ["", "kI3GCqW5JLMJa4iX1lo7X4D6XbYqlLgxIs30+P6tENUV2POR"])
        return body
    if pattern.startswith("/api/permissions"):
        return {k: _scalar(r, REGEXES) for k in ("configure", "write", "read")}
    if pattern.startswith("/api/queues"):
        return {"durable": _scalar(r, [True, False, "false"]), "auto_delete": _scalar(r, [False, True, "true"]),
                "arguments": {r.choice(QUEUE_ARGS): _scalar(r, [1, 1000, 0, "fz-x", "reject-publish", "quorum",
                                                                "stream", "classic", "fzq", True])
                              for _ in range(r.randint(0, 3))}}
    if pattern.startswith("/api/exchanges/{vhost}/{name}") and not pattern.endswith("publish"):
        return {"type": _scalar(r, ["direct", "topic", "fanout", "headers", "x-delayed-message", "x-cmq"]),
                "durable": _scalar(r, [True, False]), "auto_delete": _scalar(r, [False, True]),
                "internal": _scalar(r, [False, True]),
                "arguments": {r.choice(["alternate-exchange", "x-max-message-size", "x-delayed-type", ""]):
                              _scalar(r, ["fz-x", "amq.topic", 1024, "direct"]) for _ in range(r.randint(0, 2))}}
    if pattern.startswith("/api/bindings"):
        return {"routing_key": _scalar(r, ["k", "#", "*.a", "", "a.#.b"] + NAMES),
                "arguments": {r.choice(["x-match", "h", "", "x-cmq-filter-tag"]): _scalar(r, ["all", "any", "v", 1])
                              for _ in range(r.randint(0, 2))}}
    if pattern.startswith("/api/vhosts"):
        return {"description": _scalar(r, ["d", ""]), "tags": _scalar(r, ["", "a,b", ["x"]]),
                "default_queue_type": _scalar(r, ["classic", "quorum", "stream", "bogus"])}
    if pattern.endswith("/subscriptions"):
        return {"name": name(), "subscriptionName": name(), "protocol": _scalar(r, ["queue", "http", "https"]),
                "endpoint": _scalar(r, ["fzq", "fz-q", "http://127.0.0.1:1/"]),
                "bindingKey": _scalar(r, [["a.*"], ["#"], []]), "filterTag": _scalar(r, [["t"], [], ["\x00"]]),
                "notifyContentFormat": _scalar(r, ["JSON", "SIMPLIFIED"])}
    if pattern.startswith("/api/definitions"):
        kind = r.choice(("queues", "exchanges", "bindings", "policies", "users", "vhosts", "permissions"))
        one = {"vhost": r.choice(("/", "fz-vhost", "\x00")), "name": name()}
        one.update(templated_body(r, {"queues": "/api/queues", "exchanges": "/api/exchanges/{vhost}/{name}",
                                      "bindings": "/api/bindings", "policies": "/api/policies",
                                      "users": "/api/users", "vhosts": "/api/vhosts",
                                      "permissions": "/api/permissions"}[kind]))
        if kind == "bindings":
            one.update(source=_scalar(r, ["amq.topic", "fz-x"]), destination=name(),
                       destination_type=_scalar(r, ["queue", "exchange"]))
        if kind == "permissions":
            one["user"] = r.choice(USERS)
        return {kind: [one]}
    return {r.choice(BODY_KEYS): _value(r) for _ in range(r.randint(0, 6))}


def json_body(r: random.Random, pattern: str = "") -> bytes:
    x = r.random()
    if x < 0.5:
        return json.dumps(templated_body(r, pattern), allow_nan=True).encode()
    x = r.random()
    if x < 0.75:
        obj: Any = {r.choice(BODY_KEYS): _value(r) for _ in range(r.randint(0, 6))}
    elif x < 0.85:
        obj = _value(r)
    elif x < 0.9:
        obj = {"a": [[[[[[[[[[[[[[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]]]]]]]]]]]]]] * r.choice((1, 50))}
    else:
        return r.choice((b"", b"{", b'{"durable": tru', b"\xff\xfe{}", b"null", b"[" * 10_000, b'{"a":1}{"a":2}',
                         b'{"arguments": {"x": 1e999}}', json.dumps({"type": "direct"}).encode()[:-1]))
    text = json.dumps(obj, allow_nan=True)
    return text.encode()


def _path(r: random.Random, pattern: str) -> str:
    def fill(name: str) -> str:
        if name == "vhost":
            return r.choice(VHOSTS)
        if name == "user":
            return urllib.parse.quote(r.choice(USERS), safe="")
        if name == "kind":
            return r.choice(("q", "e", "x", ""))
        if name == "props":
            return r.choice(("~", "fz", "%7E", "a~b"))
        return urllib.parse.quote(r.choice(NAMES), safe="")

    out = pattern
    while "{" in out:
        i, j = out.index("{"), out.index("}")
        out = out[:i] + fill(out[i + 1:j]) + out[j + 1:]
    return out


def _query(r: random.Random) -> str:
    pairs = [(r.choice(QUERY_KEYS), r.choice(QUERY_VALUES)) for _ in range(r.randint(1, 6))]
    return urllib.parse.urlencode(pairs)


def _cmq_params(r: random.Random) -> dict[str, Any]:
    params: dict[str, Any] = {}
    for _ in range(r.randint(0, 6)):
        name = r.choice(CMQ_PARAMS)
        params[name] = r.choice(HOSTILE)
    # Mostly names that exist, so the hostile values reach the actions.
    if r.random() < 0.7:
        params.setdefault("queueName", r.choice(("fzq", "fzq", "nope", "fz-q")))
    if r.random() < 0.5:
        params.setdefault("topicName", r.choice(("fzt", "fzt", "nope")))
    if r.random() < 0.3:
        params.setdefault("subscriptionName", "fzs")
    if "pollingWaitSeconds" in params and params["pollingWaitSeconds"] not in ("0", "1", "2", "", "-1", "abc"):
        params["pollingWaitSeconds"] = r.choice(("0", "1", "31", "1.5"))  # a long poll only slows the run
    if r.random() < 0.3:
        name = r.choice(CMQ_LISTS)
        params.pop(name, None)
        params[name] = [r.choice(HOSTILE) for _ in range(r.choice((0, 1, 2, 16, 17)))]
    return params


def _one(r: random.Random, kind: str, mgmt: str, cmq: CmqClient, session: requests.Session, out: Requests,
         bodies: list[tuple[str, str]], gets: list[str]) -> None:
    what = ""
    try:
        if kind == "body" and r.random() < DELETES:
            method, pattern = r.choice([b for b in bodies if b[0] == "DELETE"])
            path = _path(r, pattern)
            if pattern == "/api/vhosts/{vhost}":
                path = "/api/vhosts/" + r.choice([v for v in VHOSTS if v != "%2F"])
            what = f"DELETE {path}"
            resp = session.delete(mgmt + path, auth=AUTH, timeout=TIMEOUT)
        elif kind == "body":
            method, pattern = r.choice([b for b in bodies if b[0] != "DELETE"])
            path = _path(r, pattern)
            data = json_body(r, pattern)
            what = f"{method} {path} {data[:200]!r}"
            resp = session.request(method, mgmt + path, data=data, auth=AUTH, timeout=TIMEOUT,
                                   headers={"content-type": r.choice(("application/json", "text/plain", ""))})
        elif kind == "query":
            path = _path(r, r.choice(gets)) + "?" + _query(r)
            what = f"GET {path}"
            resp = session.get(mgmt + path, auth=AUTH, timeout=TIMEOUT)
        else:
            action = r.choice(ACTIONS)
            params = cmq.signed(action, _cmq_params(r))
            x = r.random()
            if x < 0.05:
                params["Signature"] = "AAAA" + params["Signature"][4:]
            elif x < 0.08:
                params.pop("Signature")
            elif x < 0.1:
                params["SignatureMethod"] = r.choice(HOSTILE)
            what = f"cmq {action} {str(params)[:250]}"
            url = cmq.endpoint + "/v2/index.php"
            if r.random() < 0.1:
                resp = session.get(url, params=params, timeout=TIMEOUT)
            else:
                resp = session.post(url, data=params, timeout=TIMEOUT)
        out.note(kind, what, resp)
    except requests.RequestException as e:
        out.note(kind, what, None, e)


def setup(mgmt: str, cmq: CmqClient) -> None:
    """The things the pool names, so that requests reach the handlers."""
    s = requests.Session()
    s.put(f"{mgmt}/api/queues/%2F/fz-q", json={"durable": True}, auth=AUTH, timeout=TIMEOUT).raise_for_status()
    s.put(f"{mgmt}/api/exchanges/%2F/fz-x", json={"type": "topic"}, auth=AUTH, timeout=TIMEOUT).raise_for_status()
    for action, params in (("CreateQueue", {"queueName": "fzq"}), ("CreateTopic", {"topicName": "fzt"}),
                           ("Subscribe", {"topicName": "fzt", "subscriptionName": "fzs", "protocol": "queue",
                                          "endpoint": "fzq"})):
        answer = cmq.call(action, **params)
        assert answer["code"] in (0, 4460, 4470, 4480, 4490, 4500, 4510, 4518), (action, answer)


def fuzz_requests(mgmt: str, cmq_endpoint: str, count: int, seed: int) -> Requests:
    """``count`` requests, a third of each kind, WORKERS at a time."""
    out = Requests()
    cmq = CmqClient(cmq_endpoint, KEY_ID, SECRET)
    setup(mgmt, cmq)
    bodies = sorted(k for k in RULES if k[0] in ("PUT", "POST", "DELETE"))
    gets = sorted(p for m, p in RULES if m == "GET")
    local = threading.local()

    def run(i: int) -> None:
        if not hasattr(local, "session"):
            local.session = requests.Session()
        r = random.Random(seed * 1_000_003 + i)
        _one(r, ("body", "query", "cmq")[i % 3], mgmt, cmq, local.session, out, bodies, gets)

    t0 = time.monotonic()
    with ThreadPoolExecutor(WORKERS) as pool:
        for i, _ in enumerate(pool.map(run, range(count)), 1):
            if i % 1000 == 0:
                print(f"  {i} requests, {time.monotonic() - t0:.0f} s, {len(out.server_errors)} internal errors",
                      flush=True)
    return out


def lists_answer(mgmt: str, problems: list[str]) -> None:
    """After the fuzz, every list and view the administrator has still answers 200, in every
    vhost: no object a hostile request made may break them (a queue name of 300 bytes once
    made every queue list a 400 for as long as it lived). Each that does not is a problem."""
    patterns = sorted(p for m, p in RULES if m == "GET" and not p.startswith("/api/health")
                      and p.replace("{vhost}", "", 1).count("{") == 0)
    with requests.Session() as s:
        vhosts = [v["name"] for v in s.get(f"{mgmt}/api/vhosts", auth=AUTH, timeout=TIMEOUT).json()]
        paths = sorted({p.replace("{vhost}", urllib.parse.quote(v, safe="")) for p in patterns for v in vhosts})
        for path in paths:
            resp = s.get(mgmt + path, auth=AUTH, timeout=TIMEOUT)
            if resp.status_code != 200:
                problems.append(f"after the fuzz: GET {path[:300]} {resp.status_code} -> {resp.text[:300]}")


# -- what the fuzz leaves behind ---------------------------------------------------------------

# Keys of an export that say which build wrote it, not what it holds.
_EXPORT_METADATA = ("rabbit_version", "rabbitmq_version", "product_name", "product_version")


def definitions(mgmt: str) -> dict[str, Any]:
    resp = requests.get(f"{mgmt}/api/definitions", auth=AUTH, timeout=TIMEOUT)
    resp.raise_for_status()
    out: dict[str, Any] = resp.json()
    return out


def comparable(defs: dict[str, Any]) -> dict[str, Any]:
    """An export with its lists in one order and without the build's metadata. The password
    hash of a user of the configuration file is left out: each start hashes its password
    again, with a new salt."""
    def one(kind: str, x: Any) -> str:
        if kind == "users" and isinstance(x, dict) and x.get("name") in CONFIG_USERS:
            x = {k: v for k, v in x.items() if k != "password_hash"}
        return json.dumps(x, sort_keys=True)

    return {k: sorted(one(k, x) for x in v) if isinstance(v, list) else v
            for k, v in defs.items() if k not in _EXPORT_METADATA}


def durable(defs: dict[str, Any]) -> dict[str, Any]:
    """The durable part of an export, what a restart must keep: a transient queue or exchange
    goes (as in RabbitMQ), and the bindings to or from it; on JetStream the shared store keeps
    transient exchanges past one gateway's restart (docs/CLUSTER.md, CL1), so neither side's
    transient objects are compared."""
    gone = {("queue", q["vhost"], q["name"]) for q in defs.get("queues", []) if not q.get("durable")}
    gone |= {("exchange", x["vhost"], x["name"]) for x in defs.get("exchanges", []) if not x.get("durable")}
    return {**defs,
            "queues": [q for q in defs.get("queues", []) if ("queue", q["vhost"], q["name"]) not in gone],
            "exchanges": [x for x in defs.get("exchanges", []) if ("exchange", x["vhost"], x["name"]) not in gone],
            "bindings": [b for b in defs.get("bindings", [])
                         if ("exchange", b["vhost"], b["source"]) not in gone
                         and (b["destination_type"], b["vhost"], b["destination"]) not in gone]}


def differences(before: dict[str, Any], after: dict[str, Any], *, restart: bool = False) -> list[str]:
    """What differs between two exports. Across a ``restart`` only the durable part of
    ``before`` must be kept (see :func:`durable`); nothing may appear, transient or not."""
    a, b = comparable(before), comparable(after)
    kept = comparable(durable(before)) if restart else a
    out = []
    for key in sorted(set(a) | set(b)):
        x, y = a.get(key), b.get(key)
        if x == y:
            continue
        if isinstance(x, list) and isinstance(y, list):
            gone = sorted(set(kept.get(key, [])) - set(y))
            new = sorted(set(y) - set(x))
            if gone or new:
                out.append(f"{key}: {len(gone)} gone {[g[:200] for g in gone[:3]]}, {len(new)} new "
                           f"{[n[:200] for n in new[:3]]}")
        else:
            out.append(f"{key}: {str(x)[:200]} -> {str(y)[:200]}")
    return out


def cmq_lists_answer(cmq_endpoint: str, problems: list[str]) -> None:
    """The CMQ API's lists, page by page, and each listed queue's, topic's and subscription's
    attributes answer code 0."""
    cmq = CmqClient(cmq_endpoint, KEY_ID, SECRET)

    def ask(action: str, **params: Any) -> dict[str, Any]:
        try:
            answer = cmq.call(action, **params)
        except Exception as e:  # noqa: BLE001 - counted
            problems.append(f"CMQ {action} {params}: {type(e).__name__}: {str(e)[:200]}")
            return {}
        if answer.get("code") != 0:
            problems.append(f"CMQ {action} {params}: {str(answer)[:300]}")
            return {}
        return answer

    def listed(action: str, key: str, field: str, **params: Any) -> list[str]:
        names: list[str] = []
        while True:
            answer = ask(action, offset=len(names), limit=50, **params)
            page = [str(x.get(field)) for x in answer.get(key, [])]
            names += page
            if not page or len(names) >= int(answer.get("totalCount", 0)):
                return names

    for queue in listed("ListQueue", "queueList", "queueName"):
        ask("GetQueueAttributes", queueName=queue)
    for topic in listed("ListTopic", "topicList", "topicName"):
        ask("GetTopicAttributes", topicName=topic)
        for sub in listed("ListSubscriptionByTopic", "subscriptionList", "subscriptionName", topicName=topic):
            ask("GetSubscriptionAttributes", topicName=topic, subscriptionName=sub)


def amqp_declares_answer(mgmt: str, amqp_port: int, problems: list[str]) -> None:
    """Every queue and exchange the management API lists in a vhost guest may use is found
    by a passive declare on the AMQP side."""
    import pika
    import pika.exceptions

    vhosts = sorted({p["vhost"] for p in requests.get(f"{mgmt}/api/permissions", auth=AUTH, timeout=TIMEOUT).json()
                     if p.get("user") == "guest"})
    for vhost in vhosts:
        q = urllib.parse.quote(vhost, safe="")
        queues = [x["name"] for x in requests.get(f"{mgmt}/api/queues/{q}", auth=AUTH, timeout=TIMEOUT).json()
                  if not x.get("exclusive")]
        exchanges = [x["name"] for x in requests.get(f"{mgmt}/api/exchanges/{q}", auth=AUTH, timeout=TIMEOUT).json()
                     if x["name"]]
        try:
            conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", amqp_port, vhost,
                                                                     pika.PlainCredentials("guest", "guest")))
        except Exception as e:  # noqa: BLE001 - counted
            problems.append(f"AMQP login to vhost {vhost!r}: {type(e).__name__}: {str(e)[:200]}")
            continue
        try:
            ch = conn.channel()
            for kind, name in [("queue", n) for n in queues] + [("exchange", n) for n in exchanges]:
                try:
                    if kind == "queue":
                        ch.queue_declare(name, passive=True)
                    else:
                        ch.exchange_declare(name, passive=True)
                except (pika.exceptions.ChannelClosed, ValueError, TypeError) as e:
                    problems.append(f"AMQP passive {kind}.declare {name[:100]!r} in {vhost!r}: {str(e)[:200]}")
                    if ch.is_closed:
                        ch = conn.channel()
        finally:
            if conn.is_open:
                conn.close()


def everything_answers(gw: Any, problems: list[str], *, cmq: bool = True) -> None:
    """Invariant 1's and 3's part: every management list and view, the CMQ lists and the
    AMQP declares of what the management API lists."""
    mgmt = f"http://127.0.0.1:{gw.ports['management_port']}"
    lists_answer(mgmt, problems)
    if cmq and "cmq_api_port" in gw.ports:
        cmq_lists_answer(f"http://127.0.0.1:{gw.ports['cmq_api_port']}", problems)
    amqp_declares_answer(mgmt, gw.port, problems)


def write_config(path: Path, limits: dict[str, Any] | None = None) -> Path:
    """The fuzz scripts' gateway configuration: guest an administrator on "/" with the CMQ
    API key the requests sign with."""
    path.write_text(json.dumps({
        "limits": limits or {},
        "users": [{"name": "guest", "password": "guest", "tags": ["administrator"],
                   "cmq_keys": [{"secret_id": KEY_ID, "secret_key": SECRET}]}],
        "permissions": [{"user": "guest", "vhost": "/", "configure": ".*", "write": ".*", "read": ".*"}]}))
    return path


def add_after_argument(ap: Any) -> None:
    """The fuzz scripts' ``--no-after`` (``args.after``): the after phase is on by default."""
    ap.add_argument("--no-after", dest="after", action="store_false",
                    help="skip the final phase: what the fuzz left behind must survive a stop, a kill -9 and an "
                         "export/import round trip, and every list (management, CMQ, AMQP declares) must answer")


def print_after(after: dict[str, Any], problems: list[str]) -> None:
    """The after phase's lines of fuzz_sessions' and fuzz_mqtt's reports."""
    print(f"after: objects {after.get('objects')}, import {after.get('import')}")
    for p in problems[:20]:
        print(f"after problem: {p[:600]}")
    print(f"after problems: {len(problems)}")


def after_phase(gw: Any, config: Path | None, problems: list[str],
                keep: Path | None = None) -> tuple[Any, dict[str, Any]]:
    """What hostile clients left behind must not break anything later (invariants 1-3):

    1. every list answers; the gateway stopped (SIGTERM) and started again on the same data
       dir or store comes back clean (no traceback, ERROR, damaged or set-aside record) with
       the same definitions, and so it does after a kill -9 (nothing was being written);
    2. the export posted into a fresh gateway (a fresh nats-server for JetStream) is taken
       whole and exported back equal;
    3. the CMQ API's lists and the AMQP passive declares answer, before and after each start.

    ``keep``: where the export taken after the fuzz is written. Returns the gateway now
    running (the caller stops it) and what was checked."""
    from serve_process import Served, nats_store

    mgmt = f"http://127.0.0.1:{gw.ports['management_port']}"
    # The clients' exclusive queues go with their connections: the checks wait for those.
    deadline = time.monotonic() + 15
    while requests.get(f"{mgmt}/api/connections", auth=AUTH, timeout=TIMEOUT).json() and time.monotonic() < deadline:
        time.sleep(0.1)
    everything_answers(gw, problems)
    before = definitions(mgmt)
    if keep is not None:
        keep.write_text(json.dumps(before, indent=1))
    report: dict[str, Any] = {"objects": {k: len(v) for k, v in before.items() if isinstance(v, list)}}
    for kill in (False, True):
        what = "kill -9" if kill else "stop"
        try:
            gw = gw.restarted(kill=kill)
        except RuntimeError as e:
            problems.append(f"after a {what}: the gateway did not start again: {str(e)[-1500:]}")
            raise
        problems += [f"after a {what}: the log: {line[:300]}" for line in gw.start_problems()]
        mgmt = f"http://127.0.0.1:{gw.ports['management_port']}"
        problems += [f"after a {what}: definitions {d}"
                     for d in differences(before, definitions(mgmt), restart=True)]
        before_count = len(problems)
        everything_answers(gw, problems)
        problems[before_count:] = [f"after a {what}: {p}" for p in problems[before_count:]]
    with tempfile.TemporaryDirectory(prefix="fuzz-import-", ignore_cleanup_errors=True) as tmp, \
            nats_store("jetstream" if gw.store else None) as store:
        fresh = Served(Path(tmp) / "data", Path(tmp) / "gateway.log", store=store, config=config,
                       management_port=0, cmq_api_port=0)
        try:
            fresh_mgmt = f"http://127.0.0.1:{fresh.ports['management_port']}"
            resp = requests.post(f"{fresh_mgmt}/api/definitions", json=before, auth=AUTH, timeout=TIMEOUT)
            answer = resp.json() if resp.headers.get("content-type", "").startswith("application/json") else {}
            report["import"] = {"status": resp.status_code, "complete": answer.get("complete"),
                                "not_imported": answer.get("not_imported", [])[:5]}
            if resp.status_code >= 300 or answer.get("complete") is not True:
                problems.append(f"the export imported into a fresh gateway: {resp.status_code} {resp.text[:1000]}")
            problems += [f"exported again after its import: {d}" for d in differences(before, definitions(fresh_mgmt))]
            problems += [f"the fresh gateway's log: {line[:300]}" for line in fresh.start_problems()]
        finally:
            fresh.stop()
    return gw, report
