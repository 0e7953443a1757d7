"""A delivery's numbers read from its reply subject in C (gateway/jetstream/_wire.c's
``ack_numbers``, used by ``Pulls._take``, issue 28: CPU a message) are what the Python reading
(``delivery_counts``, itself held to nats-py's ``Msg.metadata``) makes of it, or nothing, and
then the Python reading decides. M11/Q7: the receive count comes from ``<delivered>``; the
queue's undelivered estimate from ``<pending>``; the latest consumer sequence from its token."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.jetstream import pulls
from gateway.jetstream.queues import delivery_counts
from tests.unit.jetstream.compiled import compiled, needs_compiled

OLD = "$JS.ACK.cmq_q_abc.cmqc.3.1055.1012.1764498000123456789.41"
NEW = "$JS.ACK.dom.ACCHASH.cmq_q_abc.cmqc.3.1055.1012.1764498000123456789.41.rnd"

# Tokens of every kind: plain numbers (also longer than C reads, or with leading zeros), and
# what int() reads but C does not (signs, spaces, underscores, other digits), and what neither does.
_token = st.one_of(
    st.integers(min_value=0, max_value=10**20).map(str),
    st.text(alphabet="0123456789", min_size=1, max_size=20),
    st.sampled_from(["", "+3", "-3", " 7", "7 ", "1_0", "\u0663", "\uff17", "x", "\U0001f600", "0x1", "3\n",
                     "$JS", "ACK"]),
    st.text(max_size=6).filter(lambda t: "." not in t),
)


def _python(reply: str) -> tuple[int, int, int] | None:
    try:
        return delivery_counts(reply)
    except (ValueError, IndexError):
        return None


def _plain(token: str) -> bool:
    return 0 < len(token) <= 18 and all("0" <= c <= "9" for c in token)


def test_the_gateway_reads_them_in_c() -> None:
    """Pulls._take uses the compiled reading where it was built, unless told not to."""
    assert pulls._ack_numbers is getattr(compiled, "ack_numbers", None)


@needs_compiled("ack_numbers")
@pytest.mark.parametrize("reply", [OLD, NEW, NEW.rpartition(".")[0]])
def test_both_forms_nats_server_writes_are_read_in_c(reply: str) -> None:
    assert compiled.ack_numbers(reply) == delivery_counts(reply) == (3, 1012, 41)


@needs_compiled("ack_numbers")
@settings(max_examples=1500, deadline=None)
@given(st.lists(_token, min_size=1, max_size=14))
def test_c_reads_as_python_or_declines(tokens: list[str]) -> None:
    reply = ".".join(tokens)
    got = compiled.ack_numbers(reply)
    want = _python(reply)
    if got is not None:
        assert got == want
        return
    if want is not None:
        # Declined only where a token it reads is not plain digits (int() reads more), or the
        # form is neither 9 nor 11 or more tokens.
        n = len(tokens)
        at = 4 if n == 9 else 6
        assert n not in (9,) and n < 11 or not all(_plain(tokens[i]) for i in (at, at + 2, at + 4))


@needs_compiled("ack_numbers")
@settings(max_examples=300, deadline=None)
@given(st.integers(0, 10**18 - 1), st.integers(0, 10**18 - 1), st.integers(0, 10**18 - 1), st.booleans())
def test_every_plain_number_is_read_in_c(delivered: int, seq: int, pending: int, new: bool) -> None:
    prefix = "$JS.ACK.dom.HASH.S.C" if new else "$JS.ACK.S.C"
    reply = f"{prefix}.{delivered}.77.{seq}.1764498000123456789.{pending}" + (".r" if new else "")
    assert compiled.ack_numbers(reply) == delivery_counts(reply) == (delivered, seq, pending)


@needs_compiled("ack_numbers")
def test_not_a_str_is_a_type_error() -> None:
    with pytest.raises(TypeError):
        compiled.ack_numbers(OLD.encode())
