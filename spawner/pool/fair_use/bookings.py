"""Bookings: N GPUs of one host held for a user (or a group) over a time window, guaranteed by the ledger.

A booking names its GPUs when it is made (the first that no other booking holds
in that window, those nobody is using first).  During its window those GPUs are
lent only to the booker, or to the members of the group it is for: every grant
leaves them out for anyone else (`exclude`).  A server or job that got one of
them before the window is told so at once, with how long it has (`soon`,
`notice`: at its start, on the pool page, in JupyterLab's GPU panel, in the job's
status), and stopped when the window starts, with reason `booking`.

A booking is not an eviction button: a plain user's booking that would take GPUs
someone is using now starts no sooner than `notice_s` from now (an hour by
default), so their holders have that long; an admin's may start at once.  A
booking is at most what its booker may hold (their GPU quota, `quota`; the pool
service checks their profiles too).  Each GPU of a booking that nobody it is for
has used `grace_s` after its start goes back to the pool (`release_no_shows`,
per GPU).  Bookings live in the ledger, so they survive hub restarts.  Limits
(`Limits`): the longest window, how far ahead, booked GPU-hours per user in a week
(cancelled and released bookings count what they booked, so booking, cancelling
and booking again does not reset it), bookings a user may hold; a request that
overlaps is refused with the next free window named.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field, fields, replace
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import bindparam, insert, select, update

from ..leasing.policy import limit_for
from ..ledger.schema import bookings_table as _b
from ..ledger.schema import gpus_table as _g
from ..ledger.schema import lease_gpus_table as _lg
from ..ledger.schema import leases_table as _l
from ..ledger.schema import meta_table as _m
from ..ledger.store import as_utc
from ..models import InvalidRequest, PoolError, gpus_text, iso

# Bookings that may matter now or later: booked, not yet over.
# (bind parameters only: the SQLite fast path runs this as it is)
ANY_LIVE = select(_b.c.id).where(_b.c.state == bindparam("booked"), _b.c.ends_at > bindparam("now"))
LIVE = select(_b).where(_b.c.state == "booked", _b.c.ends_at > bindparam("now")).order_by(_b.c.starts_at, _b.c.id)


class BookingRefused(PoolError):
    """A booking over a limit, overlapping, or otherwise impossible (HTTP 400 with the reason)."""

    status_code = 400


class UnknownBooking(PoolError):
    """No live booking has this id (HTTP 404)."""

    status_code = 404


class NotYours(PoolError):
    """Booking for another user, or a group one is not in, without being an admin."""

    status_code = 403


@dataclass(frozen=True)
class Limits:
    max_hours: float = 8.0  # the longest window
    max_days_ahead: float = 14.0  # how far ahead a window may start
    max_gpu_hours_per_week: float = 40.0  # a user's booked GPU-hours in any 7 days around a booking
    max_per_user: int = 10  # live bookings one user may hold
    grace_s: float = 900.0  # unused this long after its start, a booking's GPU is released
    notice_s: float = 3600.0  # a plain user's booking of GPUs in use starts no sooner than this
    # The lending hub's GPU quota (GPUPool.max_gpus_per_user, .group_gpu_limits): a user books
    # no more GPUs than they may hold.
    max_gpus_per_user: int | None = None
    group_gpu_limits: dict = field(default_factory=dict)

    def quota(self, groups: Iterable[str]) -> tuple[int | None, str]:
        return limit_for(groups, self.group_gpu_limits, self.max_gpus_per_user)


@dataclass(frozen=True)
class Booking:
    id: int
    user: str
    group: str | None
    host: str
    gpu_uuids: tuple[str, ...]
    starts_at: datetime
    ends_at: datetime
    created_by: str
    state: str = "booked"

    @property
    def gpu_hours(self) -> float:
        return len(self.gpu_uuids) * (self.ends_at - self.starts_at).total_seconds() / 3600.0

    def active(self, now: datetime) -> bool:
        return self.state == "booked" and self.starts_at <= now < self.ends_at

    def for_(self, user: str, groups: Iterable[str]) -> bool:
        """Whether `user` (in `groups`) may use this booking's GPUs."""
        return user == self.user if self.group is None else self.group in set(groups)

    def to_dict(self, show_user: bool = True) -> dict[str, Any]:
        return {"id": self.id, "user": self.user if show_user else None, "group": self.group, "host": self.host,
                "gpus": len(self.gpu_uuids), "gpu_uuids": list(self.gpu_uuids), "starts_at": iso(self.starts_at),
                "ends_at": iso(self.ends_at), "state": self.state, "gpu_hours": round(self.gpu_hours, 3)}


LIMITS_KEY = "booking_limits"


def publish_limits(conn, limits: Limits) -> None:
    """Write the lending hub's booking limits into the ledger: the pool page books and the
    culler releases no-shows by the hub's configuration, not by their own defaults."""
    value = json.dumps(asdict(limits))
    if conn.execute(select(_m.c.value).where(_m.c.key == LIMITS_KEY)).first() is None:
        conn.execute(insert(_m).values(key=LIMITS_KEY, value=value))
    else:
        conn.execute(update(_m).where(_m.c.key == LIMITS_KEY).values(value=value))


def published_limits(conn) -> Limits | None:
    """The lending hub's booking limits, or None where no hub has written them."""
    raw = conn.execute(select(_m.c.value).where(_m.c.key == LIMITS_KEY)).scalar()
    if not raw:
        return None
    known = {f.name for f in fields(Limits)}
    return Limits(**{k: v for k, v in json.loads(raw).items() if k in known})


def _row(r) -> Booking:
    return Booking(r.id, r.user_name, r.group_name, r.host, tuple(json.loads(r.gpu_uuids)), as_utc(r.starts_at),
                   as_utc(r.ends_at), r.created_by, r.state)


def live(conn, now: datetime) -> list[Booking]:
    """Bookings not yet over (booked), by start."""
    return [_row(r) for r in conn.execute(LIVE, {"now": now})]


def blocking(bookings: list[Booking], user: str, groups: Iterable[str], now: datetime,
             until: datetime | None = None) -> set[tuple[str, str]]:
    """The GPUs ((host, uuid)) booked for others now, or (`until`: a lease held until then at
    most) from before `until`."""
    groups = tuple(groups)
    return {(b.host, u) for b in bookings if b.state == "booked" and not b.for_(user, groups)
            and (b.active(now) or (until is not None and now < b.ends_at and b.starts_at < until))
            for u in b.gpu_uuids}


def exclude(free: dict[str, list[tuple[int, str]]], bookings: list[Booking], user: str, groups: Iterable[str],
            now: datetime, until: datetime | None = None) -> dict[str, list[tuple[int, str]]]:
    """The free GPUs `user` may be lent now: those booked now for others left out (and, for a
    lease held until `until` at most, those booked for others from before then)."""
    held = blocking(bookings, user, groups, now, until)
    if not held:
        return free
    return {h: [f for f in lst if (h, f[1]) not in held] for h, lst in free.items()}


def held_for_others(bookings: list[Booking], now: datetime):
    """(user, groups) -> the GPUs ((host, uuid)) booked now for someone else: what that waiter may
    not take in the queue's turns (so a booker behind others still gets their booked GPU)."""
    active = [b for b in bookings if b.active(now)]
    seen: dict[tuple[str, tuple[str, ...]], frozenset] = {}

    def out(user: str, groups: Iterable[str]) -> frozenset:
        key = (user, tuple(groups))
        found = seen.get(key)
        if found is None:
            found = seen[key] = frozenset((b.host, u) for b in active if not b.for_(*key) for u in b.gpu_uuids)
        return found
    return out


def soon(host: str, uuids: Iterable[str], bookings: list[Booking], user: str, groups: Iterable[str],
         now: datetime) -> Booking | None:
    """The first booking for others of any of these GPUs still to start (the server is stopped then)."""
    mine = set(uuids)
    later = [b for b in bookings if b.host == host and b.starts_at > now and not b.for_(user, groups)
             and mine & set(b.gpu_uuids)]
    return min(later, key=lambda b: b.starts_at) if later else None


def time_left(b: Booking, now: datetime) -> str:
    minutes = max(0, int((b.starts_at - now).total_seconds() // 60))
    return f"{minutes} min" if minutes < 120 else f"{minutes // 60} h {minutes % 60:02d} min"


def notice(b: Booking, now: datetime | None = None, what: str = "your server") -> str:
    """What a server (or job) on a GPU booked later is told: when, and how long it has."""
    left = f", in {time_left(b, now)}" if now is not None else ""
    return (f"This GPU is booked from {b.starts_at.strftime('%a %H:%M')} UTC{left}; {what} will be stopped then "
            f"(reason: booking): save your work before, or choose another profile")


def _users_on(conn, b: Booking):
    """(uuid, user, groups) of the leases on a booking's GPUs since its start (a minute's slack)."""
    return conn.execute(select(_lg.c.uuid, _l.c.user_name, _l.c.groups).select_from(
        _l.join(_lg, _lg.c.lease_id == _l.c.id)).where(
        _lg.c.host == b.host, _lg.c.uuid.in_(b.gpu_uuids), _l.c.started_at >= b.starts_at - timedelta(minutes=1)))


def unused_gpus(conn, bookings: list[Booking], now: datetime, grace_s: float) -> dict[int, set[str]]:
    """{booking id: its GPUs nobody it is for has used} for the bookings `grace_s` past their start.
    "Used" is per GPU: one lease on one GPU of a booking keeps that GPU, not the others."""
    out: dict[int, set[str]] = {}
    for b in bookings:
        if b.starts_at + timedelta(seconds=grace_s) > now:
            continue
        used = {u for u, user, groups in _users_on(conn, b) if b.for_(user, json.loads(groups))}
        unused = set(b.gpu_uuids) - used
        if unused:
            out[b.id] = unused
    return out


def without_unused(bookings: list[Booking], unused: dict[int, set[str]]) -> list[Booking]:
    """The bookings as they hold GPUs once their unused ones are released (none left: gone)."""
    out = []
    for b in bookings:
        gone = unused.get(b.id)
        if not gone:
            out.append(b)
        elif len(gone) < len(b.gpu_uuids):
            out.append(replace(b, gpu_uuids=tuple(u for u in b.gpu_uuids if u not in gone)))
    return out


def no_shows(conn, bookings: list[Booking], now: datetime, grace_s: float) -> list[int]:
    """Ids of the bookings none of whose GPUs was used `grace_s` after their start."""
    unused = unused_gpus(conn, bookings, now, grace_s)
    return [b.id for b in bookings if len(unused.get(b.id, ())) == len(b.gpu_uuids)]


def release_no_shows(conn, now: datetime, grace_s: float) -> list[int]:
    """Give back each GPU of a booking unused `grace_s` after its start (see unused_gpus): a
    booking with none used is released, one with some used keeps those. The ids changed."""
    found = live(conn, now)
    unused = unused_gpus(conn, found, now, grace_s)
    for b in found:
        gone = unused.get(b.id)
        if not gone:
            continue
        if len(gone) == len(b.gpu_uuids):
            conn.execute(update(_b).where(_b.c.id == b.id, _b.c.state == "booked").values(
                state="released", released_at=now))
        else:
            kept = [u for u in b.gpu_uuids if u not in gone]
            conn.execute(update(_b).where(_b.c.id == b.id, _b.c.state == "booked").values(gpu_uuids=json.dumps(kept)))
    return sorted(unused)


def lease_booked_out(conn, lease_id: int, now: datetime) -> Booking | None:
    """The booking (for someone else) that holds an active lease's GPU now, else None (for the culler)."""
    lease = conn.execute(select(_l.c.user_name, _l.c.groups, _l.c.host).where(
        _l.c.id == lease_id, _l.c.ended_at.is_(None))).first()
    if lease is None:
        return None
    uuids = {u for (u,) in conn.execute(select(_lg.c.uuid).where(_lg.c.lease_id == lease_id))}
    groups = json.loads(lease.groups)
    for b in live(conn, now):
        if b.active(now) and b.host == lease.host and uuids & set(b.gpu_uuids) and not b.for_(lease.user_name, groups):
            return b
    return None


def _window(b: Booking, start: datetime, end: datetime) -> bool:
    return b.starts_at < end and start < b.ends_at


def booked_near(conn, user: str, starts_at: datetime) -> float:
    """GPU-hours `user` booked with a start within a week of `starts_at`, whatever became of them
    (live, cancelled, released, over): what they booked, not what is left of it."""
    week = timedelta(days=7)
    rows = conn.execute(select(_b.c.count, _b.c.starts_at, _b.c.ends_at).where(
        _b.c.user_name == user, _b.c.starts_at > starts_at - week, _b.c.starts_at < starts_at + week))
    return sum(r.count * (as_utc(r.ends_at) - as_utc(r.starts_at)).total_seconds() / 3600.0 for r in rows)


def lent_to_others(conn, user: str) -> set[tuple[str, str]]:
    """The GPUs ((host, uuid)) someone other than `user` holds now."""
    rows = conn.execute(select(_lg.c.host, _lg.c.uuid).select_from(_l.join(_lg, _lg.c.lease_id == _l.c.id)).where(
        _l.c.ended_at.is_(None), _l.c.user_name != user))
    return {(r.host, r.uuid) for r in rows}


def make(conn, now: datetime, *, user: str, group: str | None, count: int, starts_at: datetime, ends_at: datetime,
         host: str | None, created_by: str, limits: Limits, admin: bool = True,
         groups: Iterable[str] = ()) -> Booking:
    """Check a booking against every limit and the others, choose its GPUs, write it.

    `admin` False (a plain user booking for themself, in `groups`): at most their GPU quota,
    and GPUs someone else uses now only from `limits.notice_s` ahead."""
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise InvalidRequest(f"count must be a whole number of GPUs >= 1, not {count!r}")
    if not admin:
        quota, source = limits.quota(groups)
        if quota is not None and count > quota:
            raise BookingRefused(f"You may hold {gpus_text(quota)} at once ({source}), so you may book at most "
                                 f"that; you asked for {gpus_text(count)}")
    length = (ends_at - starts_at).total_seconds()
    if length <= 0:
        raise BookingRefused("The booking must end after it starts")
    if starts_at < now - timedelta(minutes=1):
        raise BookingRefused(f"The booking starts in the past ({starts_at.strftime('%Y-%m-%d %H:%M')} UTC); "
                             "book from now on")
    if length > limits.max_hours * 3600:
        raise BookingRefused(f"A booking may last at most {limits.max_hours:g} hours (GPUPool.booking_max_hours)")
    if starts_at > now + timedelta(days=limits.max_days_ahead):
        raise BookingRefused(f"A booking may start at most {limits.max_days_ahead:g} days ahead "
                             "(GPUPool.booking_max_days_ahead)")
    rows = conn.execute(select(_g.c.host, _g.c.uuid, _g.c.idx).where(_g.c.present, _g.c.drained.is_(False))
                        .order_by(_g.c.host, _g.c.idx)).all()
    by_host: dict[str, list[str]] = {}
    for r in rows:
        by_host.setdefault(r.host, []).append(r.uuid)
    hosts = [host] if host is not None else sorted(by_host)
    largest = max((len(by_host.get(h, [])) for h in hosts), default=0)
    if count > largest:
        where = f"host {host}" if host else "the largest host"
        raise BookingRefused(f"You asked for {gpus_text(count)}, but {where} has {gpus_text(largest)} to lend")
    existing = live(conn, now)
    mine = [b for b in existing if b.user == user]
    if len(mine) >= limits.max_per_user:
        raise BookingRefused(f"You hold {len(mine)} bookings, the most one user may hold "
                             "(GPUPool.booking_max_per_user); cancel one first")
    near = booked_near(conn, user, starts_at)
    asked = count * length / 3600.0
    if near + asked > limits.max_gpu_hours_per_week:
        raise BookingRefused(f"You have {near:.1f} GPU-hours booked within a week of this start; {asked:.1f} more "
                             f"would pass the {limits.max_gpu_hours_per_week:g} a user may book in a week "
                             "(GPUPool.booking_max_gpu_hours_per_week)")

    # GPUs someone uses now: taken by a booking only with notice (a plain user's), and the
    # last chosen by anyone's (an admin's booking from now stops fewer people).
    in_use = lent_to_others(conn, user)

    def pick(start: datetime, end: datetime,
             avoid: frozenset[tuple[str, str]] = frozenset()) -> tuple[str, list[str]] | None:
        for h in hosts:
            taken = {u for b in existing if b.host == h and _window(b, start, end) for u in b.gpu_uuids}
            free = [u for u in by_host.get(h, []) if u not in taken and (h, u) not in avoid]
            free.sort(key=lambda u: (h, u) in in_use)  # stable: unused first, in index order
            if len(free) >= count:
                return h, free[:count]
        return None

    noticed = now + timedelta(seconds=limits.notice_s)
    short_notice = not admin and starts_at < noticed
    chosen = pick(starts_at, ends_at, frozenset(in_use) if short_notice else frozenset())
    if chosen is None and short_notice and pick(starts_at, ends_at) is not None:
        raise BookingRefused(
            f"{gpus_text(count)} free of other bookings from {starts_at.strftime('%a %H:%M')} UTC would mean "
            f"stopping people who use them now: a booking of GPUs in use starts at least "
            f"{limits.notice_s / 60:g} minutes ahead (GPUPool.booking_notice), so they have time to save "
            f"their work. Book from {noticed.strftime('%a %H:%M')} UTC on, or ask a GPU pool admin")
    if chosen is None:
        span = ends_at - starts_at
        candidates = sorted({b.ends_at for b in existing if b.ends_at > starts_at})
        nxt = next((t for t in candidates if t <= now + timedelta(days=limits.max_days_ahead)
                    and pick(t, t + span) is not None), None)
        later = (f"; the next free window of that length is {nxt.strftime('%a %Y-%m-%d %H:%M')} to "
                 f"{(nxt + span).strftime('%H:%M')} UTC" if nxt else "")
        raise BookingRefused(f"{gpus_text(count)} cannot be booked from {starts_at.strftime('%a %H:%M')} to "
                             f"{ends_at.strftime('%H:%M')} UTC: other bookings hold them{later}")
    chosen_host, uuids = chosen
    bid = conn.execute(insert(_b).values(
        user_name=user, group_name=group, host=chosen_host, gpu_uuids=json.dumps(uuids), count=count,
        starts_at=starts_at, ends_at=ends_at, created_at=now, created_by=created_by, state="booked")
    ).inserted_primary_key[0]
    return Booking(bid, user, group, chosen_host, tuple(uuids), starts_at, ends_at, created_by)


def cancel(conn, booking_id: int, by: str, admin: bool, now: datetime) -> Booking:
    r = conn.execute(select(_b).where(_b.c.id == booking_id)).first()
    if r is None or r.state != "booked":
        raise UnknownBooking(f"No live booking {booking_id}")
    b = _row(r)
    if not admin and b.user != by:
        raise NotYours("Only its booker or an admin may cancel a booking")
    conn.execute(update(_b).where(_b.c.id == booking_id).values(state="cancelled", released_at=now))
    return b
