"""The statements the ledger runs on every lease, built once from the tables.

One set of SQL: these Core statements run as they are on PostgreSQL, and the
store compiles each once to plain SQLite SQL for its fast path (store.py).
"""

from __future__ import annotations

from sqlalchemy import ColumnElement, bindparam, delete, false, func, insert, select, true, update

from .schema import gpus_table as _g
from .schema import lease_gpus_table as _lg
from .schema import leases_table as _l
from .schema import queue_log_table as _q
from .schema import waiters_table as _w

# Every GPU with the id of its active lease, if any.
SNAPSHOT = select(_g.c.host, _g.c.uuid, _g.c.idx, _g.c.present, _g.c.drained, _lg.c.lease_id).select_from(
    _g.outerjoin(_lg, (_lg.c.host == _g.c.host) & (_lg.c.uuid == _g.c.uuid) & _lg.c.ended_at.is_(None))
)

# GPUs a user holds within their share (borrowed leases are not counted by the quota), per server.
HELD = (
    select(_l.c.server_name, func.count(_lg.c.uuid))
    .select_from(_l.join(_lg, _lg.c.lease_id == _l.c.id))
    .where(_l.c.user_name == bindparam("user"), _l.c.ended_at.is_(None), _l.c.borrowed == false())
    .group_by(_l.c.server_name)
)

# A user's borrowed leases now: (server name, GPUs), one row per lease.
BORROWED = (
    select(_l.c.server_name, func.count(_lg.c.uuid))
    .select_from(_l.join(_lg, _lg.c.lease_id == _l.c.id))
    .where(_l.c.user_name == bindparam("user"), _l.c.ended_at.is_(None), _l.c.borrowed == true())
    .group_by(_l.c.id, _l.c.server_name)
)

# Whether any lease is borrowed now (one probe before a waiter looks for what to reclaim).
ANY_BORROWED = select(_l.c.id).where(_l.c.ended_at.is_(None), _l.c.borrowed == true())

WAITERS = select(_w.c.id, _w.c.user_name, _w.c.count, _w.c.hosts, _w.c.enqueued_at, _w.c.heartbeat_at).order_by(
    _w.c.id
)

# The queue as a grant needs it, in one scan, without the rows that cannot change its outcome:
# stale rows (heartbeat before :alive_since: to be removed), and live rows except those bound
# to one host that has no free GPU (their `hosts` JSON given as :full0, :full1, ...).  A long
# queue behind full hosts costs a scan in the database, not rows in Python.  One statement per
# number of such hosts, made once.
_WAITER_COLUMNS = (_w.c.id, _w.c.user_name, _w.c.count, _w.c.hosts, _w.c.enqueued_at, _w.c.heartbeat_at,
                   _w.c.workers, _w.c.groups, _w.c.beyond)
_waiters_that_matter: dict[int, object] = {}


def waiters_that_matter(full_hosts: int):
    stmt = _waiters_that_matter.get(full_hosts)
    if stmt is None:
        where: ColumnElement[bool] | None = None
        if full_hosts:
            where = (_w.c.heartbeat_at < bindparam("alive_since")) | _w.c.hosts.is_(None) | _w.c.hosts.not_in(
                [bindparam(f"full{i}") for i in range(full_hosts)])
        stmt = select(*_WAITER_COLUMNS)
        stmt = _waiters_that_matter[full_hosts] = (stmt.where(where) if where is not None else stmt).order_by(
            _w.c.enqueued_at, _w.c.id)
    return stmt


# The rows ahead in arrival order (serving_order.arrival: when each joined, then its id).
WAITERS_BEFORE = select(func.count()).select_from(_w).where(
    (_w.c.enqueued_at < bindparam("since")) | ((_w.c.enqueued_at == bindparam("since")) & (_w.c.id < bindparam("wid"))))

WAITER_EXISTS = select(_w.c.id).where(_w.c.id == bindparam("wid"))

STALE_WAITER_IDS = select(_w.c.id).where(_w.c.heartbeat_at < bindparam("alive_since"))

# What changes whenever the live queue does (ids only grow): (live rows, the newest id).
LIVE_WAITERS_SIGNATURE = select(func.count(), func.max(_w.c.id)).where(_w.c.heartbeat_at >= bindparam("alive_since"))

LIVE_WAITER_IDS = select(_w.c.id).where(_w.c.heartbeat_at >= bindparam("alive_since")).order_by(
    _w.c.enqueued_at, _w.c.id)

HEARTBEAT = update(_w).where(_w.c.id == bindparam("wid")).values(heartbeat_at=bindparam("now"))

DELETE_WAITER = delete(_w).where(_w.c.id == bindparam("wid"))


def _insert(table, *columns: str):
    """INSERT INTO table (columns) VALUES (:column, ...)."""
    return insert(table).values({c: bindparam(c) for c in columns})


INSERT_WAITER = _insert(
    _w, "owner", "user_name", "server_name", "count", "groups", "hosts", "enqueued_at", "heartbeat_at", "workers",
    "beyond",
)

INSERT_LEASE = _insert(_l, "user_name", "server_name", "host", "groups", "started_at", "borrowed")

INSERT_LEASE_GPU = _insert(_lg, "lease_id", "uuid", "host", "position")

END_LEASE = (
    update(_l)
    .where(_l.c.id == bindparam("lid"), _l.c.ended_at.is_(None))
    .values(ended_at=bindparam("now"), end_reason=bindparam("reason"))
)

END_LEASE_GPUS = (
    update(_lg).where(_lg.c.lease_id == bindparam("lid"), _lg.c.ended_at.is_(None)).values(ended_at=bindparam("now"))
)

# The queue's record: a row when a request joins, closed when it leaves.
INSERT_QUEUE_LOG = _insert(_q, "id", "user_name", "count", "enqueued_at")

CLOSE_QUEUE_LOG = (
    update(_q).where(_q.c.id == bindparam("wid"), _q.c.left_at.is_(None))
    .values(left_at=bindparam("now"), outcome=bindparam("outcome"))
)
