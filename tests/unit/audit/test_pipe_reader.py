"""gateway.audit.pipe.Reader, the audit writer process's input: whole reads whatever pieces
the bytes come in, the end of input, and (the point of it) what it waits on. While records come
it must not wait on the record pipe itself, or each hand-off's write wakes it just before the
delivery it precedes (A5); only the doorbell, and the pipe again once it has been idle."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from gateway.audit import pipe as P


@pytest.fixture
def pipes() -> Iterator[tuple[int, int, int, int]]:
    data_r, data_w = os.pipe()
    bell_r, bell_w = os.pipe()
    yield data_r, data_w, bell_r, bell_w
    for fd in (data_r, data_w, bell_r, bell_w):
        try:
            os.close(fd)
        except OSError:
            pass


def test_reads_are_whole_across_pieces_and_short_only_at_the_end(pipes: tuple[int, int, int, int]) -> None:
    data_r, data_w, bell_r, _ = pipes
    reader = P.Reader(data_r, bell_r)
    os.write(data_w, b"abc")

    def rest() -> None:
        os.write(data_w, b"defgh")
        os.close(data_w)

    t = threading.Timer(0.05, rest)  # the second piece comes while the reader waits
    t.start()
    try:
        assert reader.read(2) == b"ab"
        assert reader.read(4) == b"cdef"
        assert reader.read(5) == b"gh"  # the end of input: what there was
        assert reader.read(1) == b""
    finally:
        t.join()


def test_while_records_come_it_waits_on_the_doorbell_only(pipes: tuple[int, int, int, int],
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    data_r, data_w, bell_r, bell_w = pipes
    reader = P.Reader(data_r, bell_r)
    waits: list[tuple[tuple[int, ...], Any]] = []

    def look(rlist: tuple[int, ...], timeout: Any) -> list[int]:
        waits.append((tuple(rlist), timeout))
        if len(waits) == 3:
            os.write(data_w, b"x")  # a record arrives: no wake-up for it, the next look finds it
        return []

    monkeypatch.setattr(P, "readable", look)
    assert reader.read(1) == b"x"
    assert waits == [((bell_r,), P.POLL_SECONDS)] * 3
    # Idle for IDLE_POLLS looks: it waits on the records' pipe as well, without a timeout.
    waits.clear()

    def idle_look(rlist: tuple[int, ...], timeout: Any) -> list[int]:
        waits.append((tuple(rlist), timeout))
        if data_r in rlist:
            os.write(data_w, b"y")
        return []

    monkeypatch.setattr(P, "readable", idle_look)
    assert reader.read(1) == b"y"
    assert waits[:P.IDLE_POLLS] == [((bell_r,), P.POLL_SECONDS)] * P.IDLE_POLLS
    assert waits[P.IDLE_POLLS:] == [((bell_r, data_r), None)]
    # Having read again, it is back on its clock.
    waits.clear()
    os.write(bell_w, b"\0")
    monkeypatch.setattr(P, "readable", look)
    os.write(data_w, b"z")
    assert reader.read(1) == b"z"
    assert waits == []


def test_the_doorbell_wakes_it_at_once(pipes: tuple[int, int, int, int],
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    data_r, data_w, bell_r, bell_w = pipes
    monkeypatch.setattr(P, "POLL_SECONDS", 30.0)  # its clock alone would not do it
    reader = P.Reader(data_r, bell_r)
    real = P.readable
    returned: list[list[int]] = []

    def request() -> None:
        os.write(data_w, b"F")  # a request, then the ring that says an answer is awaited
        os.write(bell_w, b"\0")

    # The request is sent once the reader has found nothing and begins to wait: sent from a
    # timer started before read(), a loaded machine let it land before the reader's first
    # look, which then read it without waiting at all (the test failed about 1 run in 6).
    t = threading.Timer(0.05, request)

    def recording(*args: Any) -> list[int]:
        if not returned:
            t.start()
        ready = real(*args)
        returned.append(ready)
        return ready

    monkeypatch.setattr(P, "readable", recording)
    try:
        assert reader.read(1) == b"F"
    finally:
        t.join()
    assert returned == [[bell_r]]  # one wait, ended by the ring
    assert real((bell_r,), 0) == []  # and the ring was taken


def test_a_gone_doorbell_leaves_a_plain_blocking_read(pipes: tuple[int, int, int, int]) -> None:
    data_r, data_w, bell_r, bell_w = pipes
    reader = P.Reader(data_r, bell_r)
    os.close(bell_w)  # the parent's end: gone (it died, or closed it)
    threading.Timer(0.05, lambda: os.write(data_w, b"late")).start()
    assert reader.read(4) == b"late"
    assert reader.doorbell is None
    assert os.get_blocking(data_r)


def test_without_a_doorbell_it_reads_as_a_plain_pipe(pipes: tuple[int, int, int, int]) -> None:
    data_r, data_w, _, _ = pipes
    reader = P.Reader(data_r, None)
    assert os.get_blocking(data_r)
    os.write(data_w, b"12345")
    os.close(data_w)
    assert reader.read(3) == b"123"
    assert reader.read(3) == b"45"


def test_the_writer_process_is_given_a_doorbell_that_lives_as_long_as_it(tmp_path: Any) -> None:
    """AuditLog(process=True): the child learns its doorbell's descriptor from its environment
    (writer.DOORBELL_ENV), open in the child only; the parent's end is closed with the child."""
    from gateway.audit import AuditLog
    from gateway.audit.writer import DOORBELL_ENV

    audit = AuditLog(str(tmp_path), process=True)
    try:
        child = audit._child
        assert child is not None and audit._bell >= 0
        with open(f"/proc/{child.pid}/environ", "rb") as f:
            env = dict(kv.split(b"=", 1) for kv in f.read().split(b"\0") if b"=" in kv)
        fd = int(env[DOORBELL_ENV.encode()])
        assert os.readlink(f"/proc/{child.pid}/fd/{fd}").startswith("pipe:")
        assert os.readlink(f"/proc/self/fd/{audit._bell}") == os.readlink(f"/proc/{child.pid}/fd/{fd}")
        audit.emit("publish", "/", queue="q", msg_id="m", size=1, user="u", peer="p")
        assert audit.flush(10)  # a request: rung, answered
    finally:
        audit.close()
    assert audit._bell == -1
