"""GPUPool: the configurable facade of the ledger, its public API in one class.

It holds the options (traitlets) and composes the store, placement, policy,
grant, waiting, admin and reads modules; it adds no logic of its own.  What
admins do to the ledger (drain, audit, reconcile, rehome) is its mixin in
admin_actions.py.
"""

from __future__ import annotations

import asyncio
import os
import socket
from dataclasses import replace
from collections.abc import Callable, Iterable
from datetime import datetime
from typing import Any

from sqlalchemy import exc as sa_exc
from sqlalchemy import ColumnElement
from sqlalchemy.engine import Engine, make_url
from traitlets import Any as AnyTrait
from traitlets import CaselessStrEnum, Dict, Float, Int, TraitError, Unicode, validate
from traitlets.config import LoggingConfigurable

from ..inventory.machine import Inventory
from . import bookings, budget, fairshare, grant, inventory_sync, queries, release, rollup, timeline, validation
from .bookings import Booking
from .grant import Outcome, QueueRules
from .models import EndReason, GPUStatus, InvalidRequest, Lease, Waiter
from .admin_actions import PoolAdministration
from .placement import Topology
from .gpu_readings import PoolReadings
from .policy import WaiterRow, limit_for
from .schema import NAME_MAX, create_schema, leases_table
from .store import Store
from .validation import HostChoice, Request
from .waiting import QueueWatch, Wait, Wakeups


# The SQLite ledger's file name, in the hub's data directory (GPUHUB_DATA_DIR).
LEDGER_FILE = "gpu-pool.sqlite"


class GPUPool(PoolAdministration, PoolReadings, LoggingConfigurable):
    """The GPU lease ledger.  See the package docstring for the policy."""

    db_url = Unicode(
        f"sqlite:///{LEDGER_FILE}",
        config=True,
        help="""SQLAlchemy URL of the ledger database.

        The default is the SQLite file gpu-pool.sqlite in the directory the
        process runs in; hub_config/jupyterhub_config.py sets it from
        GPUHUB_POOL_DB_URL, else to gpu-pool.sqlite in GPUHUB_DATA_DIR, next
        to the hub's own database (a `.lock` file sits beside it, and every
        hub process using it must run on this machine).  Use PostgreSQL
        (`postgresql+psycopg://user:password@host/db`, needs the `postgres`
        extra) when several hubs or hosts share GPUs.  The tables are created
        on first use.  The password never appears in logs or messages.
        """,
    )

    max_gpus_per_user = Int(
        None,
        allow_none=True,
        config=True,
        help="""Most GPUs one user may hold at once, across all their named servers.

        None (the default) means no limit; 0 means no GPUs at all (unless a
        group in `group_gpu_limits` grants some).
        """,
    )

    group_gpu_limits = Dict(
        config=True,
        help="""Per-group GPU limits: {JupyterHub group name: most GPUs a member may hold}.

        A user's limit is the largest limit among their groups listed here
        (None as a value means no limit); a user in none of them gets
        `max_gpus_per_user`.  Groups come from JupyterHub, which the
        directory (AD/LDAP) fills.  Example:
        `{"ml-team": 4, "students": 1}`.
        """,
    )

    lock_timeout = Float(
        5.0,
        config=True,
        help="""Seconds to wait for the ledger's write lock before giving up.

        Writes are short (milliseconds); a lock held longer means a stuck
        process, and the caller gets a "try again" error instead of hanging.
        """,
    )

    connect_timeout = Float(
        5.0,
        config=True,
        help="Seconds to wait for a connection to a PostgreSQL ledger.",
    )

    statement_timeout = Float(
        10.0,
        config=True,
        help="""PostgreSQL: seconds one statement may run on the server before the server cancels it.

        Ledger statements take milliseconds; this stops a call that the server
        is slow to answer (a stuck lock, an overloaded server) instead of
        letting it hang.  Waiting for the ledger's write lock is bounded by
        `lock_timeout` instead.
        """,
    )

    call_timeout = Float(
        15.0,
        config=True,
        help="""PostgreSQL: seconds after which a ledger call that got no answer is abandoned.

        A server that stops answering without closing the connection (a host
        or network path gone dead, a frozen server) would otherwise hold a
        call until the kernel gives up on the connection, minutes later.
        After this many seconds the connection is shut down and the call
        fails with "the GPU ledger is unavailable" (a spawn then gets a 503).
        Also sent to the kernel as the connection's TCP user timeout.  Must
        be above `lock_timeout`, which a write may spend waiting for the lock.
        """,
    )

    tcp_keepalives_idle = Int(
        10,
        config=True,
        help="""PostgreSQL: seconds a ledger connection may sit idle before TCP keepalive probes start.

        With `tcp_keepalives_interval` and `tcp_keepalives_count`, a pooled
        connection to a server that vanished is found dead within about
        idle + interval x count seconds instead of hours.
        """,
    )

    tcp_keepalives_interval = Int(
        5,
        config=True,
        help="PostgreSQL: seconds between TCP keepalive probes on a ledger connection.",
    )

    tcp_keepalives_count = Int(
        3,
        config=True,
        help="PostgreSQL: unanswered TCP keepalive probes after which a ledger connection counts as dead.",
    )

    poll_interval = Float(
        0.5,
        config=True,
        help="""Seconds between a process's reads of the queue while requests wait.

        Waiters in the process that releases GPUs wake at once; this bounds
        how late a waiter notices GPUs released by another process (another
        hub, the CLI).  One read serves all of a process's waiters and takes
        no lock: a waiter writes only to join the queue, to take its lease
        and to leave (and its heartbeat, see `heartbeat_interval`).
        """,
    )

    heartbeat_interval = Float(
        3.0,
        config=True,
        help="""Seconds between refreshes of the heartbeats of a process's waiting requests.

        One write refreshes all of the process's queue rows, so other
        processes know they are alive (see `waiter_stale_after`).  Shortened
        to a third of `waiter_stale_after` when that is smaller.
        """,
    )

    backfill_window = Float(
        15.0,
        config=True,
        help="""Seconds during which later requests may pass an earlier waiting one.

        A request that cannot be met yet (too few free GPUs) does not block
        smaller requests behind it for its first `backfill_window` seconds.
        After that, free GPUs are held for it until it is served or gives up,
        so big requests cannot starve.  0 makes the queue strictly FIFO.
        """,
    )

    waiter_stale_after = Float(
        10.0,
        config=True,
        help="""Seconds after its last heartbeat when a waiter counts as dead.

        A process that dies while waiting leaves its queue row behind; other
        processes ignore it after this many seconds and delete it.  Must be
        well above `heartbeat_interval`.
        """,
    )

    queue_order = CaselessStrEnum(
        [fairshare.FAIRSHARE, fairshare.FIFO],
        default_value=fairshare.FAIRSHARE,
        config=True,
        help="""The order in which waiting requests are served: `fairshare` (the default) or `fifo`.

        fairshare: the request whose user (and groups, see
        `fairshare_group_shares`) used fewer GPU-hours lately, relative to
        their share, goes first; equals go in arrival order; a request that
        has waited `fifo_after` seconds is passed no more.  With no history,
        or equal use, it is FIFO, so it only changes anything where use
        differs, and then in favour of those who had less.  fifo: arrival
        order only.  Either way `backfill_window` lets small requests pass a
        big one for a while, and every waiter is told why it is where it is.
        """,
    )

    fifo_after = Float(
        120.0,
        config=True,
        help="""Seconds after which a waiting request is served in arrival order (fair-share's starvation bound).

        Requests that have waited this long go before all others, oldest
        first: a heavy user is passed by lighter ones for at most this long.
        Keep it below the spawner's `lease_wait_timeout` (300 s), or heavy
        users' spawns may time out while lighter ones pass.
        """,
    )

    fairshare_half_life = Float(
        7 * 86400.0,
        config=True,
        help="""Seconds after which a GPU-hour counts half in fair-share (the decay of recent use).

        A user's recent use is their GPU-hours with each hour weighted
        2^-(its age / half-life): 7 days (the default) means last week's
        use counts half, the week before a quarter.  The ledger keeps these
        sums as leases end; changing the half-life rebuilds them from the
        history once, at the hub's next start.
        """,
    )

    fairshare_shares = Dict(
        config=True,
        help="""Fair-share shares per user: {user name: share}, default 1 for everyone not listed.

        A user with share 2 may use twice as many GPU-hours as one with share
        1 before the queue ranks them equal.  Example: `{"alice": 2}`.
        """,
    )

    fairshare_group_shares = Dict(
        config=True,
        help="""Groups whose recent use counts in fair-share: {JupyterHub group name: share}.

        A waiter's standing is its user's recent GPU-hours / user share, plus,
        for each of its groups listed here, the group's recent GPU-hours /
        group share: a heavy group's members wait behind a light group's.
        Groups not listed do not count (directory groups that everyone is in
        would only add noise).  Example: `{"course-101": 1, "ml-team": 4}`.
        """,
    )

    gpu_hour_budget = Float(
        None,
        allow_none=True,
        config=True,
        help="""GPU-hours each user may use in any `budget_period` (a rolling budget); None (the default): no budget.

        Beside `max_gpus_per_user` (how many at once), this bounds how much
        over time.  A request over it is refused ("you have used 40.0 of your
        40 GPU-hours in the last 7 days; the next hour frees on Tue 14:00");
        a server that runs past it is shown when it will run out (pool page,
        api/wait) and is then stopped by the idle culler with reason
        `budget`, its home kept.
        """,
    )

    group_gpu_hour_budgets = Dict(
        config=True,
        help="""Rolling GPU-hour budgets of groups: {JupyterHub group name: GPU-hours per `budget_period`}.

        A group's members share it (a course's allowance for the week);
        each member's own `gpu_hour_budget` applies too.
        """,
    )

    budget_period = Float(
        7 * 86400.0,
        config=True,
        help="Seconds of the budgets' rolling window (default 7 days).",
    )

    booking_max_hours = Float(
        8.0,
        config=True,
        help="The longest window one booking may hold GPUs for, in hours.",
    )

    booking_max_days_ahead = Float(
        14.0,
        config=True,
        help="How far ahead a booking may start, in days.",
    )

    booking_max_gpu_hours_per_week = Float(
        40.0,
        config=True,
        help="""GPU-hours one user may book within any 7 days (counted around each booking's start).

        Admins booking for a group count against the group's booker, not this.
        """,
    )

    booking_max_per_user = Int(
        10,
        config=True,
        help="Bookings not yet over that one user may hold at once.",
    )

    booking_grace = Float(
        900.0,
        config=True,
        help="""Seconds after its start when a booking nobody has used is released back to the pool.

        Used means: a lease of the booker (or, for a group's booking, of a
        member) on its GPUs since the window started.
        """,
    )

    inventory = AnyTrait(
        None,
        allow_none=True,
        help="The Inventory of this hub's host (set by the constructor; not configurable).",
    )

    @validate("group_gpu_hour_budgets")
    def _check_budgets(self, proposal):
        for name, hours in proposal.value.items():
            if isinstance(hours, bool) or not isinstance(hours, int | float) or hours < 0:
                raise TraitError(f"GPUPool.group_gpu_hour_budgets[{name!r}] must be a number of GPU-hours >= 0")
        return proposal.value

    @validate("gpu_hour_budget")
    def _check_budget(self, proposal):
        if proposal.value is not None and proposal.value < 0:
            raise TraitError("GPUPool.gpu_hour_budget must be >= 0 or None")
        return proposal.value

    @validate("fairshare_shares", "fairshare_group_shares")
    def _check_shares(self, proposal):
        for name, share in proposal.value.items():
            if isinstance(share, bool) or not isinstance(share, int | float) or not share > 0:
                raise TraitError(f"GPUPool.{proposal.trait.name}[{name!r}] must be a number > 0, not {share!r}")
        return proposal.value

    @validate("fifo_after", "fairshare_half_life", "budget_period", "booking_max_hours", "booking_max_days_ahead",
              "booking_grace", "booking_max_gpu_hours_per_week")
    def _check_positive_times(self, proposal):
        if not proposal.value > 0:
            raise TraitError(f"GPUPool.{proposal.trait.name} must be > 0 (seconds)")
        return proposal.value

    @validate("db_url")
    def _check_db_url(self, proposal):
        try:
            url = make_url(proposal.value)
        except (sa_exc.ArgumentError, ValueError):
            raise TraitError("GPUPool.db_url is not a database URL (like sqlite:///file.sqlite)") from None
        if url.get_backend_name() not in ("sqlite", "postgresql"):
            raise TraitError(
                f"GPUPool.db_url: the GPU ledger supports sqlite and postgresql, not {url.get_backend_name()}"
            )
        return proposal.value

    @validate("max_gpus_per_user")
    def _check_max(self, proposal):
        if proposal.value is not None and proposal.value < 0:
            raise TraitError("GPUPool.max_gpus_per_user must be >= 0 or None")
        return proposal.value

    @validate("group_gpu_limits")
    def _check_group_limits(self, proposal):
        for group, limit in proposal.value.items():
            if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 0):
                raise TraitError(f"GPUPool.group_gpu_limits[{group!r}] must be an int >= 0 or None, not {limit!r}")
        return proposal.value

    @validate(
        "lock_timeout", "connect_timeout", "poll_interval", "heartbeat_interval", "waiter_stale_after", "statement_timeout",
        "call_timeout", "tcp_keepalives_idle", "tcp_keepalives_interval", "tcp_keepalives_count",
    )
    def _check_positive(self, proposal):
        if not proposal.value > 0:
            raise TraitError(f"GPUPool.{proposal.trait.name} must be > 0")
        return proposal.value

    @validate("backfill_window")
    def _check_window(self, proposal):
        if proposal.value < 0:
            raise TraitError("GPUPool.backfill_window must be >= 0")
        return proposal.value


    def __init__(self, inventory: Inventory | None = None, **kwargs):
        super().__init__(inventory=inventory, **kwargs)
        self._store = Store(self, self.log, self._on_create)
        self._topology = Topology(inventory, self.log)
        self._wakeups = Wakeups()
        self._watches: dict[Any, QueueWatch] = {}  # event loop -> its waiters' watch
        self._owner = f"{socket.gethostname()}:{os.getpid()}"[:NAME_MAX]
        self._use_cache: dict = {}  # rollup.decayed_use's rows between grants
        if inventory is not None:
            # An inventory of other machines' GPUs (Swarm) learns their utilisation from the ledger.
            inventory.use_readings(self.gpu_readings)

    # --- database plumbing (store.py) ---------------------------------------

    @property
    def safe_url(self) -> str:
        """The database URL with its password hidden."""
        return self._store.safe_url

    @property
    def is_sqlite(self) -> bool:
        return self._store.is_sqlite

    @property
    def _fast_sqlite(self) -> bool:
        return self._store.fast_sqlite

    @_fast_sqlite.setter
    def _fast_sqlite(self, value: bool) -> None:
        self._store.fast_sqlite = value

    def _on_create(self, store: Store, engine: Engine) -> None:
        def create(conn):
            found = create_schema(conn)
            if found is not None and found < 8:  # the history before rollups, rolled up once
                rollup.backfill(conn)
        # Without time limits: an upgrade rolls up the whole history once, which may take long.
        store.transact(engine, create, write=True, long=True)
        if self.inventory is not None:
            # A lending hub's half-life and budgets are the ledger's (readers such as the CLI and
            # the culler read them from there).
            store.transact(engine, lambda conn: rollup.ensure_decay(store, conn, self.fairshare_half_life),
                           write=True, long=True)
            store.transact(engine, lambda conn: budget.publish(conn, self._own_budgets()), write=True)
        if self.inventory is not None:
            store.transact(engine, self._sync_inventory, self.inventory.gpus(), write=True)

    def _engine_ready(self) -> Engine:
        return self._store.engine()

    def _write(self, fn: Callable, *args, durable: bool = True):
        return self._store.write(fn, *args, durable=durable)

    def _read(self, fn: Callable, *args):
        return self._store.read(fn, *args)

    def close(self) -> None:
        """Close the database connections."""
        self._store.close()

    def _notify(self) -> None:
        """Wake this process's waiters: GPUs were freed or the queue changed."""
        self._wakeups.notify()

    # --- inventory (inventory_sync.py) ----------------------------------------

    def sync_inventory(self) -> None:
        """Record the inventory's GPUs in the ledger.

        GPUs of the inventory's host that it no longer lists are marked
        missing and are not lent again (their active leases stay until they
        end).  Drain flags survive.
        """
        if self.inventory is None:
            return
        with self._store.guard():
            units = self.inventory.gpus()
        self._write(self._sync_inventory, units)
        self._topology.clear()
        self._notify()

    def check_host_identity(self) -> None:
        """Raise HostConflict, without writing, when the ledger holds this host's GPUs under another name."""
        if self.inventory is None:
            return
        with self._store.guard():
            units = self.inventory.gpus()
        self._read(inventory_sync.check_host_identity, units)

    def _sync_inventory(self, conn, units) -> None:
        hosts = self.inventory.hosts()
        inventory_sync.sync(conn, hosts, units, self._store.now(conn), self.log)

    # --- policy (policy.py, placement.py) ---------------------------------------

    def limit_for(self, groups: Iterable[str] = ()) -> tuple[int | None, str]:
        """(limit, where it comes from) for a user in `groups`; None = no limit."""
        return limit_for(groups, self.group_gpu_limits, self.max_gpus_per_user)

    def _make_request(self, user, server_name, count, groups, host: HostChoice, workers: int = 1) -> Request:
        default_host = (self.inventory.host if self.inventory is not None
                        and not getattr(self.inventory, "multi_host", False) else None)
        return validation.make_request(user, server_name, count, groups, host, default_host, workers)

    def _rules(self, groups: Iterable[str] = ()) -> QueueRules:
        return QueueRules(self.limit_for(groups), self.waiter_stale_after, self.backfill_window, self._owner,
                          self.queue_order, self.shares(), self._use_cache, self.budgets(), self.booking_grace)

    def _own_budgets(self) -> budget.Budgets:
        return budget.Budgets(self.gpu_hour_budget, dict(self.group_gpu_hour_budgets), self.budget_period)

    def budgets(self) -> budget.Budgets:
        """The budgets in force: this hub's (a lender), else those the lending hub wrote in the ledger."""
        if self.inventory is not None:
            return self._own_budgets()
        found = getattr(self, "_ledger_budgets", None)
        if found is None:
            found = self._ledger_budgets = self._read(budget.published)
        return found

    def budget_standings(self, user: str, groups: Iterable[str] = ()) -> list[budget.Standing]:
        """The GPU-hour budgets that apply to `user`, as they stand now (empty: none)."""
        user = validation.name(user, "The user name")
        groups = tuple(validation.name(g, "A group name") for g in groups)
        b = self.budgets()
        return self._read(lambda conn: budget.standings(self._store, conn, user, groups, b, self._store.now(conn)))

    # --- bookings (bookings.py) -------------------------------------------------------

    def booking_limits(self) -> bookings.Limits:
        return bookings.Limits(self.booking_max_hours, self.booking_max_days_ahead,
                               self.booking_max_gpu_hours_per_week, self.booking_max_per_user, self.booking_grace)

    def book(self, user: str, count: int, starts_at: datetime, ends_at: datetime, *, group: str | None = None,
             host: str | None = None, by: str | None = None) -> Booking:
        """Book `count` GPUs of one host for `user` (or `group`'s members) over [starts_at, ends_at).

        Who may book for whom (a user for themself; an admin for anyone or a group) is
        the caller's to check.  Raises BookingRefused (400, with the reason: past, too
        long, too far ahead, too big, over the weekly limit, overlapping: with the next
        free window) or InvalidRequest."""
        user = validation.name(user, "The user name")
        group = validation.name(group, "The group name") if group is not None else None
        host = validation.name(host, "The host name") if host is not None else None
        by = validation.name(by or user, "The booker's name")
        starts_at = validation.aware(starts_at, "starts_at")
        ends_at = validation.aware(ends_at, "ends_at")
        if starts_at is None or ends_at is None:
            raise InvalidRequest("A booking needs a start and an end")
        limits = self.booking_limits()
        made = self._write(lambda conn: bookings.make(
            conn, self._store.now(conn), user=user, group=group, count=count, starts_at=starts_at, ends_at=ends_at,
            host=host, created_by=by, limits=limits))
        self.log.info("Booked %d GPU(s) on %s for %s from %s to %s (booking %d, by %s)", len(made.gpu_uuids),
                      made.host, f"group {group}" if group else user, made.starts_at, made.ends_at, made.id, by)
        return made

    def bookings(self) -> list[Booking]:
        """Bookings not yet over, by start (no-shows past their grace released first)."""
        def write(conn):
            now = self._store.now(conn)
            bookings.release_no_shows(conn, now, self.booking_grace)
            return bookings.live(conn, now)
        return self._write(write, durable=False)

    def cancel_booking(self, booking_id: int, by: str, admin: bool = False) -> Booking:
        """Cancel a live booking (its booker, or an admin)."""
        booking_id = validation.lease_id(booking_id)
        by = validation.name(by, "The user name")
        done = self._write(lambda conn: bookings.cancel(conn, booking_id, by, admin, self._store.now(conn)))
        self._notify()  # its GPUs may be lent now
        return done

    def lease_booked_out(self, lease_id: int) -> Booking | None:
        """For the culler: the booking for someone else that holds this active lease's GPU now."""
        lease_id = validation.lease_id(lease_id)
        return self._read(lambda conn: bookings.lease_booked_out(conn, lease_id, self._store.now(conn)))

    def lease_over_budget(self, lease_id: int) -> budget.Standing | None:
        """For the culler: the used-up budget of an active lease's user or group, else None.

        The culler then records its intent `budget` in the ledger before it stops the server,
        and the lease's end says so."""
        lease_id = validation.lease_id(lease_id)
        b = self.budgets()
        if not b.any:
            return None
        return self._read(lambda conn: budget.lease_over_budget(self._store, conn, lease_id, b,
                                                                self._store.now(conn)))

    def shares(self) -> fairshare.Shares:
        return fairshare.Shares(self.fairshare_shares, self.fairshare_group_shares, self.fifo_after)

    def _attempt(self, conn, req: Request, waiter_id: int | None, enqueue: bool) -> Outcome:
        return grant.attempt(self._store, conn, req, waiter_id, enqueue, self._rules(req.groups),
                             self._topology.choose, self.log)

    # --- acquiring (grant.py, waiting.py) -----------------------------------------

    def check_request(
        self, user: str, count: int, groups: Iterable[str] = (), host: HostChoice = None, server_name: str = "",
        workers: int = 1,
    ) -> None:
        """Refuse up front a request that can never be met: bad input, too big, over quota.

        Takes no lease and joins no queue.  Raises InvalidRequest,
        Unsatisfiable, QuotaExceeded or PoolUnavailable; returns None when the
        request could be met now or after a wait.  `workers` > 1: a gang (see acquire_gang).
        """
        req = self._make_request(user, server_name, count, groups, host, workers)
        self._read(lambda conn: grant.check(self._store, conn, req, self.limit_for(req.groups), self.budgets()))

    def try_acquire(
        self, user: str, server_name: str, count: int, groups: Iterable[str] = (), host: HostChoice = None
    ) -> Lease | None:
        """Lend `count` GPUs of one host now, in one transaction, or return None.

        Waiting requests keep their turn: this only succeeds when the queue
        policy would let a newly arrived request through.  `host` restricts
        the choice to one host (default: the inventory's host, or any host
        when the pool has no inventory).  Raises InvalidRequest,
        Unsatisfiable, QuotaExceeded, PoolUnavailable.
        """
        req = self._make_request(user, server_name, count, groups, host)
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
    ) -> Lease:
        """Lend `count` GPUs of one host, waiting up to `timeout` seconds in the fair queue.

        `on_wait(position, wanted, free)` (a plain or async callable) is called
        whenever the queue position changes, first when the request joins the
        queue; position 1 is the head.  A callable with a `why` parameter gets
        it too, and is called when it changes: why the request is where it is
        (fairshare.why; names nobody).  Raises WaitTimeout (with .position)
        when the time runs out, and the errors of try_acquire.  Cancelling
        the call removes the request from the queue and leaves no lease.
        """
        req = self._make_request(user, server_name, count, groups, host)
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
    ) -> tuple[Lease, ...]:
        """Lend `workers` leases of `count` GPUs each (a cluster job), all in one transaction or none.

        The gang queues as one request in the fair queue and holds nothing while it waits, so
        two gangs never deadlock each other.  Worker i's lease is named
        `<server_name>/worker-<i>` (one accounting line per worker); the leases come back in
        worker order.  Placement takes the fewest hosts (one when one fits them all) among
        `host` (a name or a list; default as for acquire).  Quotas count every worker's
        GPUs.  Raises as acquire does; cancelling leaves no lease and no queue row.
        """
        req = self._make_request(user, server_name, count, groups, host, workers)
        return await self._wait(req, timeout).run_all(req, timeout, self.poll_interval, on_wait)

    def _wait(self, req: Request, timeout) -> Wait:
        if isinstance(timeout, bool) or not isinstance(timeout, int | float) or timeout < 0:
            raise InvalidRequest(f"timeout must be a number of seconds >= 0, not {timeout!r}")
        return Wait(
            attempt=lambda r, w, e: self._write(self._attempt, r, w, e),
            undo_leases=self._undo_leases,
            remove_waiter=self._remove_waiter,
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
                look=self._look, beat=self._beat, poll_interval=self.poll_interval,
                heartbeat_interval=min(self.heartbeat_interval, self.waiter_stale_after / 3),
                wakeups=self._wakeups, log=self.log, on_idle=lambda: self._watches.pop(loop, None))
        return watch

    def _look(self, mine: dict, known: dict | None = None) -> dict[int, grant.View] | None:
        return self._read(lambda conn: grant.look(self._store, conn, mine, self.waiter_stale_after,
                                                  self.backfill_window, self._topology.choose, known,
                                                  self._rules()))

    def _beat(self, ids: list[int]) -> None:
        self._write(lambda conn: grant.beat(self._store, conn, ids), durable=False)

    def _remove_waiter(self, waiter_id: int) -> None:
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
        ended = self._write(lambda conn: release.release(self._store, conn, lease_id, reason), durable=False)
        if ended:
            self._notify()
        return ended

    def release_all(self, lease_ids: Iterable[int], reason: EndReason | str = EndReason.STOPPED) -> list[int]:
        """End several leases (a cluster's) in one transaction; the ids that were still active."""
        ids = [validation.lease_id(i) for i in lease_ids]
        reason = validation.reason(reason)
        ended = self._write(lambda conn: [i for i in ids if release.release(self._store, conn, i, reason)],
                            durable=False)
        if ended:
            self._notify()
        return ended

    def set_problem(self, lease_id: int, problem: str) -> bool:
        """Note why an active lease stays lent after its server ended (a container that would
        not stop); `gpu-pool status` shows it.  False if the lease is not active."""
        lease_id = validation.lease_id(lease_id)
        problem = str(problem)[:500]
        return self._write(lambda conn: release.set_problem(conn, lease_id, problem), durable=False)

    # --- reading (queries.py) ---------------------------------------------------------

    def lease(self, lease_id: int) -> Lease | None:
        """The lease with this id (active or ended), or None."""
        lease_id = validation.lease_id(lease_id)
        found = self._read(lambda conn: queries.load_leases(conn, leases_table.c.id == lease_id))
        return found[0] if found else None

    def leases(self, user: str | None = None, host: str | None = None) -> list[Lease]:
        """Active leases, oldest first, optionally of one user or host."""
        where: ColumnElement[bool] = leases_table.c.ended_at.is_(None)
        if user is not None:
            where &= leases_table.c.user_name == validation.name(user, "The user name")
        if host is not None:
            where &= leases_table.c.host == validation.name(host, "The host name")
        return self._read(lambda conn: queries.load_leases(conn, where))

    def history(
        self, user: str | None = None, since: datetime | None = None, until: datetime | None = None
    ) -> list[Lease]:
        """Leases (ended or active) that overlap [since, until), by start time."""
        since, until = validation.aware(since, "since"), validation.aware(until, "until")
        user = validation.name(user, "The user name") if user is not None else None
        where = queries.history_where(user, since, until)
        order = (leases_table.c.started_at, leases_table.c.id)
        return self._read(lambda conn: queries.load_leases(conn, where, order=order))

    def usage(self, since: datetime | None = None, until: datetime | None = None) -> dict:
        """GPU-hours inside [since, until): {"users": {user: h}, "groups": {group: h}}.

        Active leases count up to now.  A lease counts fully for each group
        its user was in when it started.
        """
        since, until = validation.aware(since, "since"), validation.aware(until, "until")
        # From the rolled-up hours (rollup.py): its cost follows the period, not the history.
        return self._read(lambda conn: rollup.usage(self._store, conn, since, until, self._store.now(conn),
                                                    lambda where: queries.load_leases(conn, where)))

    def gpus(self) -> list[GPUStatus]:
        """Every GPU in the ledger with its drain flag and holding lease, by host and index."""
        return self._read(queries.gpus)

    def counts(self) -> dict[str, int]:
        """{"free", "lent", "drained", "queued"} for metrics.

        free: lendable now; lent: in an active lease (drained or not);
        drained: drained and not lent; queued: live waiters.
        """
        queued = self._read(lambda conn: queries.queued_count(conn, self._store.now(conn), self.waiter_stale_after))
        return queries.counts(self.gpus(), queued)

    def queue(self) -> list[Waiter]:
        """Live waiters, in the order they are served (queue_order), each with why it is there."""
        def read(conn):
            now = self._store.now(conn)
            waiters = queries.queue(conn, now, self.waiter_stale_after)
            rows = [WaiterRow(w.id, w.user, w.count, None, w.since, now, workers=w.workers, groups=w.groups)
                    for w in waiters]
            o = grant.ordered(self._store, conn, rows, now, self.queue_order, self.shares(), self._use_cache)
            by_id = {w.id: w for w in waiters}
            return [replace(by_id[r.id], position=i + 1,
                            why=grant.explain(o, i, self.queue_order, self.shares(), now)
                            if self.queue_order == fairshare.FAIRSHARE else fairshare.fifo_why(i + 1))
                    for i, r in enumerate(o.rows)]
        return self._read(read)

    def timeline(self, since: datetime, until: datetime | None = None) -> timeline.Timeline:
        """When each GPU was lent or drained, and requests waited, inside [since, until) (until: now)."""
        since, until = validation.aware(since, "since"), validation.aware(until, "until")

        def read(conn):
            now = self._store.now(conn)
            return timeline.timeline(conn, since, min(until or now, now), now, self.waiter_stale_after)
        return self._read(read)

    def recent_leases(self, user: str, limit: int = 50) -> list[Lease]:
        """`user`'s newest `limit` leases (active or ended), newest first."""
        user = validation.name(user, "The user name")
        return self._read(lambda conn: queries.recent_leases(conn, user, max(1, int(limit))))

    def recent_use(self) -> rollup.Use:
        """Every user's and group's GPU-hours decayed with the fair-share half-life, now, and the
        users' all-time totals (active leases included)."""
        return self._read(lambda conn: rollup.decayed_use(self._store, conn, self._store.now(conn)))

    def fairshare(self) -> dict:
        """Every user's and group's recent use, share, standing and priority (`gpu-pool fairshare`)."""
        use = self.recent_use()
        shares = self.shares()
        users = []
        for user in sorted(set(use.users) | set(self.fairshare_shares)):
            u = use.users.get(user, 0.0)
            users.append({"user": user, "recent_gpu_hours": round(u, 3),
                          "total_gpu_hours": round(use.total_users.get(user, 0.0), 3),
                          "share": shares.user_share(user), "standing": round(u / shares.user_share(user), 3),
                          "priority": round(fairshare.priority(u / shares.user_share(user)), 4)})
        groups = []
        for group in sorted(set(use.groups) | set(self.fairshare_group_shares)):
            g = use.groups.get(group, 0.0)
            share = self.fairshare_group_shares.get(group)
            groups.append({"group": group, "recent_gpu_hours": round(g, 3), "share": share,
                           "counts": share is not None,
                           "standing": round(g / share, 3) if share else None})
        return {"order": self.queue_order, "half_life_s": use.half_life_s, "fifo_after_s": self.fifo_after,
                "at": use.at.isoformat(), "users": users, "groups": groups}

    def lease_lengths(self, limit: int = 500) -> list[float]:
        """Seconds the newest `limit` ended leases lasted, newest first (for wait estimates)."""
        return self._read(lambda conn: timeline.lease_lengths(conn, max(1, int(limit))))
