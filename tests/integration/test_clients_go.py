"""RabbitMQ's Go client (amqp091-go, as Debian packages it), unchanged, against RabbitMQ and
the gateway: the same outcomes.

tests/clients/go/scenarios.go drives the client's documented API (NotifyPublish and
NotifyReturn, Qos and Consume, NotifyCancel, direct reply-to, dead-lettering, x-overflow nacks,
alternate exchanges and exchange-to-exchange bindings, every header type the client writes, the
reply codes of faults) and prints one line per scenario (tests/integration/client_programs.py
compares them). It is built once per run with Debian's Go against Debian's package of the
client (GOPATH mode, nothing fetched); scripts/test.sh installs both.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.client_programs import FAULTS, assert_same_as_rabbitmq, run_program

pytestmark = [pytest.mark.rabbitmq, pytest.mark.both_stores]

SOURCE = Path(__file__).resolve().parents[1] / "clients" / "go" / "scenarios.go"
GOPATH = "/usr/share/gocode"  # Debian's Go packages: golang-github-rabbitmq-amqp091-go-dev

# What RabbitMQ answers; the gateway must answer the same.
EXPECTED = {
    "properties": (
        "payload ct=application/json ce=gzip dm=2 pr=5 corr=corr-1 reply=replies exp=60000 id=my-id-1 "
        "ts=1700000000 type=order.created user=guest app=tests headers={bool=bool:true,bytes=[]uint8:[0 255],"
        "dec=amqp091.Decimal:{2 314},float32=float32:1.5,float64=float64:2.5,int16=int16:-3,int32=int32:7,"
        "int64=int64:1099511627776,list=[int32:1,string:two,bool:false],nil=nil,str=string:text ü,"
        "table={a=int32:1},time=time:1700000000} | 0 ct= ce= dm=0 pr=0 corr= reply= exp= id= "
        "ts=-62135596800 type= user= app= headers={} | more=false"),
    "confirms_and_return": "returned=312 NO_ROUTE {p}-confirmsandreturn nowhere lost acked=51 count=50",
    "prefetch": "1:0,2:1 1:0,2:1,3:2,4:3",
    "nack_reject": "afalse,atrue left=2,bfalse,btrue,cfalse,false",
    "faults": ", ".join(f"{k}={v}" for k, v in FAULTS.items()) + ", "
              + "unknown exchange type=503 COMMAND_INVALID, connection closed with=503 COMMAND_INVALID",
    "cancel_on_delete": "cancelled=my-tag deliveries open=false channel=accepted",
    "direct_reply_to": "1:re:one 2:re:two",
    "dead_letter_and_ttl": "dead=at once/expired,expires/expired left=0",
    "max_length_reject_publish": "1:true,2:true,3:false,4:false count=2",
    "alternate_and_exchange_bindings": "via e2e to ae after unbind",
}


@pytest.fixture(scope="module")
def program(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[str]]:
    go = shutil.which("go")
    if go is None or not os.path.isdir(f"{GOPATH}/src/github.com/rabbitmq/amqp091-go"):
        pytest.fail("the Go client tests need go and Debian's amqp091-go "
                    "(apt-get install golang-go golang-github-rabbitmq-amqp091-go-dev; scripts/test.sh does)")
    where = tmp_path_factory.mktemp("go-scenarios")
    env = {**os.environ, "GO111MODULE": "off", "GOPATH": GOPATH, "GOCACHE": str(where / "cache"),
           "GOFLAGS": ""}
    done = subprocess.run([go, "build", "-o", str(where / "scenarios"), str(SOURCE)], env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    yield [str(where / "scenarios")]


@pytest.fixture(scope="module")
def rabbitmq_lines(program: list[str], rabbitmq_url: str) -> tuple[str, dict[str, str]]:
    return run_program(program, rabbitmq_url, list(EXPECTED))


def test_M16_W4_M13_M14_go_client_scenarios_answer_as_rabbitmq(program, rabbitmq_lines, gateway_url) -> None:
    """Each scenario's outcome on the gateway equals RabbitMQ's, which equals the known value
    (M13 nack/reject, M14 confirms, M16 reply codes, W4 prefetch, and the rest)."""
    assert_same_as_rabbitmq(EXPECTED, rabbitmq_lines, run_program(program, gateway_url, list(EXPECTED)))
