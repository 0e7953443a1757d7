"""scripts/fuzz_sessions.py, small: random AMQP sessions never get 541, never kill the gateway,
never leave a traceback, and a well-behaved client works after each; and what the fuzzer found."""

from __future__ import annotations

import re
import socket
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest
from pamqp import commands, frame, header

from tests.integration.cmq_gateway import STORES

# Issue 14: these also run on the gateway on NATS JetStream (tests/conftest.py).
pytestmark = pytest.mark.both_stores

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("store", STORES)
def test_M16_fuzzed_sessions_never_541_nor_crash(tmp_path: Path, store: str) -> None:
    """And what the sessions left behind breaks nothing later (the script's after phase): a
    stop and a kill -9 keep every durable object, the export is imported whole by a fresh
    gateway, and every list (management, CMQ API, AMQP passive declares) answers."""
    # A nats-server of the run's own: the after phase's restarts and exports see only what
    # this fuzz made, not the objects other tests' gateways leave on the session's server.
    nats = ["--nats", "jetstream"] if store == "jetstream" else []
    done = subprocess.run([sys.executable, "scripts/fuzz_sessions.py", "--sessions", "20", "--seed", "7",
                           "--keep", str(tmp_path / "failed"), *nats], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert re.search(r"^sessions 20,", done.stdout, re.M), done.stdout
    assert "541: 0, failed sessions: 0, tracebacks in the gateway log: 0, crashes: 0" in done.stdout
    assert re.search(r"^after problems: 0$", done.stdout, re.M), done.stdout
    assert "'complete': True" in done.stdout, done.stdout
    # The sessions reached the broker's checks, not only the frame decoder.
    closes = re.search(r"^closes by code: (.*)$", done.stdout, re.M)
    assert closes is not None and "connection 501" in closes.group(1), done.stdout


def _open_with_vhost(port: int, vhost: bytes) -> tuple[int, str]:
    """Handshake as guest, then connection.open with a raw ``vhost`` short string; the
    connection.close that answers it."""
    so = frame.marshal(commands.Connection.StartOk(client_properties={}, response="\0guest\0guest"), 0)
    to = frame.marshal(commands.Connection.TuneOk(channel_max=10, frame_max=131072, heartbeat=0), 0)
    args = bytes([len(vhost)]) + vhost + b"\x00\x00"  # vhost, capabilities "", insist 0
    op = struct.pack(">BHIHH", 1, 0, 4 + len(args), 10, 40) + args + b"\xce"
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(frame.marshal(header.ProtocolHeader(), 0) + so + to + op)
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
            while len(data) >= 8 and len(data) >= struct.unpack_from(">I", data, 3)[0] + 8:
                n, _, value = frame.unmarshal(data)
                data = data[n:]
                if isinstance(value, commands.Connection.Close):
                    return value.reply_code, value.reply_text
    raise AssertionError("the connection ended without connection.close")


@pytest.mark.rabbitmq
def test_M16_a_reply_text_over_255_bytes_is_cut_as_rabbitmq_cuts_it(rabbitmq_url: str, tmp_path: Path) -> None:
    """Found by the fuzzer: a refusal quoting a 255-byte vhost (or mechanism) name made a
    connection.close too long to encode; the gateway logged a traceback and reset the socket.
    RabbitMQ cuts the text to 252 bytes and "..." (rabbit_binary_generator)."""
    from tests.integration.test_process import serve

    vhost = b"v" * 255
    with serve(tmp_path, "--management-port", "off", "--metrics-port", "off") as (_proc, port):
        gateway = _open_with_vhost(port, vhost)
    rabbit = _open_with_vhost(5672, vhost)
    assert rabbit[0] == gateway[0] == 530
    for _code, text in (rabbit, gateway):
        assert len(text.encode()) == 255 and text.endswith("v..."), text


@pytest.mark.rabbitmq
def test_M16_durable_declares_keep_decimal_and_byte_array_arguments(rabbitmq_url: str, tmp_path: Path,
                                                                    unique: str) -> None:
    """Found by the fuzzer: a durable queue.declare whose arguments held a decimal (or a byte
    array) answered 541, for the store's JSON could not hold it. RabbitMQ takes any value
    for an argument it does not know; so does the gateway, and the declarations survive a
    restart (the store keeps a decimal as a number and bytes as text, as it kept bytes before)."""
    from decimal import Decimal

    import pika

    from tests.integration.differential import blocking
    from tests.integration.test_process import serve

    args = {"x-fz-decimal": Decimal("1.5"), "x-fz-bytes": b"\x00\xff"}
    with blocking(rabbitmq_url) as conn:
        ch = conn.channel()
        ch.queue_declare(f"{unique}-q", durable=True, arguments=args)
        ch.queue_delete(f"{unique}-q")
    for _ in range(2):  # declared, then found again after a restart
        with serve(tmp_path, "--management-port", "off", "--metrics-port", "off") as (_proc, port), \
                blocking(f"amqp://guest:guest@127.0.0.1:{port}/%2F") as conn:
            ch = conn.channel()
            ch.exchange_declare(f"{unique}-x", "headers", durable=True, arguments=args)
            ch.queue_declare(f"{unique}-q", durable=True, arguments=args)
            ch.queue_bind(f"{unique}-q", f"{unique}-x", arguments={"x-match": "any", **args})
            ch.basic_publish(f"{unique}-x", "", b"m", pika.BasicProperties(headers={"x-other": 1}))
            assert ch.queue_declare(f"{unique}-q", passive=True).method.queue == f"{unique}-q"
            ch.exchange_declare(f"{unique}-x", passive=True)


@pytest.mark.rabbitmq
@pytest.mark.parametrize("name", ["*.b", "é", "队列", "a!b$c"])
def test_M16_names_outside_pamqps_pattern_are_answered_as_rabbitmq_answers(broker_url: str, unique: str,
                                                                             name: str) -> None:
    """Found by the fuzzer: queue.declare-ok, basic.get-ok and basic.return were built with
    pamqp's own name check ([a-zA-Z0-9-_.:@#,/+ ]), so a queue or exchange named "*.b" or in
    Chinese, which RabbitMQ takes, got 541 INTERNAL_ERROR on its declare, get or return."""
    import pika

    from tests.integration.differential import blocking, pump

    got: list[object] = []
    with blocking(broker_url) as conn:
        ch = conn.channel()
        queue, exchange = f"{unique}{name}q", f"{unique}{name}x"
        got.append(ch.queue_declare(queue, exclusive=True).method.queue == queue)
        ch.exchange_declare(exchange, "direct", auto_delete=True)
        ch.queue_bind(queue, exchange, "k")
        returned: list[str] = []
        ch.add_on_return_callback(lambda _c, method, _p, _b: returned.append(method.exchange))
        ch.basic_publish(exchange, "nowhere", b"r", mandatory=True)
        pump(conn, lambda: bool(returned))
        got.append(returned == [exchange])
        ch.basic_publish(exchange, "k", b"m", pika.BasicProperties())
        method, _props, body = ch.basic_get(queue, auto_ack=True)
        got.append((method.exchange == exchange, body))
    assert got == [True, True, (True, b"m")]


@pytest.mark.rabbitmq
def test_M16_deleting_an_auto_delete_exchange_that_has_bindings(broker_url: str, unique: str) -> None:
    """Found by the fuzzer: exchange.delete dropped the exchange's last binding, which
    auto-deleted the exchange under it, and then could not find it: 541. RabbitMQ deletes it."""
    from tests.integration.differential import blocking

    with blocking(broker_url) as conn:
        ch = conn.channel()
        ch.exchange_declare(f"{unique}-x", "direct", auto_delete=True)
        ch.queue_declare(f"{unique}-q", exclusive=True)
        ch.queue_bind(f"{unique}-q", f"{unique}-x", "k")
        ch.exchange_delete(f"{unique}-x")
        import pika.exceptions

        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as gone:
            ch.exchange_declare(f"{unique}-x", passive=True)
    assert gone.value.reply_code == 404


def _closes_after(port: int, *frames: bytes) -> list[int]:
    """Handshake as guest, send ``frames`` one by one, each once the one before had time to
    be answered (RabbitMQ answers a frame error found in the same read first); the reply
    codes of every connection.close that comes back before the socket ends."""
    so = frame.marshal(commands.Connection.StartOk(client_properties={}, response="\0guest\0guest"), 0)
    to = frame.marshal(commands.Connection.TuneOk(channel_max=10, frame_max=131072, heartbeat=0), 0)
    op = frame.marshal(commands.Connection.Open(virtual_host="/"), 0)
    codes = []
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(frame.marshal(header.ProtocolHeader(), 0) + so + to + op)
        for f in frames:
            time.sleep(0.3)
            sock.sendall(f)
        data = b""
        try:
            while chunk := sock.recv(65536):
                data += chunk
        except (TimeoutError, ConnectionResetError):
            pass  # RabbitMQ waits for close-ok; the timeout ends the wait
    while len(data) >= 8:
        n, _, value = frame.unmarshal(data)
        data = data[n:]
        if isinstance(value, commands.Connection.Close):
            codes.append(value.reply_code)
    return codes


@pytest.mark.rabbitmq
def test_M16_a_framing_error_after_connection_close_gets_no_second_close(rabbitmq_url: str,
                                                                          tmp_path: Path) -> None:
    """Found by the fuzzer: a connection already closing (504 here) answered a later frame
    with a bad frame end with a second connection.close (501). RabbitMQ sends one; AMQP
    allows nothing after connection.close but close-ok."""
    from tests.integration.test_process import serve

    qos_on_closed_channel = frame.marshal(commands.Basic.Qos(), 5)
    bad_end = frame.marshal(commands.Basic.Qos(), 1)[:-1] + b"\x00"
    with serve(tmp_path, "--management-port", "off", "--metrics-port", "off") as (_proc, port):
        gateway = _closes_after(port, qos_on_closed_channel, bad_end)
    assert _closes_after(5672, qos_on_closed_channel, bad_end) == gateway == [504]
