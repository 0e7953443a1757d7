"""amqplib (Node.js), unchanged, against RabbitMQ and the gateway: the same outcomes.

tests/clients/node/scenarios.js drives amqplib's promise API (confirm channels with
per-message callbacks, prefetch, consume with cancel notification, direct reply-to,
dead-lettering, x-overflow nacks, alternate exchanges and exchange-to-exchange bindings, every
header type amqplib writes, the reply codes of faults) and prints one line per scenario
(tests/integration/client_programs.py compares them). amqplib's version is pinned in
tests/clients/node/package-lock.json; scripts/test.sh installs it with ``npm ci``.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.integration.client_programs import FAULTS, assert_same_as_rabbitmq, run_program

pytestmark = [pytest.mark.rabbitmq, pytest.mark.both_stores]

HERE = Path(__file__).resolve().parents[1] / "clients" / "node"

# What RabbitMQ answers; the gateway must answer the same.
EXPECTED = {
    "properties": (
        "payload ct=application/json ce=gzip dm=2 pr=5 corr=corr-1 reply=replies exp=60000 id=my-id-1 "
        "ts=1700000000 type=order.created user=guest app=tests cluster=undefined headers={big=number:1099511627776,"
        "bytes=buf:00ff,dec={!=string:decimal,value={digits=number:314,places=number:2}},false=boolean:false,"
        "float=number:2.5,int=number:7,list=[number:1,string:two,boolean:false],neg=number:-3,none=null,"
        "str=string:text ü,table={a=number:1,b=[string:x,number:2]},true=boolean:true,"
        "when={!=string:timestamp,value=number:1700000000}} | 0 ct=undefined ce=undefined dm=undefined "
        "pr=undefined corr=undefined reply=undefined exp=undefined id=undefined ts=undefined type=undefined "
        "user=undefined app=undefined cluster=undefined headers=none | false"),
    "confirms_and_return": "returned=312 NO_ROUTE {p}-confirmsandreturn nowhere lost acked=50 count=50",
    "prefetch": "1:0,2:1 1:0,2:1,3:2,4:3",
    "nack_reject": "afalse,atrue left=2,bfalse,btrue,cfalse,false",
    "faults": ", ".join(f"{k}={v}" for k, v in FAULTS.items()) + ", "
              # amqplib rejects the pending declare without the reason; the close carries it.
              + "unknown exchange type=unexpected Error: Channel ended, no reply will be forthcoming, "
                "connection closed with=503 COMMAND_INVALID",
    "counts_and_names": "declared=true purged=3 consumers=0 deleted=1 generated=true",
    "cancel_on_delete": "tag=my-tag events=cancelled channel open=true",
    "direct_reply_to": "1:re:one 2:re:two",
    "dead_letter_and_ttl": "dead=at once/expired,expires/expired left=0",
    "max_length_reject_publish": "some nacked 0:ack,1:ack,2:nack,3:nack count=2",
    "alternate_and_exchange_bindings": "via e2e to ae after unbind",
    "big_message_and_recover": "same=true recovered=true redelivered=true",
}


def command() -> list[str]:
    node = shutil.which("node")
    if node is None or not (HERE / "node_modules" / "amqplib").is_dir():
        pytest.fail("the amqplib tests need node and amqplib in tests/clients/node/node_modules "
                    "(npm ci --prefix tests/clients/node; scripts/test.sh does)")
    return [node, str(HERE / "scenarios.js")]


@pytest.fixture(scope="module")
def rabbitmq_lines(rabbitmq_url: str) -> tuple[str, dict[str, str]]:
    return run_program(command(), rabbitmq_url, list(EXPECTED))


def test_M16_W4_M13_M14_amqplib_scenarios_answer_as_rabbitmq(rabbitmq_lines, gateway_url) -> None:
    """Each scenario's outcome on the gateway equals RabbitMQ's, which equals the known value
    (M13 nack/reject, M14 confirms, M16 reply codes, W4 prefetch, and the rest)."""
    assert_same_as_rabbitmq(EXPECTED, rabbitmq_lines, run_program(command(), gateway_url, list(EXPECTED)))
