"""gateway.jetstream.meta.stop_watching ends a watch task even when a cancel is lost.

On Python 3.11 asyncio.wait_for swallows a cancel that arrives as its inner future completes
(nats-py's requests wait in it), and the task then runs on: a gateway's stop hung in the
presence heartbeat's next beat. Here the task swallows its first cancel, as such a task
does; stop_watching must still end it."""

from __future__ import annotations

import asyncio

from gateway.jetstream.meta import stop_watching

HANG = 20.0  # seconds: a bound on a hang, never a measurement


async def test_a_task_that_loses_a_cancel_is_still_stopped() -> None:
    beats = 0
    lost = 0

    async def beat() -> None:
        nonlocal beats, lost
        while True:
            try:
                await asyncio.sleep(0.01)
            except asyncio.CancelledError:
                if lost:
                    raise
                lost += 1  # the first cancel vanishes, as in wait_for's race
            beats += 1

    task = asyncio.get_running_loop().create_task(beat())
    await asyncio.sleep(0.05)
    stopper = asyncio.get_running_loop().create_task(stop_watching(task, None))
    await asyncio.wait({stopper}, timeout=HANG)  # not cancelled from here: that would end it
    try:
        assert stopper.done(), "stop_watching is still waiting for a task that lost its cancel"
        assert task.done() and lost == 1 and beats > 0
    finally:
        task.cancel()
        stopper.cancel()
