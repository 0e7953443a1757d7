"""M16: reply texts fit a shortstr as RabbitMQ fits them, and a CMQ rule named at the end
stays readable."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st
from pamqp import commands, frame

from gateway.protocol.codec import encode_method, fit_reply_text


def test_a_short_text_is_unchanged() -> None:
    assert fit_reply_text("NOT_FOUND - no queue 'q' in vhost '/'") == "NOT_FOUND - no queue 'q' in vhost '/'"


def test_a_long_text_is_cut_to_252_bytes_and_dots_as_rabbitmq_does() -> None:
    text = "NOT_FOUND - no queue '" + "q" * 300 + "' in vhost '/'"
    assert fit_reply_text(text) == text[:252] + "..."


def test_the_cut_falls_on_a_character_boundary() -> None:
    text = "NOT_FOUND - no queue 'x" + "é" * 200 + "'"  # 'é' is two bytes: byte 252 splits one
    cut = fit_reply_text(text)
    assert cut.endswith("é...") and len(cut.encode()) == 254


def test_the_cmq_rule_at_the_end_is_kept() -> None:
    text = f"PRECONDITION_FAILED - subscription 'q:{'a' * 240}' filter tag 'k' is 17 characters (CMQ limit L3)"
    cut = fit_reply_text(text)
    assert cut.endswith("... (CMQ limit L3)") and len(cut.encode()) == 255
    assert cut.startswith("PRECONDITION_FAILED - subscription 'q:aaa")


@given(st.text(max_size=400))
def test_every_channel_close_encodes_and_decodes(text: str) -> None:
    raw = encode_method(1, _close(text))
    _, channel, method = frame.unmarshal(raw)
    assert channel == 1 and method.reply_text == fit_reply_text(text)
    assert len(method.reply_text.encode()) <= 255


def _close(text: str) -> commands.Channel.Close:
    close = commands.Channel.Close(reply_code=404, reply_text="", class_id=50, method_id=10)
    close.reply_text = text  # past pamqp's constructor check: the encoder is what is tested
    return close
