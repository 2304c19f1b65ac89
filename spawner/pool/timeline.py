"""The ledger over time: when each GPU was lent or drained, when requests waited.

Read-only queries for occupancy charts and wait estimates: lent intervals come
from the leases' GPUs, drained ones from the drain/undrain audit records (and
the drain flag), queue ones from gpu_pool_queue_log.  Times are aware UTC.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta

from sqlalchemy import select

from .schema import audit_table, gpus_table, lease_gpus_table, leases_table, queue_log_table, waiters_table

Interval = tuple[datetime, datetime]


@dataclass(frozen=True)
class Timeline:
    """What happened in [since, until): intervals clipped to it, per GPU where it matters."""

    since: datetime
    until: datetime
    gpus: int  # GPUs present in the ledger now (the pool's size)
    lent: dict[tuple[str, str], list[Interval]] = field(default_factory=dict)  # (host, uuid) ->
    drained: dict[tuple[str, str], list[Interval]] = field(default_factory=dict)
    queue: list[tuple[Interval, int]] = field(default_factory=list)  # (interval, GPUs asked)


def clip(start: datetime, end: datetime, since: datetime, until: datetime) -> Interval | None:
    start, end = max(start, since), min(end, until)
    return (start, end) if start < end else None


def lent_intervals(conn, since: datetime, until: datetime, now: datetime) -> dict:
    l, lg = leases_table, lease_gpus_table
    q = (select(lg.c.host, lg.c.uuid, l.c.started_at, lg.c.ended_at)
         .select_from(lg.join(l, l.c.id == lg.c.lease_id))
         .where(l.c.started_at < until, lg.c.ended_at.is_(None) | (lg.c.ended_at > since)))
    out: dict = {}
    for r in conn.execute(q):
        span = clip(r.started_at, r.ended_at or now, since, until)
        if span:
            out.setdefault((r.host, r.uuid), []).append(span)
    return out


def drained_intervals(conn, since: datetime, until: datetime, now: datetime) -> dict:
    """Per GPU, from the audit's state changes (records without a detail); a GPU drained
    now whose drain left no record counts from its drained_at."""
    a, g = audit_table, gpus_table
    rows = conn.execute(select(a.c.host, a.c.uuid, a.c.action, a.c.at)
                        .where(a.c.action.in_(("drain", "undrain")), a.c.detail.is_(None), a.c.at < until)
                        .order_by(a.c.id)).all()
    opened: dict = {}
    out: dict = {}

    def close(key, end):
        span = clip(opened.pop(key), end, since, until)
        if span:
            out.setdefault(key, []).append(span)

    for r in rows:
        key = (r.host, r.uuid)
        if r.action == "drain":
            opened.setdefault(key, r.at)
        elif key in opened:
            close(key, r.at)
    for r in conn.execute(select(g.c.host, g.c.uuid, g.c.drained, g.c.drained_at)):
        key = (r.host, r.uuid)
        if r.drained and key not in opened and r.drained_at is not None and r.drained_at < until:
            opened[key] = r.drained_at
        if key in opened:
            if r.drained:
                close(key, now)
            else:  # undrained without a record (gpu-pool before audits)
                opened.pop(key)
    return out


def queue_intervals(conn, since: datetime, until: datetime, now: datetime, stale_after: float) -> list:
    """Each request's time in the queue; one still waiting counts to now, one whose
    process died unnoticed to its last heartbeat."""
    q, w = queue_log_table, waiters_table
    rows = conn.execute(
        select(q.c.enqueued_at, q.c.left_at, q.c.count, w.c.heartbeat_at)
        .select_from(q.outerjoin(w, w.c.id == q.c.id))
        .where(q.c.enqueued_at < until, q.c.left_at.is_(None) | (q.c.left_at > since))).all()
    out = []
    fresh = now - timedelta(seconds=stale_after)
    for r in rows:
        end = r.left_at
        if end is None:
            end = now if r.heartbeat_at is not None and r.heartbeat_at >= fresh else (r.heartbeat_at or r.enqueued_at)
        span = clip(r.enqueued_at, end, since, until)
        if span:
            out.append((span, r.count))
    return out


def timeline(conn, since: datetime, until: datetime, now: datetime, stale_after: float) -> Timeline:
    present = conn.execute(select(gpus_table.c.uuid).where(gpus_table.c.present)).all()
    return Timeline(since, until, len(present), lent_intervals(conn, since, until, now),
                    drained_intervals(conn, since, until, now),
                    queue_intervals(conn, since, until, now, stale_after))


def lease_lengths(conn, limit: int) -> list[float]:
    """Seconds the newest `limit` ended leases lasted (their servers' lengths), newest first."""
    l = leases_table
    rows = conn.execute(select(l.c.started_at, l.c.ended_at).where(l.c.ended_at.is_not(None))
                        .order_by(l.c.ended_at.desc()).limit(limit)).all()
    return [(r.ended_at - r.started_at).total_seconds() for r in rows]
