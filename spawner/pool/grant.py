"""The grant transaction: one try to lend GPUs, or to join or keep a place in the queue.

Runs inside the store's write transaction: reads the snapshot and the queue,
lets policy.py and placement.py decide, then writes the lease or the queue row.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass

from sqlalchemy import delete

from . import statements as sql
from .models import Lease
from .policy import Snapshot, WaiterRow, available_after, check_feasible, check_quota, stale_waiters
from .schema import waiters_table
from .store import Store, as_utc
from .validation import Request


@dataclass
class Outcome:
    lease: Lease | None
    waiter_id: int | None
    position: int
    free: int  # free (unlent, undrained) GPUs on the request's hosts
    total: int  # lendable GPUs on the request's hosts


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

    rows = [
        WaiterRow(id_, user, count, hosts, as_utc(enqueued), as_utc(beat))
        for id_, user, count, hosts, enqueued, beat in store.rows(conn, sql.WAITERS)
    ]
    stale = stale_waiters(rows, now, rules.stale_after, waiter_id)
    if stale:
        log.info("Removing %d stale GPU waiter(s) of dead processes", len(stale))
        conn.execute(delete(waiters_table).where(waiters_table.c.id.in_(stale)))
        store.run(conn, sql.CLOSE_QUEUE_LOG, [{"wid": i, "now": now, "outcome": "stale"} for i in stale])
    live = [r for r in rows if r.id not in stale]
    if waiter_id is not None and not any(r.id == waiter_id for r in live):
        # Our row is gone (we missed heartbeats and someone cleaned up):
        # queue again at the end.
        waiter_id, enqueue = None, True
    ahead = [r for r in live if waiter_id is None or r.id < waiter_id]
    avail = available_after(snap, ahead, now, rules.backfill_window, choose)

    hosts = req.hosts if req.hosts is not None else list(snap.capacity)
    free = sum(len(snap.free.get(h, ())) for h in hosts)
    total = sum(snap.capacity.get(h, 0) for h in hosts)
    pick = choose(avail, req.hosts, req.count)
    if pick is None:
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
                ),
            )
            store.run(conn, sql.INSERT_QUEUE_LOG,
                      dict(id=waiter_id, user_name=req.user, count=req.count, enqueued_at=now))
        return Outcome(None, waiter_id, len(ahead) + 1, free, total)

    host, uuids = pick
    lease_id = store.run(
        conn,
        sql.INSERT_LEASE,
        dict(
            user_name=req.user,
            server_name=req.server_name,
            host=host,
            groups=json.dumps(list(req.groups)),
            started_at=now,
        ),
    )
    store.run(
        conn,
        sql.INSERT_LEASE_GPU,
        [{"lease_id": lease_id, "uuid": u, "host": host, "position": i} for i, u in enumerate(uuids)],
    )
    if waiter_id is not None:
        store.run(conn, sql.DELETE_WAITER, {"wid": waiter_id})
        store.run(conn, sql.CLOSE_QUEUE_LOG, {"wid": waiter_id, "now": now, "outcome": "served"})
    lease = Lease(lease_id, req.user, req.server_name, host, tuple(uuids), req.groups, now)
    return Outcome(lease, None, 0, free - len(uuids), total)
