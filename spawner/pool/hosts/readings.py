"""GPU readings (utilisation, memory in use, driver CUDA version) that the per-node agent writes to the ledger.

On Swarm the hub cannot ask NVML on other nodes; `gpu-pool agent` runs on each
GPU node and keeps the newest reading of each GPU here, stamped with the
database's clock, and the hub's inventory and the culler read them back.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import and_, delete, insert, select

from ...inventory.machine import parse_cuda_version
from .. import validation
from ..ledger.part import PoolPart
from ..ledger.schema import readings_table
from ..models import InvalidRequest

MAX_READINGS = 1024  # per call: far more GPUs than one node has
UUID_MAX = 128  # the column's width
MEMORY_MAX_MIB = 16 * 1024 * 1024  # 16 TiB: far more than one GPU has


@dataclass(frozen=True)
class Reading:
    """The newest reading of one GPU."""

    host: str
    uuid: str
    utilization: float | None
    cuda_version: str | None
    at: datetime
    age_s: float  # by the database's clock
    memory_used_mib: int | None = None


def _uuid(value) -> str:
    value = validation.name(value, "The GPU uuid")
    if len(value) > UUID_MAX:
        raise InvalidRequest(f"The GPU uuid is longer than {UUID_MAX} characters")
    return value


def _utilization(value) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) \
            or not 0 <= value <= 100:
        raise InvalidRequest(f"A GPU's utilization must be a percentage from 0 to 100 or None, not {value!r}")
    return float(value)


def _memory(value) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) \
            or not 0 <= value <= MEMORY_MAX_MIB:
        raise InvalidRequest(f"A GPU's memory in use must be MiB from 0 to {MEMORY_MAX_MIB} or None, not {value!r}")
    return int(value)


def _value(value) -> tuple[float | None, int | None]:
    """A GPU's reading: a percent (or None), or {"utilization": percent, "memory_used_mib": MiB}."""
    if isinstance(value, dict):
        unknown = set(value) - {"utilization", "memory_used_mib"}
        if unknown:
            raise InvalidRequest(f"A GPU's reading has utilization and memory_used_mib, not {sorted(unknown)}")
        return _utilization(value.get("utilization")), _memory(value.get("memory_used_mib"))
    return _utilization(value), None


def _cuda(value) -> str | None:
    if value is None or value == "":
        return None
    if not isinstance(value, str) or len(value) > 16:
        raise InvalidRequest(f"The CUDA version must be MAJOR.MINOR (like 12.4), not {value!r}")
    try:
        parsed = parse_cuda_version(value)
    except ValueError as e:
        raise InvalidRequest(str(e)) from None
    if parsed is None:  # only blanks: no version, as an empty one
        return None
    major, minor = parsed
    return f"{major}.{minor}"


def checked(host, readings, cuda_version) -> tuple[str, dict[str, tuple[float | None, int | None]], str | None]:
    """Validated (host, {uuid: (utilization, memory_used_mib)}, cuda_version) for `record`."""
    host = validation.name(host, "The host name")
    try:
        items = list(dict(readings).items())
    except (TypeError, ValueError):
        raise InvalidRequest("readings must map GPU uuids to utilization percentages") from None
    if len(items) > MAX_READINGS:
        raise InvalidRequest(f"At most {MAX_READINGS} GPU readings at once, not {len(items)}")
    clean = {_uuid(uuid): _value(value) for uuid, value in items}
    return host, clean, _cuda(cuda_version)


def record(store, conn, host: str, readings: dict[str, tuple[float | None, int | None]], cuda_version: str | None
           ) -> datetime:
    """Replace the readings of these GPUs of `host` with new ones; returns their time."""
    at = store.now(conn)
    if readings:
        conn.execute(delete(readings_table).where(and_(readings_table.c.host == host,
                                                       readings_table.c.uuid.in_(list(readings)))))
        conn.execute(insert(readings_table), [
            {"host": host, "uuid": uuid, "utilization": util, "memory_used_mib": memory,
             "cuda_version": cuda_version, "at": at}
            for uuid, (util, memory) in readings.items()])
    return at


def fresh(store, conn, max_age: float, host: str | None) -> list[Reading]:
    """Readings no older than `max_age` seconds by the database's clock (of `host`, or all)."""
    now = store.now(conn)
    where = readings_table.c.at >= now - timedelta(seconds=max_age)
    if host is not None:
        where &= readings_table.c.host == host
    rows = conn.execute(select(readings_table).where(where)).all()
    return [Reading(r.host, r.uuid, r.utilization, r.cuda_version, r.at, max(0.0, (now - r.at).total_seconds()),
                    r.memory_used_mib) for r in rows]


class PoolReadings(PoolPart):
    """GPUPool's reading methods (a mixin of the GPUPool facade)."""

    def record_readings(self, host: str, readings: dict[str, float | dict | None], cuda_version: str | None = None
                        ) -> datetime:
        """Store the newest reading of `host`'s GPUs: {uuid: utilization % or None (unknown)}, or
        {uuid: {"utilization": % or None, "memory_used_mib": MiB in use or None}}.

        `cuda_version` is the driver's (MAJOR.MINOR) or None.  Raises
        InvalidRequest on bad input (nothing is written) and PoolUnavailable.
        """
        host, clean, cuda_version = checked(host, readings, cuda_version)
        # Losing the last readings in a server crash costs one interval: no fsync wait.
        return self._write(lambda conn: record(self._store, conn, host, clean, cuda_version), durable=False)

    def gpu_readings(self, max_age: float, host: str | None = None) -> dict[tuple[str, str], Reading]:
        """{(host, uuid): newest reading} of the readings at most `max_age` seconds old."""
        if isinstance(max_age, bool) or not isinstance(max_age, int | float) or not max_age > 0:
            raise InvalidRequest(f"max_age must be a number of seconds > 0, not {max_age!r}")
        host = validation.name(host, "The host name") if host is not None else None
        found = self._read(lambda conn: fresh(self._store, conn, float(max_age), host))
        return {(r.host, r.uuid): r for r in found}
