"""The grant transaction: one try to lend GPUs, or to join or keep a place in the queue.

`attempt` runs inside the store's write transaction: reads the snapshot and
the queue, lets policy.py and placement.py decide, then writes the lease or the
queue row.  While requests wait, `look` (a read, for all of a process's waiters
at once) says which of them a grant would serve now, and `beat` (one write for
them all) refreshes their heartbeats: a waiter writes only to join, to take
its lease, and to leave.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple
from datetime import timedelta

from sqlalchemy import delete

from . import statements as sql
from .models import Lease, PoolError
from .placement import choose_gang
from .policy import Snapshot, WaiterRow, available_after, check_feasible, check_quota, served_now
from .schema import waiters_table
from .store import Store, as_utc
from .validation import Request, worker_server_name


NO_WAITER = 2**31 - 1  # the largest queue row id (INTEGER): a request not in the queue yet is behind every row


@dataclass
class Outcome:
    leases: tuple[Lease, ...]  # the grant: one lease, or one per worker of a gang; () while it waits
    waiter_id: int | None
    position: int
    free: int  # free (unlent, undrained) GPUs on the request's hosts
    total: int  # lendable GPUs on the request's hosts

    @property
    def lease(self) -> Lease | None:
        """The grant's (first) lease, or None while the request waits."""
        return self.leases[0] if self.leases else None


@dataclass(frozen=True)
class QueueRules:
    """What a grant needs from the pool's settings."""

    limit: tuple[int | None, str]  # (the user's GPU limit, its source)
    stale_after: float
    backfill_window: float
    owner: str  # host:pid, recorded on queue rows


def snapshot(store: Store, conn) -> Snapshot:
    return Snapshot.from_rows(store.rows(conn, sql.SNAPSHOT))


def held(store: Store, conn, user: str) -> tuple[int, list[str]]:
    """(GPUs `user` holds, the servers holding them)."""
    rows = store.rows(conn, sql.HELD, {"user": user})
    return sum(n for _, n in rows), sorted(s for s, _ in rows)


def check(store: Store, conn, req: Request, limit: tuple[int | None, str]) -> Snapshot:
    """Refuse a request that can never be met (too big, over quota); the snapshot read."""
    snap = snapshot(store, conn)
    check_feasible(snap, req)
    check_quota(req, *limit, held=lambda: held(store, conn, req.user))
    return snap


def attempt(
    store: Store, conn, req: Request, waiter_id: int | None, enqueue: bool, rules: QueueRules, choose: Callable, log
) -> Outcome:
    """Lend now if the queue lets this request through; else queue it (enqueue) or refresh its row."""
    now = store.now(conn)  # taken under the lock: lease times are ordered
    snap = check(store, conn, req, rules.limit)

    alive_since = now - timedelta(seconds=rules.stale_after)
    # Only the rows that can change this request's outcome are read (see waiters_that_matter).
    live, stale = waiters_that_matter(store, conn, snap, alive_since)
    stale = [i for i in stale if i != waiter_id]
    if stale:
        log.info("Removing %d stale GPU waiter(s) of dead processes", len(stale))
        conn.execute(delete(waiters_table).where(waiters_table.c.id.in_(stale)))
        store.run(conn, sql.CLOSE_QUEUE_LOG, [{"wid": i, "now": now, "outcome": "stale"} for i in stale])
    if waiter_id is not None and not store.rows(conn, sql.WAITER_EXISTS, {"wid": waiter_id}):
        # Our row is gone (we missed heartbeats and someone cleaned up):
        # queue again at the end.
        waiter_id, enqueue = None, True
    ahead = [r for r in live if waiter_id is None or r.id < waiter_id]
    avail = available_after(snap, ahead, now, rules.backfill_window, choose)

    hosts = req.hosts if req.hosts is not None else list(snap.capacity)
    free = sum(len(snap.free.get(h, ())) for h in hosts)
    total = sum(snap.capacity.get(h, 0) for h in hosts)
    picks = choose_gang(choose, avail, req.hosts, req.count, req.workers)
    if picks is None:
        # Its place: the rows ahead (all live now: the stale ones went above).
        behind = waiter_id if waiter_id is not None else NO_WAITER
        position = store.rows(conn, sql.WAITERS_BEFORE, {"wid": behind})[0][0] + 1
        if waiter_id is not None:
            store.run(conn, sql.HEARTBEAT, {"wid": waiter_id, "now": now})
        elif enqueue:
            waiter_id = store.run(
                conn,
                sql.INSERT_WAITER,
                dict(
                    owner=rules.owner,
                    user_name=req.user,
                    server_name=req.server_name,
                    count=req.count,
                    groups=json.dumps(list(req.groups)),
                    hosts=json.dumps(list(req.hosts)) if req.hosts is not None else None,
                    enqueued_at=now,
                    heartbeat_at=now,
                    workers=req.workers,
                ),
            )
            store.run(conn, sql.INSERT_QUEUE_LOG,
                      dict(id=waiter_id, user_name=req.user, count=req.total, enqueued_at=now))
        return Outcome((), waiter_id, position, free, total)

    # Every lease of the grant in this one transaction: a gang is granted whole or not at all.
    groups = json.dumps(list(req.groups))
    leases = []
    for index, (host, uuids) in enumerate(picks):
        server_name = req.server_name if req.workers == 1 else worker_server_name(req.server_name, index)
        lease_id = store.run(
            conn,
            sql.INSERT_LEASE,
            dict(user_name=req.user, server_name=server_name, host=host, groups=groups, started_at=now),
        )
        store.run(
            conn,
            sql.INSERT_LEASE_GPU,
            [{"lease_id": lease_id, "uuid": u, "host": host, "position": i} for i, u in enumerate(uuids)],
        )
        leases.append(Lease(lease_id, req.user, server_name, host, tuple(uuids), req.groups, now))
    if waiter_id is not None:
        store.run(conn, sql.DELETE_WAITER, {"wid": waiter_id})
        store.run(conn, sql.CLOSE_QUEUE_LOG, {"wid": waiter_id, "now": now, "outcome": "served"})
    return Outcome(tuple(leases), None, 0, free - req.total, total)


class View(NamedTuple):
    """One waiter's place as a read of the queue saw it (a tuple: compared in C, many at a time)."""

    present: bool  # its row is in the queue (not removed as stale by another process)
    position: int
    free: int
    total: int
    ask: bool  # a write attempt would serve it, or must tell it an error (it became impossible)


def full_hosts(snap: Snapshot) -> list[str]:
    """Queue rows' `hosts` of the one-host requests whose host has no free GPU (see
    statements.WAITERS_THAT_MATTER)."""
    return [json.dumps([h]) for h in snap.capacity.keys() | snap.free.keys() if not snap.free.get(h)]


def waiters_that_matter(store: Store, conn, snap: Snapshot, alive_since) -> tuple[list[WaiterRow], list[int]]:
    """(the live queue rows, in order, less those that can neither be served nor hold GPUs
    back now: one-host requests on a host without a free GPU (see policy._take_turns);
    the ids of the stale rows)."""
    full = full_hosts(snap)
    params = {"alive_since": alive_since, **{f"full{i}": h for i, h in enumerate(full)}}
    live, stale = [], []
    for id_, user, count, hosts, enqueued, beat, workers in store.rows(conn, sql.waiters_that_matter(len(full)),
                                                                       params):
        row = WaiterRow(id_, user, count, hosts, as_utc(enqueued), as_utc(beat), workers)
        if row.heartbeat_at < alive_since:
            stale.append(id_)
        elif hosts is None or hosts not in full:
            live.append(row)
    return live, stale


def look(store: Store, conn, mine: dict[int, Request], stale_after: float, backfill_window: float,
         choose: Callable, known: dict | None = None) -> dict[int, View] | None:
    """Where each of `mine` ({queue row id: request}) stands; reads only.

    `known` (kept by the caller between looks) spares reading every row's id when the
    live queue has not changed since the last look, and makes the answer None when nothing
    it would tell has changed."""
    now = store.now(conn)
    snap = snapshot(store, conn)
    alive_since = now - timedelta(seconds=stale_after)
    known = {} if known is None else known
    signature = tuple(store.rows(conn, sql.LIVE_WAITERS_SIGNATURE, {"alive_since": alive_since})[0])
    if known.get("signature") != signature:
        known["positions"] = {i: n for n, (i,) in
                              enumerate(store.rows(conn, sql.LIVE_WAITER_IDS, {"alive_since": alive_since}), 1)}
        known["signature"] = signature
    positions = known["positions"]
    state = (signature, frozenset(mine), tuple((h, tuple(free)) for h, free in sorted(snap.free.items())),
             tuple(sorted(snap.capacity.items())))
    if known.get("state") == state:
        # Nothing a waiter could learn has changed (time alone only takes grants away, by
        # the backfill window, and a write attempt decides those under the lock).
        return None
    known["state"] = state
    served = served_now(snap, waiters_that_matter(store, conn, snap, alive_since)[0], now, backfill_window, choose)
    views = {}
    alike: dict[tuple, tuple[int, int, bool]] = {}  # (hosts, count) -> (free, total, feasible)
    for wid, req in mine.items():
        key = (req.hosts, req.count, req.workers)
        if key not in alike:
            hosts = req.hosts if req.hosts is not None else list(snap.capacity)
            try:
                check_feasible(snap, req)
                feasible = True
            except PoolError:
                feasible = False
            alike[key] = (sum(len(snap.free.get(h, ())) for h in hosts), sum(snap.capacity.get(h, 0) for h in hosts),
                          feasible)
        free, total, feasible = alike[key]
        views[wid] = View(wid in positions, positions.get(wid, 0), free, total, wid in served or not feasible)
    return views


def beat(store: Store, conn, ids: list[int]) -> None:
    """Refresh the heartbeats of these queue rows, in one transaction."""
    now = store.now(conn)
    store.run(conn, sql.HEARTBEAT, [{"wid": i, "now": now} for i in ids])
