"""The ledger over time: when each GPU was lent or drained, when requests waited.

Read-only queries for occupancy charts and wait estimates: lent intervals come
from the leases' GPUs, drained ones from the drain/undrain audit records (and
the drain flag), queue ones from gpu_pool_queue_log.  Times are aware UTC.

A long period's lent GPUs (`hourly`) come from the hourly rollup instead
(gpu_pool_lent_hours, one row per hour): its cost follows the number of hours,
not of leases.  Only the active leases and those that ended in
the current hour are read whole, and the lent intervals of drained GPUs (a
drained GPU counts as drained only while it is not lent).  So do its queue
lengths (gpu_pool_queued_hours, queue_hours.py): whole only the requests still
waiting and those that left in the current hour.  Drains are read from the
period's start on, whatever the period.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta

from sqlalchemy import bindparam, select

from ..ledger.schema import (
    audit_table,
    gpus_table,
    lease_gpus_table,
    leases_table,
    lent_hours_table,
    queue_log_table,
    queued_hours_table,
    waiters_table,
)

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
    # hourly: ((start, end) inside one hour and the period, GPU-seconds lent in it, spread evenly
    # over it), counted beside `lent`; and the lent intervals of drained GPUs, for their drain only.
    hours: list[tuple[Interval, float]] = field(default_factory=list)
    drained_lent: dict[tuple[str, str], list[Interval]] | None = None
    # hourly: ((start, end) inside one hour and the period, request-seconds, GPU-seconds asked in
    # it), from the queue's rollup, counted beside `queue`.
    queue_hours: list[tuple[Interval, float, float]] = field(default_factory=list)


def clip(start: datetime, end: datetime, since: datetime, until: datetime) -> Interval | None:
    start, end = max(start, since), min(end, until)
    return (start, end) if start < end else None


def lent_intervals(conn, since: datetime, until: datetime, now: datetime, where=None,
                   clip_from: datetime | None = None) -> dict:
    """Per GPU, its lent intervals inside [since, until) (`where`: more conditions on the lease's
    GPU; `clip_from`: only their parts from then on)."""
    l, lg = leases_table, lease_gpus_table
    q = (select(lg.c.host, lg.c.uuid, l.c.started_at, lg.c.ended_at)
         .select_from(lg.join(l, l.c.id == lg.c.lease_id))
         .where(l.c.started_at < until, lg.c.ended_at.is_(None) | (lg.c.ended_at > (clip_from or since))))
    if where is not None:
        q = q.where(where)
    out: dict = {}
    for r in conn.execute(q):
        span = clip(r.started_at, r.ended_at or now, clip_from or since, until)
        if span:
            out.setdefault((r.host, r.uuid), []).append(span)
    return out


HOUR = timedelta(hours=1)
LENT_BY_HOUR = select(lent_hours_table.c.hour, lent_hours_table.c.gpu_seconds).where(
    lent_hours_table.c.hour >= bindparam("first"), lent_hours_table.c.hour < bindparam("end"))


def _floor_hour(t: datetime) -> datetime:
    return t.replace(minute=0, second=0, microsecond=0)


def hourly_lent(conn, since: datetime, until: datetime, now: datetime, drained: dict) -> tuple[dict, list, dict]:
    """(exact lent intervals, hourly GPU-seconds, drained GPUs' lent intervals) of [since, until).

    The ended leases' hours before the current one from the rollup; the active leases, and
    the ended ones' part in the current hour, exact (ended leases are rolled up as they end,
    active ones never, so nothing counts twice)."""
    lg = lease_gpus_table
    current = _floor_hour(until)
    exact = lent_intervals(conn, since, until, now, where=lg.c.ended_at.is_(None))
    if current < until:
        for key, spans in lent_intervals(conn, since, until, now, where=lg.c.ended_at.is_not(None),
                                         clip_from=max(current, since)).items():
            exact.setdefault(key, []).extend(spans)
    hours = []
    for hour, seconds in conn.execute(LENT_BY_HOUR, {"first": _floor_hour(since), "end": current}):
        hour = hour if hour.tzinfo else hour.replace(tzinfo=since.tzinfo)
        span = clip(hour, hour + HOUR, since, until)
        if span and seconds:
            # The part of the hour inside the period, the hour's GPU-seconds spread evenly over it.
            hours.append((span, float(seconds) * (span[1] - span[0]).total_seconds() / 3600.0))
    drained_lent = {}
    if drained:
        keys = sorted({uuid for _, uuid in drained})
        drained_lent = {k: v for k, v in lent_intervals(conn, since, until, now, where=lg.c.uuid.in_(keys)).items()
                        if k in drained}
    return exact, hours, drained_lent


def drained_intervals(conn, since: datetime, until: datetime, now: datetime) -> dict:
    """Per GPU, from the audit's state changes (records without a detail) from `since` on: a
    GPU whose first change from then on is an undrain was drained at `since`; one with no change
    since then is in the state its row holds now (drained: from its drained_at).  So the read
    follows the period, not the whole record of drains."""
    a, g = audit_table, gpus_table
    rows = conn.execute(select(a.c.host, a.c.uuid, a.c.action, a.c.at)
                        .where(a.c.action.in_(("drain", "undrain")), a.c.detail.is_(None), a.c.at >= since)
                        .order_by(a.c.id)).all()
    opened: dict = {}
    out: dict = {}
    changed = set()

    def close(key, end):
        span = clip(opened.pop(key), end, since, until)
        if span:
            out.setdefault(key, []).append(span)

    for r in rows:
        key = (r.host, r.uuid)
        if key not in changed:
            changed.add(key)
            if r.action == "undrain":  # (a state change: it was drained before)
                opened[key] = since
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


def queue_intervals(conn, since: datetime, until: datetime, now: datetime, stale_after: float,
                    left_after: datetime | None = None) -> list:
    """Each request's time in the queue; one still waiting counts to now, one whose
    process died unnoticed to its last heartbeat.  `left_after`: of the requests that have
    left, only those that left after then, and only their part from then on (the hours before
    are read from the rollup)."""
    q, w = queue_log_table, waiters_table
    base = select(q.c.enqueued_at, q.c.left_at, q.c.count, w.c.heartbeat_at).select_from(
        q.outerjoin(w, w.c.id == q.c.id))
    # Two reads, each by the index on left_at: the requests that left after the period began,
    # and those that have not left. (With `enqueued_at < until` in the query the planner took
    # the index on enqueued_at, which for a period ending now is every request ever made.)
    lo = max(since, left_after) if left_after is not None else since
    left = [r for r in conn.execute(base.where(q.c.left_at > lo)) if r.enqueued_at < until]
    waiting = [r for r in conn.execute(base.where(q.c.left_at.is_(None))) if r.enqueued_at < until]
    out = []
    for r in left:
        span = clip(r.enqueued_at, r.left_at, lo, until)
        if span:
            out.append((span, r.count))
    fresh = now - timedelta(seconds=stale_after)
    for r in waiting:
        end = now if r.heartbeat_at is not None and r.heartbeat_at >= fresh else (r.heartbeat_at or r.enqueued_at)
        span = clip(r.enqueued_at, end, since, until)
        if span:
            out.append((span, r.count))
    return out


QUEUED_BY_HOUR = select(queued_hours_table.c.hour, queued_hours_table.c.request_seconds,
                        queued_hours_table.c.gpu_seconds).where(
    queued_hours_table.c.hour >= bindparam("first"), queued_hours_table.c.hour < bindparam("end"))


def hourly_queue(conn, since: datetime, until: datetime, now: datetime, stale_after: float) -> tuple[list, list]:
    """(exact queue intervals, hourly (span, request-seconds, GPU-seconds)) of [since, until):
    the requests that left before the current hour from the rollup (queue_hours.py), those
    still waiting and the current hour's part of those that left in it exact."""
    current = _floor_hour(until)
    exact = queue_intervals(conn, since, until, now, stale_after, left_after=current)
    hours = []
    for hour, requests, gpus in conn.execute(QUEUED_BY_HOUR, {"first": _floor_hour(since), "end": current}):
        hour = hour if hour.tzinfo else hour.replace(tzinfo=since.tzinfo)
        span = clip(hour, hour + HOUR, since, until)
        if span and requests:
            part = (span[1] - span[0]).total_seconds() / 3600.0
            hours.append((span, float(requests) * part, float(gpus) * part))
    return exact, hours


def timeline(conn, since: datetime, until: datetime, now: datetime, stale_after: float,
             hourly: bool = False) -> Timeline:
    present = conn.execute(select(gpus_table.c.uuid).where(gpus_table.c.present)).all()
    drained = drained_intervals(conn, since, until, now)
    if not hourly:
        queue = queue_intervals(conn, since, until, now, stale_after)
        return Timeline(since, until, len(present), lent_intervals(conn, since, until, now), drained, queue)
    lent, hours, drained_lent = hourly_lent(conn, since, until, now, drained)
    queue, queue_hours = hourly_queue(conn, since, until, now, stale_after)
    return Timeline(since, until, len(present), lent, drained, queue, hours, drained_lent, queue_hours)


def lease_lengths(conn, limit: int) -> list[float]:
    """Seconds the newest `limit` ended leases lasted (their servers' lengths), newest first."""
    l = leases_table
    rows = conn.execute(select(l.c.started_at, l.c.ended_at).where(l.c.ended_at.is_not(None))
                        .order_by(l.c.ended_at.desc()).limit(limit)).all()
    return [(r.ended_at - r.started_at).total_seconds() for r in rows]
