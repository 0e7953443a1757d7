"""CMQ's answer codes (CA1): ``code`` and ``message`` as CMQ's HTTP API returns them.

CMQ answers every request with HTTP 200 and a JSON body whose ``code`` is 0 or an error code;
``message`` starts with the module code in parentheses, e.g. ``"(10430)action name CreateTopic
is not existed"``. The codes below come from CMQ's public API pages (Tencent Cloud API 406:
the common error table and each action's own table) and the list in Tencent's Python SDK
(``CMQServerException``: 4400 too large, 4410 queue full, 4430 bad handle, 4460 exists, 7000
empty); where neither gives a module code, the message has none.
"""

from __future__ import annotations

from semantics.errors import ACCESS_REFUSED, NOT_FOUND, CMQError

__all__ = ["CmqApiError", "from_cmq_error"]

# The common codes (API 406/5903) and the per-action ones used here.
PARAM = 4000  # 10000 invalid parameters, 10110 parameter error, 10350 out of range, ...
AUTH = 4100  # authentication failed: secretId, signature, timestamp, nonce
DENIED = 4101  # the key's user may not do this in this vhost (its permissions)
TOO_LARGE = 4400  # the message is larger than the queue's (or topic's) maxMsgSize (L6)
QUEUE_FULL = 4410  # the queue retains maxMsgHeapNum messages already (L8)
INVALID_HANDLE = 4430  # DeleteMessage: "invalid receiptHandle" (stale or unknown)
NOT_EXIST = 4440  # the queue (or topic, or subscription) does not exist
TOPIC_EXISTS = 4460  # 10550 topic is already existed (CreateTopic's table)
QUEUE_EXISTS = 4460  # CreateQueue on an existing name (the SDK's list)
SUBSCRIPTION_EXISTS = 4490  # 10470 subscribtion is already existed (Subscribe's table)
SUBSCRIPTIONS_FULL = 4500  # 10480 number of subscription has reached the limit
BATCH_DELETE_PARTIAL = 6010  # BatchDeleteMessage: some handles failed (errorList)
BATCH_DELETE_FAILED = 6020  # BatchDeleteMessage: every handle failed
NO_MESSAGE = 7000  # ReceiveMessage: nothing to receive, after the long poll if any
INTERNAL = 6000  # server internal error (CMQ's common table): a fault of the gateway, retry


class CmqApiError(Exception):
    """One refusal: the ``code`` and ``message`` of CMQ's answer."""

    def __init__(self, code: int, message: str, module: int | None = None, **extra: object) -> None:
        self.code = code
        self.message = f"({module}){message}" if module is not None else message
        super().__init__(self.message)
        self.extra = extra

    @classmethod
    def param(cls, message: str, module: int = 10110) -> CmqApiError:
        return cls(PARAM, message, module)

    @classmethod
    def missing(cls, name: str) -> CmqApiError:
        return cls(PARAM, f"lacked of required parameter {name}", 10390)

    @classmethod
    def out_of_range(cls, name: str, detail: str = "") -> CmqApiError:
        return cls(PARAM, f"parameter {name} value or length is out of range" + (f": {detail}" if detail else ""),
                   10350)

    @classmethod
    def batch_size(cls, name: str, limit: int) -> CmqApiError:
        return cls(PARAM, f"{name} parameter batch size is out of range (at most {limit})", 10370)

    @classmethod
    def queue_not_exist(cls, name: str) -> CmqApiError:
        return cls(NOT_EXIST, f"queue is not existed: {name}")

    @classmethod
    def topic_not_exist(cls, name: str) -> CmqApiError:
        return cls(NOT_EXIST, f"topic is not existed: {name}")

    @classmethod
    def subscription_not_exist(cls, topic: str, name: str) -> CmqApiError:
        return cls(NOT_EXIST, f"subscription is not existed: {name} (topic {topic})")

    def answer(self, request_id: str) -> dict[str, object]:
        return {"code": self.code, "message": self.message, "requestId": request_id, **self.extra}


def from_cmq_error(e: CMQError) -> CmqApiError:
    """A refusal of the mapping or the CMQ model, as the CMQ API words it: the AMQP reply
    code picks the CMQ code, the text (which names the SPEC rule) is the message."""
    text = f"{e.text} (CMQ rule {e.rule})"
    if e.reply_code == NOT_FOUND:
        return CmqApiError(NOT_EXIST, text)
    if e.reply_code == ACCESS_REFUSED:
        return CmqApiError(DENIED, text)
    return CmqApiError(PARAM, text, 10350)
