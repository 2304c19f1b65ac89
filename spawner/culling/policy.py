"""The GPU-idle rule of the idle culler, apart from the culler application.

`GPUCullPolicy` decides, for one server model from the hub's REST API, whether
to cull it; `CullerUtilization` reads a GPU's utilisation in the culler
process from the hub's inventory kind (NVML here, or the per-node agents'
readings in the ledger on Swarm).  spawner/culling/culler.py installs them in
jupyterhub-idle-culler.  They live here, free of jupyterhub-idle-culler,
tornado and JupyterHub, so that whatever judges a GPU without the hub's web
stack (bench/device_check.py on a bare GPU machine) runs this very code.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from .deadline import CullRules, idle_rule

# The culler's GPU-idle threshold (percent) with the inventories that read real GPUs
# (`nvml`, `swarm`): GPUIdleCuller.gpu_idle_percent's default there.
DEFAULT_GPU_IDLE_PERCENT = 5.0
# How long the GPUs must stay under it: GPUIdleCuller.gpu_idle_seconds's default.
DEFAULT_GPU_IDLE_SECONDS = 1800.0


@dataclass
class Verdict:
    cull: bool
    reason: str
    end_reason: str = "culled"  # what the lease's end records (budget: its GPU-hours ran out)


def _user_of(server: dict) -> str:
    """A readable name for logs: 'alice' or 'alice/name' (from the server's URL)."""
    parts = [p for p in (server.get("url") or "").split("/") if p]
    user = parts[parts.index("user") + 1] if "user" in parts[:-1] else "?"
    return f"{user}/{server['name']}" if server.get("name") else user


def is_gpu_server(state: dict | None) -> bool:
    """Whether a server's spawner state (from its REST model) holds a GPU lease."""
    state = state or {}
    return bool(state.get("gpu_uuids")) or state.get("gpu_lease_id") is not None


def server_idle_limit(state: dict | None, cpu_timeout: float, gpu_timeout: float,
                      rules: CullRules | None = None, contended: bool = False) -> float:
    """Seconds of inactivity after which the culler stops this server: the one rule the
    culler applies (GPUCullPolicy.decide, through deadline.idle_rule) and the deadline the
    pool service shows in JupyterLab and on its page (cull_deadline).  `rules`: the hub's
    (profiles' limits, the contended timeout, which applies when `contended`)."""
    rules = rules or CullRules(cpu_timeout, gpu_timeout)
    profile = (state or {}).get("profile")
    return idle_rule(rules, is_gpu_server(state), profile if isinstance(profile, str) else None,
                     contended)[0]


def cull_deadline(last_activity: datetime | None, state: dict | None, cpu_timeout: float,
                  gpu_timeout: float, rules: CullRules | None = None, contended: bool = False) -> datetime | None:
    """When the culler stops this server if nothing happens in it before: its last
    activity (which a busy kernel keeps moving, see images/jupyter/gpuhub_activity) plus its
    idle limit.  The culler acts at its first check after that (every `cull_every` s).
    None when no activity is recorded yet (the culler then keeps it) or culling is off
    (a limit of 0)."""
    limit = server_idle_limit(state, cpu_timeout, gpu_timeout, rules, contended)
    if last_activity is None or limit <= 0:
        return None
    return last_activity + timedelta(seconds=limit)


class GPUCullPolicy:
    """Decides whether to cull a server, from its REST model.

    `utilization(host, uuid)` returns a GPU's utilization in percent, or None
    when unknown; the GPU rule never culls on unknown readings.  `clock` is
    monotonic seconds (tests pass their own).
    """

    def __init__(
        self,
        cpu_timeout: float,
        gpu_timeout: float,
        gpu_idle_percent: float = 0.0,
        gpu_idle_seconds: float = DEFAULT_GPU_IDLE_SECONDS,
        utilization: Callable[[str, str], float | None] | None = None,
        clock: Callable[[], float] = time.monotonic,
        log=None,
        rules: CullRules | None = None,
        contention: Callable[[str], bool] | None = None,
        over_budget: Callable[[int], str | None] | None = None,
        booked_out: Callable[[int], str | None] | None = None,
        on_cull: Callable[..., Awaitable[None]] | None = None,
    ):
        self.cpu_timeout = cpu_timeout
        self.gpu_timeout = gpu_timeout
        # The idle limits (culling/deadline.py: the pages show the same); contention(host): whether a
        # request waits for GPUs on that host now.
        self.rules = rules or CullRules(cpu_timeout, gpu_timeout)
        self.contention = contention
        # over_budget(lease id): why the lease's GPU-hour budget is used up (it is then marked to
        # end with reason `budget`), or None.
        self.over_budget = over_budget
        # booked_out(lease id): why its GPU is booked by someone else now (it then ends `booking`).
        self.booked_out = booked_out
        self.gpu_idle_percent = gpu_idle_percent
        self.gpu_idle_seconds = gpu_idle_seconds
        self.utilization = utilization
        self.clock = clock
        self.log = log
        # Awaited with the server model before the culler's DELETE (the culler records its intent).
        self.on_cull = on_cull
        # lease id -> (since when all its GPUs read low, when last seen)
        self._low_since: dict[Any, tuple[float, float]] = {}
        self._warned_no_state = False

    @property
    def gpu_rule_enabled(self) -> bool:
        return self.gpu_idle_percent > 0 and self.utilization is not None

    def _gpu_idle_for(self, lease_id: Any, host: str, uuids: list[str]) -> float | None:
        """Seconds the lease's GPUs have all read under the threshold (None: not low now)."""
        now = self.clock()
        # Forget leases not seen for an hour (their servers are gone).
        for key, (_, seen) in list(self._low_since.items()):
            if now - seen > max(3600.0, 2 * self.gpu_idle_seconds):
                del self._low_since[key]
        read = self.utilization
        if read is None:  # no readings at all: never low
            return None
        readings = [read(host, uuid) for uuid in uuids]
        if not uuids or any(r is None or r >= self.gpu_idle_percent for r in readings):
            self._low_since.pop(lease_id, None)
            return None
        since = self._low_since.get(lease_id, (now, now))[0]
        self._low_since[lease_id] = (since, now)
        return now - since

    def decide(self, inactive: timedelta | None, server: dict) -> Verdict:
        state = server.get("state")
        if state is None:
            # Without admin:server_state the model has no state: we cannot tell
            # a GPU server from a CPU one, so give everyone the longer leash.
            if not self._warned_no_state and self.log:
                self.log.warning("Server models carry no state (is the culler's role missing "
                                 "admin:server_state?); using the CPU timeout for every server")
                self._warned_no_state = True
            state = {}
        uuids = list(state.get("gpu_uuids") or [])
        is_gpu = is_gpu_server(state)
        idle = inactive.total_seconds() if inactive is not None else None

        if is_gpu and self.gpu_rule_enabled:
            low_for = self._gpu_idle_for(state.get("gpu_lease_id"), state.get("gpu_host", ""), uuids)
            if low_for is not None and low_for >= self.gpu_idle_seconds:
                return Verdict(True, f"its GPUs stayed under {self.gpu_idle_percent:g}% for "
                                     f"{low_for:.1f} s (limit {self.gpu_idle_seconds:g} s)")

        lease_id = state.get("gpu_lease_id")
        if is_gpu and self.booked_out is not None and isinstance(lease_id, int):
            booked = self.booked_out(lease_id)
            if booked:
                return Verdict(True, booked, "booking")
        if is_gpu and self.over_budget is not None and isinstance(lease_id, int):
            used_up = self.over_budget(lease_id)
            if used_up:
                return Verdict(True, f"its GPU-hour budget is used up ({used_up})", "budget")
        profile = state.get("profile") or (server.get("user_options") or {}).get("profile")
        if not isinstance(profile, str):
            profile = None
        max_age = self.rules.profile_max_age.get(profile or "", 0.0)
        age = _age(server.get("started"))
        if max_age > 0 and age is not None and age >= max_age:
            return Verdict(True, f"running for {age:.1f} s, profile {profile}'s maximum age {max_age:g} s")
        contended = bool(is_gpu and self.contention is not None and self.contention(state.get("gpu_host", "")))
        limit, source = idle_rule(self.rules, is_gpu, profile, contended)
        kind = "GPU" if is_gpu else "CPU"
        if idle is None:
            return Verdict(False, "no activity recorded yet")
        why = f"{kind} server inactive for {idle:.1f} s (limit {limit:g} s: {source})"
        return Verdict(limit > 0 and idle >= limit, why)

    def __call__(self, *, inactive: timedelta | None, inactive_limit: int, server: dict, **kwargs):
        """The jupyterhub-idle-culler `cull_arbiter_hook` signature: True to cull (awaitable with `on_cull`)."""
        verdict = self.decide(inactive, server)
        if self.log:
            if verdict.cull:
                self.log.info("Culling %s: %s", _user_of(server), verdict.reason)
            else:
                self.log.debug("Keeping %s: %s", _user_of(server), verdict.reason)
        if verdict.cull and inactive is not None and self.on_cull is not None:
            return self._after(self.on_cull(server, verdict.end_reason))
        return verdict.cull

    @staticmethod
    async def _after(recorded: Awaitable[None]) -> bool:
        await recorded
        return True


def _age(started: str | None) -> float | None:
    """Seconds since a server model's `started` (ISO 8601), or None."""
    if not started:
        return None
    try:
        at = datetime.fromisoformat(started.replace("Z", "+00:00"))
    except ValueError:
        return None
    return (datetime.now(UTC) - (at if at.tzinfo else at.replace(tzinfo=UTC))).total_seconds()


class LedgerContention:
    """Whether a request waits for GPUs on a host, read from the ledger's queue in the culler.

    One read serves a cull pass (kept `max_age` seconds); a ledger that cannot be read
    counts as nobody waiting: the usual, longer timeout holds."""

    def __init__(self, queue: Callable[[], list], log=None, max_age: float = 5.0, clock=time.monotonic):
        self.queue = queue
        self.log = log
        self.max_age = max_age
        self.clock = clock
        self._read_at: float | None = None
        self._hosts: list = []

    def waiting_hosts(self) -> list:
        now = self.clock()
        if self._read_at is None or now - self._read_at >= self.max_age:
            try:
                self._hosts = [w.hosts for w in self.queue()]
            except Exception as exc:  # the ledger is away: nobody counts as waiting
                if self.log is not None:
                    self.log.warning("Cannot read the GPU queue (using the usual idle limit): %s", exc)
                self._hosts = []
            self._read_at = now
        return self._hosts

    def __call__(self, host: str) -> bool:
        from .deadline import contended

        return contended(host, self.waiting_hosts())


class LedgerBudgets:
    """The culler's budget check: the ledger's `lease_over_budget`, a failing ledger read as 'not over'."""

    def __init__(self, pool, log=None):
        self.pool = pool
        self.log = log

    def __call__(self, lease_id: int) -> str | None:
        from ..pool.fair_use.stops import over_budget

        return over_budget(self.pool, lease_id, self.log)


class LedgerBookings:
    """The culler's booking check: the ledger's `lease_booked_out`; a failing ledger reads as 'not booked'."""

    def __init__(self, pool, log=None):
        self.pool = pool
        self.log = log

    def __call__(self, lease_id: int) -> str | None:
        from ..pool.fair_use.stops import booked_out

        return booked_out(self.pool, lease_id, self.log)


class CullerUtilization:
    """GPU utilization read in the culler process, from the hub's inventory kind."""

    def __init__(self, kind: str, simulated_gpus: int, utilization_file: str, log, reading_max_age: float = 60.0,
                 db_url: str | None = None, readings=None):
        self.kind = kind
        # swarm: the readings of a ledger the caller already holds (the pool page's); else one
        # is opened, once, on db_url.
        self.readings = readings
        self.simulated_gpus = simulated_gpus
        self.utilization_file = utilization_file
        self.reading_max_age = reading_max_age
        self.db_url = db_url  # swarm: the ledger (default: $GPUHUB_POOL_DB_URL)
        self.log = log
        self._inventories: dict[str, Any] = {}

    def _swarm_inventory(self, logging: dict):
        """Swarm: the per-node agents' readings in the ledger (GPUHUB_POOL_DB_URL), no Docker access."""
        from ..inventory.swarm import SwarmInventory
        from ..pool import ENV_DB_URL, GPUPool, ledger_env

        inventory = SwarmInventory(reading_max_age=self.reading_max_age, **logging)
        if self.readings is None:
            self.readings = GPUPool(db_url=self.db_url or ledger_env(ENV_DB_URL), **logging).gpu_readings
        inventory.use_readings(self.readings)
        return inventory

    def _inventory(self, host: str):
        from ..inventory.machine import NVMLInventory, SimulatedInventory

        inventory = self._inventories.get(host if self.kind != "swarm" else "")
        if inventory is None:
            logging = {"log": self.log} if self.log is not None else {}
            if self.kind == "swarm":
                inventory = self._swarm_inventory(logging)
                self._inventories[""] = inventory
                return inventory
            if self.kind == "simulated":
                inventory = SimulatedInventory(count=self.simulated_gpus,
                                               utilization_file=self.utilization_file, **logging)
                if host:
                    inventory.host = host  # simulated uuids are made from the host name
            else:
                inventory = NVMLInventory(**logging)
            self._inventories[host] = inventory
        return inventory

    def __call__(self, host: str, uuid: str) -> float | None:
        try:
            if self.kind == "swarm":
                return self._inventory(host).utilization(uuid, host=host)
            return self._inventory(host).utilization(uuid)
        except Exception as exc:  # NVML gone, driver reset: never cull on a failed reading
            if self.log is not None:
                self.log.warning("Cannot read the utilization of GPU %s: %s", uuid, exc)
            return None

    def reading(self, host: str, uuid: str) -> tuple[float | None, int | None]:
        """(utilization %, memory in use in MiB) of one GPU, each None when unknown: what the pool
        page and JupyterLab show (the culler itself reads only the utilization)."""
        try:
            inventory = self._inventory(host)
            if self.kind == "swarm":
                found = inventory.reading(uuid, host=host)  # one ledger read for both
                return (found.utilization, found.memory_used_mib) if found else (None, None)
            return inventory.utilization(uuid), inventory.memory_used_mib(uuid)
        except Exception as exc:
            if self.log is not None:
                self.log.warning("Cannot read GPU %s: %s", uuid, exc)
            return None, None
