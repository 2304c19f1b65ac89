"""What the GPU pool page and its API show, from the ledger's data: pure functions.

Who may see a holder's name is decided here, once: an admin, the holder
themself, or everyone when the hub shows holders (GPUHUB_POOL_PAGE_SHOW_HOLDERS).
"""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass
from datetime import UTC, datetime

from ..pool.models import GPUStatus, Lease, Waiter, iso
from ..pool.validation import FIRST_TIME, LAST_TIME, TimeOutOfRange, iso_time

HIDDEN = "(another user)"


@dataclass(frozen=True)
class Viewer:
    """Who is looking: their name, whether they are a pool admin, whether names are public."""

    name: str
    admin: bool = False
    show_holders: bool = False
    runs_scripts: bool = False  # holds custom:gpu-pool:exec: action scripts in other people's servers

    def may_see(self, user: str) -> bool:
        return self.admin or self.show_holders or user == self.name


class BadInput(ValueError):
    """A query parameter the API cannot use (answered with HTTP 400)."""


def when(value: datetime | None) -> str:
    """A UTC time for the page: '2026-01-02 03:04 UTC'."""
    return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M UTC") if value is not None else ""


def gpu_row(status: GPUStatus, viewer: Viewer) -> dict:
    """One GPU as the page and /api/gpus show it."""
    lease = status.lease
    holder = None
    if lease is not None:
        holder = lease.user if viewer.may_see(lease.user) else None
    return {
        "host": status.gpu.host,
        "index": status.gpu.index,
        "uuid": status.gpu.uuid,
        "model": status.gpu.name,
        "memory_mib": status.gpu.memory_mib,
        "state": status.state,
        "drained": status.drained,
        "drained_at": iso(status.drained_at),
        "since": iso(lease.started_at) if lease is not None else None,
        "holder": holder,
        "lease_id": lease.id if lease is not None else None,
        # Why a lease stays lent (a quiet Swarm node, a container that will not stop).
        "problem": (lease.problem or None) if lease is not None else None,
        # Lent beyond its holder's share (issue 38): reclaimed with notice when someone within theirs waits.
        "borrowed": bool(lease is not None and lease.borrowed),
        "reclaim_at": iso(lease.reclaim_at) if lease is not None else None,
        # The pool's readings, where something gives them (NVML, the agents; filled by the app).
        "utilization": None,  # percent
        "memory_used_mib": None,  # MiB in use (of memory_mib)
        "yours": lease is not None and lease.user == viewer.name,
    }


def gpu_rows(statuses: list[GPUStatus], viewer: Viewer) -> list[dict]:
    return [gpu_row(s, viewer) for s in statuses]


def queue_rows(waiters: list[Waiter], viewer: Viewer) -> list[dict]:
    """The queue, in order, each waiter's name only if the viewer may see it."""
    return [{
        "position": w.position,
        "user": w.user if viewer.may_see(w.user) else None,
        "count": w.count,
        "since": iso(w.since),
        "yours": w.user == viewer.name,
        # Why it is there: it names nobody, but tells its own user's use, so only to them (and admins).
        "why": w.why if w.user == viewer.name or viewer.admin else None,
    } for w in waiters]


def lease_row(lease: Lease, now: datetime | None = None) -> dict:
    """One of the viewer's own leases, with its GPU-hours so far."""
    end = lease.ended_at or now or datetime.now(UTC)
    return {
        "id": lease.id,
        "server_name": lease.server_name,
        "host": lease.host,
        "gpus": len(lease.gpu_uuids),
        "started_at": iso(lease.started_at),
        "ended_at": iso(lease.ended_at),
        "end_reason": lease.end_reason,
        "gpu_hours": round(lease.gpu_hours(until=end), 3),
        "borrowed": lease.borrowed,
    }


def parse_time(raw: str | None, name: str) -> datetime | None:
    """An ISO 8601 query parameter (a date or a date and time; UTC unless it says)."""
    if raw is None or raw.strip() == "":
        return None
    try:
        return iso_time(raw)
    except TimeOutOfRange:
        raise BadInput(f"{name}={raw!r} is outside the times the pool answers for ({FIRST_TIME:%Y-%m-%d} to "
                       f"{LAST_TIME:%Y-%m-%d} UTC)") from None
    except ValueError:
        raise BadInput(f"{name}={raw!r} is not an ISO 8601 date or time (e.g. 2026-01-31 or "
                       "2026-01-31T12:00:00Z)") from None


def usage_period(since_raw: str | None, until_raw: str | None) -> tuple[datetime | None, datetime | None]:
    since, until = parse_time(since_raw, "since"), parse_time(until_raw, "until")
    if since is not None and until is not None and since >= until:
        raise BadInput("since must be before until")
    return since, until


def usage_for(usage: dict, viewer: Viewer) -> dict:
    """GPU-hours per user and per group: all of them for an admin, else the viewer's own."""
    users = {u: round(h, 3) for u, h in sorted(usage.get("users", {}).items())}
    groups = {g: round(h, 3) for g, h in sorted(usage.get("groups", {}).items())}
    if viewer.admin:
        return {"users": users, "groups": groups}
    return {"users": {viewer.name: users.get(viewer.name, 0.0)}, "groups": {}}


# A cell starting with one of these is a formula to a spreadsheet (TAB and CR too: some
# strip them and read on).
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def spreadsheet_safe(cell: str) -> str:
    """`cell`, quoted with a leading ' when a spreadsheet would run it as a formula."""
    return "'" + cell if cell[:1] in FORMULA_STARTS else cell


def usage_csv(usage: dict) -> str:
    """The usage as CSV: kind,name,gpu_hours (users first, then groups).

    Lines end in CRLF (RFC 4180), so a name holding a CR or LF is quoted, never read as
    the start of a new row."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\r\n")
    writer.writerow(["kind", "name", "gpu_hours"])
    for kind, key in (("user", "users"), ("group", "groups")):
        for name, hours in usage.get(key, {}).items():
            writer.writerow([kind, spreadsheet_safe(name), f"{hours:.3f}"])
    return out.getvalue()


def summary(rows: list[dict]) -> dict[str, int]:
    """How many GPUs are free, lent, drained, missing."""
    out = {"free": 0, "lent": 0, "drained": 0, "missing": 0}
    for r in rows:
        out[r["state"]] = out.get(r["state"], 0) + 1
    return out
