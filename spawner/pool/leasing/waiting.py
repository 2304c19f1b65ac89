"""Waiting in the fair queue: the async loop of acquire(), wake-ups, cancellation.

The queue itself lives in the database (grant.py); this module drives one
request's turns from the event loop, with the blocking ledger calls on the
ledger's own threads (executor.py).  A request writes to join the queue, to
take its lease and to leave; in between, one `QueueWatch` per pool and event
loop reads the queue for all of the process's waiters at once (a read, no
lock), tells each where it stands, and refreshes all their heartbeats in one
write every `heartbeat_interval`.  So N waiters cost one read per poll, not N
writes over N rows each.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
from collections.abc import Callable
from typing import Any

from ..ledger.off_loop import LEDGER_EXECUTOR
from ..models import Lease, PoolError, PoolUnavailable, WaitTimeout
from ..validation import Request
from .grant import Outcome, View
from .policy import timeout_message

# A waiter in the process that frees GPUs hears of it this much later at most: the watch reads
# the queue once per burst of releases, not once per release.
BURST_SECONDS = 0.05


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


async def _sleep(wake: asyncio.Event, seconds: float) -> None:
    # Not asyncio.wait_for: on Python 3.11 it swallows a
    # cancellation that lands as the event fires.
    woken = asyncio.ensure_future(wake.wait())
    try:
        await asyncio.wait({woken}, timeout=seconds)
    finally:
        woken.cancel()


class _Watched:
    """One waiter as the watch knows it: its request, and the newest view of it."""

    def __init__(self, req: Request):
        self.req = req
        self.view: View | PoolError | None = None  # not yet taken by the waiter
        self.last: View | PoolError | None = None  # the last one handed over
        self.seen = asyncio.Event()


class QueueWatch:
    """Reads the queue for every waiter of this process (one pool, one event loop).

    `look(mine)` and `beat(ids)` are the pool's blocking calls (grant.look in a
    read transaction, grant.beat in a write).  The watch runs while it has
    waiters: each turn it reads once, hands every waiter its view, and sleeps
    `poll_interval` or until this process frees GPUs or moves the queue.
    """

    def __init__(self, look: Callable, beat: Callable, poll_interval: float, heartbeat_interval: float,
                 wakeups: Wakeups, log, on_idle: Callable[[], object]):
        self.look = look
        self.beat = beat
        self.poll_interval = poll_interval
        self.heartbeat_interval = heartbeat_interval
        self.wakeups = wakeups
        self.log = log
        self.on_idle = on_idle
        self.waiters: dict[int, _Watched] = {}
        self._wake = asyncio.Event()
        self._task: asyncio.Task | None = None

    def add(self, waiter_id: int, req: Request) -> _Watched:
        watched = self.waiters[waiter_id] = _Watched(req)
        if self._task is None:
            self._task = asyncio.ensure_future(self._run())
        else:
            self._wake.set()  # a newcomer learns its place at the next read, now
        return watched

    def remove(self, waiter_id: int) -> None:
        self.waiters.pop(waiter_id, None)
        if not self.waiters:
            self._wake.set()  # the watch ends

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        self.wakeups.subscribe(loop, self._wake)
        last_beat = loop.time()
        failing = False
        known: dict = {}  # grant.look's memory of the queue between reads
        try:
            while self.waiters:
                self._wake.clear()
                mine = {wid: w.req for wid, w in self.waiters.items()}
                try:
                    if loop.time() - last_beat >= self.heartbeat_interval:
                        last_beat = loop.time()
                        await loop.run_in_executor(LEDGER_EXECUTOR, self.beat, list(mine))
                    views: dict[int, View] | PoolError | None = await loop.run_in_executor(
                        LEDGER_EXECUTOR, self.look, mine, known)
                    if failing:
                        self.log.info("GPU ledger answers again; %d request(s) keep waiting", len(mine))
                        failing = False
                except PoolError as exc:
                    if not failing:
                        self.log.warning("GPU ledger error while %d request(s) wait; retrying: %s", len(mine), exc)
                    failing = True
                    views = exc
                if views is not None:  # None: nothing a waiter could learn has changed
                    for wid, watched in list(self.waiters.items()):
                        if wid in mine:
                            view = views if isinstance(views, PoolError) else views.get(wid)
                            if view != watched.last:  # only a waiter whose place changed wakes
                                watched.last = watched.view = view
                                watched.seen.set()
                next_beat = last_beat + self.heartbeat_interval - loop.time()
                # Releases come in bursts (a hub stopping many servers, a spawn after a spawn):
                # one read after a short pause serves the whole burst.
                await asyncio.sleep(min(self.poll_interval, BURST_SECONDS))
                await _sleep(self._wake, max(0.0, min(self.poll_interval, next_beat) - BURST_SECONDS))
        finally:
            self.wakeups.unsubscribe(loop, self._wake)
            self._task = None
            if self.waiters:  # cancelled with waiters left (the loop closes): they see an error
                for watched in self.waiters.values():
                    watched.view = PoolUnavailable("The GPU queue's watch stopped")
                    watched.seen.set()
            else:
                self.on_idle()


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
    fut = asyncio.get_running_loop().run_in_executor(LEDGER_EXECUTOR, fn, *args)
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
    with contextlib.suppress(_CancelledAfter):
        await uncancellable(fn, *args)


def _takes_why(fn) -> bool:
    """Whether an on_wait callback declares a `why` parameter (the explanation of its place)."""
    try:
        return "why" in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


class Wait:
    """One request's wait.  The callables are the pool's blocking ledger calls:

    attempt(req, waiter_id, enqueue) -> Outcome; undo_leases(lease_ids) (a grant's, in one
    transaction); remove_waiter(waiter_id); `watch()` gives this loop's QueueWatch.
    """

    def __init__(self, attempt: Callable, undo_leases: Callable, remove_waiter: Callable, wakeups: Wakeups, log,
                 watch: Callable[[], QueueWatch]):
        self.attempt = attempt
        self.undo_leases = undo_leases
        self.remove_waiter = remove_waiter
        self.wakeups = wakeups
        self.log = log
        self.watch = watch

    async def _run_attempt(self, req: Request, waiter_id: int | None, enqueue: bool) -> Outcome:
        try:
            return await uncancellable(self.attempt, req, waiter_id, enqueue)
        except _CancelledAfter as c:
            outcome: Outcome = c.result
            # The caller went away while the grant ran: undo it.
            if outcome.leases:
                await uncancellable_quiet(self.undo_leases, [lease.id for lease in outcome.leases])
            elif outcome.waiter_id is not None and outcome.waiter_id != waiter_id:
                await uncancellable_quiet(self.remove_waiter, outcome.waiter_id)
            raise asyncio.CancelledError() from None

    async def _attempt_retrying(self, req: Request, waiter_id: int | None, enqueue: bool, deadline: float,
                                poll_interval: float, wake: asyncio.Event) -> Outcome:
        """A write attempt; a transient ledger error is retried up to the wait's deadline."""
        loop = asyncio.get_running_loop()
        failing = False
        while True:
            try:
                outcome = await self._run_attempt(req, waiter_id, enqueue and loop.time() < deadline)
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
                wake.clear()
                self.wakeups.subscribe(loop, wake)  # only now: N waiters would be N wake-ups per release
                try:
                    await _sleep(wake, min(poll_interval, remaining))
                finally:
                    self.wakeups.unsubscribe(loop, wake)
                continue
            if failing:
                self.log.info("GPU ledger answers again; %s/%s keeps waiting", req.user, req.server_name)
            return outcome

    async def run(
        self, req: Request, timeout: float, poll_interval: float, on_wait: Callable[[int, int, int], Any] | None
    ) -> Lease:
        return (await self.run_all(req, timeout, poll_interval, on_wait))[0]

    async def run_all(
        self, req: Request, timeout: float, poll_interval: float, on_wait: Callable[[int, int, int], Any] | None
    ) -> tuple[Lease, ...]:
        """The grant's leases: one, or one per worker of a gang (req.workers), all at once."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        wake = asyncio.Event()
        waiter_id: int | None = None
        watch: QueueWatch | None = None
        watched: _Watched | None = None
        watched_id: int | None = None
        position, why = 0, ""
        started = loop.time()

        def unwatch() -> None:
            if watch is None or watched_id is None:  # set together with `watched`
                raise RuntimeError("A queue wait's watch is missing while it watches")
            watch.remove(watched_id)
        try:
            outcome = await self._attempt_retrying(req, None, True, deadline, poll_interval, wake)
            while True:
                if outcome.lease is not None:
                    waiter_id = None  # its queue row went with the grant
                    if position:
                        self.log.info(
                            "GPU lease %d for %s/%s granted after %.1f s in the queue",
                            outcome.lease.id, req.user, req.server_name, loop.time() - started,
                        )
                    return outcome.leases
                if watched is not None and outcome.waiter_id != watched_id:
                    unwatch()  # queued again under a new row
                    watched = watched_id = None
                waiter_id = outcome.waiter_id
                free, total = outcome.free, outcome.total
                new_position, new_why = outcome.position, outcome.why
                while True:
                    if new_position != position or new_why != why:
                        position, why = new_position, new_why
                        if on_wait is not None and loop.time() < deadline:
                            await self._call_on_wait(on_wait, position, req.total, free, why)
                    remaining = deadline - loop.time()
                    if waiter_id is None:  # not queued: its time had run out at the first try
                        raise WaitTimeout(timeout_message(req, new_position, free, total, timeout),
                                          position=new_position)
                    if remaining <= 0:
                        last = await self._attempt_retrying(req, waiter_id, False, deadline, poll_interval, wake)
                        if last.lease is not None:
                            outcome = last
                            break
                        message = timeout_message(req, last.position, last.free, last.total, timeout)
                        raise WaitTimeout(message, position=last.position)
                    if watched is None:
                        watch = self.watch()
                        watched, watched_id = watch.add(waiter_id, req), waiter_id
                    if watched.view is None:  # (a view that came meanwhile is not lost)
                        watched.seen.clear()
                        await _sleep(watched.seen, remaining)
                    view, watched.view = watched.view, None
                    if view is None:
                        continue  # the deadline (the loop's top ends the wait)
                    if isinstance(view, PoolError):
                        continue  # the watch says so in the log and keeps reading
                    if view.ask or not view.present:
                        # A grant would serve it (or must tell it an error), or its
                        # row is gone (it missed heartbeats): a write decides.
                        outcome = await self._attempt_retrying(req, waiter_id, True, deadline, poll_interval, wake)
                        break
                    new_position, free, total, new_why = view.position, view.free, view.total, view.why
        except BaseException:
            if watched is not None:
                unwatch()
                watched = None
            if waiter_id is not None:
                try:
                    await uncancellable_quiet(self.remove_waiter, waiter_id)
                except PoolError as e:  # its row goes stale and is removed by others
                    self.log.warning("Could not remove GPU queue row %d: %s", waiter_id, e)
            raise
        finally:
            if watched is not None:
                unwatch()

    async def _call_on_wait(self, on_wait, position: int, wanted: int, free: int, why: str) -> None:
        try:
            result = (on_wait(position, wanted, free, why=why) if _takes_why(on_wait)
                      else on_wait(position, wanted, free))
            if inspect.isawaitable(result):
                await result
        except asyncio.CancelledError:
            raise
        except Exception:
            self.log.exception("GPU queue progress callback failed")
