"""The queue's record rolled up per hour as requests leave: a long period's queue chart reads
one row per hour, however many requests waited in it.

When a request leaves the queue (served, gave up, or stale), in the transaction that closes its
gpu_pool_queue_log row, its time in the queue is added to each UTC hour it touched in
gpu_pool_queued_hours: request-seconds, and GPU-seconds asked (request-seconds times the GPUs it
asked for).  The chart reads those hours for the period and only the requests still waiting,
and those that left in the current hour, whole (timeline.py).
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import bindparam, insert, select, update

from ..ledger import statements as sql
from ..ledger.schema import queue_log_table as _q
from ..ledger.schema import queued_hours_table as _qh
from ..ledger.store import Store, as_utc
from .rollup import hours_of

OPEN_ROW = select(_q.c.enqueued_at, _q.c.count).where(_q.c.id == bindparam("wid"), _q.c.left_at.is_(None))
ADD = (update(_qh).where(_qh.c.hour == bindparam("w_at"))
       .values(request_seconds=_qh.c.request_seconds + bindparam("req"),
               gpu_seconds=_qh.c.gpu_seconds + bindparam("gpu")))
NEW = insert(_qh).values(hour=bindparam("w_at"), request_seconds=bindparam("req"), gpu_seconds=bindparam("gpu"))
BY_HOUR = select(_qh.c.hour, _qh.c.request_seconds, _qh.c.gpu_seconds).where(
    _qh.c.hour >= bindparam("first"), _qh.c.hour < bindparam("end"))


def _sums(spans) -> dict[datetime, list[float]]:
    """{hour: [request-seconds, GPU-seconds]} of (enqueued, left, GPUs asked) spans."""
    out: dict[datetime, list[float]] = {}
    for enqueued, left, count in spans:
        for hour, seconds in hours_of(enqueued, left, 1):
            acc = out.setdefault(hour, [0.0, 0.0])
            acc[0] += seconds
            acc[1] += seconds * count
    return out


def close(store: Store, conn, rows: list[dict]) -> None:
    """Close the queue-log rows of requests leaving now ({"wid", "now", "outcome"} each) and
    add their time in the queue to the hours (a row already closed adds nothing)."""
    spans = []
    for r in rows:
        found = store.rows(conn, OPEN_ROW, {"wid": r["wid"]})
        if found:
            spans.append((as_utc(found[0][0]), r["now"], found[0][1]))
    store.run(conn, sql.CLOSE_QUEUE_LOG, rows if len(rows) != 1 else rows[0])
    for at, (req, gpu) in _sums(spans).items():
        params = {"w_at": at, "req": req, "gpu": gpu}
        if not store.run(conn, ADD, params):
            store.run(conn, NEW, params)


def backfill(conn) -> None:
    """Upgrade (schema 11): the hours of every request that left before the rollup existed."""
    spans = ((r.enqueued_at, r.left_at, r.count) for r in conn.execute(
        select(_q.c.enqueued_at, _q.c.left_at, _q.c.count).where(_q.c.left_at.is_not(None))))
    rows = [{"hour": at, "request_seconds": req, "gpu_seconds": gpu} for at, (req, gpu) in sorted(_sums(spans).items())]
    for i in range(0, len(rows), 5000):
        conn.execute(insert(_qh), rows[i:i + 5000])
