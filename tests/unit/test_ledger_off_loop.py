"""A ledger call off the event loop (spawner/pool/ledger/off_loop.py) never loses its task's
cancel.  On Python 3.11 `asyncio.wait_for` returned the result of a call that finished as its
task was cancelled: the gpu-pool service's loops that read the ledger (the jobs runner's page
snapshot every 2 s) then ran on after the stop, and the service left only at its 5 s exit
timer, without its own "stopped" (fresh10: test_poolpage_stop; alone, 1 run in 39 failed)."""

from __future__ import annotations

import asyncio

import pytest

from spawner.pool import PoolUnavailable
from spawner.pool.ledger.off_loop import ledger_call

pytestmark = pytest.mark.unit


def test_a_call_that_returns_as_its_task_is_cancelled_still_ends_the_task_cancelled():
    async def main():
        loop = asyncio.get_running_loop()
        tasks: list[asyncio.Task] = []

        def read():
            # The cancel reaches the loop just before the call's answer does: the order that
            # wait_for turned into a returned answer.
            loop.call_soon_threadsafe(tasks[0].cancel)
            return "the ledger's answer"

        tasks.append(asyncio.ensure_future(ledger_call(read, timeout=10)))
        with pytest.raises(asyncio.CancelledError):
            await tasks[0]

    asyncio.run(main())


def test_a_call_past_its_timeout_is_the_ledgers_unavailability_and_an_answer_is_returned():
    async def main():
        assert await ledger_call(lambda: 42, timeout=10) == 42
        import threading

        stuck = threading.Event()
        try:
            with pytest.raises(PoolUnavailable, match="did not answer within 0.2 s"):
                await ledger_call(stuck.wait, 5, timeout=0.2)
        finally:
            stuck.set()

    asyncio.run(main())
