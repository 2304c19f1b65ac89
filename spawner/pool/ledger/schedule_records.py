"""The schedules' records in the ledger: one row per cron schedule, so schedules outlive the
service that fires them and the user's server (spawner/jobs/scheduler.py fires them).

A firing claims its slot by moving `next_at` on in one transaction (`claim`): of two
services looking at once, one wins; a slot missed while no service ran is not run again.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import delete, func, insert, select, update

from ..models import iso
from ..validation import storable_id
from .schema import schedules_table as _s


@dataclass(frozen=True)
class Schedule:
    id: int
    user: str
    name: str
    cron: str
    body: dict  # the job's submission, as the jobs API takes it
    host: str
    paused: bool
    next_at: datetime | None
    created_at: datetime
    last_fired_at: datetime | None = None
    last_job_id: int | None = None
    last_error: str | None = None
    fired: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "user": self.user, "name": self.name, "cron": self.cron,
                "profile": self.body.get("profile"), "command": self.body.get("command"),
                "notebook": self.body.get("notebook"), "parameters": self.body.get("parameters"),
                "timeout": self.body.get("timeout"), "workdir": self.body.get("workdir"),
                "paused": self.paused, "next_at": iso(self.next_at), "created_at": iso(self.created_at),
                "last_fired_at": iso(self.last_fired_at), "last_job_id": self.last_job_id,
                "last_error": self.last_error, "fired": self.fired}


def _schedule(row) -> Schedule:
    m = row._mapping
    return Schedule(id=m["id"], user=m["user_name"], name=m["name"], cron=m["cron"], body=json.loads(m["body"]),
                    host=m["host"], paused=m["paused"], next_at=m["next_at"], created_at=m["created_at"],
                    last_fired_at=m["last_fired_at"], last_job_id=m["last_job_id"], last_error=m["last_error"],
                    fired=m["fired"])


class ScheduleLedger:
    """Reads and writes of `gpu_pool_schedules` through a GPUPool's database (its clock, its locks)."""

    def __init__(self, pool):
        self._store = pool._store

    def now(self) -> datetime:
        return self._store.read(self._store.now)

    def create(self, user: str, name: str, cron: str, body: dict, host: str,
               first_at: Callable[[datetime], datetime],
               check: Callable[[int], None] | None = None) -> Schedule:
        """Record an active schedule; `first_at(now)` is its first firing (by the ledger's clock).
        `check`, given how many schedules the user has, may refuse it by raising, in the same
        transaction under the write lock, so two creations cannot pass the per-user limit together."""
        def write(conn):
            if check is not None:
                check(conn.execute(select(func.count()).select_from(_s).where(_s.c.user_name == user)).scalar() or 0)
            now = self._store.now(conn)
            sid = conn.execute(insert(_s).values(
                user_name=user, name=name, cron=cron, body=json.dumps(body, sort_keys=True), host=host,
                paused=False, next_at=first_at(now), created_at=now)).inserted_primary_key[0]
            return self._get(conn, sid)
        return self._store.write(write)

    def _get(self, conn, schedule_id: int) -> Schedule | None:
        rows = conn.execute(select(_s).where(_s.c.id == schedule_id)).all()
        return _schedule(rows[0]) if rows else None

    def get(self, schedule_id: int) -> Schedule | None:
        if not storable_id(schedule_id):
            return None
        return self._store.read(lambda conn: self._get(conn, schedule_id))

    def schedules(self, user: str | None = None, limit: int = 500) -> list[Schedule]:
        """Oldest first."""
        stmt = select(_s).order_by(_s.c.id).limit(limit)
        if user is not None:
            stmt = stmt.where(_s.c.user_name == user)
        return self._store.read(lambda conn: [_schedule(r) for r in conn.execute(stmt).all()])

    def due(self, host: str, now: datetime, limit: int = 100) -> list[Schedule]:
        """This host's active schedules due at `now`, the longest due first."""
        stmt = (select(_s).where(_s.c.paused.is_(False), _s.c.next_at <= now, _s.c.host == host)
                .order_by(_s.c.next_at, _s.c.id).limit(limit))
        return self._store.read(lambda conn: [_schedule(r) for r in conn.execute(stmt).all()])

    def claim(self, schedule_id: int, due_at: datetime, next_at: datetime) -> bool:
        """Move a due schedule's next firing from `due_at` to `next_at`; True for the one caller
        that did (the others saw it moved, paused or deleted meanwhile)."""
        def write(conn):
            stmt = (update(_s).where(_s.c.id == schedule_id, _s.c.next_at == due_at, _s.c.paused.is_(False))
                    .values(next_at=next_at, last_fired_at=self._store.now(conn), fired=_s.c.fired + 1))
            return conn.execute(stmt).rowcount == 1
        return self._store.write(write)

    def record_firing(self, schedule_id: int, job_id: int | None, error: str | None) -> None:
        self._store.write(lambda conn: conn.execute(
            update(_s).where(_s.c.id == schedule_id).values(last_job_id=job_id, last_error=error)))

    def set_paused(self, schedule_id: int, paused: bool, next_at: datetime | None) -> Schedule | None:
        """Pause (no next firing) or resume (firing next at `next_at`); the schedule, or None if gone."""
        def write(conn):
            conn.execute(update(_s).where(_s.c.id == schedule_id).values(paused=paused, next_at=next_at))
            return self._get(conn, schedule_id)
        return self._store.write(write)

    def delete(self, schedule_id: int) -> bool:
        return self._store.write(lambda conn: conn.execute(delete(_s).where(_s.c.id == schedule_id)).rowcount == 1)
