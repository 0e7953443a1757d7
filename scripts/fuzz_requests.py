"""Well-formed HTTP requests with hostile contents, for scripts/fuzz_http.py's ``--requests``:
never an HTTP 500, never a traceback (SE5; CA1-CA3 answer CMQ codes).

Three kinds, in turn:

* ``body``: a PUT or POST route of the management API (every one authz.RULES lists) with a
  random JSON body: objects with the routes' own keys holding wrong types, huge and negative
  numbers, NaN, NUL, deep nesting; non-objects, truncated JSON, bytes that are not UTF-8;
* ``query``: a GET route with a random query string (pagination, columns, sort, rates,
  regexes that do not compile, repeated and empty keys);
* ``cmq``: a signed CMQ API action (every one, and unknown ones) with random parameters, each
  holding one of the HOSTILE values (or a list of them as ``name.n``), and now and then a
  request badly signed, unsigned, or sent by GET.

Path parameters and CMQ names come from a small pool, mostly of things that exist (a queue,
an exchange, a CMQ queue and topic made first), so that requests reach the handlers. Nothing
names the user the canary logs in as, nor the default vhost in a DELETE. At the end every
list and view of the management API must still answer the administrator 200.
"""

from __future__ import annotations

import json
import math
import random
import sys
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


def json_body(r: random.Random) -> bytes:
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
        if kind == "body":
            method, pattern = r.choice(bodies)
            path = _path(r, pattern)
            data = json_body(r)
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
    bodies = sorted(k for k in RULES if k[0] in ("PUT", "POST"))
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
    lists_answer(mgmt, out)
    return out


def lists_answer(mgmt: str, out: Requests) -> None:
    """After the fuzz, every list and view the administrator has still answers 200: no object
    a hostile request made may break them (a queue name of 300 bytes once made every queue
    list a 400 for as long as it lived). Each that does not counts as an internal error."""
    paths = sorted(p.replace("{vhost}", "%2F") for m, p in RULES if m == "GET" and not p.startswith("/api/health")
                   and p.replace("{vhost}", "", 1).count("{") == 0)
    with requests.Session() as s:
        for path in paths:
            resp = s.get(mgmt + path, auth=AUTH, timeout=TIMEOUT)
            if resp.status_code != 200:
                out.server_errors.append(f"after the fuzz: GET {path} {resp.status_code} -> {resp.text[:300]}")
