"""The ledger's tables, as SQLAlchemy Core metadata, and their creation.

The only definition of the ledger's SQL shape: the statements of the hot path
(statements.py) and every query are built from these tables.
"""

from __future__ import annotations

from datetime import UTC

from sqlalchemy import (
    Boolean,
    Column,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    false,
    insert,
    inspect,
    select,
    text,
    true,
    update,
)
from sqlalchemy.types import TypeDecorator

from ..models import PoolUnavailable

# 2: gpu_pool_leases.problem; 3: gpu_pool_audit; 4: gpu_pool_queue_log; 5: gpu_pool_jobs;
# 6: gpu_pool_readings (the per-node agent's GPU utilisation); 7: gpu_pool_end_intents;
# 8: gpu_pool_waiters.workers and gpu_pool_jobs.workers/units (gangs, cluster jobs)
# 8: gpu_pool_lease_hours and gpu_pool_decayed_use (history rolled up, so reads cost what their
# period holds, not the history), gpu_pool_bookings; 9: gpu_pool_readings.memory_used_mib
# 10: gpu_pool_lent_hours (the pool's lent GPU-seconds per hour)
# 11: gpu_pool_queued_hours (the queue's request-seconds per hour)
# 12: gpu_pool_outbox (events to tell users, written with the fact they tell) and
# gpu_pool_notify_users (each user's notification choices and directory address)
# 13: borrowing beyond a share (issue 38): gpu_pool_leases.borrowed/reclaim_at,
# gpu_pool_waiters.beyond, gpu_pool_jobs.borrow/requeue/attempts
# 14: gpu_pool_schedules (cron schedules the service fires) and gpu_pool_jobs.notebook/parameters/
# schedule_id (notebook jobs, and the schedule a job was fired by)
SCHEMA_VERSION = 14
NAME_MAX = 255


class UTCDateTime(TypeDecorator):
    """Stores naive UTC, returns aware UTC datetimes (SQLite keeps no zone)."""

    impl = DateTime
    cache_ok = True

    def process_bind_param(self, value, dialect):
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("the GPU ledger stores aware datetimes only")
        return value.astimezone(UTC).replace(tzinfo=None)

    def process_result_value(self, value, dialect):
        return None if value is None else value.replace(tzinfo=UTC)


metadata = MetaData()

meta_table = Table(
    "gpu_pool_meta",
    metadata,
    Column("key", String(64), primary_key=True),
    Column("value", Text, nullable=False),
)

gpus_table = Table(
    "gpu_pool_gpus",
    metadata,
    Column("host", String(NAME_MAX), primary_key=True),
    Column("uuid", String(128), primary_key=True),
    Column("idx", Integer, nullable=False),
    Column("name", String(NAME_MAX), nullable=False),
    Column("memory_mib", Integer, nullable=False),
    Column("parent_uuid", String(128)),
    Column("pci_bus_id", String(64)),
    # False once the GPU is gone from its host's inventory: never lent again
    # until it comes back (its active lease, if any, stays until it ends).
    Column("present", Boolean, nullable=False),
    Column("drained", Boolean, nullable=False),
    Column("drained_at", UTCDateTime),
    Column("seen_at", UTCDateTime, nullable=False),
)

leases_table = Table(
    "gpu_pool_leases",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("user_name", String(NAME_MAX), nullable=False),
    Column("server_name", String(NAME_MAX), nullable=False),
    Column("host", String(NAME_MAX), nullable=False),
    Column("groups", Text, nullable=False),  # JSON list
    Column("started_at", UTCDateTime, nullable=False),
    Column("ended_at", UTCDateTime),
    Column("end_reason", String(32)),
    # Why a lease whose server ended is still lent (a container that would
    # not stop); the reconciler ends it once the container is gone.
    Column("problem", Text),
    # Lent beyond its user's share (GPUPool.max_gpus_per_user, group_gpu_limits): idle GPUs
    # borrowed, reclaimed with notice when a request within its share waits (reclaim.py).
    Column("borrowed", Boolean, nullable=False, server_default=false()),
    # When a waiting request within its share asked for this borrowed lease back: its holder
    # stops it within GPUPool.reclaim_grace of then; NULL while nobody has.
    Column("reclaim_at", UTCDateTime),
    Index("ix_gpu_pool_leases_user", "user_name"),
    Index("ix_gpu_pool_leases_started", "started_at"),
    # The newest ended leases (wait estimates) and a period's leases (charts) without a scan.
    Index("ix_gpu_pool_leases_ended", "ended_at"),
    # ids are never reused, even after the newest lease is undone, because
    # they travel in container labels and spawner state.
    sqlite_autoincrement=True,
)

lease_gpus_table = Table(
    "gpu_pool_lease_gpus",
    metadata,
    Column("lease_id", Integer, ForeignKey("gpu_pool_leases.id", ondelete="CASCADE"), primary_key=True),
    Column("uuid", String(128), primary_key=True),
    Column("host", String(NAME_MAX), nullable=False),
    Column("position", Integer, nullable=False),
    Column("ended_at", UTCDateTime),
    # A period's lent intervals (charts) without a scan of the whole history.
    Index("ix_gpu_pool_lease_gpus_ended", "ended_at"),
    # THE exclusivity guarantee: at most one active lease row per GPU.
    Index(
        "uq_gpu_pool_one_active_lease_per_gpu",
        "host",
        "uuid",
        unique=True,
        sqlite_where=text("ended_at IS NULL"),
        postgresql_where=text("ended_at IS NULL"),
    ),
)

waiters_table = Table(
    "gpu_pool_waiters",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("owner", String(NAME_MAX), nullable=False),  # host:pid, for operators
    Column("user_name", String(NAME_MAX), nullable=False),
    Column("server_name", String(NAME_MAX), nullable=False),
    Column("count", Integer, nullable=False),  # GPUs per worker (per lease)
    Column("groups", Text, nullable=False),
    Column("hosts", Text),  # JSON list, NULL = any host
    # A gang (a cluster job): this many leases of `count` GPUs, granted in one transaction.
    Column("workers", Integer, nullable=False, server_default=text("1")),
    # The request would go beyond its user's share (a job that may borrow): it is served only
    # while no request within its share waits, and reclaims nothing for itself.
    Column("beyond", Boolean, nullable=False, server_default=false()),
    Column("enqueued_at", UTCDateTime, nullable=False),
    Column("heartbeat_at", UTCDateTime, nullable=False),
    sqlite_autoincrement=True,
)

audit_table = Table(
    "gpu_pool_audit",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("at", UTCDateTime, nullable=False),
    Column("actor", String(NAME_MAX), nullable=False),  # who (a hub user or service)
    Column("action", String(32), nullable=False),  # what: drain, undrain
    Column("host", String(NAME_MAX)),
    Column("uuid", String(128)),
    Column("detail", Text),
    Index("ix_gpu_pool_audit_at", "at"),
    sqlite_autoincrement=True,
)

# One row per request that joined the queue, kept after it left: the record
# of queue length over time (the live queue is gpu_pool_waiters).
queue_log_table = Table(
    "gpu_pool_queue_log",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=False),  # the waiter's id
    Column("user_name", String(NAME_MAX), nullable=False),
    Column("count", Integer, nullable=False),
    Column("enqueued_at", UTCDateTime, nullable=False),
    Column("left_at", UTCDateTime),  # NULL while it waits
    Column("outcome", String(16)),  # served, left (gave up or cancelled), stale (its process died)
    Index("ix_gpu_pool_queue_log_enqueued", "enqueued_at"),
    Index("ix_gpu_pool_queue_log_left", "left_at"),
)


jobs_table = Table(
    "gpu_pool_jobs",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("user_name", String(NAME_MAX), nullable=False),
    Column("groups", Text, nullable=False),  # JSON list, as the user's leases record them
    Column("profile", String(NAME_MAX), nullable=False),
    Column("command", Text, nullable=False),  # JSON list of strings
    Column("workdir", Text, nullable=False),
    Column("timeout_s", Integer, nullable=False),
    Column("host", String(NAME_MAX), nullable=False),
    # The identity the container runs as (the servers' rule, fixed at submission).
    Column("uid", Integer, nullable=False),
    Column("gid", Integer, nullable=False),
    # queued, starting, running, succeeded, failed, cancelled, timed-out
    Column("state", String(16), nullable=False),
    Column("lease_id", Integer),
    Column("container", String(NAME_MAX)),
    Column("gpu_uuids", Text, nullable=False),  # JSON list
    Column("exit_code", Integer),
    Column("message", Text),
    Column("submitted_at", UTCDateTime, nullable=False),
    Column("started_at", UTCDateTime),
    Column("ended_at", UTCDateTime),
    # The output kept once the container is gone (its last bytes, capped).
    Column("log", Text),
    # A cluster job: its containers (workers), and once leased each worker's
    # {"worker", "host", "lease_id", "gpus"} (JSON list); NULL for a plain job.
    Column("workers", Integer, nullable=False, server_default=text("1")),
    Column("units", Text),
    # May take idle GPUs beyond its user's share (borrowed leases, reclaimed with notice); and
    # whether a reclaimed run goes back to the queue by itself; how many runs it has started.
    Column("borrow", Boolean, nullable=False, server_default=false()),
    Column("requeue", Boolean, nullable=False, server_default=true()),
    Column("attempts", Integer, nullable=False, server_default=text("1")),
    # A notebook job: the notebook's path in the home and papermill's parameters (JSON object);
    # NULL for a command job.  The schedule that fired it, if one did.
    Column("notebook", Text),
    Column("parameters", Text),
    Column("schedule_id", Integer),
    Index("ix_gpu_pool_jobs_user", "user_name"),
    Index("ix_gpu_pool_jobs_state", "state"),
    sqlite_autoincrement=True,
)


# Cron schedules (spawner/jobs/scheduler.py): each firing submits `body` (a job's submission, JSON)
# as `user_name`, through the same queue and limits as any job.  `next_at` is the next time it is
# due: a firing claims it by moving it on in one transaction, so two services never fire one slot
# twice, and slots missed while no service ran are skipped (one firing, then the next slot).
schedules_table = Table(
    "gpu_pool_schedules",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("user_name", String(NAME_MAX), nullable=False),
    Column("name", String(NAME_MAX), nullable=False),
    Column("cron", String(128), nullable=False),
    Column("body", Text, nullable=False),  # JSON: profile, command or notebook + parameters, timeout
    Column("host", String(NAME_MAX), nullable=False),  # the service (Docker host) that fires it
    Column("paused", Boolean, nullable=False),
    Column("next_at", UTCDateTime),  # NULL while paused
    Column("created_at", UTCDateTime, nullable=False),
    Column("last_fired_at", UTCDateTime),
    Column("last_job_id", Integer),
    Column("last_error", Text),  # why the last firing made no job (refused), for its owner
    Column("fired", Integer, nullable=False, server_default=text("0")),
    Index("ix_gpu_pool_schedules_due", "paused", "next_at"),
    Index("ix_gpu_pool_schedules_user", "user_name"),
    sqlite_autoincrement=True,
)


# The newest reading of each GPU by the per-node agent (`gpu-pool agent`, see
# spawner/cli/agent.py): one row per GPU, overwritten, stamped with the database's
# clock so readers on other machines judge its age by one clock.
readings_table = Table(
    "gpu_pool_readings",
    metadata,
    Column("host", String(NAME_MAX), primary_key=True),
    Column("uuid", String(128), primary_key=True),
    Column("utilization", Float),  # percent; NULL: the agent could not read it
    Column("memory_used_mib", Integer),  # MiB in use; NULL: unknown (or an agent older than 9)
    Column("cuda_version", String(16)),  # the driver's, MAJOR.MINOR; NULL if unknown
    Column("at", UTCDateTime, nullable=False),
)


# Who asked a server to end, recorded by the asker before it asks the hub (the idle
# culler before its DELETE: `culled`; the pool page's admin end: `admin`).  The spawner
# reads it when the stop arrives; without a fresh one the stop is the user's own.
end_intents_table = Table(
    "gpu_pool_end_intents",
    metadata,
    Column("lease_id", Integer, ForeignKey("gpu_pool_leases.id", ondelete="CASCADE"), primary_key=True),
    Column("reason", String(32), nullable=False),
    Column("actor", String(NAME_MAX), nullable=False),
    Column("at", UTCDateTime, nullable=False),
)


# An ended lease's GPU-seconds in each UTC hour it touched (rollup.py writes them as it ends):
# a period's usage sums the hours inside it and clips only the leases of its two edge hours.
lease_hours_table = Table(
    "gpu_pool_lease_hours",
    metadata,
    Column("hour", UTCDateTime, primary_key=True),  # the hour's start
    Column("lease_id", Integer, primary_key=True),
    Column("user_name", String(NAME_MAX), nullable=False),
    Column("groups", Text, nullable=False),  # JSON list, as on the lease
    Column("gpu_seconds", Float, nullable=False),
    # One user's hours in a period (the budget check at each grant).
    Index("ix_gpu_pool_lease_hours_user", "user_name", "hour"),
)

# The same summed per user (and groups) and hour, and per day: a period's whole days and hours
# are a few rows per user, whatever the number of leases in them.
usage_hours_table = Table(
    "gpu_pool_usage_hours",
    metadata,
    Column("hour", UTCDateTime, primary_key=True),
    Column("user_name", String(NAME_MAX), primary_key=True),
    Column("groups", Text, primary_key=True),
    Column("gpu_seconds", Float, nullable=False),
)
usage_days_table = Table(
    "gpu_pool_usage_days",
    metadata,
    Column("day", UTCDateTime, primary_key=True),  # midnight UTC
    Column("user_name", String(NAME_MAX), primary_key=True),
    Column("groups", Text, primary_key=True),
    Column("gpu_seconds", Float, nullable=False),
)

# The GPU-seconds lent in each UTC hour, all users together (rollup.py adds each ended lease's
# hours): a period's occupancy chart reads one row per hour, however busy the hour was.
lent_hours_table = Table(
    "gpu_pool_lent_hours",
    metadata,
    Column("hour", UTCDateTime, primary_key=True),
    Column("gpu_seconds", Float, nullable=False),
)

# The time requests spent in the queue in each UTC hour, all together, added as each leaves
# (queue_hours.py): a period's queue chart reads one row per hour.
queued_hours_table = Table(
    "gpu_pool_queued_hours",
    metadata,
    Column("hour", UTCDateTime, primary_key=True),
    Column("request_seconds", Float, nullable=False),
    Column("gpu_seconds", Float, nullable=False),  # request-seconds times the GPUs each asked for
)

# Each user's and group's GPU-hours decayed with the fair-share half-life, as of `as_of`
# (ended leases only; active ones are added when read), and their undecayed total.
decayed_use_table = Table(
    "gpu_pool_decayed_use",
    metadata,
    Column("kind", String(8), primary_key=True),  # user, group
    Column("name", String(NAME_MAX), primary_key=True),
    Column("gpu_hours", Float, nullable=False),
    Column("as_of", UTCDateTime, nullable=False),
    Column("half_life_s", Float, nullable=False),
    Column("total_hours", Float, nullable=False),
)


# Bookings (bookings.py): N GPUs of one host for a user or a group over [starts_at, ends_at).
bookings_table = Table(
    "gpu_pool_bookings",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("user_name", String(NAME_MAX), nullable=False),  # the booker
    Column("group_name", String(NAME_MAX)),  # NULL: for the booker alone
    Column("host", String(NAME_MAX), nullable=False),
    Column("gpu_uuids", Text, nullable=False),  # JSON list, chosen when booked
    Column("count", Integer, nullable=False),
    Column("starts_at", UTCDateTime, nullable=False),
    Column("ends_at", UTCDateTime, nullable=False),
    Column("created_at", UTCDateTime, nullable=False),
    Column("created_by", String(NAME_MAX), nullable=False),
    Column("state", String(16), nullable=False),  # booked, cancelled, released (unused: a no-show)
    Column("released_at", UTCDateTime),
    Index("ix_gpu_pool_bookings_live", "state", "ends_at"),
    sqlite_autoincrement=True,
)


# Events to tell a user outside the tab (spawner/notify/ sends them), written in the transaction
# of the fact they tell: a queued server granted its GPUs, a job ended.  One row per event and
# channel; `state` pending -> sending (claimed by one sender) -> sent, or failed / expired /
# skipped (the user chose not to get it) / unknown (the server may have taken it: never resent).
outbox_table = Table(
    "gpu_pool_outbox",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("user_name", String(NAME_MAX), nullable=False),
    Column("event", String(32), nullable=False),  # granted, job-ended
    Column("channel", String(16), nullable=False),  # email
    Column("payload", Text, nullable=False),  # JSON: what the message says
    Column("created_at", UTCDateTime, nullable=False),
    Column("state", String(16), nullable=False),
    Column("attempts", Integer, nullable=False, server_default=text("0")),
    Column("next_at", UTCDateTime, nullable=False),  # not tried before (backoff)
    Column("claimed_by", String(NAME_MAX)),  # host:pid of the sender holding it
    Column("done_at", UTCDateTime),
    Column("error", Text),  # the last failure, for operators (never a password)
    Column("mail_id", String(NAME_MAX)),  # the message it went in (several: a digest); rate limits count these
    Index("ix_gpu_pool_outbox_due", "state", "next_at"),
    Index("ix_gpu_pool_outbox_user", "user_name", "done_at"),
    sqlite_autoincrement=True,
)

# Each user's notification choices (JSON, spawner/notify/preferences.py; NULL: the defaults)
# and the address the directory gave at their last login or spawn (NULL: none known).
notify_users_table = Table(
    "gpu_pool_notify_users",
    metadata,
    Column("user_name", String(NAME_MAX), primary_key=True),
    Column("preferences", Text),
    Column("address", String(NAME_MAX)),
    Column("updated_at", UTCDateTime, nullable=False),
)


def _add_columns(conn, table: str, columns: dict[str, str]) -> None:
    """ALTER TABLE ADD COLUMN for those of `columns` the table lacks (create_all made new tables whole)."""
    have = {c["name"] for c in inspect(conn).get_columns(table)}
    for name, kind in columns.items():
        if name not in have:
            conn.execute(text(f"ALTER TABLE {table} ADD COLUMN {name} {kind}"))


def create_schema(conn) -> int | None:
    """Create the tables if missing; refuse a ledger written by newer code.  Returns the
    version the ledger had (None: a new ledger)."""
    metadata.create_all(conn)
    version = conn.execute(select(meta_table.c.value).where(meta_table.c.key == "schema_version")).scalar()
    if version is None:
        conn.execute(insert(meta_table).values(key="schema_version", value=str(SCHEMA_VERSION)))
    elif int(version) < SCHEMA_VERSION:
        if int(version) < 2:
            # 1 -> 2: the column ledgers made by 0.1 lack.
            conn.execute(text("ALTER TABLE gpu_pool_leases ADD COLUMN problem TEXT"))
        # 2 -> 3: gpu_pool_audit; 3 -> 4: gpu_pool_queue_log; 4 -> 5: gpu_pool_jobs;
        # 5 -> 6: gpu_pool_readings; 6 -> 7: gpu_pool_end_intents: new tables create_all has just made.
        if int(version) < 8:
            # 7 -> 8: gangs and cluster jobs (issue 24); every request and job before was one lease.
            _add_columns(conn, "gpu_pool_waiters", {"workers": "INTEGER NOT NULL DEFAULT 1"})
            _add_columns(conn, "gpu_pool_jobs", {"workers": "INTEGER NOT NULL DEFAULT 1", "units": "TEXT"})
            # 7 -> 8: create_all made the new tables but adds no index to a table that exists.
            # The caller rolls up the history so far in this transaction (rollup.backfill: the
            # returned version says so), and the decayed use follows (rollup.ensure_decay).
            for index, table, column in (("ix_gpu_pool_leases_ended", "gpu_pool_leases", "ended_at"),
                                         ("ix_gpu_pool_lease_gpus_ended", "gpu_pool_lease_gpus", "ended_at"),
                                         ("ix_gpu_pool_queue_log_left", "gpu_pool_queue_log", "left_at")):
                conn.execute(text(f"CREATE INDEX IF NOT EXISTS {index} ON {table} ({column})"))
        if int(version) < 9:
            # 8 -> 9: the agents' readings of GPU memory in use (unknown in the readings before).
            _add_columns(conn, "gpu_pool_readings", {"memory_used_mib": "INTEGER"})
        if 8 <= int(version) < 10:
            # 8 or 9 -> 10: the pool's lent GPU-seconds per hour, from the per-user hours (a ledger
            # before 8 gets both from rollup.backfill).
            conn.execute(text("INSERT INTO gpu_pool_lent_hours (hour, gpu_seconds) SELECT hour, SUM(gpu_seconds) "
                              "FROM gpu_pool_usage_hours GROUP BY hour"))
        # 10 -> 11: gpu_pool_queued_hours, a new table: the caller fills it from the queue's
        # record in this transaction (queue_hours.backfill: the returned version says so).
        # 11 -> 12: gpu_pool_outbox and gpu_pool_notify_users, new tables create_all has just made.
        if int(version) < 13:
            # 12 -> 13: borrowing (issue 38); every lease, request and job before was within its share.
            sqlite = conn.dialect.name == "sqlite"
            no, yes = ("0", "1") if sqlite else ("false", "true")
            _add_columns(conn, "gpu_pool_leases", {"borrowed": f"BOOLEAN NOT NULL DEFAULT {no}",
                                                   "reclaim_at": "DATETIME" if sqlite else "TIMESTAMP"})
            _add_columns(conn, "gpu_pool_waiters", {"beyond": f"BOOLEAN NOT NULL DEFAULT {no}"})
            _add_columns(conn, "gpu_pool_jobs", {"borrow": f"BOOLEAN NOT NULL DEFAULT {no}",
                                                 "requeue": f"BOOLEAN NOT NULL DEFAULT {yes}",
                                                 "attempts": "INTEGER NOT NULL DEFAULT 1"})
        if int(version) < 14:
            # 13 -> 14: notebook jobs and the schedule a job came from (gpu_pool_schedules is new).
            _add_columns(conn, "gpu_pool_jobs", {"notebook": "TEXT", "parameters": "TEXT", "schedule_id": "INTEGER"})
        conn.execute(update(meta_table).where(meta_table.c.key == "schema_version")
                     .values(value=str(SCHEMA_VERSION)))
    elif int(version) > SCHEMA_VERSION:
        raise PoolUnavailable(
            f"The GPU ledger has schema version {version}, newer than this code understands "
            f"({SCHEMA_VERSION}); upgrade jupyterhub-gpuspawner",
            transient=False,
        )
    return None if version is None else int(version)
