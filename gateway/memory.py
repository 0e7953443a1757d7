"""The memory the broker holds (W5), counted as it is taken and given back.

Process RSS is no measure of it: CPython keeps the memory freed objects used, so a queue
that drained left RSS where it was and the memory alarm never cleared. What the alarm
compares with ``memory_high_watermark`` instead is what the broker holds for its clients:

* messages: body + raw properties + a fixed estimate of the objects that carry one message
  through queues and topics (``MESSAGE_OVERHEAD``), added when the broker's ``Message`` is
  made and taken off when the last queue, topic or delivery lets go of it (``__del__``: a
  message routed to ten queues is one object, counted once);
* partial bodies: the body frames of contents still being assembled, per connection, as
  they arrive (a client that sends a huge content header and trickles its body is held
  memory long before it is a message);
* the store's map (journalled state: a persistent message in a durable queue is there once
  more, encoded), which the store keeps counted for compaction anyway (``live_bytes``);
* unsent output: the sockets' write buffers, summed by the server's tick;
* bytes received before login (SE5: an MQTT CONNECT, HTTP requests until handled), in
  ``partial`` with the partial bodies;
* retained MQTT messages (SE6): topic + payload + ``RETAINED_OVERHEAD`` each, as the
  RetainedStore keeps them in memory (the store may hold a large one on disk only).

The counters are process-wide, as the memory they stand for is: two gateways in one test
process add up, like their RSS would.
"""

from __future__ import annotations

__all__ = ["HELD", "MESSAGE_OVERHEAD", "RETAINED_OVERHEAD", "HeldMemory"]

# Bytes of Python objects per queued message besides its body and properties: the Message,
# the queue's message record, its ID and the index entries (tracemalloc: 690 bytes per
# one-byte transient message in a queue, 5x10^4 messages, CPython 3.12).
MESSAGE_OVERHEAD = 700
# A retained message's dict entry, tuple and key beside its topic and payload.
RETAINED_OVERHEAD = 200


class HeldMemory:
    """``messages``, ``partial`` and ``retained`` bytes held now; the server adds the write
    buffers."""

    __slots__ = ("messages", "partial", "retained")

    def __init__(self) -> None:
        self.messages = 0
        self.partial = 0
        self.retained = 0

    @property
    def total(self) -> int:
        return self.messages + self.partial + self.retained


HELD = HeldMemory()
