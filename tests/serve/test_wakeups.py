"""The engine's thread wakes the server's readers with one loop call for all of a step's tokens."""

from __future__ import annotations

import asyncio
import threading

from graphtop.server.wakeups import LoopWaker, waker_for


def test_a_burst_of_wakes_from_another_thread_is_one_loop_call_that_runs_them_all() -> None:
    loop = asyncio.new_event_loop()
    try:
        calls = []
        real = loop.call_soon_threadsafe

        def counted(cb, *args):  # type: ignore[no-untyped-def]
            calls.append(cb)
            return real(cb, *args)

        loop.call_soon_threadsafe = counted  # type: ignore[method-assign]
        waker = LoopWaker(loop)
        woken: list[int] = []
        burst = threading.Thread(target=lambda: [waker.wake(lambda i=i: woken.append(i)) for i in range(100)])
        burst.start()
        burst.join()
        assert len(calls) == 1  # the loop has not run yet: one call pending holds the whole burst
        loop.run_until_complete(asyncio.sleep(0))
        assert woken == list(range(100))  # every reader, in the order the engine woke them
        waker.wake(lambda: woken.append(100))  # after the loop looked, the next wake asks again
        assert len(calls) == 2
        loop.run_until_complete(asyncio.sleep(0))
        assert woken[-1] == 100
    finally:
        loop.close()


def test_a_wake_after_the_loop_closed_is_dropped_quietly_and_a_loop_has_one_waker() -> None:
    loop = asyncio.new_event_loop()
    assert waker_for(loop) is waker_for(loop)
    waker = waker_for(loop)
    loop.close()
    ran: list[int] = []
    waker.wake(lambda: ran.append(1))  # the server is gone: no RuntimeError reaches the engine's thread
    waker.wake(lambda: ran.append(2))
    assert ran == []
    assert waker._pending == [] and not waker._scheduled
