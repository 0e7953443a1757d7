"""Acks and naks go to JetStream as the PUB commands ``wire.pub`` makes, whichever way
``wire.pubs`` builds them (issue 28: an ack's command concatenated, not formatted): M12/M13
(an ack or nak that reaches the server is the one the broker settled) and the commands nats-py
publishes instead while the connection is down (the tuple's other fields)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.jetstream.wire import pub, pubs

_subject = st.text(alphabet=st.characters(blacklist_categories=("Cs", "Zs", "Cc")), min_size=1, max_size=80)
_payload = st.one_of(st.sampled_from([b"+ACK", b"-NAK", b"+TERM", b"+WPI", b"+ACK ", b" +ACK", b"+ack", b"",
                                      b'-NAK {"delay": 1000000000}']), st.binary(max_size=40))


@settings(max_examples=500, deadline=None)
@given(st.lists(st.tuples(_subject, _payload), max_size=8))
def test_M12_acks_and_naks_are_the_commands_pub_makes(replies: list[tuple[str, bytes]]) -> None:
    assert pubs(replies) == [pub(subject, "", payload) for subject, payload in replies]


def test_M12_an_ack_command() -> None:
    (command, subject, reply, payload, headers), = pubs([("$JS.ACK.S.C.1.2.3.4.0", b"+ACK")])
    assert command == b"PUB $JS.ACK.S.C.1.2.3.4.0 4\r\n+ACK\r\n"
    assert (subject, reply, payload, headers) == ("$JS.ACK.S.C.1.2.3.4.0", "", b"+ACK", None)
