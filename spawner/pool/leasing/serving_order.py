"""The queue's order, as a pure function over the waiters: fair-share or FIFO, and why.

A waiter's *standing* is its user's recent GPU use per share, plus that of each
of its groups that has a share: GPU-hours decayed with the fair-share half-life
(rollup.py keeps them), divided by the share (users: `fairshare_shares`,
default 1 each; groups count only when listed in `fairshare_group_shares`).
Lower standing goes first; equal standings go in arrival order.  A request that
has waited longer than `fifo_after` seconds stops being passed: such requests
go first, in arrival order, so nobody starves behind lighter users.

`order` knows nothing of the database: the grant transaction (grant.py) and
the queue's readers hand it the waiters (with their GPU count, so a request
for several GPUs, or a gang of them, is one entry like any other) and the use;
placement and backfill (policy._take_turns) then walk the queue in this order.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Protocol

from ..models import ordinal

FAIRSHARE = "fairshare"
FIFO = "fifo"


class Entry(Protocol):
    """What the order needs of a waiter (policy.WaiterRow has it), read-only."""

    @property
    def id(self) -> int: ...
    @property
    def user(self) -> str: ...
    @property
    def count(self) -> int: ...
    @property
    def enqueued_at(self) -> datetime: ...
    @property
    def groups(self) -> tuple[str, ...]: ...


@dataclass(frozen=True)
class Shares:
    """The fair-share settings the order needs."""

    users: Mapping[str, float]
    groups: Mapping[str, float]
    fifo_after: float

    def user_share(self, user: str) -> float:
        return float(self.users.get(user, 1.0))


def standing(user: str, groups: Iterable[str], use_users: Mapping[str, float], use_groups: Mapping[str, float],
             shares: Shares) -> float:
    """Recent GPU-hours per share of `user` plus those of its groups that have a share."""
    value = use_users.get(user, 0.0) / shares.user_share(user)
    for g in groups:
        if g in shares.groups:
            value += use_groups.get(g, 0.0) / float(shares.groups[g])
    return value


def priority(value: float) -> float:
    """A standing as a priority in (0, 1]: 1 for no recent use, halving per 10 GPU-hours per share
    (as Slurm's fair-share factor, shown by `gpu-pool fairshare`)."""
    return 2.0 ** (-value / 10.0)


def order(entries: Sequence[Entry], mode: str, standing_of: Callable[[Entry], float], now: datetime,
          fifo_after: float) -> list[Entry]:
    """The waiters in the order they are served (entries come in arrival order; `standing_of`
    gives comparable values, rounded so that equal use compares equal).

    fifo: arrival order.  fairshare: those that waited `fifo_after` or longer first, in
    arrival order; then the rest by standing, arrival order among equals.  Arrival is a row's
    `enqueued_at`, then its id: a reclaimed job queued again arrives when it first did."""
    if mode != FAIRSHARE:
        return sorted(entries, key=arrival)
    cutoff = now - timedelta(seconds=fifo_after)
    overdue = [e for e in entries if e.enqueued_at <= cutoff]
    rest = [e for e in entries if e.enqueued_at > cutoff]
    rest.sort(key=lambda e: (standing_of(e), e.enqueued_at, e.id))
    return sorted(overdue, key=arrival) + rest


def arrival(entry: Entry) -> tuple[datetime, int]:
    """A waiter's place in arrival order: when it joined (its first time, for a job queued again
    after a reclaim), then its row id."""
    return entry.enqueued_at, entry.id


def why(position: int, ahead: Sequence[Entry], me: Entry, mode: str, standing_of: Callable[[Entry], float],
        now: datetime, fifo_after: float, my_use: float, half_life_s: float) -> str:
    """Why a waiter is where it is, naming nobody: '2nd in the queue: 1 request from someone
    with less recent GPU use is ahead of you; your recent GPU use: 14.2 GPU-hours (half-life 7 days)'."""
    head = f"{ordinal(position)} in the queue"
    if not ahead:
        return f"{head}: next to be served"
    if mode != FAIRSHARE:
        return fifo_why(position)
    cutoff = now - timedelta(seconds=fifo_after)
    mine = standing_of(me)
    overdue = sum(1 for e in ahead if e.enqueued_at <= cutoff)
    lighter = sum(1 for e in ahead if e.enqueued_at > cutoff and standing_of(e) < mine)
    equal = len(ahead) - overdue - lighter
    parts = []
    if lighter:
        parts.append(f"{_requests(lighter)} from someone with less recent GPU use")
    if equal:
        parts.append(f"{_requests(equal)} with as much recent use that came earlier")
    if overdue:
        parts.append(f"{_requests(overdue)} that waited longer than {_duration(fifo_after)} (then the queue "
                     "goes by arrival)")
    verb = "is" if len(ahead) == 1 else "are"
    return (f"{head}: {'; '.join(parts)} {verb} ahead of you; your recent GPU use: {my_use:.1f} GPU-hours "
            f"(half-life {_duration(half_life_s)})")


def fifo_why(position: int) -> str:
    """The FIFO queue's `why`: only arrival counts."""
    head = f"{ordinal(position)} in the queue"
    n = position - 1
    return (f"{head}: next to be served" if n <= 0
            else f"{head}: {_requests(n)} that came earlier {_are(n)} ahead of you")


def _requests(n: int) -> str:
    return "1 request" if n == 1 else f"{n} requests"


def _are(n: int) -> str:
    return "is" if n == 1 else "are"


def _duration(seconds: float) -> str:
    if seconds >= 86400 and seconds % 86400 == 0:
        days = int(seconds // 86400)
        return "day" if days == 1 else f"{days} days"
    if seconds >= 3600 and seconds % 3600 == 0:
        hours = int(seconds // 3600)
        return "hour" if hours == 1 else f"{hours} hours"
    if seconds >= 60 and seconds % 60 == 0:
        return f"{int(seconds // 60)} min"
    return f"{seconds:g} s"
