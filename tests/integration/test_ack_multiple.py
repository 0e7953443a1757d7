"""basic.ack with ``multiple`` (M12) against RabbitMQ and the gateway: the same deliveries
are settled and the same ones come back.

Channel.take_tagged settles a multiple ack in one pass (it stops at the first tag past the
one acked, and takes the whole window at once when the tag is the last one): these pin that
to RabbitMQ's outcome, with gaps that single acks left in the window.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.integration.differential import blocking, pump

pytestmark = [pytest.mark.rabbitmq, pytest.mark.both_stores]


def _consume_ten(conn: Any, ch: Any, name: str) -> list[tuple[int, bytes]]:
    ch.queue_declare(name)
    for i in range(10):
        ch.basic_publish("", name, str(i).encode())
    got: list[tuple[int, bytes]] = []
    ch.basic_consume(name, lambda c, m, p, b: got.append((m.delivery_tag, b)))
    pump(conn, lambda: len(got) >= 10)
    return got


def _left_over(conn: Any, name: str) -> list[tuple[bytes, bool]]:
    ch2 = conn.channel()
    back = []
    while True:
        method, _, body = ch2.basic_get(name, auto_ack=True)
        if method is None:
            break
        back.append((body, method.redelivered))
    ch2.queue_delete(name)
    return back


def test_M12_multiple_ack_with_gaps_settles_the_same_deliveries(rabbitmq_url, gateway_url, unique) -> None:
    """On JetStream this also pins the requeue of a closing channel: the first delivery naked
    after the consumer's pull requests were withdrawn came back only after the visibility
    timeout (nats-server 2.9; gateway.jetstream.pulls.Pulls._forget_requests)."""
    def scenario(url: str, name: str) -> Any:
        with blocking(url) as conn:
            ch = conn.channel()
            got = _consume_ten(conn, ch, name)
            ch.basic_ack(3)                   # a gap before the multiple ack's tag
            ch.basic_ack(6, multiple=True)    # 1, 2, 4, 5, 6: stops before 7
            ch.basic_ack(8)                   # a gap after it
            ch.close()                        # 7, 9 and 10 are requeued
            return got, _left_over(conn, name)

    rabbit = scenario(rabbitmq_url, unique)
    assert rabbit == ([(t, str(t - 1).encode()) for t in range(1, 11)],
                      [(b"6", True), (b"8", True), (b"9", True)])
    assert scenario(gateway_url, unique) == rabbit


def test_M12_multiple_ack_of_the_last_tag_and_of_tag_zero_settle_everything(rabbitmq_url, gateway_url,
                                                                             unique) -> None:
    def scenario(url: str, name: str) -> Any:
        with blocking(url) as conn:
            ch = conn.channel()
            _consume_ten(conn, ch, name)
            ch.basic_ack(2)
            ch.basic_ack(10, multiple=True)   # the last tag: the whole window, gap and all
            after_last = ch.queue_declare(name, passive=True).method.message_count
            ch.close()
            first = _left_over(conn, name)
            ch = conn.channel()
            _consume_ten(conn, ch, name)
            ch.basic_ack(5)
            ch.basic_ack(0, multiple=True)    # tag 0 with multiple: everything outstanding
            ch.close()
            return after_last, first, _left_over(conn, name)

    rabbit = scenario(rabbitmq_url, unique)
    assert rabbit == (0, [], [])
    assert scenario(gateway_url, unique) == rabbit


def test_M12_multiple_acks_of_the_oldest_tag_in_order_and_after_a_rollback(rabbitmq_url, gateway_url,
                                                                           unique) -> None:
    """A client acking in order with multiple=true names the oldest outstanding tag each time
    (Channel.take_tagged finds it from ``low_tag`` by lookups, not by walking the window):
    after single acks left gaps below it, and after tx.rollback gave back acked tags below
    the one last found (``low_tag`` starts over), the same deliveries settle as on RabbitMQ."""
    def scenario(url: str, name: str) -> Any:
        with blocking(url) as conn:
            ch = conn.channel()
            _consume_ten(conn, ch, name)
            ch.basic_ack(1, multiple=True)    # the oldest
            ch.basic_ack(2, multiple=True)
            ch.basic_ack(4)                   # a gap above the next oldest
            ch.basic_ack(3, multiple=True)
            ch.basic_ack(5, multiple=True)    # 4 went before: 5 is the oldest
            ch.tx_select()
            ch.basic_ack(6, multiple=True)    # in the transaction, each the oldest in turn
            ch.basic_ack(7, multiple=True)
            ch.tx_rollback()                  # 6 and 7 outstanding again
            ch.basic_ack(7, multiple=True)    # 6 and 7: 6 is below the oldest last found
            ch.tx_commit()
            ch.close()                        # 8 to 10 are requeued
            return _left_over(conn, name)

    rabbit = scenario(rabbitmq_url, unique)
    assert rabbit == [(b"7", True), (b"8", True), (b"9", True)]
    assert scenario(gateway_url, unique) == rabbit
