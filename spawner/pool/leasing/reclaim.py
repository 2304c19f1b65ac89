"""Reclaiming borrowed GPUs for a request within its share: which leases, and the ledger's mark.

A lease lent beyond its user's share is *borrowed* (grant.py).  When a request within its
share cannot be served from the free GPUs, its grant transaction marks borrowed leases
(`reclaim_at`) until the GPUs they hold, with those already marked and those free, would
serve it.  The holder (the jobs runner, spawner/jobs/reclaim.py) sees the mark, tells the job
(SIGTERM), waits `GPUPool.reclaim_grace`, stops it and ends the lease `reclaimed` once the
engine confirms it gone; the waiting request is then served as GPUs free.  Nothing here stops
anything: the pool never calls an engine.

The choice (`choose`) is a pure function: the most recently started first (the least work
lost), then, among those started at the same moment, the holder with the lowest fair-share
priority (the most recent GPU use per share: serving_order.standing, what orders the queue);
a cluster as a whole (all of its workers' leases, on whatever hosts); never a lease on GPUs
its holder has booked now (the booking is theirs).  For a one-host request, the host that
needs the fewest GPUs reclaimed; for a gang of workers, each worker's GPUs on one host, as
placement lends them (placement.gang_fits): GPUs reclaimed on a host count only in whole
workers' worth, and a lease whose GPUs no worker would use is left alone.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import select, update

from ..fair_use.bookings import Booking
from ..ledger.schema import lease_gpus_table, leases_table
from ..ledger.store import as_utc
from .placement import gang_fits

# A holder's fair-share standing (user, groups) -> recent GPU-hours per share: higher is a
# lower priority, reclaimed first among leases started at the same moment.
Standing = Callable[[str, tuple[str, ...]], float]


@dataclass(frozen=True)
class Borrowed:
    """An active borrowed lease, as the choice needs it."""

    id: int
    user: str
    groups: tuple[str, ...]
    server_name: str
    host: str
    uuids: tuple[str, ...]
    started_at: datetime
    reclaim_at: datetime | None = None

    @property
    def unit(self) -> str:
        """What is reclaimed together: a cluster job's leases (`job/7/worker-1`) are one unit."""
        return self.server_name.split("/worker-", 1)[0] if "/worker-" in self.server_name else \
            f"{self.user}\0{self.server_name}"


def notice_text(grace: float) -> str:
    """How much notice a borrowed lease gets, in words: '2 minutes'', '30 seconds''."""
    if grace >= 60 and grace % 60 == 0:
        minutes = int(grace // 60)
        return "1 minute's" if minutes == 1 else f"{minutes} minutes'"
    return f"{grace:g} seconds'"


def borrowed_notice(grace: float) -> str:
    """What the holder of a borrowed lease is told while nobody asks it back."""
    return f"running on borrowed GPUs: may be reclaimed with {notice_text(grace)} notice"


def booked_by_holder(lease: Borrowed, bookings: Iterable[Booking], now: datetime) -> bool:
    """Whether any GPU of `lease` is booked now for its own holder (never reclaimed then)."""
    return any(b.active(now) and b.host == lease.host and b.for_(lease.user, lease.groups)
               and set(b.gpu_uuids) & set(lease.uuids) for b in bookings)


def _units(candidates: Iterable[Borrowed], standing: Standing | None = None) -> list[list[Borrowed]]:
    """The candidates grouped by unit in the order they are reclaimed: the most recently started
    unit first; among those started together, the lowest fair-share priority first."""
    by_unit: dict[str, list[Borrowed]] = {}
    for lease in candidates:
        by_unit.setdefault(lease.unit, []).append(lease)

    def order(unit: list[Borrowed]) -> tuple:
        first = unit[0]
        return (max(l.started_at for l in unit), standing(first.user, first.groups) if standing else 0.0,
                max(l.id for l in unit))

    return sorted(by_unit.values(), key=order, reverse=True)


def _gang_served(have: dict[str, int], units: list[list[Borrowed]], count: int, workers: int) -> bool:
    """Whether `workers` x `count` GPUs fit, each worker on one host, in what `have` holds per
    host plus the GPUs of `units` there."""
    room = dict(have)
    for unit in units:
        for lease in unit:
            if lease.host in room:
                room[lease.host] += len(lease.uuids)
    return gang_fits(room, None, count, workers)


def choose(candidates: Iterable[Borrowed], free: dict[str, int], coming: dict[str, int],
           hosts: Iterable[str] | None, count: int, workers: int = 1,
           standing: Standing | None = None) -> list[int]:
    """The ids of the borrowed leases to reclaim so that a request for `workers` x `count` GPUs
    on `hosts` (None: any) could be served; [] when the GPUs free (`free`, per host: those left
    to it after the requests ahead) and coming free (`coming`: leases already being reclaimed)
    serve it already, or when reclaiming every candidate would not.  `standing` breaks ties of
    start time (None: by lease id alone)."""
    candidates = list(candidates)
    names = sorted(set(free) | set(coming) | {c.host for c in candidates}) if hosts is None else list(hosts)
    have = {h: free.get(h, 0) + coming.get(h, 0) for h in names}
    units = [u for u in _units(candidates, standing) if any(l.host in have for l in u)]
    if workers > 1:
        if _gang_served(have, [], count, workers):
            return []
        picked: list[list[Borrowed]] = []
        for unit in units:
            picked.append(unit)
            if _gang_served(have, picked, count, workers):
                break
        else:
            return []
        # Units taken on the way whose GPUs no worker needs in the end go back, the oldest first
        # (each one, one host's GPUs short of a worker's worth, may have been made whole by later ones).
        for unit in reversed(picked[:-1]):
            if _gang_served(have, [u for u in picked if u is not unit], count, workers):
                picked.remove(unit)
        return sorted(l.id for u in picked for l in u)
    if any(n >= count for n in have.values()):
        return []
    best: tuple[int, list[list[Borrowed]]] | None = None
    for host in names:
        got, picked = have[host], []
        for unit in units:
            here = sum(len(l.uuids) for l in unit if l.host == host)
            if not here:
                continue
            picked.append(unit)
            got += here
            if got >= count:
                break
        if got >= count:
            cost = sum(len(l.uuids) for u in picked for l in u)
            if best is None or cost < best[0]:
                best = (cost, picked)
    return sorted(l.id for u in best[1] for l in u) if best else []


def borrowed_now(conn) -> list[Borrowed]:
    """Every active borrowed lease, with its GPUs."""
    l, lg = leases_table, lease_gpus_table
    rows = conn.execute(
        select(l.c.id, l.c.user_name, l.c.groups, l.c.server_name, l.c.host, l.c.started_at, l.c.reclaim_at,
               lg.c.uuid)
        .select_from(l.join(lg, lg.c.lease_id == l.c.id))
        .where(l.c.ended_at.is_(None), l.c.borrowed.is_(True))
        .order_by(l.c.id, lg.c.position)).all()
    found: dict[int, Borrowed] = {}
    uuids: dict[int, list[str]] = {}
    for r in rows:
        if r.id not in found:
            found[r.id] = Borrowed(r.id, r.user_name, tuple(json.loads(r.groups)), r.server_name, r.host, (),
                                   as_utc(r.started_at), as_utc(r.reclaim_at) if r.reclaim_at else None)
            uuids[r.id] = []
        uuids[r.id].append(r.uuid)
    return [Borrowed(**{**b.__dict__, "uuids": tuple(uuids[i])}) for i, b in found.items()]


def mark(conn, free: dict[str, int], hosts: Iterable[str] | None, count: int, workers: int,
         bookings: list[Booking], now: datetime, standing: Standing | None = None) -> list[Borrowed]:
    """Mark for reclaiming (reclaim_at = now) the borrowed leases `choose` picks for a request
    within its share; the leases marked."""
    leases = borrowed_now(conn)
    coming: dict[str, int] = {}
    for lease in leases:
        if lease.reclaim_at is not None:
            coming[lease.host] = coming.get(lease.host, 0) + len(lease.uuids)
    candidates = [lease for lease in leases if lease.reclaim_at is None
                  and not booked_by_holder(lease, bookings, now)]
    ids = choose(candidates, free, coming, hosts, count, workers, standing)
    if not ids:
        return []
    conn.execute(update(leases_table).where(leases_table.c.id.in_(ids), leases_table.c.ended_at.is_(None),
                                            leases_table.c.reclaim_at.is_(None)).values(reclaim_at=now))
    return [lease for lease in candidates if lease.id in ids]


def reclaiming(conn, host: str | None = None) -> list[Borrowed]:
    """The borrowed leases asked back and not yet ended (on `host`; None: all)."""
    return [lease for lease in borrowed_now(conn)
            if lease.reclaim_at is not None and (host is None or lease.host == host)]
