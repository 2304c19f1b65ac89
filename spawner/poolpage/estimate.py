"""Wait estimates for the queue and idle-cull deadlines: pure functions, labelled as estimates.

Each lent GPU is expected back at the first end known for its lease (its
server's idle cull or maximum age, its job's timeout, the start of someone
else's booking of its GPU, when its server is stopped, its holder's GPU-hour
budget running out, when the culler stops its server), or when a lease like it
typically ends (the median length of past leases that ran at least as long as
this one has) if that is sooner or nothing is known.  Waiters are then served in
queue order from the GPUs free now and those expected back; a GPU that someone
else has booked is not free for a waiter during the booking, only once it ends
(the booker's own waiters may take it).  It ignores hosts, backfill and people
who stop early: an estimate, never a promise.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from statistics import median
from typing import Protocol

NOTE = ("Estimates: each lent GPU is expected back at the first end known for it (an idle cull, a maximum "
        "age, a job's timeout, someone else's booking, its holder's GPU-hour budget running out) or after a "
        "typical lease (the median of past leases that ran as long), whichever is sooner; a GPU booked by "
        "someone else is free again when the booking ends. Servers stopped early or kept busy change them.")

Slot = tuple[str, str]  # (host, uuid) of one GPU


@dataclass(frozen=True)
class Holding:
    """A lent lease: when it started, how many GPUs, when its server is culled if it stays idle."""

    started: datetime
    gpus: int
    cull_at: datetime | None = None
    # What is known about its end, for the estimate's reason: "alice's idle server is culled at
    # 14:35 if she stays idle" (whose: only where the viewer may see it).
    cull_reason: str = ""
    # Other ends known at the latest, each with its reason: a job's timeout, a booking that
    # stops the server.
    ends: tuple[tuple[datetime, str], ...] = ()
    # Its GPUs (host, uuid), where bookings matter; empty: anonymous GPUs.
    slots: tuple[Slot, ...] = ()


class BookingLike(Protocol):
    """What the estimate reads of a booking (pool.bookings.Booking)."""

    host: str
    gpu_uuids: tuple[str, ...]
    starts_at: datetime
    ends_at: datetime

    def for_(self, user: str, groups: Iterable[str]) -> bool: ...


Who = tuple[str, tuple[str, ...]]  # a waiter's (user, groups)


def typical_end(started: datetime, now: datetime, lengths: list[float]) -> datetime | None:
    """When a lease that started at `started` typically ends, given past lease lengths (s)."""
    age = (now - started).total_seconds()
    longer = [x for x in lengths if x >= age]
    if not longer:
        return None
    return started + timedelta(seconds=median(longer))


def expected_back(h: Holding, now: datetime, lengths: list[float]) -> datetime | None:
    return back_and_why(h, now, lengths)[0]


def back_and_why(h: Holding, now: datetime, lengths: list[float]) -> tuple[datetime | None, str]:
    """When the lease's GPUs are expected back, and what that rests on: the soonest of its known
    ends and its typical end (a known end wins a tie)."""
    known = list(h.ends)
    if h.cull_at is not None:
        known.append((h.cull_at, h.cull_reason or f"a server is culled at {h.cull_at.strftime('%H:%M')} UTC"))
    typical = typical_end(h.started, now, lengths)
    options = [(t, 0, why) for t, why in known] + ([(typical, 1, "a lease of typical length ends")]
                                                   if typical is not None else [])
    if not options:
        return None, ""
    at, _, why = min(options, key=lambda o: (o[0], o[1]))
    return max(now, at), why


def _free_for(slot: Slot | None, at: datetime, why: str, who: Who | None,
              bookings: Sequence[BookingLike], hold: float | None = None) -> tuple[datetime, str]:
    """When a GPU back at `at` is free for the waiter `who`: after every booking of it for others
    that holds it then, or, for a waiter that says how long it holds its GPUs (`hold` seconds: a
    batch job, which nothing stops at a booking's start), that starts before it would be done;
    the grant lends such a GPU to neither."""
    if slot is None or not bookings:
        return at, why
    host, uuid = slot
    mine = sorted((b for b in bookings if b.host == host and uuid in b.gpu_uuids
                   and (who is None or not b.for_(*who))), key=lambda b: b.starts_at)
    for b in mine:
        if at < b.ends_at and (b.starts_at <= at or (hold and b.starts_at < at + timedelta(seconds=hold))):
            at, why = b.ends_at, f"a booking of a GPU ends at {b.ends_at.strftime('%H:%M')} UTC"
    return at, why


def waits_explained(queue: list[int], free: int, holdings: list[Holding], now: datetime,
                    lengths: list[float], bookings: Sequence[BookingLike] = (),
                    who: Sequence[Who | None] = (), free_slots: Sequence[Slot] = (),
                    holds: Sequence[float | None] = ()) -> list[tuple[float | None, str]]:
    """Like `waits`, with the reason of each: the known end that serves the waiter (playing the
    queue forward over the holdings' known and typical ends and the bookings).

    `who`: each waiter's (user, groups), so that their own bookings do not hold them back;
    `free_slots`: the free GPUs themselves (else `free` anonymous ones); `holds`: each waiter's
    seconds it holds its GPUs, where known (a job's timeout: see _free_for)."""
    # (back at, why, the GPU, until): until, where a waiter ahead took the GPU only once someone
    # else's booking of it ended, is when that waiter takes it; the booking's own people may use
    # it before (the queue lets them pass, as the grant does).
    Entry = tuple[datetime, str, Slot | None, datetime | None]
    slots: list[Entry] = [(now, "GPUs are free now", s, None) for s in free_slots] or \
        [(now, "GPUs are free now", None, None)] * free
    for h in holdings:
        back, why = back_and_why(h, now, lengths)
        if back is None:
            continue
        keys: Sequence[Slot | None] = h.slots if len(h.slots) == h.gpus else [None] * h.gpus
        slots += [(back, why, k, None) for k in keys]
    out: list[tuple[float | None, str]] = []
    for i, count in enumerate(queue):
        waiter = who[i] if i < len(who) else None
        hold = holds[i] if i < len(holds) else None
        ready = sorted(((t, reason, n) for n, (at, why, k, until) in enumerate(slots)
                        for t, reason in [_free_for(k, at, why, waiter, bookings, hold)]
                        if until is None or t < until),
                       key=lambda r: (r[0], r[2]))
        if count > len(ready) or count < 1:
            out.append((None, "nothing lent is expected back"))
            continue
        taken = ready[:count]
        when, reason, _ = taken[-1]
        gaps = [(at, why, k, t) for t, _, n in taken for at, why, k, until in [slots[n]] if t > at and until is None]
        for n in sorted((n for *_, n in taken), reverse=True):
            del slots[n]
        slots += gaps
        out.append(((when - now).total_seconds(), reason))
    return out


def waits(queue: list[int], free: int, holdings: list[Holding], now: datetime,
          lengths: list[float]) -> list[float | None]:
    """Estimated seconds until each waiter (GPUs asked, in queue order) is served; None: unknown."""
    return [s for s, _ in waits_explained(queue, free, holdings, now, lengths)]


def say(seconds: float | None) -> str:
    """'about 25 min (estimate)', 'soon (estimate)', 'unknown'."""
    if seconds is None:
        return "unknown"
    if seconds < 60:
        return "soon (estimate)"
    minutes = round(seconds / 60)
    if minutes < 90:
        return f"about {minutes} min (estimate)"
    return f"about {seconds / 3600:.1f} h (estimate)"
