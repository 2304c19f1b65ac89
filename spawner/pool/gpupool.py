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
from collections.abc import Callable, Iterable
from datetime import datetime
from typing import Any

from sqlalchemy import exc as sa_exc
from sqlalchemy import ColumnElement
from sqlalchemy.engine import Engine, make_url
from traitlets import Any as AnyTrait
from traitlets import Dict, Float, Int, TraitError, Unicode, validate
from traitlets.config import LoggingConfigurable

from ..inventory.machine import Inventory
from . import release
from . import grant
from . import inventory_sync
from . import queries
from . import timeline
from . import validation
from .grant import Outcome, QueueRules
from .models import EndReason, GPUStatus, InvalidRequest, Lease, Waiter
from .admin_actions import PoolAdministration
from .placement import Topology
from .gpu_readings import PoolReadings
from .policy import limit_for
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

    inventory = AnyTrait(
        None,
        allow_none=True,
        help="The Inventory of this hub's host (set by the constructor; not configurable).",
    )

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
        store.transact(engine, create_schema, write=True)
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

    def _make_request(self, user, server_name, count, groups, host: HostChoice) -> Request:
        default_host = (self.inventory.host if self.inventory is not None
                        and not getattr(self.inventory, "multi_host", False) else None)
        return validation.make_request(user, server_name, count, groups, host, default_host)

    def _attempt(self, conn, req: Request, waiter_id: int | None, enqueue: bool) -> Outcome:
        rules = QueueRules(self.limit_for(req.groups), self.waiter_stale_after, self.backfill_window, self._owner)
        return grant.attempt(self._store, conn, req, waiter_id, enqueue, rules, self._topology.choose, self.log)

    # --- acquiring (grant.py, waiting.py) -----------------------------------------

    def check_request(
        self, user: str, count: int, groups: Iterable[str] = (), host: HostChoice = None, server_name: str = ""
    ) -> None:
        """Refuse up front a request that can never be met: bad input, too big, over quota.

        Takes no lease and joins no queue.  Raises InvalidRequest,
        Unsatisfiable, QuotaExceeded or PoolUnavailable; returns None when the
        request could be met now or after a wait.
        """
        req = self._make_request(user, server_name, count, groups, host)
        self._read(lambda conn: grant.check(self._store, conn, req, self.limit_for(req.groups)))

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
        queue; position 1 is the head.  Raises WaitTimeout (with .position)
        when the time runs out, and the errors of try_acquire.  Cancelling
        the call removes the request from the queue and leaves no lease.
        """
        req = self._make_request(user, server_name, count, groups, host)
        if isinstance(timeout, bool) or not isinstance(timeout, int | float) or timeout < 0:
            raise InvalidRequest(f"timeout must be a number of seconds >= 0, not {timeout!r}")
        wait = Wait(
            attempt=lambda r, w, e: self._write(self._attempt, r, w, e),
            undo_lease=self._undo_lease,
            remove_waiter=self._remove_waiter,
            wakeups=self._wakeups,
            log=self.log,
            watch=self._watch,
        )
        return await wait.run(req, timeout, self.poll_interval, on_wait)

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
                                                  self.backfill_window, self._topology.choose, known))

    def _beat(self, ids: list[int]) -> None:
        self._write(lambda conn: grant.beat(self._store, conn, ids), durable=False)

    def _remove_waiter(self, waiter_id: int) -> None:
        self._write(lambda conn: release.remove_waiter(self._store, conn, waiter_id), durable=False)
        self._notify()  # the queue moved

    def _undo_lease(self, lease_id: int) -> None:
        self._write(release.undo_lease, lease_id)
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
        return queries.usage(self.history(since=since, until=until), since, until)

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
        """Live waiters, in queue order."""
        return self._read(lambda conn: queries.queue(conn, self._store.now(conn), self.waiter_stale_after))

    def timeline(self, since: datetime, until: datetime | None = None) -> timeline.Timeline:
        """When each GPU was lent or drained, and requests waited, inside [since, until) (until: now)."""
        since, until = validation.aware(since, "since"), validation.aware(until, "until")

        def read(conn):
            now = self._store.now(conn)
            return timeline.timeline(conn, since, min(until or now, now), now, self.waiter_stale_after)
        return self._read(read)

    def lease_lengths(self, limit: int = 500) -> list[float]:
        """Seconds the newest `limit` ended leases lasted, newest first (for wait estimates)."""
        return self._read(lambda conn: timeline.lease_lengths(conn, max(1, int(limit))))
