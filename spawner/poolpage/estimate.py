"""Wait estimates for the queue and idle-cull deadlines: pure functions, labelled as estimates.

Each lent GPU is expected back when its lease would typically end (the median
length of past leases that ran at least as long as this one has), or at its
server's idle-cull deadline if that comes first.  Waiters are then served in
queue order from the GPUs free now and those expected back.  It ignores hosts,
backfill and people who stop early: an estimate, never a promise.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from statistics import median

NOTE = ("Estimates: each lent GPU is expected back after a typical lease (the median of past leases that "
        "ran as long) or at its server's idle cull, whichever is sooner. Servers stopped early or kept "
        "busy change them.")


@dataclass(frozen=True)
class Holding:
    """A lent lease: when it started, how many GPUs, when its server is culled if it stays idle."""

    started: datetime
    gpus: int
    cull_at: datetime | None = None
    # What is known about its end, for the estimate's reason: "alice's idle server is culled at
    # 14:35 if she stays idle" (whose: only where the viewer may see it).
    cull_reason: str = ""


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
    """When the lease's GPUs are expected back, and what that rests on."""
    typical = typical_end(h.started, now, lengths)
    if h.cull_at is not None and (typical is None or h.cull_at <= typical):
        return max(now, h.cull_at), h.cull_reason or f"a server is culled at {h.cull_at.strftime('%H:%M')} UTC"
    if typical is not None:
        return max(now, typical), "a lease of typical length ends"
    return None, ""


def waits_explained(queue: list[int], free: int, holdings: list[Holding], now: datetime,
                    lengths: list[float]) -> list[tuple[float | None, str]]:
    """Like `waits`, with the reason of each: the known end that serves the waiter (playing the
    queue forward over the holdings' known and typical ends)."""
    returns = sorted((t, h.gpus, why) for h in holdings for t, why in [back_and_why(h, now, lengths)]
                     if t is not None)
    available, i, reason = free, 0, "GPUs are free now"
    out: list[tuple[float | None, str]] = []
    for count in queue:
        when = now
        while available < count and i < len(returns):
            when, n, reason = returns[i]
            available += n
            i += 1
        if available < count:
            out.append((None, "nothing lent is expected back"))
            continue
        available -= count
        out.append(((when - now).total_seconds(), reason))
    return out


def waits(queue: list[int], free: int, holdings: list[Holding], now: datetime,
          lengths: list[float]) -> list[float | None]:
    """Estimated seconds until each waiter (GPUs asked, in queue order) is served; None: unknown."""
    returns = sorted((t, h.gpus) for h in holdings if (t := expected_back(h, now, lengths)) is not None)
    available, i = free, 0
    out: list[float | None] = []
    for count in queue:
        when = now
        while available < count and i < len(returns):
            when, n = returns[i]
            available += n
            i += 1
        if available < count:
            out.append(None)  # nothing left that is expected back
            continue
        available -= count
        out.append((when - now).total_seconds())
    return out


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
