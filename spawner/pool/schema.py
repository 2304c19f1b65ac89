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
    insert,
    select,
    text,
    update,
)
from sqlalchemy.types import TypeDecorator

from .models import PoolUnavailable

# 2: gpu_pool_leases.problem; 3: gpu_pool_audit; 4: gpu_pool_queue_log; 5: gpu_pool_jobs;
# 6: gpu_pool_readings (the per-node agent's GPU utilisation)
SCHEMA_VERSION = 7
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
    Index("ix_gpu_pool_leases_user", "user_name"),
    Index("ix_gpu_pool_leases_started", "started_at"),
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
    Column("count", Integer, nullable=False),
    Column("groups", Text, nullable=False),
    Column("hosts", Text),  # JSON list, NULL = any host
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
    Index("ix_gpu_pool_jobs_user", "user_name"),
    Index("ix_gpu_pool_jobs_state", "state"),
    sqlite_autoincrement=True,
)


# The newest reading of each GPU by the per-node agent (`gpu-pool agent`, see
# spawner/inventory/agent.py): one row per GPU, overwritten, stamped with the database's
# clock so readers on other machines judge its age by one clock.
readings_table = Table(
    "gpu_pool_readings",
    metadata,
    Column("host", String(NAME_MAX), primary_key=True),
    Column("uuid", String(128), primary_key=True),
    Column("utilization", Float),  # percent; NULL: the agent could not read it
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


def create_schema(conn) -> None:
    """Create the tables if missing; refuse a ledger written by newer code."""
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
        conn.execute(update(meta_table).where(meta_table.c.key == "schema_version")
                     .values(value=str(SCHEMA_VERSION)))
    elif int(version) > SCHEMA_VERSION:
        raise PoolUnavailable(
            f"The GPU ledger has schema version {version}, newer than this code understands "
            f"({SCHEMA_VERSION}); upgrade jupyterhub-gpuspawner",
            transient=False,
        )
