"""A6: a record a start restored (origin "recovery") is counted by no /metrics family; a
record rebuilt after a crash (origin "rebuilt") counts as the client's action it was."""

from __future__ import annotations

from gateway.audit.counting import count_key


def test_A6_restored_records_are_not_counted_as_client_actions() -> None:
    assert count_key("limit_exceeded", "/", {"rule": "L2", "origin": "recovery"}) == ("recovery", "/", "limit_exceeded")
    assert count_key("limit_exceeded", "/", {"rule": "L2"}) == ("limit_exceeded", "/", "L2")
    assert count_key("queue_declare", "/", {"queue": "q", "origin": "recovery"})[0] == "recovery"
    assert count_key("publish", "/", {"topic": "x", "origin": "rebuilt"}) == ("publish", "/", "x")
