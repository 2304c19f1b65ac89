"""The GPU lease ledger: a locked pool that never lends one GPU twice.

A lease lends one or more GPUs of one host to one user's server.  The ledger
lives in SQL (SQLite by default, PostgreSQL for several hubs or hosts) and
keeps every lease after it ends: it is the accounting record.

Exclusivity
    The database enforces it, not Python: a partial unique index over the
    active rows of `gpu_pool_lease_gpus` allows one active lease per
    (host, uuid).  Every change runs in one transaction under the ledger's
    write lock (SQLite: ``BEGIN IMMEDIATE`` with a busy timeout; PostgreSQL:
    a transaction-scoped advisory lock), so N GPUs are granted all at once or
    not at all, and two hub processes, or a hub and the ``gpu-pool`` CLI, can
    never hand out one GPU twice.  Should anything bypass the lock, the
    unique index rejects the second lease and the request is retried.

Fair queue
    A request that cannot be met now may wait (``acquire(timeout=...)``) in a
    queue that lives in the database (``gpu_pool_waiters``), shared by every
    process using the ledger.  The policy is FIFO with bounded backfill:

    - Requests are served in arrival order.  When GPUs free up, the earliest
      waiters that fit are served first.
    - A later request may pass an earlier one that cannot be met yet (say a
      1-GPU request behind a 4-GPU one while 2 GPUs are free), but only while
      the earlier one has waited less than ``GPUPool.backfill_window``
      seconds.  After that, free GPUs on its hosts are held for it until it
      is served or gives up, so a big request cannot starve behind small
      ones.  A big request blocks small ones at most for its own timeout,
      which the spawner bounds by its start timeout.
    - A request that can never be met (more GPUs than any host has, over its
      quota) is refused at once instead of queueing.

    Waiters refresh a heartbeat while they wait; the rows of waiters whose
    process died are ignored after ``waiter_stale_after`` seconds and deleted.
    A waiter in the same process as a release wakes at once (an asyncio
    event); waiters in other processes poll every ``poll_interval`` seconds.
    A cancelled wait removes its queue row and leaves no lease behind.

Placement
    A lease never spans hosts.  Among hosts that fit, the one with the fewest
    free GPUs is chosen (keeping big blocks free for big requests); on a host,
    a multi-GPU lease takes the GPUs closest in the inventory's topology (NVML
    topology levels), and a single-GPU lease takes the most isolated free GPU
    so that close pairs stay free.  Drained GPUs and GPUs missing from the
    inventory are never lent.

Quotas
    ``max_gpus_per_user`` caps the GPUs one user holds across all their named
    servers; ``group_gpu_limits`` gives members of a JupyterHub group their
    own cap (a user gets the largest cap of their groups; None = no cap).
    The user's groups are recorded on each lease, for per-group accounting.
"""

from __future__ import annotations

import asyncio
import fcntl
import inspect
import json
import math
import os
import socket
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable
from contextlib import contextmanager
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from enum import Enum
from typing import Any

from sqlalchemy import (
    Boolean,
    Column,
    DateTime,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    create_engine,
    delete,
    event,
    func,
    insert,
    bindparam,
    select,
    text,
    update,
)
from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import Engine, make_url
from sqlalchemy.pool import StaticPool
from sqlalchemy.types import TypeDecorator
from traitlets import Any as AnyTrait
from traitlets import Dict, Float, Int, TraitError, Unicode, validate
from traitlets.config import LoggingConfigurable

from .inventory import GPU, TOPOLOGY_SYSTEM, Inventory, InventoryError

SCHEMA_VERSION = 2  # 2: gpu_pool_leases.problem
# Key of the PostgreSQL advisory lock that serialises writes to the ledger
# (an arbitrary 63-bit constant: "gpupool" in ASCII).
PG_LOCK_KEY = 0x677075706F6F6C
NAME_MAX = 255
INTEGRITY_RETRIES = 5


# --- errors ---------------------------------------------------------------


class PoolError(Exception):
    """Base of the pool's errors.  str(exc) is a message fit to show a user."""

    status_code = 500


class InvalidRequest(PoolError):
    """Bad input: a count that is not a positive integer, a bad name or reason."""

    status_code = 400


class Unsatisfiable(PoolError):
    """More GPUs asked for than any host has: waiting cannot help."""

    status_code = 400


class QuotaExceeded(PoolError):
    """The request would take the user over their GPU limit."""

    status_code = 403


class UnknownGPU(PoolError):
    """No GPU with that uuid in the ledger."""

    status_code = 404


class PoolUnavailable(PoolError):
    """The ledger's database is unreachable, or stayed locked too long."""

    status_code = 503


class WaitTimeout(PoolError):
    """No GPUs came free within the wait's timeout."""

    status_code = 503

    def __init__(self, message: str, position: int):
        super().__init__(message)
        self.position = position


# --- values ---------------------------------------------------------------


class EndReason(str, Enum):
    """Why a lease ended; kept in the ledger for accounting."""

    STOPPED = "stopped"
    CULLED = "culled"
    FAILED_START = "failed-start"
    DIED = "died"
    RECONCILED = "reconciled"
    ADMIN = "admin"

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class Lease:
    """GPUs of one host lent to one user's server."""

    id: int
    user: str
    server_name: str
    host: str
    gpu_uuids: tuple[str, ...]
    groups: tuple[str, ...]
    started_at: datetime
    ended_at: datetime | None = None
    end_reason: str | None = None
    problem: str | None = None
    """Set while the lease's server has ended but its container would not stop."""

    @property
    def active(self) -> bool:
        return self.ended_at is None

    def gpu_hours(self, since: datetime | None = None, until: datetime | None = None) -> float:
        """GPU-hours of this lease inside [since, until) (an active lease counts up to now)."""
        end = self.ended_at or datetime.now(UTC)
        if until is not None:
            end = min(end, until)
        start = self.started_at if since is None else max(self.started_at, since)
        seconds = (end - start).total_seconds()
        return max(seconds, 0.0) * len(self.gpu_uuids) / 3600.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "user": self.user,
            "server_name": self.server_name,
            "host": self.host,
            "gpu_uuids": list(self.gpu_uuids),
            "groups": list(self.groups),
            "started_at": _iso(self.started_at),
            "ended_at": _iso(self.ended_at),
            "end_reason": self.end_reason,
            "problem": self.problem,
        }


@dataclass(frozen=True)
class GPUStatus:
    """A GPU as the ledger sees it: drained or not, and who holds it."""

    gpu: GPU
    drained: bool
    lease: Lease | None
    present: bool = True
    """False when the GPU is gone from its host's inventory (lost, removed)."""
    drained_at: datetime | None = None

    @property
    def state(self) -> str:
        """'lent' (drained or not), 'drained', 'missing' or 'free'."""
        if self.lease is not None:
            return "lent"
        if self.drained:
            return "drained"
        if not self.present:
            return "missing"
        return "free"

    def to_dict(self) -> dict[str, Any]:
        return {
            "host": self.gpu.host,
            "index": self.gpu.index,
            "uuid": self.gpu.uuid,
            "name": self.gpu.name,
            "memory_mib": self.gpu.memory_mib,
            "parent_uuid": self.gpu.parent_uuid,
            "state": self.state,
            "drained": self.drained,
            "drained_at": _iso(self.drained_at),
            "present": self.present,
            "lease": self.lease.to_dict() if self.lease else None,
        }


@dataclass(frozen=True)
class Waiter:
    """A request waiting in the queue."""

    id: int
    user: str
    server_name: str
    count: int
    since: datetime
    position: int
    groups: tuple[str, ...] = ()
    hosts: tuple[str, ...] | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "position": self.position,
            "user": self.user,
            "server_name": self.server_name,
            "count": self.count,
            "since": _iso(self.since),
            "groups": list(self.groups),
            "hosts": list(self.hosts) if self.hosts is not None else None,
        }


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value is not None else None


def ordinal(n: int) -> str:
    """1 -> '1st', 2 -> '2nd', 11 -> '11th'."""
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def _gpus(n: int) -> str:
    return f"{n} GPU" if n == 1 else f"{n} GPUs"


# --- schema ---------------------------------------------------------------


class UTCDateTime(TypeDecorator):
    """Stores naive UTC, returns aware UTC datetimes (SQLite keeps no zone)."""

    impl = DateTime
    cache_ok = True

    def process_bind_param(self, value, dialect):
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("the GPU ledger stores aware datetimes only")
        return value.astimezone(UTC).replace(tzinfo=None)

    def process_result_value(self, value, dialect):
        return None if value is None else value.replace(tzinfo=UTC)


metadata = MetaData()

meta_table = Table(
    "gpu_pool_meta",
    metadata,
    Column("key", String(64), primary_key=True),
    Column("value", Text, nullable=False),
)

gpus_table = Table(
    "gpu_pool_gpus",
    metadata,
    Column("host", String(NAME_MAX), primary_key=True),
    Column("uuid", String(128), primary_key=True),
    Column("idx", Integer, nullable=False),
    Column("name", String(NAME_MAX), nullable=False),
    Column("memory_mib", Integer, nullable=False),
    Column("parent_uuid", String(128)),
    Column("pci_bus_id", String(64)),
    # False once the GPU is gone from its host's inventory: never lent again
    # until it comes back (its active lease, if any, stays until it ends).
    Column("present", Boolean, nullable=False),
    Column("drained", Boolean, nullable=False),
    Column("drained_at", UTCDateTime),
    Column("seen_at", UTCDateTime, nullable=False),
)

leases_table = Table(
    "gpu_pool_leases",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("user_name", String(NAME_MAX), nullable=False),
    Column("server_name", String(NAME_MAX), nullable=False),
    Column("host", String(NAME_MAX), nullable=False),
    Column("groups", Text, nullable=False),  # JSON list
    Column("started_at", UTCDateTime, nullable=False),
    Column("ended_at", UTCDateTime),
    Column("end_reason", String(32)),
    # Why a lease whose server ended is still lent (a container that would
    # not stop); the reconciler ends it once the container is gone.
    Column("problem", Text),
    Index("ix_gpu_pool_leases_user", "user_name"),
    Index("ix_gpu_pool_leases_started", "started_at"),
    # ids are never reused, even after the newest lease is undone, because
    # they travel in container labels and spawner state.
    sqlite_autoincrement=True,
)

lease_gpus_table = Table(
    "gpu_pool_lease_gpus",
    metadata,
    Column("lease_id", Integer, ForeignKey("gpu_pool_leases.id", ondelete="CASCADE"), primary_key=True),
    Column("uuid", String(128), primary_key=True),
    Column("host", String(NAME_MAX), nullable=False),
    Column("position", Integer, nullable=False),
    Column("ended_at", UTCDateTime),
    # THE exclusivity guarantee: at most one active lease row per GPU.
    Index(
        "uq_gpu_pool_one_active_lease_per_gpu",
        "host",
        "uuid",
        unique=True,
        sqlite_where=text("ended_at IS NULL"),
        postgresql_where=text("ended_at IS NULL"),
    ),
)

waiters_table = Table(
    "gpu_pool_waiters",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("owner", String(NAME_MAX), nullable=False),  # host:pid, for operators
    Column("user_name", String(NAME_MAX), nullable=False),
    Column("server_name", String(NAME_MAX), nullable=False),
    Column("count", Integer, nullable=False),
    Column("groups", Text, nullable=False),
    Column("hosts", Text),  # JSON list, NULL = any host
    Column("enqueued_at", UTCDateTime, nullable=False),
    Column("heartbeat_at", UTCDateTime, nullable=False),
    sqlite_autoincrement=True,
)


# Hot-path statements, built once: building Core statements per call costs
# more than SQLite takes to run them.
_g, _l, _lg, _w = gpus_table, leases_table, lease_gpus_table, waiters_table
_SNAPSHOT = select(_g.c.host, _g.c.uuid, _g.c.idx, _g.c.present, _g.c.drained, _lg.c.lease_id).select_from(
    _g.outerjoin(_lg, (_lg.c.host == _g.c.host) & (_lg.c.uuid == _g.c.uuid) & _lg.c.ended_at.is_(None))
)
_HELD = (
    select(_l.c.server_name, func.count(_lg.c.uuid))
    .select_from(_l.join(_lg, _lg.c.lease_id == _l.c.id))
    .where(_l.c.user_name == bindparam("user"), _l.c.ended_at.is_(None))
    .group_by(_l.c.server_name)
)
_WAITERS = select(_w).order_by(_w.c.id)
_HEARTBEAT = update(_w).where(_w.c.id == bindparam("wid")).values(heartbeat_at=bindparam("now"))
_DELETE_WAITER = delete(_w).where(_w.c.id == bindparam("wid"))
_INSERT_WAITER = insert(_w)
_INSERT_LEASE = insert(_l)
_INSERT_LEASE_GPUS = insert(_lg)
_END_LEASE = (
    update(_l)
    .where(_l.c.id == bindparam("lid"), _l.c.ended_at.is_(None))
    .values(ended_at=bindparam("now"), end_reason=bindparam("reason"))
)
_END_LEASE_GPUS = (
    update(_lg).where(_lg.c.lease_id == bindparam("lid"), _lg.c.ended_at.is_(None)).values(ended_at=bindparam("now"))
)
_PG_LOCK = select(func.pg_advisory_xact_lock(PG_LOCK_KEY))


@dataclass(frozen=True)
class _Hot:
    """A hot-path statement: Core for any backend, the same SQL by hand for SQLite.

    On SQLite the hand-written SQL runs on the driver's connection: it costs
    a fifth of going through SQLAlchemy's execution machinery, which is most
    of a lease's cost.  Both forms take the same named parameters.
    """

    core: Any
    sqlite: str


_H_SNAPSHOT = _Hot(
    _SNAPSHOT,
    "SELECT g.host, g.uuid, g.idx, g.present, g.drained, lg.lease_id FROM gpu_pool_gpus AS g "
    "LEFT OUTER JOIN gpu_pool_lease_gpus AS lg "
    "ON lg.host = g.host AND lg.uuid = g.uuid AND lg.ended_at IS NULL",
)
_H_HELD = _Hot(
    _HELD,
    "SELECT l.server_name, count(lg.uuid) FROM gpu_pool_leases AS l "
    "JOIN gpu_pool_lease_gpus AS lg ON lg.lease_id = l.id "
    "WHERE l.user_name = :user AND l.ended_at IS NULL GROUP BY l.server_name",
)
_H_WAITERS = _Hot(
    select(_w.c.id, _w.c.user_name, _w.c.count, _w.c.hosts, _w.c.enqueued_at, _w.c.heartbeat_at).order_by(_w.c.id),
    "SELECT id, user_name, count, hosts, enqueued_at, heartbeat_at FROM gpu_pool_waiters ORDER BY id",
)
_H_HEARTBEAT = _Hot(_HEARTBEAT, "UPDATE gpu_pool_waiters SET heartbeat_at = :now WHERE id = :wid")
_H_DELETE_WAITER = _Hot(_DELETE_WAITER, "DELETE FROM gpu_pool_waiters WHERE id = :wid")
_H_INSERT_WAITER = _Hot(
    _INSERT_WAITER,
    "INSERT INTO gpu_pool_waiters (owner, user_name, server_name, count, groups, hosts, enqueued_at, heartbeat_at) "
    "VALUES (:owner, :user_name, :server_name, :count, :groups, :hosts, :enqueued_at, :heartbeat_at)",
)
_H_INSERT_LEASE = _Hot(
    _INSERT_LEASE,
    "INSERT INTO gpu_pool_leases (user_name, server_name, host, groups, started_at) "
    "VALUES (:user_name, :server_name, :host, :groups, :started_at)",
)
_H_INSERT_LEASE_GPUS = _Hot(
    _INSERT_LEASE_GPUS,
    "INSERT INTO gpu_pool_lease_gpus (lease_id, uuid, host, position) VALUES (:lease_id, :uuid, :host, :position)",
)
_H_END_LEASE = _Hot(
    _END_LEASE,
    "UPDATE gpu_pool_leases SET ended_at = :now, end_reason = :reason WHERE id = :lid AND ended_at IS NULL",
)
_H_END_LEASE_GPUS = _Hot(
    _END_LEASE_GPUS, "UPDATE gpu_pool_lease_gpus SET ended_at = :now WHERE lease_id = :lid AND ended_at IS NULL"
)


def _sqlite_param(value):
    # The storage format of SQLAlchemy's SQLite DateTime, so Core reads these back.
    if isinstance(value, datetime):
        return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S.%f")
    return value


def _utc(value) -> datetime:
    if isinstance(value, str):
        return datetime.fromisoformat(value).replace(tzinfo=UTC)
    return value
# Same lock, and no wait for the commit's fsync: for writes whose loss in a
# server crash is harmless (a release, a queue heartbeat): the GPU would look
# lent until reconciled, never lent twice.
_PG_LOCK_LAX = select(func.pg_advisory_xact_lock(PG_LOCK_KEY), func.set_config("synchronous_commit", "off", True))


# --- internals ------------------------------------------------------------


@dataclass(frozen=True)
class _Request:
    user: str
    server_name: str
    count: int
    groups: tuple[str, ...]
    hosts: tuple[str, ...] | None


@dataclass
class _Outcome:
    lease: Lease | None
    waiter_id: int | None
    position: int
    free: int  # free (unlent, undrained) GPUs on the request's hosts
    total: int  # lendable GPUs on the request's hosts


@dataclass(frozen=True)
class _WaiterRow:
    id: int
    user: str
    count: int
    hosts: str | None
    enqueued_at: datetime
    heartbeat_at: datetime


@dataclass
class _Free:
    """Snapshot of the lendable GPUs, per host, inside one transaction."""

    free: dict[str, list[tuple[int, str]]]  # host -> [(index, uuid)] unlent, lendable
    capacity: dict[str, int]  # host -> lendable GPUs (present, undrained), lent or not
    drained: dict[str, int]


def _validate_name(value: Any, what: str, allow_empty: bool = False) -> str:
    if not isinstance(value, str):
        raise InvalidRequest(f"{what} must be a string, not {type(value).__name__}")
    if not value and not allow_empty:
        raise InvalidRequest(f"{what} must not be empty")
    if len(value) > NAME_MAX:
        raise InvalidRequest(f"{what} is longer than {NAME_MAX} characters")
    if any(ord(ch) < 32 for ch in value):
        raise InvalidRequest(f"{what} contains control characters")
    return value


def _validate_count(count: Any) -> int:
    if isinstance(count, bool) or not isinstance(count, int):
        raise InvalidRequest(f"The number of GPUs must be a whole number, not {count!r}")
    if count <= 0:
        raise InvalidRequest(f"The number of GPUs must be at least 1, not {count}")
    return count


def _validate_groups(groups: Any) -> tuple[str, ...]:
    if groups is None:
        return ()
    if isinstance(groups, str):
        raise InvalidRequest("groups must be a list of group names, not one string")
    try:
        items = list(groups)
    except TypeError:
        raise InvalidRequest("groups must be a list of group names") from None
    return tuple(sorted({_validate_name(g, "A group name") for g in items}))


def _reason(reason: EndReason | str) -> str:
    try:
        return EndReason(reason).value
    except ValueError:
        choices = ", ".join(r.value for r in EndReason)
        raise InvalidRequest(f"Unknown end reason {reason!r}; use one of {choices}") from None


class GPUPool(LoggingConfigurable):
    """The GPU lease ledger.  See the module docstring for the policy."""

    db_url = Unicode(
        "sqlite:///jupyterhub-gpu-pool.sqlite",
        config=True,
        help="""SQLAlchemy URL of the ledger database.

        The default is an SQLite file next to the hub's own database (in the
        directory the hub runs in; a `.lock` file sits beside it, and every
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

    poll_interval = Float(
        0.5,
        config=True,
        help="""Seconds between a waiting request's checks of the ledger.

        Waiters in the process that releases GPUs wake at once; this bounds
        how late a waiter notices GPUs released by another process (another
        hub, the CLI).  Each check also refreshes the waiter's heartbeat.
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
        well above `poll_interval`.
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

    @validate("lock_timeout", "connect_timeout", "poll_interval", "waiter_stale_after")
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
        self._engine: Engine | None = None
        self._init_lock = threading.Lock()
        self._distance_cache: dict[str, dict[str, dict[str, int]]] = {}
        self._neighbour_cache: dict[str, dict[str, tuple[set[str], list[tuple[int, str]]]]] = {}
        self._subscribers: set[tuple[asyncio.AbstractEventLoop, asyncio.Event]] = set()
        self._owner = f"{socket.gethostname()}:{os.getpid()}"[:NAME_MAX]
        self._lock_path: str | None = None  # SQLite: the side file of _host_lock
        self._lock_fd: int | None = None
        self._thread_lock = threading.Lock()
        self._fast_sqlite = False  # set when the engine is SQLite (see _Hot)

    # --- database plumbing ------------------------------------------------

    @property
    def safe_url(self) -> str:
        """The database URL with its password hidden."""
        try:
            return make_url(self.db_url).render_as_string(hide_password=True)
        except Exception:
            return "(unparsable URL)"

    @property
    def is_sqlite(self) -> bool:
        return make_url(self.db_url).get_backend_name() == "sqlite"

    def _make_engine(self) -> Engine:
        url = make_url(self.db_url)
        if url.get_backend_name() == "sqlite":
            memory = url.database in (None, "", ":memory:")
            self._fast_sqlite = True
            self._lock_path = None if memory else os.path.abspath(url.database) + ".lock"
            kwargs: dict[str, Any] = {
                # The busy timeout: how long BEGIN IMMEDIATE waits for the lock.
                "connect_args": {"timeout": self.lock_timeout, "check_same_thread": False},
            }
            if memory:
                kwargs["poolclass"] = StaticPool
            engine = create_engine(url, **kwargs)

            @event.listens_for(engine, "connect")
            def _on_connect(dbapi_conn, _record):
                # Let SQLAlchemy's "begin" event issue BEGIN itself (pysqlite's
                # own transaction handling would defer the lock).
                dbapi_conn.isolation_level = None
                cur = dbapi_conn.cursor()
                if not memory:
                    # WAL: readers never block the writer; NORMAL sync is
                    # durable against process crashes (power loss may lose
                    # the last commits, never corrupt the file).
                    cur.execute("PRAGMA journal_mode=WAL")
                    cur.execute("PRAGMA synchronous=NORMAL")
                cur.execute("PRAGMA foreign_keys=ON")
                cur.close()

            @event.listens_for(engine, "begin")
            def _on_begin(conn):
                # Writers take the write lock up front, so a transaction never
                # fails half-way on a lock upgrade.
                # (On the driver's connection: SQLAlchemy's execution
                # machinery would double the cost of a short transaction.)
                raw = conn.connection.driver_connection
                raw.execute("BEGIN IMMEDIATE" if conn.get_execution_options().get("gpu_pool_write") else "BEGIN")

            return engine
        connect_args = {
            "connect_timeout": max(1, math.ceil(self.connect_timeout)),
            # Bounds the wait for the advisory lock (and any row lock).
            "options": f"-c lock_timeout={int(self.lock_timeout * 1000)}",
        }
        return create_engine(url, connect_args=connect_args)

    def _unavailable(self, error: Exception) -> PoolUnavailable:
        orig = getattr(error, "orig", None) or error
        message = str(orig).strip().splitlines()[0] if str(orig).strip() else type(orig).__name__
        password = None
        try:
            password = make_url(self.db_url).password
        except Exception:
            pass
        if password:
            message = message.replace(str(password), "***")
        sqlstate = getattr(orig, "sqlstate", None) or getattr(orig, "pgcode", None)
        if "database is locked" in message or sqlstate == "55P03":
            return self._locked()
        return PoolUnavailable(f"The GPU ledger database {self.safe_url} is unavailable: {message}")

    @contextmanager
    def _guard(self):
        """Turn database failures into PoolUnavailable (IntegrityError passes: callers retry)."""
        try:
            yield
        except (PoolError, sa_exc.IntegrityError, sqlite3.IntegrityError):
            raise
        except sa_exc.DBAPIError as e:
            raise self._unavailable(e) from e
        except (sa_exc.SQLAlchemyError, sqlite3.Error) as e:  # sqlite3: our raw BEGIN
            raise self._unavailable(e) from e
        except InventoryError as e:
            raise PoolUnavailable(f"Cannot read this host's GPUs: {e}") from e

    def _engine_ready(self) -> Engine:
        if self._engine is not None:
            return self._engine
        with self._init_lock:
            if self._engine is None:
                with self._guard():
                    engine = self._make_engine()
                    self._transact(engine, self._create_schema, write=True)
                    if self.inventory is not None:
                        self._transact(engine, self._sync_inventory, self.inventory.gpus(), write=True)
                self._engine = engine
        return self._engine

    def _create_schema(self, conn) -> None:
        metadata.create_all(conn)
        version = conn.execute(select(meta_table.c.value).where(meta_table.c.key == "schema_version")).scalar()
        if version is None:
            conn.execute(insert(meta_table).values(key="schema_version", value=str(SCHEMA_VERSION)))
        elif int(version) < 2:
            # 1 -> 2: a column that ledgers made by 0.1 lack.
            conn.execute(text("ALTER TABLE gpu_pool_leases ADD COLUMN problem TEXT"))
            conn.execute(update(meta_table).where(meta_table.c.key == "schema_version").values(value="2"))
        elif int(version) > SCHEMA_VERSION:
            raise PoolUnavailable(
                f"The GPU ledger has schema version {version}, newer than this code understands "
                f"({SCHEMA_VERSION}); upgrade jupyterhub-gpuspawner"
            )

    @contextmanager
    def _host_lock(self):
        """For an SQLite file: a kernel lock on a side file, taken before BEGIN IMMEDIATE.

        SQLite's own busy handler sleeps 1, 2, 5, 10, 25... ms between tries,
        which puts tens of milliseconds into the tail latency when several hub
        processes write at once.  This lock hands over within a millisecond.
        Threads of one process queue on a thread lock first (flock does not
        exclude threads sharing a file description).
        """
        if self._lock_path is None:
            yield
            return
        deadline = time.monotonic() + self.lock_timeout
        if not self._thread_lock.acquire(timeout=self.lock_timeout):
            raise self._locked()
        try:
            if self._lock_fd is None:
                try:
                    self._lock_fd = os.open(self._lock_path, os.O_RDWR | os.O_CREAT, 0o600)
                except OSError as e:
                    raise PoolUnavailable(f"The GPU ledger database {self.safe_url} is unavailable: {e}") from e
            delay = 0.0001
            while True:
                try:
                    fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() > deadline:
                        raise self._locked() from None
                    time.sleep(delay)
                    delay = min(delay * 2, 0.001)
            try:
                yield
            finally:
                fcntl.flock(self._lock_fd, fcntl.LOCK_UN)
        finally:
            self._thread_lock.release()

    def _locked(self) -> PoolUnavailable:
        return PoolUnavailable(
            f"The GPU ledger stayed locked for more than {self.lock_timeout:g} s "
            "(another process holds it); try again in a moment"
        )

    def _transact(self, engine: Engine, fn: Callable, *args, write: bool, durable: bool = True):
        """Run fn(conn, *args) in one transaction; writes hold the ledger's lock.

        durable=False lets PostgreSQL skip waiting for the commit's fsync; only
        for writes that are safe to lose in a server crash.
        """
        reconnected = False
        for attempt in range(INTEGRITY_RETRIES):
            try:
                with self._guard(), _Reconnect(reconnected), (self._host_lock() if write else _nothing()), \
                        engine.connect() as conn:
                    if write:
                        conn.execution_options(gpu_pool_write=True)
                    with conn.begin():
                        if write and engine.dialect.name == "postgresql":
                            conn.execute(_PG_LOCK if durable else _PG_LOCK_LAX)
                        return fn(conn, *args)
            except _Reconnect.Retry:
                # A pooled connection had died (server restart): the
                # transaction rolled back with it, so running it again on a
                # fresh connection is safe.  Once.
                reconnected = True
            except (sa_exc.IntegrityError, sqlite3.IntegrityError) as e:
                # Only something that bypassed the lock gets here (the unique
                # index caught it): re-read the ledger and decide again.
                self.log.warning("GPU ledger write conflicted (%s); retrying", type(getattr(e, "orig", e)).__name__)
                time.sleep(0.01 * (attempt + 1))
        raise PoolUnavailable("The GPU ledger kept changing under this request; try again")

    def _write(self, fn: Callable, *args, durable: bool = True):
        return self._transact(self._engine_ready(), fn, *args, write=True, durable=durable)

    def _read(self, fn: Callable, *args):
        return self._transact(self._engine_ready(), fn, *args, write=False)

    def _raw(self, conn):
        """The sqlite3 connection under `conn` when the hand-written SQL may run on it."""
        return conn.connection.driver_connection if self._fast_sqlite else None

    def _rows(self, conn, hot: _Hot, params: dict | None = None) -> list:
        raw = self._raw(conn)
        if raw is not None:
            return raw.execute(hot.sqlite, {k: _sqlite_param(v) for k, v in (params or {}).items()}).fetchall()
        return conn.execute(hot.core, params or {}).all()

    def _run(self, conn, hot: _Hot, params: dict | list[dict]) -> int:
        """Execute a write; returns the new row id (INSERT) or the rows changed."""
        raw = self._raw(conn)
        if raw is not None:
            if isinstance(params, list):
                raw.executemany(hot.sqlite, [{k: _sqlite_param(v) for k, v in p.items()} for p in params])
                return len(params)
            cur = raw.execute(hot.sqlite, {k: _sqlite_param(v) for k, v in params.items()})
            return cur.lastrowid if hot.sqlite.startswith("INSERT") else cur.rowcount
        result = conn.execute(hot.core, params)
        if isinstance(params, dict) and hot.sqlite.startswith("INSERT"):
            return result.inserted_primary_key[0]
        return result.rowcount

    def close(self) -> None:
        """Close the database connections."""
        if self._engine is not None:
            self._engine.dispose()
            self._engine = None
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    # --- in-process wake-ups ----------------------------------------------

    def _notify(self) -> None:
        """Wake this process's waiters: GPUs were freed or the queue changed."""
        for loop, event_ in list(self._subscribers):
            try:
                loop.call_soon_threadsafe(event_.set)
            except RuntimeError:  # the loop is closed
                self._subscribers.discard((loop, event_))

    # --- inventory --------------------------------------------------------

    def sync_inventory(self) -> None:
        """Record the inventory's GPUs in the ledger.

        GPUs of the inventory's host that it no longer lists are marked
        missing and are not lent again (their active leases stay until they
        end).  Drain flags survive.
        """
        if self.inventory is None:
            return
        with self._guard():
            units = self.inventory.gpus()
        self._write(self._sync_inventory, units)
        self._distance_cache.clear()
        self._neighbour_cache.clear()
        self._notify()

    def _sync_inventory(self, conn, units: list[GPU]) -> None:
        now = datetime.now(UTC)
        hosts = {self.inventory.host} | {g.host for g in units}
        existing = {
            (r.host, r.uuid)
            for r in conn.execute(
                select(gpus_table.c.host, gpus_table.c.uuid).where(gpus_table.c.host.in_(hosts))
            )
        }
        for g in units:
            values = dict(
                idx=g.index,
                name=g.name[:NAME_MAX],
                memory_mib=g.memory_mib,
                parent_uuid=g.parent_uuid,
                pci_bus_id=g.pci_bus_id,
                present=True,
                seen_at=now,
            )
            if (g.host, g.uuid) in existing:
                conn.execute(
                    update(gpus_table)
                    .where(gpus_table.c.host == g.host, gpus_table.c.uuid == g.uuid)
                    .values(**values)
                )
            else:
                conn.execute(insert(gpus_table).values(host=g.host, uuid=g.uuid, drained=False, **values))
        gone = existing - {(g.host, g.uuid) for g in units}
        for host, uuid in gone:
            self.log.warning("GPU %s on %s is gone from the inventory; it will not be lent", uuid, host)
            conn.execute(
                update(gpus_table).where(gpus_table.c.host == host, gpus_table.c.uuid == uuid).values(present=False)
            )

    # --- policy helpers ---------------------------------------------------

    def limit_for(self, groups: Iterable[str] = ()) -> tuple[int | None, str]:
        """(limit, where it comes from) for a user in `groups`; None = no limit."""
        limits = {g: self.group_gpu_limits[g] for g in groups if g in self.group_gpu_limits}
        if not limits:
            return self.max_gpus_per_user, "the per-user limit"
        if any(v is None for v in limits.values()):
            return None, "group limits"
        group = max(limits, key=lambda g: (limits[g], g))
        return limits[group], f"the limit of group '{group}'"

    def _distance(self, host: str, a: str, b: str) -> int:
        """Topology distance of two GPUs of `host` (cached: NVML calls are slow)."""
        row = self._distance_cache.setdefault(host, {}).setdefault(a, {})
        d = row.get(b)
        if d is None:
            if a == b:
                d = 0
            elif self.inventory is not None and self.inventory.host == host:
                try:
                    d = int(self.inventory.distance(a, b))
                except Exception as e:  # topology is a preference, never a failure
                    self.log.debug("No topology for %s/%s: %s", a, b, e)
                    d = TOPOLOGY_SYSTEM
            else:
                d = TOPOLOGY_SYSTEM  # another host's topology is unknown here
            row[b] = d
            self._distance_cache[host].setdefault(b, {})[a] = d
        return d

    def _neighbours(self, host: str, uuid: str, free_set: set[str]) -> list[tuple[int, str]]:
        """Other GPUs of `host`, nearest first (cached; extended as GPUs appear)."""
        cache = self._neighbour_cache.setdefault(host, {})
        entry = cache.get(uuid)
        if entry is None or not free_set <= entry[0]:
            known = (entry[0] if entry else set()) | free_set | {uuid}
            others = sorted((self._distance(host, uuid, o), o) for o in known if o != uuid)
            entry = cache[uuid] = (known, others)
        return entry[1]

    def _pick_on_host(self, host: str, free: list[tuple[int, str]], count: int) -> list[str]:
        """The `count` GPUs of `free` (sorted by index) to lend together."""
        if count == len(free):
            return [u for _, u in free]
        dist = self._distance
        if count == 1:
            # Take the most isolated GPU, keeping close pairs free for
            # multi-GPU requests; ties go to the lowest index.
            free_set = {u for _, u in free}
            best_uuid, best_near = None, -1
            for _, uuid in free:
                near = next(d for d, other in self._neighbours(host, uuid, free_set) if other in free_set)
                if near > best_near:
                    best_uuid, best_near = uuid, near
            return [best_uuid]
        best = None
        for seed in free:
            chosen = [seed]
            rest = [f for f in free if f is not seed]
            while len(chosen) < count:
                nxt = min(rest, key=lambda f: (sum(dist(host, f[1], c[1]) for c in chosen), f[0]))
                chosen.append(nxt)
                rest.remove(nxt)
            pairs = [dist(host, x[1], y[1]) for i, x in enumerate(chosen) for y in chosen[i + 1 :]]
            score = (max(pairs), sum(pairs), sorted(i for i, _ in chosen))
            if best is None or score < best[0]:
                best = (score, chosen)
        return [u for _, u in sorted(best[1])]

    def _choose(self, free: dict[str, list[tuple[int, str]]], hosts, count: int) -> tuple[str, list[str]] | None:
        """Pick a host and GPUs for `count` from `free`; None if none fits."""
        fitting = [h for h in (hosts if hosts is not None else free) if len(free.get(h, ())) >= count]
        if not fitting:
            return None
        # Best fit: the host with the fewest free GPUs that still fits.
        host = min(fitting, key=lambda h: (len(free[h]), h))
        return host, self._pick_on_host(host, free[host], count)

    # --- the grant transaction --------------------------------------------

    def _snapshot(self, conn) -> _Free:
        rows = self._rows(conn, _H_SNAPSHOT)
        snap = _Free({}, {}, {})
        for host, uuid, idx, present, drained, lease_id in rows:
            snap.free.setdefault(host, [])
            snap.capacity.setdefault(host, 0)
            snap.drained.setdefault(host, 0)
            if drained:
                snap.drained[host] += 1
            elif present:
                snap.capacity[host] += 1
                if lease_id is None:
                    snap.free[host].append((idx, uuid))
        for lst in snap.free.values():
            lst.sort()
        return snap

    def _held(self, conn, user: str) -> tuple[int, list[str]]:
        rows = self._rows(conn, _H_HELD, {"user": user})
        return sum(n for _, n in rows), sorted(s for s, _ in rows)

    def _check_feasible(self, snap: _Free, req: _Request) -> None:
        hosts = req.hosts if req.hosts is not None else list(snap.capacity)
        capacity = max((snap.capacity.get(h, 0) for h in hosts), default=0)
        if req.count <= capacity:
            return
        drained = max((snap.drained.get(h, 0) for h in hosts), default=0)
        if capacity == 0 and not drained:
            where = f"host {req.hosts[0]}" if req.hosts and len(req.hosts) == 1 else "this hub"
            raise Unsatisfiable(f"You asked for {_gpus(req.count)}, but {where} has no GPUs to lend")
        note = f" ({drained} more drained for maintenance)" if drained else ""
        raise Unsatisfiable(
            f"You asked for {_gpus(req.count)}, but the largest host has {_gpus(capacity)}{note}; "
            f"ask for {capacity} or fewer"
        )

    def _check_quota(self, conn, req: _Request) -> None:
        limit, source = self.limit_for(req.groups)
        if limit is None:
            return
        if req.count > limit:
            raise QuotaExceeded(
                f"You may hold at most {_gpus(limit)} ({source}) and asked for {req.count}"
            )
        held, servers = self._held(conn, req.user)
        if held + req.count > limit:
            names = ", ".join(repr(s) if s else "the default server" for s in servers)
            raise QuotaExceeded(
                f"You may hold at most {_gpus(limit)} ({source}); you hold {held} "
                f"(servers: {names}) and asked for {req.count} more. Stop a server to free GPUs"
            )

    def _attempt(self, conn, req: _Request, waiter_id: int | None, enqueue: bool) -> _Outcome:
        now = datetime.now(UTC)  # taken under the lock: lease times are ordered
        snap = self._snapshot(conn)
        self._check_feasible(snap, req)
        self._check_quota(conn, req)

        w = waiters_table
        rows = [
            _WaiterRow(id_, user, count, hosts, _utc(enqueued), _utc(beat))
            for id_, user, count, hosts, enqueued, beat in self._rows(conn, _H_WAITERS)
        ]
        stale_before = now - timedelta(seconds=self.waiter_stale_after)
        stale = [r.id for r in rows if r.heartbeat_at < stale_before and r.id != waiter_id]
        if stale:
            self.log.info("Removing %d stale GPU waiter(s) of dead processes", len(stale))
            conn.execute(delete(w).where(w.c.id.in_(stale)))
        live = [r for r in rows if r.id not in stale]
        if waiter_id is not None and not any(r.id == waiter_id for r in live):
            # Our row is gone (we missed heartbeats and someone cleaned up):
            # queue again at the end.
            waiter_id, enqueue = None, True
        ahead = [r for r in live if waiter_id is None or r.id < waiter_id]

        avail = {h: list(lst) for h, lst in snap.free.items()}
        window = timedelta(seconds=self.backfill_window)
        for r in ahead:
            hosts = json.loads(r.hosts) if r.hosts else None
            pick = self._choose(avail, hosts, r.count)
            if pick is not None:
                # An earlier waiter fits: those GPUs are its, not ours.
                host, uuids = pick
                avail[host] = [f for f in avail[host] if f[1] not in uuids]
                continue
            cap = max((snap.capacity.get(h, 0) for h in (hosts or snap.capacity)), default=0)
            if r.count <= cap and now - r.enqueued_at >= window:
                # Waited past the backfill window: hold its hosts' free GPUs for it.
                for h in hosts or list(avail):
                    avail[h] = []

        hosts = req.hosts if req.hosts is not None else list(snap.capacity)
        free = sum(len(snap.free.get(h, ())) for h in hosts)
        total = sum(snap.capacity.get(h, 0) for h in hosts)
        pick = self._choose(avail, req.hosts, req.count)
        if pick is None:
            if waiter_id is not None:
                self._run(conn, _H_HEARTBEAT, {"wid": waiter_id, "now": now})
            elif enqueue:
                waiter_id = self._run(
                    conn,
                    _H_INSERT_WAITER,
                    dict(
                        owner=self._owner,
                        user_name=req.user,
                        server_name=req.server_name,
                        count=req.count,
                        groups=json.dumps(list(req.groups)),
                        hosts=json.dumps(list(req.hosts)) if req.hosts is not None else None,
                        enqueued_at=now,
                        heartbeat_at=now,
                    ),
                )
            return _Outcome(None, waiter_id, len(ahead) + 1, free, total)

        host, uuids = pick
        lease_id = self._run(
            conn,
            _H_INSERT_LEASE,
            dict(
                user_name=req.user,
                server_name=req.server_name,
                host=host,
                groups=json.dumps(list(req.groups)),
                started_at=now,
            ),
        )
        self._run(
            conn,
            _H_INSERT_LEASE_GPUS,
            [{"lease_id": lease_id, "uuid": u, "host": host, "position": i} for i, u in enumerate(uuids)],
        )
        if waiter_id is not None:
            self._run(conn, _H_DELETE_WAITER, {"wid": waiter_id})
        lease = Lease(lease_id, req.user, req.server_name, host, tuple(uuids), req.groups, now)
        return _Outcome(lease, None, 0, free - len(uuids), total)

    def _make_request(self, user, server_name, count, groups, host) -> _Request:
        hosts = None
        if host is not None:
            hosts = (_validate_name(host, "The host name"),)
        elif self.inventory is not None:
            hosts = (self.inventory.host,)
        return _Request(
            user=_validate_name(user, "The user name"),
            server_name=_validate_name(server_name, "The server name", allow_empty=True),
            count=_validate_count(count),
            groups=_validate_groups(groups),
            hosts=hosts,
        )

    # --- acquiring ----------------------------------------------------------

    def check_request(
        self, user: str, count: int, groups: Iterable[str] = (), host: str | None = None, server_name: str = ""
    ) -> None:
        """Refuse up front a request that can never be met: bad input, too big, over quota.

        Takes no lease and joins no queue.  Raises InvalidRequest,
        Unsatisfiable, QuotaExceeded or PoolUnavailable; returns None when the
        request could be met now or after a wait.
        """
        req = self._make_request(user, server_name, count, groups, host)

        def run(conn):
            self._check_feasible(self._snapshot(conn), req)
            self._check_quota(conn, req)

        self._read(run)

    def try_acquire(
        self, user: str, server_name: str, count: int, groups: Iterable[str] = (), host: str | None = None
    ) -> Lease | None:
        """Lend `count` GPUs of one host now, in one transaction, or return None.

        Waiting requests keep their turn: this only succeeds when the queue
        policy would let a newly arrived request through.  `host` restricts
        the choice to one host (default: the inventory's host, or any host
        when the pool has no inventory).  Raises InvalidRequest,
        Unsatisfiable, QuotaExceeded, PoolUnavailable.
        """
        req = self._make_request(user, server_name, count, groups, host)
        outcome = self._write(self._attempt, req, None, False)
        return outcome.lease

    async def acquire(
        self,
        user: str,
        server_name: str,
        count: int,
        groups: Iterable[str] = (),
        timeout: float = 60.0,
        on_wait: Callable[[int, int, int], Any] | None = None,
        host: str | None = None,
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
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        wake = asyncio.Event()
        sub = (loop, wake)
        self._subscribers.add(sub)
        waiter_id: int | None = None
        position = 0
        started = loop.time()
        try:
            while True:
                wake.clear()
                outcome = await self._run_attempt(req, waiter_id, enqueue=loop.time() < deadline)
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
                    raise WaitTimeout(self._timeout_message(req, outcome, timeout), position=outcome.position)
                # Not asyncio.wait_for: on Python 3.11 it swallows a
                # cancellation that lands as the event fires.
                woken = asyncio.ensure_future(wake.wait())
                try:
                    await asyncio.wait({woken}, timeout=min(self.poll_interval, remaining))
                finally:
                    woken.cancel()
        except BaseException:
            if waiter_id is not None:
                await self._uncancellable_quiet(self._remove_waiter, waiter_id)
            raise
        finally:
            self._subscribers.discard(sub)

    async def _call_on_wait(self, on_wait, position: int, wanted: int, free: int) -> None:
        try:
            result = on_wait(position, wanted, free)
            if inspect.isawaitable(result):
                await result
        except asyncio.CancelledError:
            raise
        except Exception:
            self.log.exception("GPU queue progress callback failed")

    async def _uncancellable(self, fn: Callable, *args):
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

    async def _run_attempt(self, req: _Request, waiter_id: int | None, enqueue: bool) -> _Outcome:
        try:
            return await self._uncancellable(self._write, self._attempt, req, waiter_id, enqueue)
        except _CancelledAfter as c:
            outcome: _Outcome = c.result
            # The caller went away while the grant ran: undo it.
            if outcome.lease is not None:
                await self._uncancellable_quiet(self._undo_lease, outcome.lease.id)
            elif outcome.waiter_id is not None and outcome.waiter_id != waiter_id:
                await self._uncancellable_quiet(self._remove_waiter, outcome.waiter_id)
            raise asyncio.CancelledError() from None

    async def _uncancellable_quiet(self, fn: Callable, *args) -> None:
        try:
            await self._uncancellable(fn, *args)
        except _CancelledAfter:
            pass

    def _remove_waiter(self, waiter_id: int) -> None:
        self._write(lambda conn: conn.execute(_DELETE_WAITER, {"wid": waiter_id}), durable=False)
        self._notify()  # the queue moved

    def _undo_lease(self, lease_id: int) -> None:
        """Erase a lease nobody ever saw (its acquire was cancelled)."""

        def undo(conn):
            conn.execute(delete(lease_gpus_table).where(lease_gpus_table.c.lease_id == lease_id))
            conn.execute(delete(leases_table).where(leases_table.c.id == lease_id))

        self._write(undo)
        self._notify()

    def _timeout_message(self, req: _Request, outcome: _Outcome, timeout: float) -> str:
        where = f"you were {ordinal(outcome.position)} in the queue for {_gpus(req.count)}"
        if outcome.free == 0:
            head = f"All {_gpus(outcome.total)} are lent" if outcome.total != 1 else "The only GPU is lent"
        elif outcome.free < req.count:
            head = f"Only {outcome.free} of {_gpus(outcome.total)} are free"
        else:
            head = f"{_gpus(outcome.free)} are free but held for requests ahead of yours"
        return f"{head}; {where} and waited {timeout:g} s; try again later"

    # --- releasing and admin ------------------------------------------------

    def release(self, lease_id: int, reason: EndReason | str = EndReason.STOPPED) -> bool:
        """End a lease.  Idempotent: False if it had already ended (or never existed)."""
        if isinstance(lease_id, bool) or not isinstance(lease_id, int):
            raise InvalidRequest(f"A lease id is a whole number, not {lease_id!r}")
        reason = _reason(reason)

        def end(conn):
            now = datetime.now(UTC)
            done = self._run(conn, _H_END_LEASE, {"lid": lease_id, "now": now, "reason": reason})
            if done:
                self._run(conn, _H_END_LEASE_GPUS, {"lid": lease_id, "now": now})
            return bool(done)

        ended = self._write(end, durable=False)
        if ended:
            self._notify()
        return ended

    def set_problem(self, lease_id: int, problem: str) -> bool:
        """Note why an active lease stays lent after its server ended (shown by `gpu-pool status`)."""
        if isinstance(lease_id, bool) or not isinstance(lease_id, int):
            raise InvalidRequest(f"A lease id is a whole number, not {lease_id!r}")
        problem = str(problem)[:500]
        return bool(self._write(lambda conn: conn.execute(
            update(leases_table).where(leases_table.c.id == lease_id, leases_table.c.ended_at.is_(None))
            .values(problem=problem)).rowcount))

    def _end_leases(self, conn, ids: list[int], reason: str, now: datetime) -> None:
        conn.execute(
            update(leases_table)
            .where(leases_table.c.id.in_(ids), leases_table.c.ended_at.is_(None))
            .values(ended_at=now, end_reason=reason)
        )
        conn.execute(
            update(lease_gpus_table)
            .where(lease_gpus_table.c.lease_id.in_(ids), lease_gpus_table.c.ended_at.is_(None))
            .values(ended_at=now)
        )

    def reconcile(self, host: str, live_lease_ids: Iterable[int]) -> list[Lease]:
        """End the active leases of `host` whose ids are not in `live_lease_ids`.

        The hub calls this at start with the lease ids of the containers it
        found running; leases without a container end with reason
        'reconciled'.  Returns the leases ended.
        """
        host = _validate_name(host, "The host name")
        try:
            live = {int(i) for i in live_lease_ids}
        except (TypeError, ValueError):
            raise InvalidRequest("live_lease_ids must be lease ids (whole numbers)") from None

        def run(conn):
            now = datetime.now(UTC)
            active = self._load_leases(conn, (leases_table.c.host == host) & leases_table.c.ended_at.is_(None))
            gone = [l for l in active if l.id not in live]
            if gone:
                self._end_leases(conn, [l.id for l in gone], EndReason.RECONCILED.value, now)
            return [replace(l, ended_at=now, end_reason=EndReason.RECONCILED.value) for l in gone]

        ended = self._write(run)
        for l in ended:
            self.log.warning(
                "Ended GPU lease %d of %s/%s on %s: no container holds it", l.id, l.user, l.server_name, host
            )
        if ended:
            self._notify()
        return ended

    def _find_gpu(self, conn, uuid: str, host: str | None):
        uuid = _validate_name(uuid, "The GPU uuid")
        q = select(gpus_table).where(gpus_table.c.uuid == uuid)
        if host is not None:
            q = q.where(gpus_table.c.host == _validate_name(host, "The host name"))
        rows = conn.execute(q).all()
        if not rows:
            on = f" on host {host}" if host is not None else ""
            raise UnknownGPU(f"No GPU {uuid}{on} in the ledger; `gpu-pool status` lists the GPUs")
        if len(rows) > 1:
            hosts = ", ".join(sorted(r.host for r in rows))
            raise InvalidRequest(f"GPU {uuid} is listed on several hosts ({hosts}); name the host")
        return rows[0]

    def _set_drained(self, uuid: str, host: str | None, drained: bool) -> GPUStatus:
        def run(conn):
            row = self._find_gpu(conn, uuid, host)
            if bool(row.drained) != drained:
                conn.execute(
                    update(gpus_table)
                    .where(gpus_table.c.host == row.host, gpus_table.c.uuid == row.uuid)
                    .values(drained=drained, drained_at=datetime.now(UTC) if drained else None)
                )
            return row.host, row.uuid

        gpu_host, gpu_uuid = self._write(run)
        if not drained:
            self._notify()
        return next(s for s in self.gpus() if s.gpu.host == gpu_host and s.gpu.uuid == gpu_uuid)

    def drain(self, uuid: str, host: str | None = None) -> GPUStatus:
        """Stop lending a GPU (for maintenance).  Its current lease, if any, runs on."""
        status = self._set_drained(uuid, host, True)
        self.log.info("Drained GPU %s on %s", status.gpu.uuid, status.gpu.host)
        return status

    def undrain(self, uuid: str, host: str | None = None) -> GPUStatus:
        """Lend a drained GPU again."""
        status = self._set_drained(uuid, host, False)
        self.log.info("Undrained GPU %s on %s", status.gpu.uuid, status.gpu.host)
        return status

    # --- reading ------------------------------------------------------------

    def _load_leases(self, conn, where, order=None) -> list[Lease]:
        l, lg = leases_table, lease_gpus_table
        q = (
            select(l, lg.c.uuid)
            .select_from(l.outerjoin(lg, lg.c.lease_id == l.c.id))
            .where(where)
            .order_by(*(order or (l.c.id,)), lg.c.position)
        )
        leases: dict[int, Lease] = {}
        uuids: dict[int, list[str]] = {}
        for r in conn.execute(q):
            if r.id not in leases:
                leases[r.id] = Lease(
                    r.id,
                    r.user_name,
                    r.server_name,
                    r.host,
                    (),
                    tuple(json.loads(r.groups)),
                    r.started_at,
                    r.ended_at,
                    r.end_reason,
                    r.problem,
                )
                uuids[r.id] = []
            if r.uuid is not None:
                uuids[r.id].append(r.uuid)
        return [replace(lease, gpu_uuids=tuple(uuids[i])) for i, lease in leases.items()]

    def lease(self, lease_id: int) -> Lease | None:
        """The lease with this id (active or ended), or None."""
        if isinstance(lease_id, bool) or not isinstance(lease_id, int):
            raise InvalidRequest(f"A lease id is a whole number, not {lease_id!r}")
        found = self._read(lambda conn: self._load_leases(conn, leases_table.c.id == lease_id))
        return found[0] if found else None

    def leases(self, user: str | None = None, host: str | None = None) -> list[Lease]:
        """Active leases, oldest first, optionally of one user or host."""
        where = leases_table.c.ended_at.is_(None)
        if user is not None:
            where &= leases_table.c.user_name == _validate_name(user, "The user name")
        if host is not None:
            where &= leases_table.c.host == _validate_name(host, "The host name")
        return self._read(lambda conn: self._load_leases(conn, where))

    def history(
        self, user: str | None = None, since: datetime | None = None, until: datetime | None = None
    ) -> list[Lease]:
        """Leases (ended or active) that overlap [since, until), by start time."""
        since, until = _aware(since, "since"), _aware(until, "until")
        l = leases_table
        where = l.c.id.is_not(None)
        if user is not None:
            where &= l.c.user_name == _validate_name(user, "The user name")
        if until is not None:
            where &= l.c.started_at < until
        if since is not None:
            where &= l.c.ended_at.is_(None) | (l.c.ended_at > since)
        return self._read(lambda conn: self._load_leases(conn, where, order=(l.c.started_at, l.c.id)))

    def usage(self, since: datetime | None = None, until: datetime | None = None) -> dict:
        """GPU-hours inside [since, until): {"users": {user: h}, "groups": {group: h}}.

        Active leases count up to now.  A lease counts fully for each group
        its user was in when it started.
        """
        since, until = _aware(since, "since"), _aware(until, "until")
        users: dict[str, float] = {}
        groups: dict[str, float] = {}
        for lease in self.history(since=since, until=until):
            hours = lease.gpu_hours(since, until)
            users[lease.user] = users.get(lease.user, 0.0) + hours
            for g in lease.groups:
                groups[g] = groups.get(g, 0.0) + hours
        return {"users": users, "groups": groups}

    def gpus(self) -> list[GPUStatus]:
        """Every GPU in the ledger with its drain flag and holding lease, by host and index."""

        def run(conn):
            active = self._load_leases(conn, leases_table.c.ended_at.is_(None))
            holder = {(l.host, u): l for l in active for u in l.gpu_uuids}
            rows = conn.execute(select(gpus_table).order_by(gpus_table.c.host, gpus_table.c.idx, gpus_table.c.uuid))
            return [
                GPUStatus(
                    gpu=GPU(r.host, r.uuid, r.idx, r.name, r.memory_mib, r.parent_uuid, r.pci_bus_id),
                    drained=bool(r.drained),
                    lease=holder.get((r.host, r.uuid)),
                    present=bool(r.present),
                    drained_at=r.drained_at,
                )
                for r in rows
            ]

        return self._read(run)

    def counts(self) -> dict[str, int]:
        """{"free", "lent", "drained", "queued"} for metrics.

        free: lendable now; lent: in an active lease (drained or not);
        drained: drained and not lent; queued: live waiters.
        """

        def run(conn):
            stale_before = datetime.now(UTC) - timedelta(seconds=self.waiter_stale_after)
            queued = conn.execute(
                select(func.count()).select_from(waiters_table).where(waiters_table.c.heartbeat_at >= stale_before)
            ).scalar_one()
            return queued

        queued = self._read(run)
        counts = {"free": 0, "lent": 0, "drained": 0, "queued": queued}
        for s in self.gpus():
            if s.lease is not None:
                counts["lent"] += 1
            elif s.drained:
                counts["drained"] += 1
            elif s.present:
                counts["free"] += 1
        return counts

    def queue(self) -> list[Waiter]:
        """Live waiters, in queue order."""

        def run(conn):
            stale_before = datetime.now(UTC) - timedelta(seconds=self.waiter_stale_after)
            w = waiters_table
            return conn.execute(select(w).where(w.c.heartbeat_at >= stale_before).order_by(w.c.id)).all()

        return [
            Waiter(
                id=r.id,
                user=r.user_name,
                server_name=r.server_name,
                count=r.count,
                since=r.enqueued_at,
                position=i + 1,
                groups=tuple(json.loads(r.groups)),
                hosts=tuple(json.loads(r.hosts)) if r.hosts else None,
            )
            for i, r in enumerate(self._read(run))
        ]


@contextmanager
def _nothing():
    yield


class _Reconnect:
    """Turns the first 'connection was invalidated' error into Retry.

    Cheaper than pinging the server before every transaction
    (pool_pre_ping costs a round trip each time).
    """

    class Retry(Exception):
        pass

    def __init__(self, already: bool):
        self.already = already

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if not self.already and isinstance(exc, sa_exc.DBAPIError) and exc.connection_invalidated:
            raise self.Retry() from exc
        return False


class _CancelledAfter(Exception):
    """Internal: the caller was cancelled while a thread finished `result`."""

    def __init__(self, result):
        super().__init__("cancelled")
        self.result = result


def _aware(value: datetime | None, what: str) -> datetime | None:
    """Naive datetimes are taken as UTC."""
    if value is None:
        return None
    if not isinstance(value, datetime):
        raise InvalidRequest(f"{what} must be a datetime, not {value!r}")
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)
