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
from dataclasses import dataclass, replace
from datetime import timedelta
from typing import NamedTuple

from sqlalchemy import delete, update

from ..fair_use import bookings, budget
from ..history import queue_hours, rollup
from ..ledger import events
from ..ledger import statements as sql
from ..ledger.schema import waiters_table
from ..ledger.store import Store, as_utc
from ..models import Lease, PoolError, QuotaExceeded
from ..validation import Request, worker_server_name
from . import reclaim, serving_order
from .placement import choose_gang
from .policy import (
    BorrowLimits,
    Snapshot,
    WaiterRow,
    available_after,
    check_borrow,
    check_feasible,
    check_quota,
    served_now,
)

NO_WAITER = 2**31 - 1  # the largest queue row id (INTEGER): a request not in the queue yet is behind every row


@dataclass
class Outcome:
    leases: tuple[Lease, ...]  # the grant: one lease, or one per worker of a gang; () while it waits
    waiter_id: int | None
    position: int
    free: int  # free (unlent, undrained) GPUs on the request's hosts
    total: int  # lendable GPUs on the request's hosts
    why: str = ""  # where it stands in the queue and why, naming nobody (serving_order.why)

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
    order: str = serving_order.FIFO  # the queue's order (serving_order.order)
    shares: serving_order.Shares | None = None
    use_cache: dict | None = None  # rollup.decayed_use's, kept by the pool between grants
    budgets: budget.Budgets | None = None
    booking_grace: float = bookings.Limits.grace_s
    borrow: BorrowLimits = BorrowLimits()
    reclaim_grace: float = 120.0  # GPUPool.reclaim_grace: told to the holders of reclaimed leases


class Ordered(NamedTuple):
    """The live queue in serving order, and how each waiter stands (for the explanations)."""

    rows: list  # WaiterRow, in serving order
    standing_of: Callable
    use: rollup.Use | None


def ordered(store: Store, conn, rows: list[WaiterRow], now, mode: str, shares: serving_order.Shares | None,
            cache: dict | None, explained: bool = True) -> Ordered:
    """`rows` (arrival order) in serving order (serving_order.order) with the use it was decided by
    (not read for one row that needs no explanation)."""
    if mode != serving_order.FAIRSHARE or shares is None or (len(rows) < 2 and not explained):
        return Ordered(sorted(rows, key=serving_order.arrival), lambda e: 0.0, None)
    use = rollup.decayed_use(store, conn, now, cache)
    memo: dict = {}
    by_group = bool(shares.groups)  # without group shares a user's standing is theirs alone

    def standing_of(e) -> float:
        key = (e.user, e.groups) if by_group else e.user
        found = memo.get(key)
        if found is None:
            found = memo[key] = round(serving_order.standing(e.user, e.groups, use.users, use.groups, shares), 6)
        return found

    return Ordered(serving_order.order(rows, mode, standing_of, now, shares.fifo_after), standing_of, use)


def holders_standing(store: Store, conn, now, rules: QueueRules) -> reclaim.Standing | None:
    """The fair-share standing of borrowed leases' holders, which breaks ties in the reclaim's
    choice (the lowest priority first); None without shares."""
    shares = rules.shares
    if shares is None:
        return None
    use = rollup.decayed_use(store, conn, now, rules.use_cache)
    return lambda user, groups: serving_order.standing(user, groups, use.users, use.groups, shares)


def explain(o: Ordered, index: int, mode: str, shares: serving_order.Shares | None, now) -> str:
    """serving_order.why for the waiter at `index` of the serving order."""
    me = o.rows[index]
    return serving_order.why(index + 1, o.rows[:index], me, mode, o.standing_of, now,
                         shares.fifo_after if shares else 0.0,
                         o.use.users.get(me.user, 0.0) if o.use else 0.0,
                         o.use.half_life_s if o.use else rollup.DEFAULT_HALF_LIFE)


def snapshot(store: Store, conn) -> Snapshot:
    return Snapshot.from_rows(store.rows(conn, sql.SNAPSHOT))


def held(store: Store, conn, user: str) -> tuple[int, list[str]]:
    """(GPUs `user` holds, the servers holding them)."""
    rows = store.rows(conn, sql.HELD, {"user": user})
    return sum(n for _, n in rows), sorted(s for s, _ in rows)


def borrowed(store: Store, conn, user: str) -> list[tuple[str, int]]:
    """`user`'s borrowed leases now: (server name, GPUs) each."""
    return [(s, n) for s, n in store.rows(conn, sql.BORROWED, {"user": user})]


class Checked(NamedTuple):
    snap: Snapshot
    beyond: bool  # it would go beyond its user's share: a borrowed lease
    over: str = ""  # why it may not borrow now (over a borrowing limit), when told to wait for that


def check(store: Store, conn, req: Request, limit: tuple[int | None, str],
          budgets: budget.Budgets | None = None, borrow: BorrowLimits | None = None,
          wait_over: bool = False) -> Checked:
    """Refuse a request that can never be met (too big, over quota or over its borrowing limits,
    over budget).  `wait_over`: a borrower over its borrowing limits is not refused but told
    why it waits (a queued job waits for its borrowed jobs to end; its submission was checked)."""
    snap = snapshot(store, conn)
    check_feasible(snap, req)
    beyond, over = False, ""
    if req.borrow and limit[0] is not None and held(store, conn, req.user)[0] + req.total > limit[0]:
        beyond = True  # idle GPUs beyond the share, within the borrowing limits
        try:
            check_borrow(req, borrow or BorrowLimits(), lambda: borrowed(store, conn, req.user))
        except QuotaExceeded as exc:
            if not wait_over:
                raise
            over = str(exc)
    else:
        check_quota(req, *limit, held=lambda: held(store, conn, req.user))
    if budgets is not None and budgets.any:
        budget.check(store, conn, req.user, req.groups, budgets, store.now(conn))
    return Checked(snap, beyond, over)


def attempt(
    store: Store, conn, req: Request, waiter_id: int | None, enqueue: bool, rules: QueueRules, choose: Callable, log
) -> Outcome:
    """Lend now if the queue lets this request through; else queue it (enqueue) or refresh its row."""
    now = store.now(conn)  # taken under the lock: lease times are ordered
    snap, beyond, over = check(store, conn, req, rules.limit, rules.budgets, rules.borrow,
                               wait_over=enqueue or waiter_id is not None)
    # (One indexed probe first: most grants meet no booking at all.)
    booked = bookings.live(conn, now) if store.rows(conn, bookings.ANY_LIVE, {"now": now, "booked": "booked"}) else []
    whole, booked_out, mine_out = snap, None, set()
    if booked:
        # Bookings unused past their grace go back to the pool; the GPUs booked now for
        # others are not this request's to take, nor those of the waiters ahead of it.
        if bookings.release_no_shows(conn, now, rules.booking_grace):
            booked = bookings.live(conn, now)
        booked_out = bookings.held_for_others(booked, now)
        # A request that says how long it holds its GPUs (a batch job: nothing stops it at a
        # booking's start) is not lent those booked for others from before then either.
        until = now + timedelta(seconds=req.holds_for) if req.holds_for is not None else None
        mine_out = bookings.blocking(booked, req.user, req.groups, now, until)
        snap = Snapshot(bookings.exclude(snap.free, booked, req.user, req.groups, now, until), snap.capacity,
                        snap.drained)

    alive_since = now - timedelta(seconds=rules.stale_after)
    fair = rules.order == serving_order.FAIRSHARE
    # Only the rows that can change this request's outcome are read (see waiters_that_matter):
    # fair-share orders each row by its own standing, so their order is the same in any subset.
    live, stale = waiters_that_matter(store, conn, snap, alive_since)
    stale = [i for i in stale if i != waiter_id]
    if stale:
        log.info("Removing %d stale GPU waiter(s) of dead processes", len(stale))
        conn.execute(delete(waiters_table).where(waiters_table.c.id.in_(stale)))
        queue_hours.close(store, conn, [{"wid": i, "now": now, "outcome": "stale"} for i in stale])
    if waiter_id is not None and not store.rows(conn, sql.WAITER_EXISTS, {"wid": waiter_id}):
        # Our row is gone (we missed heartbeats and someone cleaned up):
        # queue again at the end.
        waiter_id, enqueue = None, True

    def me_in(rows: list[WaiterRow]) -> tuple[list[WaiterRow], WaiterRow | None]:
        """`rows` with this request in them (a new one joins at the end of the arrival order)."""
        if waiter_id is not None:
            return rows, next((r for r in rows if r.id == waiter_id), None)
        new = WaiterRow(NO_WAITER, req.user, req.count,
                        json.dumps(list(req.hosts)) if req.hosts is not None else None, req.since or now, now,
                        workers=req.workers, groups=req.groups, beyond=beyond)
        return rows + [new], new

    if waiter_id is not None:
        mine = next((r for r in live if r.id == waiter_id), None)
        if mine is not None and mine.beyond != beyond:  # its user's share changed while it waited
            conn.execute(update(waiters_table).where(waiters_table.c.id == waiter_id).values(beyond=beyond))
            live = [replace(r, beyond=beyond) if r.id == waiter_id else r for r in live]

    o = None
    if fair:
        rows, me = me_in(live)
        if me is None:  # a one-host request on a full host: nothing can be lent to it now
            ahead = live
        else:
            o = ordered(store, conn, rows, now, rules.order, rules.shares, rules.use_cache, explained=False)
            ahead = o.rows[:next(i for i, r in enumerate(o.rows) if r.id == me.id)]
    else:
        mine_row = next((r for r in live if r.id == waiter_id), None) if waiter_id is not None else None
        my_place = serving_order.arrival(mine_row) if mine_row is not None else (req.since or now, NO_WAITER)
        ahead = [r for r in live if serving_order.arrival(r) < my_place]
    # Requests within their share go before any that would borrow: a borrower is served only
    # while none of them waits, and takes nothing from them in the turns ahead.
    within_waits = any(not r.beyond for r in live if r.id != waiter_id)
    if not beyond:
        ahead = [r for r in ahead if not r.beyond]
    avail = available_after(whole, ahead, now, rules.backfill_window, choose, booked_out)
    if booked_out is not None:
        avail = {h: [f for f in lst if (h, f[1]) not in mine_out] for h, lst in avail.items()}

    hosts = req.hosts if req.hosts is not None else list(snap.capacity)
    free = sum(len(snap.free.get(h, ())) for h in hosts)
    total = sum(snap.capacity.get(h, 0) for h in hosts)
    picks = None if beyond and (within_waits or over) else choose_gang(choose, avail, req.hosts, req.count,
                                                                         req.workers)
    if picks is None and not beyond and store.rows(conn, sql.ANY_BORROWED):
        # Within its share and nothing free enough: ask borrowed leases back (their holders
        # stop them within GPUPool.reclaim_grace; this request is served as they end).
        free_for = {h: len(lst) for h, lst in avail.items()}
        marked = reclaim.mark(conn, free_for, req.hosts, req.count, req.workers, booked, now,
                              holders_standing(store, conn, now, rules))
        if marked:
            events.reclaimed(store, conn, marked, now, rules.reclaim_grace)
            log.info("Reclaiming %d borrowed lease(s) (%s) for %s/%s within its share", len(marked),
                     ", ".join(str(m.id) for m in marked), req.user, req.server_name)
    if picks is None:
        if fair:
            # Its place among every live row (the stale ones went above): those read above
            # when they were all of them, else all read now.
            count = store.rows(conn, sql.LIVE_WAITERS_SIGNATURE, {"alive_since": alive_since})[0][0]
            if o is None or o.use is None or count != len(live):
                rows, me = me_in(waiters_that_matter(store, conn, None, alive_since)[0])
                o = ordered(store, conn, rows, now, rules.order, rules.shares, rules.use_cache)
            index = next((i for i, r in enumerate(o.rows) if r.id == me.id), len(o.rows)) if me else len(o.rows)
            position = index + 1
            why = explain(o, index, rules.order, rules.shares, now) if me else serving_order.fifo_why(position)
        else:
            # Its place: the rows ahead (all live now: the stale ones went above).
            since, behind = my_place
            position = store.rows(conn, sql.WAITERS_BEFORE, {"wid": behind, "since": since})[0][0] + 1
            why = serving_order.fifo_why(position)
        if beyond and over:
            why = f"{over}; it waits until one of them ends"
        elif beyond and within_waits:
            why = "waiting to borrow idle GPUs beyond your share: requests within their share go first"
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
                    workers=req.workers,
                    groups=json.dumps(list(req.groups)),
                    hosts=json.dumps(list(req.hosts)) if req.hosts is not None else None,
                    enqueued_at=req.since or now,
                    heartbeat_at=now,
                    beyond=beyond,
                ),
            )
            store.run(conn, sql.INSERT_QUEUE_LOG,
                      dict(id=waiter_id, user_name=req.user, count=req.total, enqueued_at=now))
        return Outcome((), waiter_id, position, free, total, why)

    # Every lease of the grant in this one transaction: a gang is granted whole or not at all.
    groups = json.dumps(list(req.groups))
    leases = []
    for index, (host, uuids) in enumerate(picks):
        server_name = req.server_name if req.workers == 1 else worker_server_name(req.server_name, index)
        lease_id = store.run(
            conn,
            sql.INSERT_LEASE,
            dict(user_name=req.user, server_name=server_name, host=host, groups=groups, started_at=now,
                 borrowed=beyond),
        )
        store.run(
            conn,
            sql.INSERT_LEASE_GPU,
            [{"lease_id": lease_id, "uuid": u, "host": host, "position": i} for i, u in enumerate(uuids)],
        )
        later = bookings.soon(host, uuids, booked, req.user, req.groups, now) if booked else None
        leases.append(Lease(lease_id, req.user, server_name, host, tuple(uuids), req.groups, now,
                            notice=bookings.notice(later, now) if later else None, borrowed=beyond))
    if waiter_id is not None:
        if not req.server_name.startswith("job/"):  # a job's grant is told by its end (events.job_ended)
            events.granted(store, conn, waiter_id, req.user, req.server_name, leases[0].host, req.total, now,
                           leases[0].id)
        store.run(conn, sql.DELETE_WAITER, {"wid": waiter_id})
        queue_hours.close(store, conn, [{"wid": waiter_id, "now": now, "outcome": "served"}])
    return Outcome(tuple(leases), None, 0, free - req.total, total)


class View(NamedTuple):
    """One waiter's place as a read of the queue saw it (a tuple: compared in C, many at a time)."""

    present: bool  # its row is in the queue (not removed as stale by another process)
    position: int
    free: int
    total: int
    ask: bool  # a write attempt would serve it, or must tell it an error (it became impossible)
    why: str = ""  # serving_order.why


def full_hosts(snap: Snapshot) -> list[str]:
    """Queue rows' `hosts` of the one-host requests whose host has no free GPU (see
    statements.WAITERS_THAT_MATTER)."""
    return [json.dumps([h]) for h in snap.capacity.keys() | snap.free.keys() if not snap.free.get(h)]


_GROUPS: dict[str, tuple[str, ...]] = {}  # a queue row's groups JSON, parsed once per process


def _groups(raw: str | None) -> tuple[str, ...]:
    found = _GROUPS.get(raw or "[]")
    if found is None:
        if len(_GROUPS) > 10000:
            _GROUPS.clear()
        found = _GROUPS[raw or "[]"] = tuple(json.loads(raw or "[]"))
    return found


def waiters_that_matter(store: Store, conn, snap: Snapshot | None, alive_since) -> tuple[list[WaiterRow], list[int]]:
    """(the live queue rows, in order, less those that can neither be served nor hold GPUs
    back now: one-host requests on a host without a free GPU (see policy._take_turns);
    the ids of the stale rows).  snap None: every live row."""
    full = full_hosts(snap) if snap is not None else []
    params = {"alive_since": alive_since, **{f"full{i}": h for i, h in enumerate(full)}}
    live, stale = [], []
    for id_, user, count, hosts, enqueued, beat, workers, groups, beyond in store.rows(
            conn, sql.waiters_that_matter(len(full)), params):
        row = WaiterRow(id_, user, count, hosts, as_utc(enqueued), as_utc(beat), workers=workers,
                        groups=_groups(groups), beyond=bool(beyond))
        if row.heartbeat_at < alive_since:
            stale.append(id_)
        elif hosts is None or hosts not in full:
            live.append(row)
    return live, stale


def look(store: Store, conn, mine: dict[int, Request], stale_after: float, backfill_window: float,
         choose: Callable, known: dict | None = None, rules: QueueRules | None = None) -> dict[int, View] | None:
    """Where each of `mine` ({queue row id: request}) stands; reads only.

    `known` (kept by the caller between looks) spares reading every row's id when the
    live queue has not changed since the last look, and makes the answer None when nothing
    it would tell has changed."""
    now = store.now(conn)
    snap = snapshot(store, conn)
    booked = bookings.live(conn, now) if store.rows(conn, bookings.ANY_LIVE, {"now": now, "booked": "booked"}) else []
    if booked and rules is not None:
        # A booked GPU unused past its grace holds nothing: the write that serves a waiter releases it.
        booked = bookings.without_unused(booked, bookings.unused_gpus(conn, booked, now, rules.booking_grace))
    # Each waiter's turn leaves out the GPUs booked now for others (a write decides the rest).
    booked_out = bookings.held_for_others(booked, now) if booked else None
    alive_since = now - timedelta(seconds=stale_after)
    known = {} if known is None else known
    signature = tuple(store.rows(conn, sql.LIVE_WAITERS_SIGNATURE, {"alive_since": alive_since})[0])
    if known.get("signature") != signature:
        known["positions"] = {i: n for n, (i,) in
                              enumerate(store.rows(conn, sql.LIVE_WAITER_IDS, {"alive_since": alive_since}), 1)}
        known["signature"] = signature
    positions = known["positions"]
    fair = rules is not None and rules.order == serving_order.FAIRSHARE
    state = (signature, frozenset(mine), tuple((h, tuple(free)) for h, free in sorted(snap.free.items())),
             tuple((b.id, b.active(now)) for b in booked),
             tuple(sorted(snap.capacity.items())),
             # fair-share: standings move with time (use decays, requests pass fifo_after); the
             # explanations follow within half a minute, any grant they allow comes with a change above
             int(now.timestamp() // 30) if fair else 0)
    if known.get("state") == state:
        # Nothing a waiter could learn has changed (time alone only takes grants away, by
        # the backfill window, and a write attempt decides those under the lock).
        return None
    known["state"] = state
    whys: dict[int, str] = {}
    if fair and rules is not None:
        o = ordered(store, conn, waiters_that_matter(store, conn, None, alive_since)[0], now, rules.order,
                    rules.shares, rules.use_cache)
        positions = {r.id: n for n, r in enumerate(o.rows, 1)}
        whys = {r.id: explain(o, n - 1, rules.order, rules.shares, now) for r in o.rows
                if (n := positions[r.id]) and r.id in mine}
        served = served_now(snap, o.rows, now, backfill_window, choose, booked_out)
    else:
        served = served_now(snap, waiters_that_matter(store, conn, snap, alive_since)[0], now, backfill_window,
                            choose, booked_out)
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
        position = positions.get(wid, 0)
        views[wid] = View(wid in positions, position, free, total, wid in served or not feasible,
                          whys.get(wid) or (serving_order.fifo_why(position) if position else ""))
    return views


def beat(store: Store, conn, ids: list[int]) -> None:
    """Refresh the heartbeats of these queue rows, in one transaction."""
    now = store.now(conn)
    store.run(conn, sql.HEARTBEAT, [{"wid": i, "now": now} for i in ids])
