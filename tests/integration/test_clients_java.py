"""The RabbitMQ Java client, unchanged, against RabbitMQ and the gateway: the same outcomes.

tests/clients/java/Scenarios.java drives the client through its documented API (confirm and
return listeners, DefaultConsumer with prefetch, RpcClient over direct reply-to, dead-lettering,
x-overflow, alternate exchanges and exchange-to-exchange bindings, transactions, consumer
cancel notification, the reply codes of faults) and prints one line per scenario. It runs once
against RabbitMQ, whose lines are checked against known values (so the scenario itself is
right), and once against the gateway (on each store), whose lines must be the same.

The client is Debian's librabbitmq-client-java (scripts/test.sh installs it); Java 17 runs the
program as a single source file, so there is no build step.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from tests.integration.client_programs import assert_same_as_rabbitmq, run_program

pytestmark = [pytest.mark.rabbitmq, pytest.mark.both_stores]

ROOT = Path(__file__).resolve().parents[2]
PROGRAM = ROOT / "tests" / "clients" / "java" / "Scenarios.java"
JARS = ("/usr/share/java/amqp-client.jar", "/usr/share/java/slf4j-api.jar")

# What RabbitMQ answers (RabbitMQ 3.x on this machine); the gateway must answer the same.
EXPECTED = {
    "confirms_and_return": "returned=[312 NO_ROUTE {p}-confirm nowhere lost] count=50 next=52",
    "prefetch": "[1:0, 2:1] [1:0, 2:1, 3:2, 4:3]",
    "nack_reject": "[afalse, atrue left=2, bfalse, btrue, cfalse, null]",
    "counts_and_names": "declared=true purged=3 consumers=0 deleted=1 generated=true",
    "transactions": "afterRollback=0 beforeCommit=0 got=committed held=null back=committed redelivered=true",
    "cancel_on_delete": "tag=my-tag events=[cancel my-tag] channel open=true",
    "routing": "{direct.q0=[red], direct.q1=[blue], fanout.q0=[red, blue, green, 1.x.0, 1.2.3.0, 1.0, 1.x.1], "
               "topic.q0=[1.x.0], topic.q1=[1.x.0, 1.2.3.0, 1.0], topic.q2=[red, blue, green, 1.x.0, 1.2.3.0, 1.0, 1.x.1]}",
    "direct_reply_to": "re:one re:two",
    "dead_letter_and_ttl": "dead=[at once/expired, expires/expired] left=0",
    "max_length_reject_publish": "allAcked=false nacked=[3, 4] count=2",
    "alternate_and_exchange_bindings": "via e2e to ae after unbind",
    "big_message_and_recover": "same=true recovered=true redelivered=true",
    "exclusive_consumer": "second=channel 403 ACCESS_REFUSED same tag=connection 530 NOT_ALLOWED connection open=false",
    "faults": "{passive missing queue=channel 404 NOT_FOUND, passive missing exchange=channel 404 NOT_FOUND, "
              "publish to missing exchange=channel 404 NOT_FOUND, redeclare with other durable=channel 406 "
              "PRECONDITION_FAILED, redeclare with other arguments=channel 406 PRECONDITION_FAILED, redeclare "
              "exchange other type=channel 406 PRECONDITION_FAILED, consume missing queue=channel 404 NOT_FOUND, "
              "unknown delivery tag=channel 406 PRECONDITION_FAILED, exclusive elsewhere=channel 405 "
              "RESOURCE_LOCKED, bind missing exchange=channel 404 NOT_FOUND, declare amq. name=channel 403 "
              "ACCESS_REFUSED, delete default exchange=channel 403 ACCESS_REFUSED, unknown exchange "
              "type=connection 503 COMMAND_INVALID, connection open after=false}",
}
# Every header type of the Java client, and a message with no properties at all.
PROPERTIES = (
    "payload ct=application/json ce=gzip dm=2 pr=5 corr=corr-1 reply=replies exp=60000 id=my-id-1 "
    "ts=1700000000000 type=order.created user=guest app=tests cluster=c1 headers={bool=Boolean:true,"
    "byte=Byte:5,bytes=bytes:[0, -1],date=Date:1700000000000,dec=BigDecimal:3.14,double=Double:2.5,"
    "float=Float:1.5,int=Integer:7,list=[Integer:1,S:two,Boolean:false,],long=Long:1099511627776,none=null,"
    "short=Short:-3,str=S:text ü,table={a=Integer:1,},} | 0 ct=null ce=null dm=null pr=null corr=null "
    "reply=null exp=null id=null ts=null type=null user=null app=null cluster=null headers=null | empty"
)
EXPECTED["properties"] = PROPERTIES


def command() -> list[str]:
    java = shutil.which("java")
    missing = [j for j in JARS if not os.path.exists(j)]
    if java is None or missing:
        pytest.fail(f"the Java client tests need java and {missing or JARS} "
                    "(apt-get install librabbitmq-client-java; scripts/test.sh does)")
    return [java, "-cp", os.pathsep.join(JARS), str(PROGRAM)]


@pytest.fixture(scope="module")
def rabbitmq_lines(rabbitmq_url: str) -> tuple[str, dict[str, str]]:
    return run_program(command(), rabbitmq_url, list(EXPECTED))


def test_M16_W4_M13_M14_java_client_scenarios_answer_as_rabbitmq(rabbitmq_lines, gateway_url) -> None:
    """Each scenario's outcome on the gateway equals RabbitMQ's, which equals the known value
    (M13 nack/reject, M14 confirms, M16 reply codes, W4 prefetch, and the rest)."""
    assert_same_as_rabbitmq(EXPECTED, rabbitmq_lines, run_program(command(), gateway_url, list(EXPECTED)))
