"""Waiting in the fair queue: the async loop of acquire(), wake-ups, cancellation.

The queue itself lives in the database (grant.py); this module drives one
request's turns from the event loop, with the blocking ledger calls in threads.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable
from typing import Any

from .grant import Outcome
from .models import Lease, PoolError, PoolUnavailable, WaitTimeout
from .policy import timeout_message
from .validation import Request


class Wakeups:
    """Wakes this process's waiters at once when GPUs are freed or the queue moves."""

    def __init__(self):
        self._subscribers: set[tuple[asyncio.AbstractEventLoop, asyncio.Event]] = set()

    def notify(self) -> None:
        for loop, event_ in list(self._subscribers):
            try:
                loop.call_soon_threadsafe(event_.set)
            except RuntimeError:  # the loop is closed
                self._subscribers.discard((loop, event_))

    def subscribe(self, loop, event_) -> None:
        self._subscribers.add((loop, event_))

    def unsubscribe(self, loop, event_) -> None:
        self._subscribers.discard((loop, event_))


class _CancelledAfter(Exception):
    """Internal: the caller was cancelled while a thread finished `result`."""

    def __init__(self, result):
        super().__init__("cancelled")
        self.result = result


async def uncancellable(fn: Callable, *args):
    """Run fn(*args) in a thread and wait for it even through cancellation.

    A cancelled caller must still learn what the thread did (a lease was
    granted, a queue row was written) so that it can undo it.
    """
    fut = asyncio.get_running_loop().run_in_executor(None, fn, *args)
    cancelled = False
    while True:
        try:
            result = await asyncio.shield(fut)
            break
        except asyncio.CancelledError:
            # Noted even when the thread has already finished: a cancel
            # can land after its result reached the loop but before this
            # task resumed, and must not be dropped.
            cancelled = True
            if fut.done():
                break
    if cancelled:
        if fut.cancelled() or fut.exception() is not None:
            raise asyncio.CancelledError()  # the thread did nothing to undo
        raise _CancelledAfter(fut.result())
    return result


async def uncancellable_quiet(fn: Callable, *args) -> None:
    try:
        await uncancellable(fn, *args)
    except _CancelledAfter:
        pass


class Wait:
    """One request's wait.  The callables are the pool's blocking ledger calls:

    attempt(req, waiter_id, enqueue) -> Outcome; undo_lease(lease_id);
    remove_waiter(waiter_id).
    """

    def __init__(self, attempt: Callable, undo_lease: Callable, remove_waiter: Callable, wakeups: Wakeups, log):
        self.attempt = attempt
        self.undo_lease = undo_lease
        self.remove_waiter = remove_waiter
        self.wakeups = wakeups
        self.log = log

    async def _run_attempt(self, req: Request, waiter_id: int | None, enqueue: bool) -> Outcome:
        try:
            return await uncancellable(self.attempt, req, waiter_id, enqueue)
        except _CancelledAfter as c:
            outcome: Outcome = c.result
            # The caller went away while the grant ran: undo it.
            if outcome.lease is not None:
                await uncancellable_quiet(self.undo_lease, outcome.lease.id)
            elif outcome.waiter_id is not None and outcome.waiter_id != waiter_id:
                await uncancellable_quiet(self.remove_waiter, outcome.waiter_id)
            raise asyncio.CancelledError() from None

    async def run(
        self, req: Request, timeout: float, poll_interval: float, on_wait: Callable[[int, int, int], Any] | None
    ) -> Lease:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        wake = asyncio.Event()
        self.wakeups.subscribe(loop, wake)
        waiter_id: int | None = None
        position = 0
        started = loop.time()
        try:
            failing = False
            while True:
                wake.clear()
                try:
                    outcome = await self._run_attempt(req, waiter_id, enqueue=loop.time() < deadline)
                except PoolUnavailable as e:
                    # A lock held a moment too long, a connection lost: the
                    # next turn may succeed.  Waiting is what this call does,
                    # so it waits, up to its own timeout.
                    remaining = deadline - loop.time()
                    if not e.transient or remaining <= 0:
                        raise
                    if not failing:
                        self.log.warning("GPU ledger error while %s/%s waits; retrying: %s",
                                         req.user, req.server_name, e)
                    failing = True
                    await self._sleep(wake, min(poll_interval, remaining))
                    continue
                if failing:
                    self.log.info("GPU ledger answers again; %s/%s keeps waiting", req.user, req.server_name)
                    failing = False
                if outcome.waiter_id is not None:
                    waiter_id = outcome.waiter_id
                if outcome.lease is not None:
                    waiter_id = None  # its queue row went with the grant
                    if position:
                        self.log.info(
                            "GPU lease %d for %s/%s granted after %.1f s in the queue",
                            outcome.lease.id, req.user, req.server_name, loop.time() - started,
                        )
                    return outcome.lease
                if outcome.position != position:
                    position = outcome.position
                    if on_wait is not None and loop.time() < deadline:
                        await self._call_on_wait(on_wait, position, req.count, outcome.free)
                remaining = deadline - loop.time()
                if remaining <= 0:
                    message = timeout_message(req, outcome.position, outcome.free, outcome.total, timeout)
                    raise WaitTimeout(message, position=outcome.position)
                await self._sleep(wake, min(poll_interval, remaining))
        except BaseException:
            if waiter_id is not None:
                try:
                    await uncancellable_quiet(self.remove_waiter, waiter_id)
                except PoolError as e:  # its row goes stale and is removed by others
                    self.log.warning("Could not remove GPU queue row %d: %s", waiter_id, e)
            raise
        finally:
            self.wakeups.unsubscribe(loop, wake)

    @staticmethod
    async def _sleep(wake: asyncio.Event, seconds: float) -> None:
        # Not asyncio.wait_for: on Python 3.11 it swallows a
        # cancellation that lands as the event fires.
        woken = asyncio.ensure_future(wake.wait())
        try:
            await asyncio.wait({woken}, timeout=seconds)
        finally:
            woken.cancel()

    async def _call_on_wait(self, on_wait, position: int, wanted: int, free: int) -> None:
        try:
            result = on_wait(position, wanted, free)
            if inspect.isawaitable(result):
                await result
        except asyncio.CancelledError:
            raise
        except Exception:
            self.log.exception("GPU queue progress callback failed")
