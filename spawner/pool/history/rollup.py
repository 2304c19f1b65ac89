"""The history rolled up as leases end: GPU-seconds per lease and hour, decayed use per user and group.

The history grows without end, and the pool page, the usage API and the fair
queue all read it.  So when a lease ends, in the same transaction:

- `gpu_pool_lease_hours` gets one row per UTC hour the lease touched, with its
  GPU-seconds in that hour.  A period's usage sums the whole hours inside it in
  the database and clips exactly only the leases of its two edge hours (and the
  active leases, at most one per GPU): its cost follows the period, not the
  history.
- `gpu_pool_lent_hours` adds its GPU-seconds to each of those hours for the whole pool: a
  period's occupancy chart reads one row per hour.
- `gpu_pool_decayed_use` adds the lease to its user's and each of its groups'
  GPU-hours decayed with the fair-share half-life (an exact integral, kept
  "as of" a time and decayed further when read): the queue's order reads one
  row per user, however long the history.

The half-life the decayed rows were made with is kept in gpu_pool_meta; a hub
configured with another one rebuilds them from the leases once (ensure_decay).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from sqlalchemy import DateTime, bindparam, delete, func, insert, or_, select, text, type_coerce, update

from ..ledger.schema import decayed_use_table as _d
from ..ledger.schema import lease_gpus_table as _lg
from ..ledger.schema import lease_hours_table as _h
from ..ledger.schema import leases_table as _l
from ..ledger.schema import lent_hours_table as _lh
from ..ledger.schema import meta_table as _m
from ..ledger.schema import usage_days_table as _ud
from ..ledger.schema import usage_hours_table as _uh
from ..ledger.store import as_utc

HOUR = timedelta(hours=1)
HALF_LIFE_KEY = "decayed_use_half_life_s"
DEFAULT_HALF_LIFE = 7 * 86400.0

# --- statements (built once; the SQLite fast path compiles each once) ---------------

ENDED_LEASE = (
    select(_l.c.user_name, _l.c.groups, _l.c.started_at, _l.c.ended_at, func.count(_lg.c.uuid))
    .select_from(_l.outerjoin(_lg, _lg.c.lease_id == _l.c.id))
    .where(_l.c.id == bindparam("lid"))
    .group_by(_l.c.id, _l.c.user_name, _l.c.groups, _l.c.started_at, _l.c.ended_at)
)
INSERT_HOUR = insert(_h).values({c: bindparam(c) for c in ("hour", "lease_id", "user_name", "groups", "gpu_seconds")})
DECAYED_ROW = select(_d.c.gpu_hours, _d.c.as_of, _d.c.total_hours).where(
    _d.c.kind == bindparam("kind"), _d.c.name == bindparam("name"))
UPDATE_DECAYED = update(_d).where(_d.c.kind == bindparam("w_kind"), _d.c.name == bindparam("w_name")).values(
    gpu_hours=bindparam("gpu_hours"), as_of=bindparam("as_of"), total_hours=bindparam("total_hours"))
INSERT_DECAYED = insert(_d).values({c: bindparam(c) for c in (
    "kind", "name", "gpu_hours", "as_of", "half_life_s", "total_hours")})
ALL_DECAYED = select(_d.c.kind, _d.c.name, _d.c.gpu_hours, _d.c.as_of, _d.c.total_hours)
DECAYED_SINCE = ALL_DECAYED.where(_d.c.as_of >= bindparam("since"))
DECAYED_SIGNATURE = select(func.count(), func.max(_d.c.as_of))
# Active leases, for their live part of the use: (user, groups, started, GPUs).
ACTIVE_USE = (
    select(_l.c.user_name, _l.c.groups, _l.c.started_at, func.count(_lg.c.uuid))
    .select_from(_l.join(_lg, _lg.c.lease_id == _l.c.id))
    .where(_l.c.ended_at.is_(None))
    .group_by(_l.c.id, _l.c.user_name, _l.c.groups, _l.c.started_at)
)
def _sums(table, column, lower: bool):
    where = table.c[column] < bindparam("end")
    if lower:
        where = (table.c[column] >= bindparam("first")) & where
    return (select(table.c.user_name, table.c.groups, func.sum(table.c.gpu_seconds)).where(where)
            .group_by(table.c.user_name, table.c.groups))


HOURS_INSIDE, DAYS_INSIDE, DAYS_BEFORE = _sums(_uh, "hour", True), _sums(_ud, "day", True), _sums(_ud, "day", False)


def _adder(table, column):
    """(UPDATE adding to a row, INSERT of a new one) of a per-user sum table."""
    add = (update(table).where(table.c[column] == bindparam("w_at"), table.c.user_name == bindparam("w_user"),
                               table.c.groups == bindparam("w_groups"))
           .values(gpu_seconds=table.c.gpu_seconds + bindparam("add")))
    new = insert(table).values({column: bindparam("w_at"), "user_name": bindparam("w_user"),
                                "groups": bindparam("w_groups"), "gpu_seconds": bindparam("add")})
    return add, new


ADD_HOUR, NEW_HOUR = _adder(_uh, "hour")
ADD_LENT = update(_lh).where(_lh.c.hour == bindparam("w_at")).values(gpu_seconds=_lh.c.gpu_seconds + bindparam("add"))
NEW_LENT = insert(_lh).values(hour=bindparam("w_at"), gpu_seconds=bindparam("add"))
ADD_DAY, NEW_DAY = _adder(_ud, "day")
# The ended leases' parts in a period's two edge hours, with their times to clip them by: one
# statement of a fixed shape (the same hour twice where there is one), which PostgreSQL prepares.
# (Its times as the database holds them, naive UTC: a hundred rows' worth of zone conversions
# cost more than the statement.)
EDGE_HOURS = (
    select(type_coerce(_h.c.hour, DateTime()), _h.c.user_name, _h.c.groups, _h.c.gpu_seconds,
           type_coerce(_l.c.started_at, DateTime()), type_coerce(_l.c.ended_at, DateTime()))
    .select_from(_h.join(_l, _l.c.id == _h.c.lease_id))
    .where(or_(_h.c.hour == bindparam("h0"), _h.c.hour == bindparam("h1")))
)
HALF_LIFE = select(_m.c.value).where(_m.c.key == bindparam("key"))


# --- pure arithmetic -----------------------------------------------------------------

def floor_hour(t: datetime) -> datetime:
    return t.replace(minute=0, second=0, microsecond=0)


def floor_day(t: datetime) -> datetime:
    return t.replace(hour=0, minute=0, second=0, microsecond=0)


def ceil_day(t: datetime) -> datetime:
    f = floor_day(t)
    return f if f == t else f + timedelta(days=1)


def ceil_hour(t: datetime) -> datetime:
    f = floor_hour(t)
    return f if f == t else f + HOUR


def hours_of(started: datetime, ended: datetime, gpus: int) -> list[tuple[datetime, float]]:
    """(hour start, GPU-seconds in it) for a lease of `gpus` GPUs over [started, ended)."""
    out = []
    hour = floor_hour(started)
    while hour < ended:
        lo, hi = max(started, hour), min(ended, hour + HOUR)
        if hi > lo:
            out.append((hour, (hi - lo).total_seconds() * gpus))
        hour += HOUR
    return out


def decayed_hours(started: datetime, ended: datetime, gpus: int, at: datetime, half_life_s: float) -> float:
    """GPU-hours of [started, ended) with `gpus` GPUs, each moment weighted 2^-(age at `at` / half-life)."""
    if ended <= started:
        return 0.0
    k = math.log(2) / half_life_s
    age_end = max(0.0, (at - ended).total_seconds())
    age_start = max(0.0, (at - started).total_seconds())
    return gpus / 3600.0 * (math.exp(-k * age_end) - math.exp(-k * age_start)) / k


def decay(value: float, since: datetime, at: datetime, half_life_s: float) -> float:
    """`value` as of `since`, decayed to `at`."""
    return value * 2.0 ** (-max(0.0, (at - since).total_seconds()) / half_life_s)


# --- writing, as leases end --------------------------------------------------------------

@dataclass(frozen=True)
class Ended:
    lease_id: int
    user: str
    groups: str  # JSON list
    started: datetime
    ended: datetime
    gpus: int


def half_life(store, conn) -> float:
    """The half-life the ledger's decayed rows use (read once per store)."""
    value = getattr(store, "half_life", None)
    if value is None:
        raw = store.rows(conn, HALF_LIFE, {"key": HALF_LIFE_KEY})
        value = store.half_life = float(raw[0][0]) if raw else DEFAULT_HALF_LIFE
    return value


def record_ended(store, conn, lease_ids: Iterable[int]) -> None:
    """Roll up leases that have just ended (inside the transaction that ended them)."""
    hl = half_life(store, conn)
    hour_rows: list[dict] = []
    adds: dict[tuple[str, str], list[Ended]] = {}
    for lid in lease_ids:
        found = store.rows(conn, ENDED_LEASE, {"lid": lid})
        if not found:
            continue
        user, groups, started, ended, gpus = found[0]
        started, ended = as_utc(started), as_utc(ended)
        if ended is None:
            continue
        hour_rows += [{"hour": h, "lease_id": lid, "user_name": user, "groups": groups, "gpu_seconds": s}
                      for h, s in hours_of(started, ended, gpus)]
        for key in [("user", user)] + [("group", g) for g in json.loads(groups)]:
            adds.setdefault(key, []).append(Ended(lid, user, groups, started, ended, gpus))
    if hour_rows:
        store.run(conn, INSERT_HOUR, hour_rows)
        hours: dict[tuple, float] = {}
        days: dict[tuple, float] = {}
        for r in hour_rows:
            key = (r["user_name"], r["groups"])
            hours[(r["hour"], *key)] = hours.get((r["hour"], *key), 0.0) + r["gpu_seconds"]
            days[(floor_day(r["hour"]), *key)] = days.get((floor_day(r["hour"]), *key), 0.0) + r["gpu_seconds"]
        for sums, (add, new) in ((hours, (ADD_HOUR, NEW_HOUR)), (days, (ADD_DAY, NEW_DAY))):
            for (at, user, groups), seconds in sums.items():
                params = {"w_at": at, "w_user": user, "w_groups": groups, "add": seconds}
                if not store.run(conn, add, params):
                    store.run(conn, new, params)
        lent: dict[datetime, float] = {}
        for r in hour_rows:
            lent[r["hour"]] = lent.get(r["hour"], 0.0) + r["gpu_seconds"]
        for at, seconds in lent.items():
            if not store.run(conn, ADD_LENT, {"w_at": at, "add": seconds}):
                store.run(conn, NEW_LENT, {"w_at": at, "add": seconds})
    for (kind, name), ended_leases in adds.items():
        _add(store, conn, kind, name, ended_leases, hl)


def _add(store, conn, kind: str, name: str, leases: list[Ended], hl: float) -> None:
    row = store.rows(conn, DECAYED_ROW, {"kind": kind, "name": name})
    at = max(e.ended for e in leases)
    value, total = 0.0, 0.0
    if row:
        old, as_of, total = row[0][0], as_utc(row[0][1]), row[0][2]
        at = max(at, as_of)
        value = decay(old, as_of, at, hl)
    value += sum(decayed_hours(e.started, e.ended, e.gpus, at, hl) for e in leases)
    total += sum((e.ended - e.started).total_seconds() * e.gpus / 3600.0 for e in leases)
    params = {"gpu_hours": value, "as_of": at, "total_hours": total}
    if row:
        store.run(conn, UPDATE_DECAYED, {**params, "w_kind": kind, "w_name": name})
    else:
        store.run(conn, INSERT_DECAYED, {**params, "kind": kind, "name": name, "half_life_s": hl})


def backfill(conn) -> None:
    """Upgrade: the hours of every lease that ended before rollups existed (one pass)."""
    lg = _lg
    counts = dict(conn.execute(select(lg.c.lease_id, func.count()).group_by(lg.c.lease_id)).all())
    batch = []
    hours: dict[tuple, float] = {}
    days: dict[tuple, float] = {}
    for r in conn.execute(select(_l.c.id, _l.c.user_name, _l.c.groups, _l.c.started_at, _l.c.ended_at)
                          .where(_l.c.ended_at.is_not(None))):
        for h, s in hours_of(r.started_at, r.ended_at, counts.get(r.id, 0)):
            batch.append({"hour": h, "lease_id": r.id, "user_name": r.user_name, "groups": r.groups, "gpu_seconds": s})
            hours[(h, r.user_name, r.groups)] = hours.get((h, r.user_name, r.groups), 0.0) + s
            day = floor_day(h)
            days[(day, r.user_name, r.groups)] = days.get((day, r.user_name, r.groups), 0.0) + s
        if len(batch) >= 5000:
            conn.execute(insert(_h), batch)
            batch = []
    if batch:
        conn.execute(insert(_h), batch)
    for table, column, sums in ((_uh, "hour", hours), (_ud, "day", days)):
        rows = [{column: at, "user_name": u, "groups": g, "gpu_seconds": s} for (at, u, g), s in sums.items()]
        for i in range(0, len(rows), 5000):
            conn.execute(insert(table), rows[i:i + 5000])
    lent: dict[datetime, float] = {}
    for (at, _, _), seconds in hours.items():
        lent[at] = lent.get(at, 0.0) + seconds
    rows = [{"hour": at, "gpu_seconds": s} for at, s in sorted(lent.items())]
    for i in range(0, len(rows), 5000):
        conn.execute(insert(_lh), rows[i:i + 5000])
    if conn.dialect.name == "postgresql":
        # Tables just filled in bulk have no statistics until autovacuum comes round: without
        # them the planner may scan a year of hours for one week's.
        conn.execute(text("ANALYZE gpu_pool_leases, gpu_pool_lease_gpus, gpu_pool_lease_hours, "
                          "gpu_pool_usage_hours, gpu_pool_usage_days, gpu_pool_lent_hours"))


def ensure_decay(store, conn, configured: float, force: bool = False) -> None:
    """Make the decayed rows follow `configured` (a hub's fair-share half-life): rebuilt from
    every ended lease when the ledger's differ (a changed setting, an upgraded ledger), or `force`."""
    raw = conn.execute(HALF_LIFE, {"key": HALF_LIFE_KEY}).scalar()
    if raw is not None and float(raw) == configured and not force:
        store.half_life = configured
        return
    now = store.now(conn)
    conn.execute(delete(_d))
    values: dict[tuple[str, str], list[float]] = {}
    lg = _lg
    counts = dict(conn.execute(select(lg.c.lease_id, func.count()).group_by(lg.c.lease_id)).all())
    for r in conn.execute(select(_l.c.id, _l.c.user_name, _l.c.groups, _l.c.started_at, _l.c.ended_at)
                          .where(_l.c.ended_at.is_not(None))):
        gpus = counts.get(r.id, 0)
        value = decayed_hours(r.started_at, r.ended_at, gpus, now, configured)
        total = (r.ended_at - r.started_at).total_seconds() * gpus / 3600.0
        for key in [("user", r.user_name)] + [("group", g) for g in json.loads(r.groups)]:
            acc = values.setdefault(key, [0.0, 0.0])
            acc[0] += value
            acc[1] += total
    if values:
        conn.execute(insert(_d), [{"kind": k, "name": n, "gpu_hours": v, "as_of": now, "half_life_s": configured,
                                   "total_hours": t} for (k, n), (v, t) in values.items()])
    if raw is None:
        conn.execute(insert(_m).values(key=HALF_LIFE_KEY, value=repr(float(configured))))
    else:
        conn.execute(update(_m).where(_m.c.key == HALF_LIFE_KEY).values(value=repr(float(configured))))
    store.half_life = configured


# --- reading -------------------------------------------------------------------------------

class _Decayed(Mapping):
    """name -> GPU-hours at `at`: stored rows decayed on first use (a grant asks for a few of
    a thousand users), plus the live part of active leases."""

    def __init__(self, rows: dict, live: dict, at: datetime, hl: float, at_ref: dict):
        # at_ref (kept with the rows): each row decayed to one reference time, so that a read at
        # `at` costs one multiplication by the factor all rows share.
        self._rows, self._live, self._hl, self._ref = rows, live, hl, at_ref
        self._done: dict[str, float] = {}
        ref = at_ref.setdefault("", at)
        self._factor = 2.0 ** (-(at - ref).total_seconds() / hl)

    def __getitem__(self, name: str) -> float:
        found = self._done.get(name)
        if found is None:
            row = self._rows.get(name)
            if row is None and name not in self._live:
                raise KeyError(name)
            stored: float = 0.0
            if row is not None:
                cached = self._ref.get(name)
                if cached is not None:
                    stored = cached
                else:
                    stored = self._ref[name] = decay(row[0], row[1], self._ref[""], self._hl) if row[1] <= \
                        self._ref[""] else row[0] * 2.0 ** ((row[1] - self._ref[""]).total_seconds() / self._hl)
            found = stored * self._factor + self._live.get(name, 0.0)
            self._done[name] = found
        return found

    def get(self, name: str, default=None):
        if name in self._done:
            return self._done[name]
        if name not in self._rows and name not in self._live:
            return default
        return self[name]

    def __iter__(self):
        return iter(set(self._rows) | set(self._live))

    def __len__(self) -> int:
        return len(set(self._rows) | set(self._live))


@dataclass(frozen=True)
class Use:
    """Decayed GPU-hours per user and per group at one moment, and the users' undecayed totals."""

    users: Mapping[str, float]
    groups: Mapping[str, float]
    total_users: Mapping[str, float]
    half_life_s: float
    at: datetime


def _all_rows(store, conn) -> dict:
    out: dict[str, dict] = {"user": {}, "group": {}}
    for k, n, v, a, t in store.rows(conn, ALL_DECAYED):
        out.setdefault(k, {})[n] = (v, as_utc(a), t)
    return out


def decayed_use(store, conn, now: datetime, cache: dict | None = None) -> Use:
    """Every user's and group's decayed GPU-hours at `now`, active leases included.

    `cache` (kept by the caller) keeps the rows between reads: only those changed since (as
    leases end) are read again, so a grant costs the same with a thousand users' history."""
    hl = half_life(store, conn)
    count, newest = store.rows(conn, DECAYED_SIGNATURE)[0]
    newest = as_utc(newest)
    cache = {} if cache is None else cache
    known = cache.get("rows")
    if known is None or cache.get("newest") is None or newest is None:
        known = _all_rows(store, conn)
    elif (count, newest) != cache.get("signature"):
        # Rows change only as leases end, to as_of = the end: read those changed since (a few).
        changed = store.rows(conn, DECAYED_SINCE, {"since": cache["newest"]})
        # Copied, not changed in place: other threads may be reading the old ones.
        known = {kind: dict(rows) if any(k == kind for k, *_ in changed) else rows for kind, rows in known.items()}
        ref = {kind: dict(values) for kind, values in cache.get("ref", {}).items()}
        for k, n, v, a, t in changed:
            known.setdefault(k, {})[n] = (v, as_utc(a), t)
            ref.get(k, {}).pop(n, None)
        if sum(len(rows) for rows in known.values()) != count:  # rows went (a rebuild): read them all
            known = _all_rows(store, conn)
        else:
            cache["ref"], cache["rows"] = ref, known
    if cache.get("rows") is not known or "ref" not in cache:
        # Rows read anew: their values at the reference time are made again as asked for.
        cache["ref"] = {"user": {}, "group": {}}
    cache["rows"], cache["signature"], cache["newest"] = known, (count, newest), newest
    users_rows, groups_rows = (known or {}).get("user", {}), (known or {}).get("group", {})
    live_users: dict[str, float] = {}
    live_groups: dict[str, float] = {}
    live_totals: dict[str, float] = {}
    for user, groups_json, started, gpus in store.rows(conn, ACTIVE_USE):
        started = as_utc(started)
        live = decayed_hours(started, now, gpus, now, hl)
        live_users[user] = live_users.get(user, 0.0) + live
        live_totals[user] = live_totals.get(user, 0.0) + max(0.0, (now - started).total_seconds()) * gpus / 3600.0
        for g in json.loads(groups_json):
            live_groups[g] = live_groups.get(g, 0.0) + live
    return Use(_Decayed(users_rows, live_users, now, hl, cache["ref"]["user"]),
               _Decayed(groups_rows, live_groups, now, hl, cache["ref"]["group"]),
               _LazyTotals(users_rows, live_totals), hl, now)


class _LazyTotals(Mapping):
    """name -> all-time GPU-hours (stored + active), computed when asked."""

    def __init__(self, rows: dict, live: dict):
        self._rows, self._live = rows, live

    def __getitem__(self, name: str) -> float:
        if name not in self._rows and name not in self._live:
            raise KeyError(name)
        return (self._rows[name][2] if name in self._rows else 0.0) + self._live.get(name, 0.0)

    def __iter__(self):
        return iter(set(self._rows) | set(self._live))

    def __len__(self) -> int:
        return len(set(self._rows) | set(self._live))


def _negated(rows) -> list:
    return [(user, groups, -seconds) for user, groups, seconds in rows]


DAY = timedelta(days=1)
DAY_ROW = _sums(_ud, "day", True)


def _part_of_day(store, conn, day: datetime, lo: datetime, hi: datetime, last: datetime | None) -> list:
    """The rows of the whole hours [lo, hi) inside `day`: the hours themselves, or the day's
    sums less the hours of the day outside [lo, hi), whichever reads fewer hours (hours from
    `last` on hold nothing yet: a period that ends now costs its last day's one row per user)."""
    inside = (hi - lo) / HOUR
    after = max(timedelta(0), min(day + DAY, last) - hi) if last is not None else day + DAY - hi
    outside = (lo - day) / HOUR + after / HOUR
    if inside <= outside + 1:
        return store.rows(conn, HOURS_INSIDE, {"first": lo, "end": hi}) if lo < hi else []
    rows = list(store.rows(conn, DAY_ROW, {"first": day, "end": day + DAY}))
    if day < lo:
        rows += _negated(store.rows(conn, HOURS_INSIDE, {"first": day, "end": lo}))
    if hi < day + DAY:
        rows += _negated(store.rows(conn, HOURS_INSIDE, {"first": hi, "end": day + DAY}))
    return rows


def whole_hours(store, conn, first: datetime | None, end: datetime, last: datetime | None = None) -> list:
    """(user, groups, GPU-seconds) rows of the whole hours [first, end) (first None: since the
    start): the whole days from the daily sums, the hours around them from the hourly ones (or
    their days' sums less the hours outside, see _part_of_day; a row may then be negative).
    `last`: the first hour with no rolled-up use yet (the current one + 1), if known."""
    day0 = ceil_day(first) if first is not None else None
    day1 = floor_day(end)
    if first is not None and day0 is not None and day0 >= day1:
        return _part_of_day(store, conn, floor_day(first), first, end, last) if first < end else []
    rows = list(store.rows(conn, DAYS_INSIDE, {"first": day0, "end": day1}) if day0 is not None
                else store.rows(conn, DAYS_BEFORE, {"end": day1}))
    if first is not None and day0 is not None and first < day0:
        rows += _part_of_day(store, conn, floor_day(first), first, day0, last)
    if day1 < end:
        rows += _part_of_day(store, conn, day1, day1, end, last)
    return rows


def _overlap(a0: datetime, a1: datetime, b0: datetime, b1: datetime) -> float:
    return max(0.0, (min(a1, b1) - max(a0, b0)).total_seconds())


def _naive(value: str | datetime) -> datetime:
    """A time as naive UTC (SQLite's fast path gives text, the drivers naive datetimes)."""
    if isinstance(value, str):
        return datetime.fromisoformat(value)
    return value if value.tzinfo is None else value.astimezone(UTC).replace(tzinfo=None)


def usage(store, conn, since: datetime | None, until: datetime | None, now: datetime) -> dict:
    """GPU-hours inside [since, until) per user and group, from the hours (see the module docstring).

    The whole hours from the per-user sums; the ended leases' parts in the edge hours from
    their hour rows, clipped by the leases' times; the active leases (at most one per GPU) up to
    now.  A period that ends now takes its last hour whole too: every ended lease ended by now."""
    end = min(until, now) if until is not None else now
    users: dict[str, float] = {}
    groups: dict[str, float] = {}

    parsed: dict[str, tuple[str, ...]] = {}

    def add(user: str, groups_json: str, hours: float) -> None:
        users[user] = users.get(user, 0.0) + hours
        found = parsed.get(groups_json)
        if found is None:
            found = parsed[groups_json] = tuple(json.loads(groups_json))
        for g in found:
            groups[g] = groups.get(g, 0.0) + hours

    if since is not None and since >= end:
        return {"users": users, "groups": groups}
    open_end = until is None or until >= now
    first = ceil_hour(since) if since is not None else None
    # (Only ended leases are rolled up, so nothing is in the hours after the current one.)
    last = floor_hour(now) + HOUR if open_end else floor_hour(end)
    edge_hours = set()
    if since is not None and first is not None and first > last:  # the period lies inside one hour
        edge_hours.add(floor_hour(since))
    else:
        if since is not None and first != since:
            edge_hours.add(floor_hour(since))
        if not open_end and last != end:
            edge_hours.add(last)
        for user, groups_json, seconds in whole_hours(store, conn, first, last, floor_hour(now) + HOUR):
            add(user, groups_json, seconds / 3600.0)
        # A day's sums less its hours outside may leave a user or group at a rounding error of 0.
        for found in (users, groups):
            for name in [n for n, h in found.items() if abs(h) < 1e-9]:
                del found[name]
    if edge_hours:
        h0, h1 = min(edge_hours), max(edge_hours)
        lo_n = _naive(since) if since is not None else None
        end_n = _naive(end)
        for hour, user, groups_json, seconds, started, ended in store.rows(conn, EDGE_HOURS, {"h0": h0, "h1": h1}):
            hour, started, ended = _naive(hour), _naive(started), _naive(ended)
            in_hour = _overlap(started, ended, hour, hour + HOUR)
            if in_hour <= 0:
                continue
            lo = max(hour, lo_n) if lo_n is not None else hour
            # The hour's GPU-seconds times the part of the lease's time in it that is inside the period.
            part = _overlap(started, ended, lo, min(hour + HOUR, end_n)) / in_hour
            if part > 0:
                add(user, groups_json, seconds * part / 3600.0)
    for user, groups_json, started, gpus in store.rows(conn, ACTIVE_USE):
        started = as_utc(started)
        seconds = _overlap(started, now, since if since is not None else started, end)
        add(user, groups_json, seconds * gpus / 3600.0)
    return {"users": users, "groups": groups}
