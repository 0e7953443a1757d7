"""SE5: the admission gates' arithmetic (gateway/admission.py): a connection limit per
listener, and the descriptor reserve that keeps a flood of one listener from taking the
descriptors the others need. The sockets are the gates' counts; the descriptors are the test
process's own (RLIMIT_NOFILE lowered for the test, /proc/self/fd counted)."""

from __future__ import annotations

import resource
from collections.abc import Iterator

import pytest

from gateway.admission import Admission
from gateway.config import Limits


@pytest.fixture
def soft_limit() -> Iterator[int]:
    old = resource.getrlimit(resource.RLIMIT_NOFILE)
    soft = 2048 if old[0] == resource.RLIM_INFINITY else min(old[0], 2048)
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, old[1]))
    try:
        yield soft
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, old)


def test_SE5_max_connections_counts_each_listener_on_its_own() -> None:
    admission = Admission(Limits(max_connections=2, fd_reserve=0))
    amqp, cmq = admission.gate("amqp"), admission.gate("CMQ API")
    assert [cmq.enter() for _ in range(3)] == [True, True, False]
    assert [amqp.enter() for _ in range(2)] == [True, True]  # the CMQ API's are not AMQP's
    cmq.leave()
    assert cmq.enter() and not cmq.enter()
    assert (cmq.refused, amqp.refused, admission.refused) == (2, 0, 2)


def test_SE5_fd_reserve_leaves_descriptors_to_the_other_listeners(soft_limit: int) -> None:
    """A listener flooded until the reserve is reached takes no more, while another (holding
    fewer than reserve/4) still takes sockets until reserve/8 are left; then none does."""
    reserve = 512
    admission = Admission(Limits(fd_reserve=reserve))
    flood, amqp = admission.gate("CMQ API"), admission.gate("amqp")
    while flood.enter():
        assert flood.count < soft_limit
    free = admission.free_descriptors()
    assert free is not None and reserve // 8 <= free < reserve <= soft_limit - flood.count
    taken = 0
    while amqp.enter():
        taken += 1
        assert amqp.count < reserve
    assert taken == reserve // 4  # then amqp holds its quarter of the reserve too
    listeners = 0
    while admission.gate(f"other {listeners}").enter():  # each new listener gets some...
        while admission.gate(f"other {listeners}").enter():
            pass
        listeners += 1
    free = admission.free_descriptors()
    assert listeners >= 1 and free is not None and free < reserve // 8  # ...until none is left
    assert not admission.gate("metrics").enter() and not flood.enter()
    amqp.leave()  # one socket closed: that listener may take one again
    assert amqp.enter()
