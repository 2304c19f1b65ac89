"""Policy: quotas and the fair queue's order, as pure functions over plain data.

No database here: the grant transaction (grant.py) reads a snapshot and the
queue, and these functions decide; unit tests call them directly.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from ..models import QuotaExceeded, Unsatisfiable, gpus_text, ordinal
from ..validation import Request
from .placement import choose_gang, gang_fits

Choose = Callable[[dict, "Iterable[str] | None", int], "tuple[str, list[str]] | None"]


@dataclass
class Snapshot:
    """The lendable GPUs, per host, as one transaction saw them."""

    free: dict[str, list[tuple[int, str]]] = field(default_factory=dict)  # unlent, lendable, by index
    capacity: dict[str, int] = field(default_factory=dict)  # lendable (present, undrained), lent or not
    drained: dict[str, int] = field(default_factory=dict)

    @classmethod
    def from_rows(cls, rows: Iterable[tuple]) -> Snapshot:
        """From (host, uuid, index, present, drained, active lease id or None) rows."""
        snap = cls()
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


@dataclass(frozen=True)
class WaiterRow:
    """A queue row as the grant transaction reads it."""

    id: int
    user: str
    count: int
    hosts: str | None  # JSON list, None = any host
    enqueued_at: datetime
    heartbeat_at: datetime
    workers: int = 1  # a gang: this many leases of `count` GPUs, all at once
    groups: tuple[str, ...] = ()  # the user's groups (fair-share counts group use too)
    beyond: bool = False  # it would borrow (beyond its user's share): served only while no other row waits


def asked(count: int, workers: int) -> str:
    """What a request asks for, in words: '2 GPUs', or '2 workers x 1 GPU' for a gang."""
    return gpus_text(count) if workers == 1 else f"{workers} workers x {gpus_text(count)}"


def limit_for(
    groups: Iterable[str], group_limits: Mapping[str, int | None], per_user: int | None
) -> tuple[int | None, str]:
    """(limit, where it comes from) for a user in `groups`; None = no limit.

    A user gets the largest limit of their groups listed in `group_limits`,
    else the per-user limit.
    """
    limits = {g: group_limits[g] for g in groups if g in group_limits}
    if not limits:
        return per_user, "the per-user limit"
    if any(v is None for v in limits.values()):
        return None, "group limits"
    group = max(limits, key=lambda g: (limits[g], g))
    return limits[group], f"the limit of group '{group}'"


def check_feasible(snap: Snapshot, req: Request) -> None:
    """Refuse a request that no host could ever meet (Unsatisfiable)."""
    if req.workers > 1:
        _check_gang_feasible(snap, req)
        return
    hosts = req.hosts if req.hosts is not None else list(snap.capacity)
    capacity = max((snap.capacity.get(h, 0) for h in hosts), default=0)
    if req.count <= capacity:
        return
    drained = max((snap.drained.get(h, 0) for h in hosts), default=0)
    if capacity == 0 and not drained:
        where = f"host {req.hosts[0]}" if req.hosts and len(req.hosts) == 1 else "this hub"
        raise Unsatisfiable(f"You asked for {gpus_text(req.count)}, but {where} has no GPUs to lend")
    note = f" ({drained} more drained for maintenance)" if drained else ""
    raise Unsatisfiable(
        f"You asked for {gpus_text(req.count)}, but the largest host has {gpus_text(capacity)}{note}; "
        f"ask for {capacity} or fewer"
    )


def _check_gang_feasible(snap: Snapshot, req: Request) -> None:
    hosts = req.hosts if req.hosts is not None else list(snap.capacity)
    if gang_fits(snap.capacity, hosts, req.count, req.workers):
        return
    where = f"host {hosts[0]}" if len(hosts) == 1 else f"the {len(hosts)} hosts it may use"
    fit = sum(snap.capacity.get(h, 0) // req.count for h in hosts)
    drained = sum(snap.drained.get(h, 0) for h in hosts)
    note = f" ({drained} more drained for maintenance)" if drained else ""
    raise Unsatisfiable(
        f"You asked for {asked(req.count, req.workers)} ({gpus_text(req.total)} at once), but {where} can hold "
        f"at most {fit} such worker{'s' if fit != 1 else ''}{note}; ask for {fit} or fewer workers"
    )


def check_quota(req: Request, limit: int | None, source: str, held: Callable[[], tuple[int, list[str]]]) -> None:
    """Refuse a request over the user's limit (QuotaExceeded).

    `held()` gives (GPUs the user holds, their servers); called only when a
    limit applies.
    """
    if limit is None:
        return
    if req.total > limit:
        raise QuotaExceeded(f"You may hold at most {gpus_text(limit)} ({source}) and asked for {req.total}")
    count, servers = held()
    if count + req.total > limit:
        names = ", ".join(repr(s) if s else "the default server" for s in servers)
        raise QuotaExceeded(
            f"You may hold at most {gpus_text(limit)} ({source}); you hold {count} "
            f"(servers: {names}) and asked for {req.total} more. Stop a server to free GPUs"
        )


@dataclass(frozen=True)
class BorrowLimits:
    """How much one user may borrow beyond their share at once (GPUPool's max_borrowed_*)."""

    gpus: int | None = 0  # GPUs in borrowed leases; None: no limit
    jobs: int | None = 0  # jobs holding borrowed leases (a cluster is one); None: no limit


def _unit_of(server_name: str) -> str:
    return server_name.split("/worker-", 1)[0]


def check_borrow(req: Request, limits: BorrowLimits, borrowed: Callable[[], list[tuple[str, int]]]) -> None:
    """Refuse a request that would take its user over their borrowing limits (QuotaExceeded, 403).

    `borrowed()` gives the user's borrowed leases now as (server name, GPUs)."""
    if limits.gpus is not None and req.total > limits.gpus:
        raise QuotaExceeded(
            f"You asked for {gpus_text(req.total)} beyond your share, but you may borrow at most "
            f"{gpus_text(limits.gpus)} (GPUPool.max_borrowed_gpus_per_user)")
    leases = borrowed()
    held = sum(n for _, n in leases)
    if limits.gpus is not None and held + req.total > limits.gpus:
        raise QuotaExceeded(
            f"You may borrow at most {gpus_text(limits.gpus)} beyond your share "
            f"(GPUPool.max_borrowed_gpus_per_user); you borrow {held} and asked for {req.total} more")
    units = {_unit_of(s) for s, _ in leases if s.startswith("job/")}
    if req.server_name.startswith("job/") and limits.jobs is not None and len(units) + 1 > limits.jobs:
        raise QuotaExceeded(
            f"You may run at most {limits.jobs} job{'s' if limits.jobs != 1 else ''} on borrowed GPUs at once "
            f"(GPUPool.max_borrowed_jobs_per_user); {len(units)} of yours run on them now")


def stale_waiters(rows: Iterable[WaiterRow], now: datetime, stale_after: float, own_id: int | None) -> list[int]:
    """Ids of queue rows whose process stopped refreshing them (never `own_id`)."""
    stale_before = now - timedelta(seconds=stale_after)
    return [r.id for r in rows if r.heartbeat_at < stale_before and r.id != own_id]


def _hosts_of(row: WaiterRow, cache: dict) -> list[str] | None:
    if not row.hosts:
        return None
    hosts = cache.get(row.hosts)
    if hosts is None:
        hosts = cache[row.hosts] = json.loads(row.hosts)
    return hosts


# (user, groups) -> the GPUs ((host, uuid)) booked now for someone else (bookings.held_for_others).
BookedOut = Callable[[str, tuple[str, ...]], frozenset]


def _without(avail: dict[str, list[tuple[int, str]]], out: frozenset) -> dict[str, list[tuple[int, str]]]:
    return {h: [f for f in lst if (h, f[1]) not in out] for h, lst in avail.items()} if out else avail


def _take_turns(
    snap: Snapshot, rows: Iterable[WaiterRow], now: datetime, backfill_window: float, choose: Choose,
    booked_out: BookedOut | None = None,
) -> Iterable[tuple[WaiterRow, dict, bool]]:
    """Each queue row's turn, in order: (row, the free GPUs it sees, whether it is served).

    FIFO with bounded backfill: an earlier waiter that fits takes its GPUs; one
    that cannot be met yet lets later requests pass for `backfill_window`
    seconds, after which free GPUs on its hosts are held for it.  `avail` is
    changed as turns go by (a row that fits has taken its GPUs when the next
    row's turn comes).  `booked_out`: the GPUs each row may not take (booked now for others);
    they are neither lent to it nor held for it.
    """
    avail = {h: list(lst) for h, lst in snap.free.items()}
    window = timedelta(seconds=backfill_window)
    parsed: dict[str, list[str]] = {}
    rows = list(rows)
    within_waits = any(not r.beyond for r in rows)
    for r in rows:
        if r.beyond and within_waits:
            # A borrower is served only while no request within its share waits (and holds
            # nothing back for itself meanwhile).
            yield r, avail, False
            continue
        hosts = _hosts_of(r, parsed)
        out = booked_out(r.user, r.groups) if booked_out is not None else frozenset()
        sees = _without(avail, out)
        if not any(sees.get(h) for h in (hosts if hosts is not None else sees)):
            # Nothing free where it may go: it cannot be served, and holding
            # nothing for it changes nothing (the common case of a long queue).
            yield r, avail, False
            continue
        picks = choose_gang(choose, sees, hosts, r.count, r.workers)
        if picks is not None:
            yield r, avail, True
            take(avail, picks)
            continue
        yield r, avail, False
        if gang_fits(snap.capacity, hosts, r.count, r.workers) and now - r.enqueued_at >= window:
            for h in hosts or list(avail):
                avail[h] = [f for f in avail[h] if (h, f[1]) in out]


def take(avail: dict[str, list[tuple[int, str]]], picks) -> None:
    """Take the GPUs of `picks` ([(host, uuids)], a grant's leases) out of `avail`."""
    for host, uuids in picks:
        avail[host] = [f for f in avail[host] if f[1] not in uuids]


def available_after(
    snap: Snapshot, ahead: Iterable[WaiterRow], now: datetime, backfill_window: float, choose: Choose,
    booked_out: BookedOut | None = None,
) -> dict[str, list[tuple[int, str]]]:
    """The free GPUs left for a request after the waiters ahead of it take their turn
    (FIFO with bounded backfill, see _take_turns)."""
    avail = {h: list(lst) for h, lst in snap.free.items()}
    for _row, avail, _served in _take_turns(snap, ahead, now, backfill_window, choose, booked_out):  # noqa: B007 (the last turn's GPUs are the answer)
        pass
    return avail


def served_now(
    snap: Snapshot, rows: Iterable[WaiterRow], now: datetime, backfill_window: float, choose: Choose,
    booked_out: BookedOut | None = None,
) -> set[int]:
    """Ids of the queue rows (all of them, in queue order) that a grant would serve now.

    One pass over the queue for every waiter of a process: a waiter asks the
    ledger for its lease (a write) only when this says it would get one.
    """
    return {row.id for row, _avail, served in _take_turns(snap, rows, now, backfill_window, choose, booked_out)
            if served}


def timeout_message(req: Request, position: int, free: int, total: int, waited: float) -> str:
    """What a user reads when their wait for GPUs ran out."""
    where = f"you were {ordinal(position)} in the queue for {asked(req.count, req.workers)}"
    if free == 0:
        head = f"All {gpus_text(total)} are lent" if total != 1 else "The only GPU is lent"
    elif free < req.total:
        head = f"Only {free} of {gpus_text(total)} are free"
    else:
        head = f"{gpus_text(free)} are free but held for requests ahead of yours"
    return f"{head}; {where} and waited {waited:g} s; try again later"
