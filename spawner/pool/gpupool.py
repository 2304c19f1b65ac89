"""GPUPool: the configurable facade of the ledger, its public API in one class.

It holds the options (traitlets) and composes the store, placement, policy,
grant, waiting, admin and reads modules; it adds no logic of its own.  Its mixins:
what admins do to the ledger (drain, audit, reconcile, rehome) in admin_actions.py,
acquire and release in leasing.py, budgets, bookings and fair-share standings in fair_use.py,
the reads in pool_queries.py.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable, Iterable
from typing import Any

from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import Engine, make_url
from traitlets import Any as AnyTrait
from traitlets import CaselessStrEnum, Dict, Float, Int, TraitError, Unicode, validate
from traitlets.config import LoggingConfigurable

from ..inventory.machine import Inventory
from . import validation
from .fair_use import bookings, budget
from .fair_use.allowances import PoolFairUse
from .history import queue_hours, rollup
from .history.reports import PoolQueries
from .hosts import inventory_sync
from .hosts.admin import PoolAdministration
from .hosts.readings import PoolReadings
from .leasing import grant, serving_order
from .leasing.grant import Outcome, QueueRules
from .leasing.lending import PoolLeasing
from .leasing.placement import Topology
from .leasing.policy import BorrowLimits, limit_for
from .leasing.waiting import QueueWatch, Wakeups
from .ledger.schema import NAME_MAX, create_schema
from .ledger.store import Store
from .validation import HostChoice, Request

# The SQLite ledger's file name, in the hub's data directory (GPUHUB_DATA_DIR).
LEDGER_FILE = "gpu-pool.sqlite"


class GPUPool(PoolLeasing, PoolAdministration, PoolFairUse, PoolQueries, PoolReadings, LoggingConfigurable):
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

    max_borrowed_gpus_per_user = Int(
        4,
        allow_none=True,
        config=True,
        help="""Most GPUs one user may borrow beyond their share at once (borrowed leases).

        A job that asks to borrow (`gpu-job submit --borrow`), and a server whose profile
        says `borrow: true`, may take idle GPUs beyond its user's limit (`max_gpus_per_user`,
        `group_gpu_limits`) while no request within its share waits; such a lease is borrowed
        as a whole, does not count against the limit, and is reclaimed with `reclaim_grace`
        seconds' notice when a request within its share needs its GPUs.  A submission or
        spawn over this is refused (403) naming this limit.  0: no borrowing at all; None: no
        limit.
        """,
    )

    max_borrowed_jobs_per_user = Int(
        2,
        allow_none=True,
        config=True,
        help="""Most jobs of one user that may run on borrowed GPUs at once (a cluster job is one).

        A submission that would borrow beyond it is refused (403) naming this limit.  None: no limit.
        """,
    )

    reclaim_grace = Float(
        120.0,
        config=True,
        help="""Seconds of notice a borrowed lease gets when a request within its share needs its GPUs.

        The job is told at once (its processes get SIGTERM: save a checkpoint and exit), is
        stopped when the grace is over if it still runs, and its lease ends `reclaimed` once
        the engine confirms its containers gone; the waiting request then gets the GPUs.  A
        reclaimed job goes back to the queue by itself (unless submitted with `--no-requeue`).
        A server's user is told at once in JupyterLab's GPU panel (and by a `reclaimed`
        notification); the gpu-pool service stops the server when the grace is over, as the
        culler would.
        Keep it well inside the spawner's `lease_wait_timeout` and `start_timeout`, which the
        waiting server spends meanwhile.
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
        [serving_order.FAIRSHARE, serving_order.FIFO],
        default_value=serving_order.FAIRSHARE,
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
        rollup.DEFAULT_HALF_LIFE,
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
        budget.Budgets.period_s,
        config=True,
        help="Seconds of the budgets' rolling window (default 7 days).",
    )

    booking_max_hours = Float(
        bookings.Limits.max_hours,
        config=True,
        help="The longest window one booking may hold GPUs for, in hours.",
    )

    booking_max_days_ahead = Float(
        bookings.Limits.max_days_ahead,
        config=True,
        help="How far ahead a booking may start, in days.",
    )

    booking_max_gpu_hours_per_week = Float(
        bookings.Limits.max_gpu_hours_per_week,
        config=True,
        help="""GPU-hours one user may book within any 7 days (counted around each booking's start).

        What was booked counts whatever became of it: cancelled and released
        bookings count their booked GPU-hours, so booking, cancelling and booking
        again does not reset the limit.

        Admins booking for a group count against the group's booker, not this.
        """,
    )

    booking_max_per_user = Int(
        bookings.Limits.max_per_user,
        config=True,
        help="Bookings not yet over that one user may hold at once.",
    )

    booking_grace = Float(
        bookings.Limits.grace_s,
        config=True,
        help="""Seconds after its start when each GPU of a booking that nobody has used is released back to the pool.

        Used means: a lease of the booker (or, for a group's booking, of a
        member) on that GPU since the window started.  A booking with none of
        its GPUs used is released; one with some used keeps those.
        """,
    )

    booking_notice = Float(
        bookings.Limits.notice_s,
        config=True,
        help="""Seconds of notice a plain user's booking gives the people using its GPUs now.

        A booking that would take GPUs someone else holds starts no sooner than
        this from when it is made; the holders are told at once, on the pool page,
        in JupyterLab's GPU panel and in their job's status, how long they have.  A
        GPU pool admin's booking may start at once.  Bookings of GPUs nobody uses
        may start at once too.
        """,
    )

    inventory = AnyTrait(
        None,
        allow_none=True,
        help="The Inventory of this hub's host (set by the constructor; not configurable).",
    )

    clock = AnyTrait(
        None,
        allow_none=True,
        help="""The ledger's clock: a callable returning the time now as an aware UTC datetime (not configurable).

        None (the default) is the database's own clock (SQLite: this machine's; PostgreSQL: the
        server's, one for all hubs).  Every decision of the pool that depends on time reads
        it: lease and queue times, waiters' heartbeats and staleness, the backfill window,
        `fifo_after`, the fair-share decay, budgets and bookings.  Tests and the replay bench
        (bench/replay.py) pass a virtual clock here to run hours of the pool's policy in
        milliseconds.  Only the queue wait of `acquire` (its timeout, the heartbeat and poll
        pace) runs on the event loop's own clock.
        """,
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

    @validate("booking_notice")
    def _check_notice(self, proposal):
        if not proposal.value >= 0:
            raise TraitError("GPUPool.booking_notice must be >= 0 (seconds; 0: no notice)")
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

    @validate("max_gpus_per_user", "max_borrowed_gpus_per_user", "max_borrowed_jobs_per_user")
    def _check_max(self, proposal):
        if proposal.value is not None and proposal.value < 0:
            raise TraitError(f"GPUPool.{proposal.trait.name} must be >= 0 or None")
        return proposal.value

    @validate("reclaim_grace")
    def _check_reclaim_grace(self, proposal):
        if not 0 <= proposal.value <= 86400:
            raise TraitError("GPUPool.reclaim_grace must be between 0 and 86400 seconds")
        return proposal.value

    @validate("group_gpu_limits")
    def _check_group_limits(self, proposal):
        for group, limit in proposal.value.items():
            if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 0):
                raise TraitError(f"GPUPool.group_gpu_limits[{group!r}] must be an int >= 0 or None, not {limit!r}")
        return proposal.value

    @validate(
        "lock_timeout", "connect_timeout", "poll_interval", "heartbeat_interval", "waiter_stale_after",
        "statement_timeout", "call_timeout", "tcp_keepalives_idle", "tcp_keepalives_interval", "tcp_keepalives_count",
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
            if found is not None and found < 11:  # the queue's record before its hourly rollup
                queue_hours.backfill(conn)
        # Without time limits: an upgrade rolls up the whole history once, which may take long.
        store.transact(engine, create, write=True, long=True)
        if self.inventory is not None:
            # A lending hub's half-life and budgets are the ledger's (readers such as the CLI and
            # the culler read them from there).
            store.transact(engine, lambda conn: rollup.ensure_decay(store, conn, self.fairshare_half_life),
                           write=True, long=True)
            store.transact(engine, lambda conn: budget.publish(conn, self._own_budgets()), write=True)
            store.transact(engine, lambda conn: bookings.publish_limits(conn, self._own_booking_limits()), write=True)
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
                        and not self.inventory.multi_host else None)
        return validation.make_request(user, server_name, count, groups, host, default_host, workers)

    def _rules(self, groups: Iterable[str] = ()) -> QueueRules:
        return QueueRules(self.limit_for(groups), self.waiter_stale_after, self.backfill_window, self._owner,
                          self.queue_order, self.shares(), self._use_cache, self.budgets(), self.booking_grace,
                          self.borrow_limits(), self.reclaim_grace)

    def borrow_limits(self) -> BorrowLimits:
        """How much one user may borrow beyond their share (max_borrowed_gpus/jobs_per_user)."""
        return BorrowLimits(self.max_borrowed_gpus_per_user, self.max_borrowed_jobs_per_user)

    def _attempt(self, conn, req: Request, waiter_id: int | None, enqueue: bool) -> Outcome:
        return grant.attempt(self._store, conn, req, waiter_id, enqueue, self._rules(req.groups),
                             self._topology.choose, self.log)
