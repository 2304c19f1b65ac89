"""The batch jobs' records in the ledger: one row per job, so jobs outlive the process running them.

A job's lease is an ordinary lease (same queue, quotas and accounting) whose
server name is `job/<id>`: JupyterHub server names never contain a slash, so
the hub's reconciler can tell a job's lease from a notebook server's.  A cluster
job (`workers` > 1) holds one lease per worker, `job/<id>/worker-<i>`, granted
together (GPUPool.acquire_gang); `units` records where each worker runs.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import insert, select, update

from ..models import EndReason, iso
from ..validation import storable_id
from . import events
from .schema import jobs_table

JOB_SERVER_PREFIX = "job/"
# Seconds a job's containers may take to start after its GPUs are leased (image pull, create),
# when the pool needs to know how long a job holds them (bookings ahead).
JOB_START_ALLOWANCE = 300.0

QUEUED, STARTING, RUNNING = "queued", "starting", "running"
SUCCEEDED, FAILED, CANCELLED, TIMED_OUT = "succeeded", "failed", "cancelled", "timed-out"
ACTIVE_STATES = (QUEUED, STARTING, RUNNING)
# A finished job's state -> the reason its lease ends with.
END_REASONS = {
    SUCCEEDED: EndReason.JOB_FINISHED,
    FAILED: EndReason.JOB_FAILED,
    CANCELLED: EndReason.JOB_CANCELLED,
    TIMED_OUT: EndReason.JOB_TIMEOUT,
}


def job_server_name(job_id: int) -> str:
    """The server name a job's lease and queue entry carry."""
    return f"{JOB_SERVER_PREFIX}{job_id}"


def is_job_server(server_name: str) -> bool:
    return server_name.startswith(JOB_SERVER_PREFIX)


def job_id_of(server_name: str) -> int | None:
    """The job id in a job lease's server name (`job/12`, `job/12/worker-1`); None if it has none."""
    part = server_name[len(JOB_SERVER_PREFIX):].split("/", 1)[0]
    return int(part) if is_job_server(server_name) and part.isdigit() else None


def notebook_outputs(notebook: str, job_id: int) -> dict[str, str]:
    """Where notebook job `job_id` writes its executed notebook and the HTML copy, relative to the
    home: beside the input, named after the job (`train.ipynb` -> `train.job-12.ipynb`, `.html`)."""
    stem = notebook.removesuffix(".ipynb")
    return {"output": f"{stem}.job-{job_id}.ipynb", "output_html": f"{stem}.job-{job_id}.html"}


@dataclass(frozen=True)
class Job:
    id: int
    user: str
    groups: tuple[str, ...]
    profile: str
    command: tuple[str, ...]
    workdir: str
    timeout_s: int
    host: str
    uid: int
    gid: int
    state: str
    lease_id: int | None
    container: str | None
    gpu_uuids: tuple[str, ...]
    exit_code: int | None
    message: str | None
    submitted_at: datetime
    started_at: datetime | None
    ended_at: datetime | None
    workers: int = 1
    # A cluster's workers once leased: ({"worker": i, "host", "lease_id", "gpus": [...]}, ...).
    units: tuple[dict, ...] = ()
    borrow: bool = False  # may run on idle GPUs beyond its user's share (borrowed leases)
    requeue: bool = True  # a reclaimed run goes back to the queue by itself
    attempts: int = 1  # runs started or queued for: 2 after its first reclaim
    notebook: str | None = None  # a notebook job's notebook (its path in the home)
    parameters: dict | None = None
    schedule_id: int | None = None  # the schedule that fired it

    @property
    def outputs(self) -> dict[str, str]:
        """A notebook job's executed notebook and HTML copy, relative to the home ({} otherwise)."""
        if not self.notebook:
            return {}
        return notebook_outputs(self.notebook, self.id)

    @property
    def is_cluster(self) -> bool:
        return self.workers > 1

    @property
    def lease_ids(self) -> tuple[int, ...]:
        """Every lease the job holds: its one, or each worker's."""
        if self.units:
            return tuple(u["lease_id"] for u in self.units if u.get("lease_id") is not None)
        return (self.lease_id,) if self.lease_id is not None else ()

    @property
    def holds_for(self) -> float:
        """The most seconds its leases are held: its timeout, counted from its start, and the
        time its containers take to start (JOB_START_ALLOWANCE)."""
        return float(self.timeout_s) + JOB_START_ALLOWANCE

    @property
    def active(self) -> bool:
        return self.state in ACTIVE_STATES

    @property
    def public_state(self) -> str:
        # "starting" holds GPUs already: to a user it is running.
        return RUNNING if self.state == STARTING else self.state

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id, "user": self.user, "profile": self.profile,
            "command": list(self.command), "workdir": self.workdir, "timeout": self.timeout_s,
            "state": self.public_state, "exit_code": self.exit_code, "message": self.message,
            "gpus": list(self.gpu_uuids), "host": self.host, "lease_id": self.lease_id,
            "submitted_at": iso(self.submitted_at), "started_at": iso(self.started_at),
            "ended_at": iso(self.ended_at), "workers": self.workers,
            "units": [dict(u) for u in self.units],
            "borrow": self.borrow, "requeue": self.requeue, "attempts": self.attempts,
            "notebook": self.notebook, "parameters": self.parameters,
            "output": self.outputs.get("output"), "output_html": self.outputs.get("output_html"),
            "schedule_id": self.schedule_id,
        }


def _job(row) -> Job:
    m = row._mapping
    return Job(
        id=m["id"], user=m["user_name"], groups=tuple(json.loads(m["groups"])), profile=m["profile"],
        command=tuple(json.loads(m["command"])), workdir=m["workdir"], timeout_s=m["timeout_s"],
        host=m["host"], uid=m["uid"], gid=m["gid"], state=m["state"], lease_id=m["lease_id"], container=m["container"],
        gpu_uuids=tuple(json.loads(m["gpu_uuids"])), exit_code=m["exit_code"], message=m["message"],
        submitted_at=m["submitted_at"], started_at=m["started_at"], ended_at=m["ended_at"],
        workers=m["workers"], units=tuple(json.loads(m["units"])) if m["units"] else (),
        borrow=bool(m["borrow"]), requeue=bool(m["requeue"]), attempts=m["attempts"],
        notebook=m["notebook"], parameters=json.loads(m["parameters"]) if m["parameters"] else None,
        schedule_id=m["schedule_id"],
    )


_COLUMNS = [c for c in jobs_table.c if c.name != "log"]


class JobLedger:
    """Reads and writes of `gpu_pool_jobs` through a GPUPool's database (its clock, its locks)."""

    def __init__(self, pool):
        self._store = pool._store

    def create(self, user: str, groups, profile: str, command, workdir: str, timeout_s: int,
               host: str, uid: int, gid: int, check: Callable[[list[tuple[str, str]]], None] | None = None,
               workers: int = 1, borrow: bool = False, requeue: bool = True, notebook: str | None = None,
               parameters: dict | None = None, schedule_id: int | None = None) -> Job:
        """Record a queued job.  `check`, given the user's active jobs as (profile, state)
        pairs, may refuse it by raising: it runs in the same transaction, under the
        ledger's write lock, so concurrent submissions cannot pass a limit together."""
        def write(conn):
            if check is not None:
                check([tuple(r) for r in conn.execute(
                    select(jobs_table.c.profile, jobs_table.c.state).where(
                        jobs_table.c.user_name == user, jobs_table.c.state.in_(ACTIVE_STATES))).all()])
            job_id = conn.execute(insert(jobs_table).values(**{
                "user_name": user, "groups": json.dumps(sorted(groups)), "profile": profile,
                "command": json.dumps(list(command)), "workdir": workdir, "timeout_s": timeout_s,
                "host": host, "uid": uid, "gid": gid, "state": QUEUED, "gpu_uuids": "[]", "workers": workers,
                "borrow": bool(borrow), "requeue": bool(requeue),
                "notebook": notebook, "schedule_id": schedule_id,
                "parameters": json.dumps(parameters, sort_keys=True) if notebook else None,
                "submitted_at": self._store.now(conn)})).inserted_primary_key[0]
            return self._get(conn, job_id)
        return self._store.write(write)

    def _get(self, conn, job_id: int) -> Job | None:
        rows = conn.execute(select(*_COLUMNS).where(jobs_table.c.id == job_id)).all()
        return _job(rows[0]) if rows else None

    def get(self, job_id: int) -> Job | None:
        if not storable_id(job_id):
            return None  # an id past 64 bits names no job
        return self._store.read(lambda conn: self._get(conn, job_id))

    def jobs(self, user: str | None = None, active_only: bool = False, limit: int = 200) -> list[Job]:
        """Newest first."""
        stmt = select(*_COLUMNS).order_by(jobs_table.c.id.desc()).limit(limit)
        if user is not None:
            stmt = stmt.where(jobs_table.c.user_name == user)
        if active_only:
            stmt = stmt.where(jobs_table.c.state.in_(ACTIVE_STATES))
        return self._store.read(lambda conn: [_job(r) for r in conn.execute(stmt).all()])

    def update(self, job_id: int, expect: tuple[str, ...] | None = None, stamp: str | None = None,
               **values) -> Job | None:
        """Set `values` (columns; lists as JSON), and `stamp` (started_at/ended_at) to the
        database's now; only while the job's state is in `expect`.  The job, or None if not."""
        for key in ("gpu_uuids", "command", "groups", "units"):
            if key in values:
                values[key] = json.dumps(list(values[key]))

        def write(conn):
            stmt = update(jobs_table).where(jobs_table.c.id == job_id)
            if expect is not None:
                stmt = stmt.where(jobs_table.c.state.in_(expect))
            row = dict(values)
            if stamp:
                row[stamp] = self._store.now(conn)
            if conn.execute(stmt.values(**row)).rowcount == 0:
                return None
            job = self._get(conn, job_id)
            if (job is not None and values.get("state") not in (None, *ACTIVE_STATES) and expect is not None
                    and set(expect) <= set(ACTIVE_STATES)):  # from active to ended: once
                events.job_ended(self._store, conn, job)  # the end and its news in one transaction
            return job
        return self._store.write(write)

    def log(self, job_id: int) -> str | None:
        if not storable_id(job_id):
            return None
        stmt = select(jobs_table.c.log).where(jobs_table.c.id == job_id)
        return self._store.read(lambda conn: conn.execute(stmt).scalar())
