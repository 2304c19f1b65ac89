"""Reading the ledger: leases, history and GPU-hours, every GPU's state, the queue.

Read-only queries for the admin views, the CLI, metrics and accounting; none
takes the write lock.
"""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import datetime, timedelta

from sqlalchemy import ColumnElement, func, select

from ...inventory.machine import GPU
from ..ledger.schema import audit_table, gpus_table, lease_gpus_table, leases_table, waiters_table
from ..models import GPUStatus, Lease, Waiter, iso


def load_leases(conn, where, order=None) -> list[Lease]:
    """Leases matching `where` (over leases_table), with their GPUs in order."""
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
                borrowed=bool(r.borrowed),
                reclaim_at=r.reclaim_at,
            )
            uuids[r.id] = []
        if r.uuid is not None:
            uuids[r.id].append(r.uuid)
    return [replace(lease, gpu_uuids=tuple(uuids[i])) for i, lease in leases.items()]


def recent_leases(conn, user: str, limit: int) -> list[Lease]:
    """`user`'s newest `limit` leases, newest first (by the user index, not the whole history)."""
    l = leases_table
    ids = [r.id for r in conn.execute(select(l.c.id).where(l.c.user_name == user).order_by(l.c.id.desc())
                                      .limit(limit))]
    if not ids:
        return []
    return load_leases(conn, l.c.id.in_(ids), order=(l.c.id.desc(),))


def history_where(user: str | None, since: datetime | None, until: datetime | None):
    """Leases (ended or active) of `user` that overlap [since, until)."""
    l = leases_table
    where: ColumnElement[bool] = l.c.id.is_not(None)
    if user is not None:
        where &= l.c.user_name == user
    if until is not None:
        where &= l.c.started_at < until
    if since is not None:
        where &= l.c.ended_at.is_(None) | (l.c.ended_at > since)
    return where


def usage(leases: list[Lease], since: datetime | None, until: datetime | None) -> dict:
    """GPU-hours inside [since, until): {"users": {user: h}, "groups": {group: h}}."""
    users: dict[str, float] = {}
    groups: dict[str, float] = {}
    for lease in leases:
        hours = lease.gpu_hours(since, until)
        users[lease.user] = users.get(lease.user, 0.0) + hours
        for g in lease.groups:
            groups[g] = groups.get(g, 0.0) + hours
    return {"users": users, "groups": groups}


def gpus(conn) -> list[GPUStatus]:
    """Every GPU in the ledger with its drain flag and holding lease, by host and index."""
    active = load_leases(conn, leases_table.c.ended_at.is_(None))
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


def counts(statuses: list[GPUStatus], queued: int) -> dict[str, int]:
    """{"free", "lent", "drained", "queued"} from every GPU's state."""
    out = {"free": 0, "lent": 0, "drained": 0, "queued": queued}
    for s in statuses:
        if s.lease is not None:
            out["lent"] += 1
        elif s.drained:
            out["drained"] += 1
        elif s.present:
            out["free"] += 1
    return out


def queued_count(conn, now: datetime, stale_after: float) -> int:
    """Live waiters (heartbeat within `stale_after` of `now`)."""
    w = waiters_table
    stale_before = now - timedelta(seconds=stale_after)
    return conn.execute(select(func.count()).select_from(w).where(w.c.heartbeat_at >= stale_before)).scalar_one()


def queue(conn, now: datetime, stale_after: float) -> list[Waiter]:
    """Live waiters, in queue order."""
    w = waiters_table
    stale_before = now - timedelta(seconds=stale_after)
    rows = conn.execute(select(w).where(w.c.heartbeat_at >= stale_before).order_by(w.c.id)).all()
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
            workers=r.workers,
        )
        for i, r in enumerate(rows)
    ]


def audit(conn, limit: int) -> list[dict]:
    """The newest `limit` audit records (admin actions), newest first."""
    a = audit_table
    rows = conn.execute(select(a).order_by(a.c.id.desc()).limit(limit)).all()
    return [{"at": iso(r.at), "actor": r.actor, "action": r.action, "host": r.host,
             "uuid": r.uuid, "detail": r.detail} for r in rows]
