"""A consumer's acks arriving together (M12): the gateway takes a run of plain basic.ack
frames in one call (fastpath.ack_run, Session.on_acks), not one read-loop turn each. What
the client sees must be what RabbitMQ gives for the same bytes in one write: the acks before
an unknown tag settle, the channel closes with 406 on it, nothing after it counts, and the
unsettled deliveries come back redelivered.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlparse

import pytest
from pamqp import body, commands, frame, header

from tests.integration.raw_amqp import RawClient

pytestmark = [pytest.mark.rabbitmq, pytest.mark.both_stores]

MESSAGES = 40


def _scenario(url: str, queue: str, acks: list[tuple[int, bool]]) -> Any:
    c = RawClient(urlparse(url).port or 5672)
    try:
        c.sock.sendall(frame.marshal(commands.Queue.Declare(queue=queue), 1))
        c.expect(commands.Queue.DeclareOk)
        out = bytearray()
        for i in range(MESSAGES):
            data = str(i).encode()
            out += frame.marshal(commands.Basic.Publish(exchange="", routing_key=queue), 1)
            out += frame.marshal(header.ContentHeader(0, len(data), commands.Basic.Properties()), 1)
            out += frame.marshal(body.ContentBody(data), 1)
        out += frame.marshal(commands.Basic.Consume(queue=queue, consumer_tag="run"), 1)
        c.sock.sendall(out)
        c.expect(commands.Basic.ConsumeOk)
        delivered = []
        while len(delivered) < MESSAGES:
            tag = c.expect(commands.Basic.Deliver).delivery_tag
            c.expect(header.ContentHeader)
            delivered.append((tag, bytes(c.expect(body.ContentBody).value)))
        # Every ack in one write: one read of the server's takes them together.
        c.sock.sendall(b"".join(frame.marshal(commands.Basic.Ack(delivery_tag=t, multiple=m), 1) for t, m in acks)
                       + frame.marshal(commands.Basic.Qos(prefetch_count=0), 1))
        _, reply = c.read_frame()
        if isinstance(reply, commands.Channel.Close):
            answer = ("close", reply.reply_code, reply.class_id, reply.method_id)
            c.sock.sendall(frame.marshal(commands.Channel.CloseOk(), 1))
        else:
            assert isinstance(reply, commands.Basic.QosOk), reply
            answer = ("qos-ok",)
            c.sock.sendall(frame.marshal(commands.Channel.Close(reply_code=200, reply_text="bye", class_id=0, method_id=0), 1))
            c.expect(commands.Channel.CloseOk)
        c.sock.sendall(frame.marshal(commands.Channel.Open(), 2))
        c.expect(commands.Channel.OpenOk)
        left = []
        while True:
            c.sock.sendall(frame.marshal(commands.Basic.Get(queue=queue, no_ack=True), 2))
            _, got = c.read_frame()
            if isinstance(got, commands.Basic.GetEmpty):
                break
            assert isinstance(got, commands.Basic.GetOk), got
            redelivered = got.redelivered
            c.expect(header.ContentHeader)
            left.append((bytes(c.expect(body.ContentBody).value), redelivered))
        c.sock.sendall(frame.marshal(commands.Queue.Delete(queue=queue), 2))
        c.expect(commands.Queue.DeleteOk)
        return delivered, answer, sorted(left, key=lambda x: int(x[0]))
    finally:
        c.close()


CASES = {
    # an unknown tag in the middle of a run: 1 and 2 settle, 3 and 4 after it do not
    "unknown_tag_mid_run": [(1, False), (2, False), (99, False), (3, False), (4, False)],
    # longer than a run's limit (transport.ACK_RUN_MAX), every tag: nothing left
    "all_forty": [(t, False) for t in range(1, MESSAGES + 1)],
    # a multiple ack inside the run, then an ack of a tag it already settled
    "multiple_then_settled_tag": [(2, False), (1, False), (6, True), (7, False), (8, False), (5, False)],
    # an ack twice in a row
    "twice": [(t, False) for t in range(1, 11)] + [(10, False)] + [(t, False) for t in range(11, 20)],
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_M12_a_run_of_acks_in_one_read_settles_as_on_rabbitmq(rabbitmq_url, gateway_url, unique, case) -> None:
    acks = CASES[case]
    rabbit = _scenario(rabbitmq_url, unique, acks)
    assert rabbit[0] == [(t, str(t - 1).encode()) for t in range(1, MESSAGES + 1)]
    assert _scenario(gateway_url, unique, acks) == rabbit
