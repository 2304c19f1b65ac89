"""Lending and returning leases, as methods of the GPUPool facade (a mixin): a request checked,
granted now or after a wait in the queue (one lease, or a gang's), and a lease's end.

The decisions are in grant.py (one transaction) and waiting.py (the queue's wait); the SQL of
an end in release.py.  The facade supplies the store, its options, its topology and wake-ups.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
from dataclasses import replace
from datetime import datetime
from typing import TYPE_CHECKING, Any

from .. import validation
from ..fair_use import budget
from ..ledger.part import PoolPart
from ..models import EndReason, InvalidRequest, Lease
from ..validation import HostChoice, Request
from . import grant, release
from .reclaim import reclaiming as release_reclaiming
from .waiting import QueueWatch, Wait

if TYPE_CHECKING:
    from .placement import Topology
    from .waiting import Wakeups


class PoolLeasing(PoolPart):
    """GPUPool's acquire and release (see the module docstring)."""

    # Supplied by the GPUPool facade besides PoolPart's (declared for the type checker only).
    _topology: Topology
    _wakeups: Wakeups
    _watches: dict[Any, QueueWatch]
    _make_request: Callable[..., Request]
    _attempt: Callable[..., grant.Outcome]
    _rules: Callable[..., grant.QueueRules]
    limit_for: Callable[..., tuple[int | None, str]]
    budgets: Callable[[], budget.Budgets]
    borrow_limits: Callable[[], Any]
    poll_interval: float
    heartbeat_interval: float
    waiter_stale_after: float
    backfill_window: float

    # --- acquiring (grant.py, waiting.py) -----------------------------------------

    def check_request(
        self, user: str, count: int, groups: Iterable[str] = (), host: HostChoice = None, server_name: str = "",
        workers: int = 1, borrow: bool = False,
    ) -> bool:
        """Refuse up front a request that can never be met: bad input, too big, over quota (or,
        `borrow`, over the borrowing limits).

        Takes no lease and joins no queue.  Raises InvalidRequest,
        Unsatisfiable, QuotaExceeded or PoolUnavailable; returns whether it would borrow
        (go beyond the user's share) if granted now.  `workers` > 1: a gang (see acquire_gang).
        """
        req = replace(self._make_request(user, server_name, count, groups, host, workers), borrow=bool(borrow))
        return self._read(lambda conn: grant.check(self._store, conn, req, self.limit_for(req.groups), self.budgets(),
                                                   self.borrow_limits()).beyond)

    def set_host_demand(self, demand: dict[str, int]) -> None:
        """How many host-tagged profiles can use each host ({host: n}; hosts left out: 0).

        A request then goes to the hosts fewer profiles ask for first (before best
        fit), so GPUs that only some profiles may use (an A100 node) are lent last
        to requests that could run anywhere.  The spawner sets it from its
        profiles; it only orders placement, and changes no lease."""
        if not isinstance(demand, dict) or not all(
                isinstance(h, str) and isinstance(n, int) and not isinstance(n, bool) and n >= 0
                for h, n in demand.items()):
            raise InvalidRequest("host demand must map host names to counts >= 0")
        self._topology.demand = dict(demand)

    def try_acquire(
        self, user: str, server_name: str, count: int, groups: Iterable[str] = (), host: HostChoice = None,
        borrow: bool = False,
    ) -> Lease | None:
        """Lend `count` GPUs of one host now, in one transaction, or return None.

        Waiting requests keep their turn: this only succeeds when the queue
        policy would let a newly arrived request through.  `host` restricts
        the choice to one host (default: the inventory's host, or any host
        when the pool has no inventory).  Raises InvalidRequest,
        Unsatisfiable, QuotaExceeded, PoolUnavailable.  `borrow`: as for acquire.
        """
        req = replace(self._make_request(user, server_name, count, groups, host), borrow=bool(borrow))
        return self._write(self._attempt, req, None, False).lease

    async def acquire(
        self,
        user: str,
        server_name: str,
        count: int,
        groups: Iterable[str] = (),
        timeout: float = 60.0,
        on_wait: Callable[[int, int, int], Any] | None = None,
        host: HostChoice = None,
        holds_for: float | None = None,
        borrow: bool = False,
        since: datetime | None = None,
    ) -> Lease:
        """Lend `count` GPUs of one host, waiting up to `timeout` seconds in the fair queue.

        `on_wait(position, wanted, free)` (a plain or async callable) is called
        whenever the queue position changes, first when the request joins the
        queue; position 1 is the head.  A callable with a `why` parameter gets
        it too, and is called when it changes: why the request is where it is
        (fairshare.why; names nobody).  Raises WaitTimeout (with .position)
        when the time runs out, and the errors of try_acquire.  Cancelling
        the call removes the request from the queue and leaves no lease.
        `holds_for`: the most seconds the lease will be held (a batch job's timeout); GPUs
        booked for someone else from before then are not lent to it.  `borrow`: it may go
        beyond the user's share on idle GPUs (a borrowed lease, reclaimed with notice, see
        reclaim.py).  `since`: when it first joined the queue (a reclaimed job keeps its place).
        """
        req = self.request_for(user, server_name, count, groups, host, 1, holds_for, borrow, since)
        return await self._wait(req, timeout).run(req, timeout, self.poll_interval, on_wait)

    async def acquire_gang(
        self,
        user: str,
        server_name: str,
        count: int,
        workers: int,
        groups: Iterable[str] = (),
        timeout: float = 60.0,
        on_wait: Callable[[int, int, int], Any] | None = None,
        host: HostChoice = None,
        holds_for: float | None = None,
        borrow: bool = False,
        since: datetime | None = None,
    ) -> tuple[Lease, ...]:
        """Lend `workers` leases of `count` GPUs each (a cluster job), all in one transaction or none.

        The gang queues as one request in the fair queue and holds nothing while it waits, so
        two gangs never deadlock each other.  Worker i's lease is named
        `<server_name>/worker-<i>` (one accounting line per worker); the leases come back in
        worker order.  Placement takes the fewest hosts (one when one fits them all) among
        `host` (a name or a list; default as for acquire).  Quotas count every worker's
        GPUs.  Raises as acquire does; cancelling leaves no lease and no queue row.
        """
        req = self.request_for(user, server_name, count, groups, host, workers, holds_for, borrow, since)
        return await self._wait(req, timeout).run_all(req, timeout, self.poll_interval, on_wait)

    def _wait(self, req: Request, timeout) -> Wait:
        if isinstance(timeout, bool) or not isinstance(timeout, int | float) or timeout < 0:
            raise InvalidRequest(f"timeout must be a number of seconds >= 0, not {timeout!r}")
        return Wait(
            attempt=self.grant_or_queue,
            undo_leases=self._undo_leases,
            remove_waiter=self.leave_queue,
            wakeups=self._wakeups,
            log=self.log,
            watch=self._watch,
        )

    def _watch(self) -> QueueWatch:
        """The running loop's QueueWatch (made while it has waiters)."""
        loop = asyncio.get_running_loop()
        watch = self._watches.get(loop)
        if watch is None:
            watch = self._watches[loop] = QueueWatch(
                look=self.read_queue, beat=self.heartbeat, poll_interval=self.poll_interval,
                heartbeat_interval=min(self.heartbeat_interval, self.waiter_stale_after / 3),
                wakeups=self._wakeups, log=self.log, on_idle=lambda: self._watches.pop(loop, None))
        return watch

    # --- a wait's steps, public (what acquire's wait and its watch call; a caller with its own
    # clock, such as bench/replay.py, drives them itself) ----------------------------------------

    def request_for(
        self, user: str, server_name: str, count: int, groups: Iterable[str] = (), host: HostChoice = None,
        workers: int = 1, holds_for: float | None = None, borrow: bool = False, since: datetime | None = None,
    ) -> Request:
        """The checked request acquire (`workers` 1) or acquire_gang would make of these arguments
        (the same meanings); raises InvalidRequest.  Writes nothing: grant_or_queue takes it."""
        return replace(self._make_request(user, server_name, count, groups, host, workers),
                       holds_for=validation.holds_for(holds_for), borrow=bool(borrow),
                       since=validation.aware(since, "since"))

    def grant_or_queue(self, req: Request, waiter_id: int | None = None, queue: bool = True) -> grant.Outcome:
        """One turn of a wait, in one transaction: grant `req` now (Outcome.leases), or, `queue`,
        keep its place in the queue (join it when `waiter_id` is None; Outcome.waiter_id, position,
        why).  With `queue` False a request not granted leaves no new row (a wait's last try).
        Raises as try_acquire does (Unsatisfiable, QuotaExceeded, ... when it became impossible)."""
        return self._write(self._attempt, req, waiter_id, queue)

    def read_queue(self, waiters: dict[int, Request], known: dict | None = None) -> dict[int, grant.View] | None:
        """Where each of `waiters` ({waiter id: its request}) stands, in one read (no lock): its
        position, and `ask`, whether a grant_or_queue now would serve it (or tell it an error).
        `known`: the previous read's memory of the queue (a watch keeps it); with it, None means
        nothing these waiters could learn has changed."""
        return self._read(lambda conn: grant.look(self._store, conn, waiters, self.waiter_stale_after,
                                                  self.backfill_window, self._topology.choose, known,
                                                  self._rules()))

    def heartbeat(self, waiter_ids: list[int]) -> None:
        """These waiters are alive (one write): rows without a heartbeat for `waiter_stale_after`
        seconds are another process's dead waiters, ignored and removed."""
        self._write(lambda conn: grant.beat(self._store, conn, waiter_ids), durable=False)

    def leave_queue(self, waiter_id: int) -> None:
        """Remove a waiter's queue row (it gave up or was cancelled); the queue moves up."""
        self._write(lambda conn: release.remove_waiter(self._store, conn, waiter_id), durable=False)
        self._notify()  # the queue moved

    def _undo_leases(self, lease_ids: list[int]) -> None:
        def undo(conn):
            for lease_id in lease_ids:
                release.undo_lease(conn, lease_id)
        self._write(undo)
        self._notify()

    # --- releasing and admin (release.py) -------------------------------------------

    def release(self, lease_id: int, reason: EndReason | str = EndReason.STOPPED) -> bool:
        """End a lease.  Idempotent: False if it had already ended (or never existed)."""
        lease_id = validation.lease_id(lease_id)
        reason = validation.reason(reason)
        if not validation.storable_id(lease_id):
            return False
        ended = self._write(lambda conn: release.release(self._store, conn, lease_id, reason), durable=False)
        if ended:
            self._notify()
        return ended

    def release_all(self, lease_ids: Iterable[int], reason: EndReason | str = EndReason.STOPPED) -> list[int]:
        """End several leases (a cluster's) in one transaction; the ids that were still active."""
        ids = [i for i in (validation.lease_id(i) for i in lease_ids) if validation.storable_id(i)]
        reason = validation.reason(reason)
        if not ids:
            return []
        ended = self._write(lambda conn: [i for i in ids if release.release(self._store, conn, i, reason)],
                            durable=False)
        if ended:
            self._notify()
        return ended

    def reclaiming(self, host: str | None = None) -> list:
        """The borrowed leases a waiting request within its share asked back, not yet ended
        (reclaim.Borrowed, with `reclaim_at`), on `host` (None: every host)."""
        return self._read(lambda conn: release_reclaiming(conn, host))

    def set_problem(self, lease_id: int, problem: str) -> bool:
        """Note why an active lease stays lent after its server ended (a container that would
        not stop); `gpu-pool status` shows it.  False if the lease is not active."""
        lease_id = validation.lease_id(lease_id)
        problem = str(problem)[:500]
        if not validation.storable_id(lease_id):
            return False
        return self._write(lambda conn: release.set_problem(conn, lease_id, problem), durable=False)
