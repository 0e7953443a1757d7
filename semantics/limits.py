"""The numbers of SPEC "Names and limits" (L1-L8) and the topic lifecycle (D3).

Kept in one place so that the model, the gateway's error texts and the README agree.
Validators live next to the code that owns each concept (names.py, matching.py,
queue_attrs.py); they raise :class:`semantics.errors.LimitError` with these numbers.
"""

from __future__ import annotations

# L1: CMQ topic and queue names.
NAME_MIN_BYTES = 3
NAME_MAX_BYTES = 64

# L2: AMQP names as clients give them.
AMQP_NAME_MAX_BYTES = 255

# L3: filter tags, per message and per subscription.
MAX_TAGS = 5
MAX_TAG_CHARS = 16

# L4: routing and binding keys.
MAX_KEY_BYTES = 64
MAX_KEY_DOTS = 15
MAX_BINDING_KEYS = 5

# L5: subscriptions per topic.
MAX_SUBSCRIPTIONS = 500

# L6: message sizes.
TOPIC_MAX_MSG_SIZE_MIN = 1024
TOPIC_MAX_MSG_SIZE_MAX = 1024 * 1024
TOPIC_MAX_MSG_SIZE_DEFAULT = 64 * 1024
QUEUE_MAX_MSG_SIZE_MIN = 1024
QUEUE_MAX_MSG_SIZE_MAX = 65536
QUEUE_MAX_MSG_SIZE_DEFAULT = 65536

# L7: retention and the topic lifecycle (D3).
QUEUE_RETENTION_MIN = 60
QUEUE_RETENTION_MAX = 1_296_000
QUEUE_RETENTION_DEFAULT = 345_600
TOPIC_LIFECYCLE_SECONDS = 86_400

# L8: queue attributes.
VISIBILITY_TIMEOUT_MIN = 1
VISIBILITY_TIMEOUT_MAX = 43_200
VISIBILITY_TIMEOUT_DEFAULT = 30
POLLING_WAIT_MIN = 0
POLLING_WAIT_MAX = 30
DELAY_SECONDS_MIN = 0
DELAY_SECONDS_MAX = 3_600
REWIND_SECONDS_MIN = 0
REWIND_SECONDS_MAX = 1_296_000
MAX_INFLIGHT_DELAYED = 20_000
# CMQ's console allows 1e6..1e8 retained messages per queue; the gateway makes it configurable.
MAX_MSG_HEAP_NUM_DEFAULT = 100_000_000
MAX_MSG_HEAP_NUM_MIN = 1

# Q8: dead-letter policy.
MAX_RECEIVE_COUNT_MIN = 1
MAX_RECEIVE_COUNT_MAX = 1_000
MAX_TIME_TO_LIVE_MIN = 300
MAX_TIME_TO_LIVE_MAX = 43_200

# D5 / D6: retry policies.
BACKOFF_MAX_RETRIES = 3
BACKOFF_WAIT_MIN = 10
BACKOFF_WAIT_MAX = 20
EXP_DECAY_RETRIES = 176
EXP_DECAY_CAP_SECONDS = 512

__all__ = [_name for _name in dir() if _name.isupper()]
