"""GPU-hour budgets: a rolling allowance per user and per group, beside the concurrency quotas.

A user may use `gpu_hour_budget` GPU-hours in any `budget_period` (7 days by
default); a group listed in `group_gpu_hour_budgets` may use that many among
all its members.  Checked when a lease is granted (refused with what was used
and when the next hour frees) and while it runs: the culler ends a lease whose
budget has run out like a culled server, with reason `budget` (the home is
kept).  Use is read from the rolled-up hours (rollup.py), one user's or
group's rows of the period, never the whole history.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from sqlalchemy import bindparam, func, insert, select, update

from ..history.rollup import HOUR, ceil_hour, floor_hour
from ..ledger.schema import lease_gpus_table as _lg
from ..ledger.schema import lease_hours_table as _h
from ..ledger.schema import leases_table as _l
from ..ledger.schema import meta_table as _m
from ..ledger.store import as_utc
from ..models import QuotaExceeded

USER_HOURS = (select(_h.c.hour, func.sum(_h.c.gpu_seconds))
              .where(_h.c.user_name == bindparam("user"), _h.c.hour >= bindparam("first"))
              .group_by(_h.c.hour).order_by(_h.c.hour))
# A group's rows, coarsely: those whose JSON list holds the name's JSON text (a LIKE with every
# wildcard and the escape character escaped, so it matches literally on both databases; SQLite's
# LIKE still ignores ASCII case), summed per hour and list.  group_hours() then keeps the rows
# whose list names the group exactly.
LIKE_ESCAPE = "!"
GROUP_HOURS = (select(_h.c.hour, _h.c.groups, func.sum(_h.c.gpu_seconds))
               .where(_h.c.groups.like(bindparam("pattern"), escape=LIKE_ESCAPE), _h.c.hour >= bindparam("first"))
               .group_by(_h.c.hour, _h.c.groups).order_by(_h.c.hour))
ACTIVE = (select(_l.c.id, _l.c.user_name, _l.c.groups, _l.c.started_at, func.count(_lg.c.uuid))
          .select_from(_l.join(_lg, _lg.c.lease_id == _l.c.id))
          .where(_l.c.ended_at.is_(None))
          .group_by(_l.c.id, _l.c.user_name, _l.c.groups, _l.c.started_at))
LEASE_OWNER = select(_l.c.user_name, _l.c.groups, _l.c.ended_at).where(_l.c.id == bindparam("lid"))


class BudgetExhausted(QuotaExceeded):
    """The user's or group's GPU-hours of the period are used up."""


@dataclass(frozen=True)
class Budgets:
    user: float | None = None  # GPU-hours per period for each user (None: no budget)
    groups: Mapping[str, float] = field(default_factory=dict)
    period_s: float = 7 * 86400.0

    @property
    def any(self) -> bool:
        return self.user is not None or bool(self.groups)


@dataclass(frozen=True)
class Standing:
    """One budget as it stands now."""

    who: str  # "you" or "group 'x'"
    used: float
    limit: float
    frees_at: datetime | None  # when the next GPU-hour frees, if nothing more is used
    runs_out_at: datetime | None  # when what is held now uses it up (None: holds nothing)

    @property
    def exhausted(self) -> bool:
        # Within a millisecond of GPU time: the hours are sums of floats, never exact.
        return self.used >= self.limit - 1e-6

    def message(self, period_s: float) -> str:
        period = _period(period_s)
        whose = "your" if self.who == "you" else f"{self.who}'s"
        who = "You have" if self.who == "you" else f"{self.who[0].upper()}{self.who[1:]} has"
        frees = f"; the next hour frees on {self.frees_at.strftime('%a %H:%M')} UTC" if self.frees_at else ""
        # One decimal, as the queue's fair-share reasons say use; rounded down while some is left,
        # so that "40.0 of your 40" is said only of a budget that is used up.
        used = self.used if self.exhausted else math.floor(self.used * 10) / 10
        return f"{who} used {used:.1f} of {whose} {self.limit:g} GPU-hours in the last {period}{frees}"


def _period(seconds: float) -> str:
    days = seconds / 86400
    return f"{days:g} days" if days != 1 else "day"


def _hours_rows(store, conn, stmt, params) -> list[tuple[datetime, float]]:
    return [(as_utc(h), s) for h, s in store.rows(conn, stmt, params)]


def like_pattern(group: str) -> str:
    """A LIKE pattern (ESCAPE LIKE_ESCAPE) matching the group's JSON text anywhere in a JSON list."""
    literal = json.dumps(group)
    for ch in (LIKE_ESCAPE, "%", "_"):
        literal = literal.replace(ch, LIKE_ESCAPE + ch)
    return f"%{literal}%"


def group_hours(store, conn, group: str, first: datetime) -> list[tuple[datetime, float]]:
    """The group's ended GPU-seconds per hour from `first`: the rows of leases whose groups hold
    exactly `group` (the SQL's match is coarse; membership is decided here)."""
    sums: dict[datetime, float] = {}
    member: dict[str, bool] = {}
    for hour, groups_json, seconds in store.rows(conn, GROUP_HOURS, {"pattern": like_pattern(group), "first": first}):
        found = member.get(groups_json)
        if found is None:
            found = member[groups_json] = group in json.loads(groups_json)
        if found:
            at = as_utc(hour)
            sums[at] = sums.get(at, 0.0) + seconds
    return sorted(sums.items())


def _standing(who: str, hour_rows: list[tuple[datetime, float]], active: list[tuple], since: datetime,
              now: datetime, limit: float, period_s: float) -> Standing:
    """From the period's ended hours and the active leases (started, GPUs)."""
    # The first hour of the period counts only its part inside it (at hour resolution:
    # an ended lease's seconds in that hour are spread evenly over it).
    edge = floor_hour(since)
    used_s = 0.0
    spread: list[tuple[datetime, float]] = []  # (when it leaves the window, GPU-seconds)
    for hour, seconds in hour_rows:
        part = seconds * (min(hour + HOUR, now) - max(hour, since)).total_seconds() / 3600.0 if hour == edge \
            else seconds
        used_s += part
        spread.append((hour + HOUR + timedelta(seconds=period_s), part))
    held = 0
    for started, gpus in active:
        lo = max(started, since)
        used_s += max(0.0, (now - lo).total_seconds()) * gpus
        held += gpus
    used = used_s / 3600.0
    frees_at = None
    if used >= limit - 1 and spread:
        need, dropped = (used - limit + 1) * 3600.0, 0.0
        for leaves, part in spread:
            dropped += part
            if dropped >= need:
                frees_at = ceil_hour(leaves)
                break
    runs_out = now + timedelta(hours=max(0.0, limit - used) / held) if held else None
    return Standing(who, used, limit, frees_at, runs_out)


def standings(store, conn, user: str, groups: Iterable[str], budgets: Budgets, now: datetime) -> list[Standing]:
    """The budgets that apply to `user` (in `groups`), as they stand at `now`."""
    if not budgets.any:
        return []
    since = now - timedelta(seconds=budgets.period_s)
    first = floor_hour(since)
    active = [(lid, u, json.loads(g), as_utc(s), n) for lid, u, g, s, n in store.rows(conn, ACTIVE)]
    out = []
    if budgets.user is not None:
        rows = _hours_rows(store, conn, USER_HOURS, {"user": user, "first": first})
        out.append(_standing("you", rows, [(s, n) for _, u, _, s, n in active if u == user], since, now,
                             budgets.user, budgets.period_s))
    for group in sorted(set(groups) & set(budgets.groups)):
        rows = group_hours(store, conn, group, first)
        out.append(_standing(f"group '{group}'", rows, [(s, n) for _, _, g, s, n in active if group in g], since,
                             now, float(budgets.groups[group]), budgets.period_s))
    return out


def check(store, conn, user: str, groups: Iterable[str], budgets: Budgets, now: datetime) -> None:
    """Refuse a grant when a budget of the user's is used up (BudgetExhausted, HTTP 403)."""
    for s in standings(store, conn, user, groups, budgets, now):
        if s.exhausted:
            raise BudgetExhausted(s.message(budgets.period_s))


def lease_over_budget(store, conn, lease_id: int, budgets: Budgets, now: datetime) -> Standing | None:
    """The exhausted budget of an active lease's user or group, else None (for the culler)."""
    found = store.rows(conn, LEASE_OWNER, {"lid": lease_id})
    if not found or found[0][2] is not None:
        return None
    user, groups_json, _ = found[0]
    for s in standings(store, conn, user, json.loads(groups_json), budgets, now):
        if s.exhausted:
            return s
    return None


BUDGETS_KEY = "gpu_hour_budgets"


def publish(conn, budgets: Budgets) -> None:
    """Write the lending hub's budgets into the ledger, for the culler and the pool page."""
    value = json.dumps({"user": budgets.user, "groups": dict(budgets.groups), "period_s": budgets.period_s})
    if conn.execute(select(_m.c.value).where(_m.c.key == BUDGETS_KEY)).first() is None:
        conn.execute(insert(_m).values(key=BUDGETS_KEY, value=value))
    else:
        conn.execute(update(_m).where(_m.c.key == BUDGETS_KEY).values(value=value))


def published(conn) -> Budgets:
    raw = conn.execute(select(_m.c.value).where(_m.c.key == BUDGETS_KEY)).scalar()
    if not raw:
        return Budgets()
    d = json.loads(raw)
    return Budgets(d.get("user"), d.get("groups") or {}, float(d.get("period_s") or Budgets.period_s))
