"""The one-header fast paths of gateway.jetstream.wire read and write what the general paths do.

A queue message carries its ``Nats-Msg-Id`` alone (CL3: the key JetStream stores it once
under, and the id the gateway leases it by, M11), so parse_headers and hpub take that shape
without their line loops (issue 28, CPU per message); any other shape goes the general way.
"""

from __future__ import annotations

import pytest

from gateway.jetstream.wire import hpub, parse_headers


def _general(raw: bytes) -> dict[str, str]:
    """parse_headers' general rule, written out: the status line, then ``Key: value`` lines."""
    lines = raw.split(b"\r\n")
    hdr: dict[str, str] = {}
    if len(lines[0]) > 9:
        status, _, desc = lines[0][9:].partition(b" ")
        if status.isdigit():
            hdr["Status"] = status.decode()
        if desc:
            hdr["Description"] = desc.decode()
    for line in lines[1:]:
        key, sep, value = line.partition(b":")
        if line and sep:
            hdr[key.decode().strip()] = value.decode().strip()
    return hdr


@pytest.mark.parametrize("raw", [
    b"NATS/1.0\r\nNats-Msg-Id: 8f3c2a1b9d7e\r\n\r\n",
    b"NATS/1.0\r\nNats-Msg-Id:   spaced  \r\n\r\n",
    b"NATS/1.0\r\nNats-Msg-Id: a:b:c\r\n\r\n",  # a colon in the value
    b"NATS/1.0\r\nno separator\r\n\r\n",
    b"NATS/1.0\r\n\r\n\r\n",
    b"NATS/1.0\r\nA: 1\r\nB: 2\r\n\r\n",
    b"NATS/1.0 404 No Messages\r\n\r\n",
    b"NATS/1.0 408 Request Timeout\r\nNats-Pending-Messages: 3\r\n\r\n",
    b"NATS/1.0 100 Idle Heartbeat\r\n\r\n",
])
def test_CL3_M11_one_header_read_as_the_general_rule_reads_it(raw: bytes) -> None:
    assert parse_headers(raw) == _general(raw)


def test_CL3_one_header_written_as_several_are() -> None:
    one = hpub("CMQ.q", "_I.7", {"Nats-Msg-Id": "m-1"}, b"body")[0]
    two = hpub("CMQ.q", "_I.7", {"Nats-Msg-Id": "m-1", "Cmq-Expires-At": "9.5"}, b"body")[0]
    assert one == b"HPUB CMQ.q _I.7 30 34\r\nNATS/1.0\r\nNats-Msg-Id: m-1\r\n\r\nbody\r\n"
    assert two == (b"HPUB CMQ.q _I.7 51 55\r\nNATS/1.0\r\nNats-Msg-Id: m-1\r\nCmq-Expires-At: 9.5\r\n\r\n"
                   b"body\r\n")
