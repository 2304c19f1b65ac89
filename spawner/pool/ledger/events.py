"""The facts the ledger tells users about (spawner/notify/ sends them), each written to the outbox
in the transaction that records it.

- `granted`: a request that waited in the queue got its GPUs (its server starts now).  Only
  notebook servers: a job's grant is told by its end.
- `job_ended`: a batch job reached an end state (its exit code, GPU-hours, how long it ran).
- `cull_warning`: a server will be culled soon if it stays idle (written by the gpu-pool
  service's cull watch, spawner/notify/cull_warning.py, once per idle spell).
- `reclaimed`: borrowed GPUs are asked back for a request within its share (leasing/reclaim.py):
  the job (or server) holding them is stopped at `stops_at`, `GPUPool.reclaim_grace` after the
  mark; one event per job (a cluster's workers together).
- `budget`: a GPU-hour budget of the user's (their own, or a group's) reached 80 % or 100 %
  (written by the gpu-pool service's budget watch, spawner/notify/budget_watch.py), once per
  budget and threshold in a budget period.
- `booking`: for the booker, a booking starts within 15 minutes (`kind` "soon"), then its GPUs
  are free for them (`kind` "ready"), once each; `booked-out`: for a holder of a GPU booked by
  someone else, their server or job is stopped when the booking starts, once per lease and
  booking (both written by the gpu-pool service's booking watch, spawner/notify/booking_watch.py).

The notify senders tell `granted` once the server is ready (they ask the hub), so the mail's link
opens a running server.
"""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import select

from . import outbox
from .schema import outbox_table, waiters_table

GRANTED, JOB_ENDED, CULL_WARNING = "granted", "job-ended", "cull-warning"
RECLAIMED, BUDGET, BOOKING, BOOKED_OUT = "reclaimed", "budget", "booking", "booked-out"
EVENTS = (GRANTED, JOB_ENDED, CULL_WARNING, RECLAIMED, BUDGET, BOOKING, BOOKED_OUT)
SPELLS_LOOKED_AT = 50  # a user's newest cull warnings compared with a new one (one per idle spell)


def granted(store, conn, waiter_id: int, user: str, server_name: str, host: str, gpus: int, now: datetime,
            lease_id: int | None = None) -> None:
    """Call before the queue row `waiter_id` is deleted (its enqueued_at says how long it waited)."""
    enqueued = conn.execute(select(waiters_table.c.enqueued_at).where(waiters_table.c.id == waiter_id)).scalar()
    waited = max(0.0, (now - enqueued).total_seconds()) if enqueued is not None else 0.0
    outbox.enqueue(store, conn, user, GRANTED, {
        "server_name": server_name, "host": host, "gpus": gpus, "waited_s": round(waited, 1),
        "granted_at": now.isoformat(), "lease_id": lease_id})


def job_ended(store, conn, job) -> None:
    """`job`: the ended Job (job_records.Job), as just written."""
    ran = (job.ended_at - job.started_at).total_seconds() if job.started_at and job.ended_at else 0.0
    gpus = sum(len(u.get("gpus") or ()) for u in job.units) if job.units else len(job.gpu_uuids)
    outbox.enqueue(store, conn, job.user, JOB_ENDED, {
        "job_id": job.id, "state": job.public_state, "exit_code": job.exit_code,
        "message": (job.message or "")[:2000], "command": " ".join(job.command)[:2000],
        "ran_s": round(max(0.0, ran), 1), "gpu_hours": round(gpus * max(0.0, ran) / 3600, 3),
        "ended_at": job.ended_at.isoformat() if job.ended_at else None})


def reclaimed(store, conn, marked, now: datetime, grace_s: float) -> None:
    """Tell the holders of the borrowed leases just marked for reclaiming (reclaim.Borrowed), one
    event per unit (a cluster job's workers are one), in the marking transaction."""
    units: dict[tuple[str, str], list] = {}
    for lease in marked:
        units.setdefault((lease.user, lease.unit), []).append(lease)
    for (user, _), leases in sorted(units.items()):
        name = leases[0].server_name.split("/worker-", 1)[0]
        job = name.split("/", 1)[1] if name.startswith("job/") else None
        outbox.enqueue(store, conn, user, RECLAIMED, {
            "server_name": name, "job_id": int(job) if job and job.isdigit() else None,
            "hosts": sorted({lease.host for lease in leases}), "gpus": sum(len(lease.uuids) for lease in leases),
            "asked_at": now.isoformat(), "grace_s": round(grace_s, 1),
            "stops_at": (now + timedelta(seconds=grace_s)).isoformat()})


def budget_reached(store, conn, user: str, who: str, percent: int, period_s: float,
                   payload: dict[str, Any]) -> bool:
    """Queue the news that `user`'s budget `who` ("you", "group 'x'") reached `percent` of its
    GPU-hours, unless it was told within the last `period_s` (one budget period).  True when queued."""
    since = store.now(conn) - timedelta(seconds=period_s)
    return once(store, conn, user, BUDGET, {"who": who, "percent": percent}, {**payload, "period_s": period_s},
                since=since)


def budget_told(store, conn, user: str, who: str, percent: int, period_s: float) -> bool:
    """Whether budget_reached would find this news told already (a read: watches look first)."""
    since = store.now(conn) - timedelta(seconds=period_s)
    return told(conn, user, BUDGET, {"who": who, "percent": percent}, since=since)


def told(conn, user: str, event: str, key: dict[str, Any], since: datetime | None = None) -> bool:
    """Whether one of `user`'s newest `event`s (written since `since`, when given) already has
    these `key` values in its payload."""
    t = outbox_table.c
    stmt = select(t.payload).where(t.user_name == user, t.event == event, t.channel == outbox.CHANNELS[0])
    if since is not None:
        stmt = stmt.where(t.created_at >= since)
    seen = conn.execute(stmt.order_by(t.id.desc()).limit(SPELLS_LOOKED_AT)).scalars()
    return any(all(json.loads(raw).get(k) == v for k, v in key.items()) for raw in seen)


def once(store, conn, user: str, event: str, key: dict[str, Any], payload: dict[str, Any],
         since: datetime | None = None) -> bool:
    """Queue `event` for `user` unless it was told already (`told`: an idle spell's cull warning,
    a booking's "soon", a lease's "booked-out": told once).  True when queued."""
    if told(conn, user, event, key, since):
        return False
    outbox.enqueue(store, conn, user, event, {**payload, **key})
    return True


def cull_warning(store, conn, user: str, server_name: str, spell: str, payload: dict[str, Any]) -> bool:
    """Queue the warning that `user`'s server `server_name` is culled soon, unless this idle spell
    (`spell`: the last activity it began at) was warned about already.  True when queued."""
    return once(store, conn, user, CULL_WARNING, {"server_name": server_name, "spell": spell}, payload)
