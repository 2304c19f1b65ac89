"""A job's group of units: N units started, watched, ended and cancelled together.

Every job is one group: a plain job's has one unit; a cluster job's (cluster.py gives it its
parts) one unit per worker, each on its own lease's host, on a network of the group's own,
each told its peers in `TF_CONFIG`.  The runner (runner.py) drives every group the same way;
the group says what its units are called, what their leases carry, how they lease (one grant
for all), and runs the engine calls on all of them.  The rules of a group's end: its lead
unit's (unit 0, a cluster's chief) exit 0 is the group's success (the others are then
stopped); any unit that exits non-zero, is killed or vanishes ends the group as failed,
naming the worker; in a group whose units cannot go on without each other (a cluster) so
does a unit whose node stays quiet (Swarm: down) for `JobSettings.node_down_grace` s, the
servers' grace (a node back within it lets the cluster carry on); cancel and timeout stop
every unit.  After a restart a group with a unit missing is made again, never left half alive.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence

from ..engines.common.labels import LABEL_JOB, LABEL_POOL
from ..pool.ledger.job_records import FAILED, SUCCEEDED, TIMED_OUT, Job, job_server_name
from ..pool.validation import worker_server_name
from ..profiles import Profile
from .cluster import merge_logs, network_name, units_of, worker_env, worker_name
from .engine import ENDED, UNKNOWN, JobEngine, UnitGone, UnitSpec, UnitState
from .runner_settings import JobSettings
from .spec import Unit, only_unit, unit_spec

log = logging.getLogger("gpu-pool-page")
# What `watch` returns when the group's borrowed leases are asked back (not a job state: the
# runner queues the job again, reclaim.py).
RECLAIMED = "reclaimed"
# What `watch` returns when the runner is stopping the job (its owner's cancel, a fair-use stop):
# the runner says why.
STOPPING = "stopping"
# The most bytes of one Docker log entry: a longer line is split into entries of this size.
LOG_ENTRY_MAX = 16 * 1024
# Seconds a unit's processes get after SIGTERM when the runner stops it, before SIGKILL.
STOP_GRACE_SECONDS = 5


class UnitGroup:
    """The units of one job, and the engine calls made on all of them."""

    def __init__(self, job: Job, units: Sequence[Unit], settings: JobSettings, engine: JobEngine,
                 network: str | None = None):
        self.job = job
        self.units = tuple(units)
        self.settings = settings
        self.engine = engine
        self.network = network  # the group's own network, made with it and removed with it; None: none

    @property
    def size(self) -> int:
        return len(self.units)

    @property
    def names(self) -> list[str]:
        return [u.name for u in self.units]

    @property
    def lease_names(self) -> list[str]:
        """The server name each unit's lease carries, unit by unit."""
        return [u.server_name for u in self.units]

    @property
    def interdependent(self) -> bool:
        """Whether its units cannot go on without each other (a cluster's workers)."""
        return self.size > 1

    # ------------------------------------------------------------ words

    @property
    def noun(self) -> str:
        return "Cluster job" if self.interdependent else "Job"

    def unit_words(self, index: int) -> str:
        """How a message names unit `index`'s container."""
        return f"worker {index}'s container ({self.units[index].name})" if self.interdependent else "its container"

    def unit_subject(self, index: int) -> str:
        """How a message about unit `index`'s end begins ("" for a job's only unit)."""
        return f"worker {index} " if self.interdependent else ""

    def stuck_words(self, index: int, host: str) -> str:
        """The lease problem of unit `index`, whose stop the engine did not confirm."""
        if self.interdependent:
            return (f"cluster job {self.job.id}'s worker {index} would not stop (its node: {host or 'unknown'}); "
                    "retried by the job reconciler")
        return f"job {self.job.id}'s container would not stop; retried by the job reconciler"

    # ------------------------------------------------------------ leases

    async def acquire(self, pool, gpus: int, hosts, timeout: float) -> list:
        """Every unit's GPUs in one grant, waiting in the pool's fair queue: the leases, unit by unit."""
        job = self.job
        if self.size == 1:
            return [await pool.acquire(job.user, job_server_name(job.id), gpus, job.groups, timeout=timeout,
                                       host=hosts, holds_for=job.holds_for, borrow=job.borrow,
                                       since=job.submitted_at)]
        return list(await pool.acquire_gang(job.user, job_server_name(job.id), gpus, self.size, job.groups,
                                            timeout=timeout, host=hosts, holds_for=job.holds_for))

    def lease_record(self, leases: Sequence) -> dict:
        """What the job's record keeps of its units' leases (`leases`: unit by unit; none for CPUs)."""
        if not self.interdependent:
            return {"lease_id": leases[0].id, "gpu_uuids": list(leases[0].gpu_uuids)} if leases else {}
        units = units_of(leases, self.size, self.settings.host)
        return {"lease_id": units[0]["lease_id"], "gpu_uuids": [g for u in units for g in u["gpus"]],
                "units": units}

    @property
    def lease_ids(self) -> list[int | None]:
        """Each unit's lease id (None: a unit without GPUs)."""
        return [u.lease_id for u in self.units]

    # ------------------------------------------------------------ start

    def specs(self, profile: Profile, home_volume: str, pool_id: str, hosts: Sequence[str],
              stop_grace: float | None = None) -> list[UnitSpec]:
        """Every unit's spec, unit `i` on `hosts[i]` (its lease's host); `stop_grace`: as UnitSpec's."""
        return [unit_spec(self.job, profile, self.settings, home_volume, pool_id, host, stop_grace, unit,
                          self.network) for unit, host in zip(self.units, hosts)]

    async def found(self) -> list[UnitState | None]:
        """Each unit's state now (None: not there)."""
        return [await self.engine.inspect(name) for name in self.names]

    async def create(self, specs: Sequence[UnitSpec], pool_id: str, outbound: bool) -> None:
        """Make the group's network (`outbound`: as JobEngine.create_network's), then every unit at
        once (a cluster's workers wait for each other in TensorFlow's own start-up); raises if one
        could not start."""
        if self.network is not None:
            await self.engine.create_network(self.network, {LABEL_JOB: str(self.job.id), LABEL_POOL: pool_id},
                                             outbound=outbound)
        results = await asyncio.gather(*(self.engine.create(s) for s in specs), return_exceptions=True)
        failed = [(index, r) for index, r in enumerate(results) if isinstance(r, BaseException)]
        if failed:
            index, exc = failed[0]
            if not self.interdependent:
                raise exc
            raise RuntimeError(f"worker {index} ({specs[index].name}) could not start: {exc}")

    # ------------------------------------------------------------ watch

    async def watch(self, deadline: float, poll: float, stopping: Callable[[], bool],
                    reclaim_turn: Callable[[list[str], bool], Awaitable[bool]],
                    node_down_grace: float) -> tuple[str, int | None, str | None]:
        """Until the group ends (state, the lead unit's exit code, message), the runner stops it
        (STOPPING) or its borrowed leases are asked back and it is to stop (RECLAIMED).
        `stopping()`: whether the runner is stopping it; `reclaim_turn(names, any ended)`: the
        reclaim's turn (reclaim.py)."""
        loop = asyncio.get_running_loop()
        names = self.names
        quiet_since: dict[int, float] = {}  # unit index -> when its node was first seen quiet
        while True:
            # Wait on the lead unit (its end is the common one); look at the others each turn.
            lead = await self.engine.wait(names[0], max(0.0, min(poll, deadline - loop.time())))
            states = [lead] + [await self.engine.inspect(n) for n in names[1:]]
            # Its borrowed leases asked back: told, then stopped (a unit's exit is the notice heeded).
            if not stopping() and await reclaim_turn(names, any(s is not None and s.phase == ENDED for s in states)):
                return RECLAIMED, None, None
            for index, state in enumerate(states):
                if state is None:
                    return FAILED, None, f"{self.unit_words(index)} was removed from outside"
                if state.phase == ENDED and state.exit_code != 0:
                    why = (f"exited with code {state.exit_code}" if state.exit_code is not None
                           else f"ended without an exit code: {state.message or 'no reason given'}")
                    code = lead.exit_code if lead is not None and lead.phase == ENDED else None
                    return FAILED, code, f"{self.unit_subject(index)}{why}"
                quiet = node_quiet_for(state, quiet_since, index, loop.time()) if self.interdependent else None
                if quiet is not None and quiet >= node_down_grace:
                    return FAILED, None, (f"worker {index}'s node {state.node} has not answered for {quiet:.0f} s "
                                          f"({state.message}); the other workers were stopped")
            if lead is not None and lead.phase == ENDED:  # exit 0: the group's success
                return SUCCEEDED, 0, None
            if stopping():
                return STOPPING, None, None
            if loop.time() >= deadline:
                return TIMED_OUT, None, f"stopped after its timeout of {self.job.timeout_s} s"

    # ------------------------------------------------------------ end

    async def stop(self, grace: float = STOP_GRACE_SECONDS) -> list[bool]:
        """Stop every unit at once; each unit's: True once the engine confirms it no longer runs."""
        return list(await asyncio.gather(*(self._stop(name, grace) for name in self.names)))

    async def _stop(self, name: str, grace: float) -> bool:
        try:
            if await self.engine.stop(name, grace):
                return True
        except Exception as exc:
            log.error("Could not stop job %s's unit %s: %s", self.job.id, name, exc)
            return False
        log.error("Could not stop job %s's unit %s", self.job.id, name)
        return False

    async def remove(self) -> None:
        """Remove every unit, then the group's network."""
        for name in self.names:
            await remove_unit(self.engine, name)
        if self.network is not None:
            await self.engine.remove_network(self.network)

    async def read_log(self, limit: int, worker: int | None = None) -> str | None:
        """The units' output so far: a job's one unit's last `limit` bytes; a cluster's every
        worker's, each its share of `limit`, merged with `[worker i]` marks (or worker `worker`'s
        alone, unmarked).  None if no unit is there any more."""
        indexes = range(self.size) if worker is None else [worker]
        share = limit if len(indexes) == 1 else max(1024, limit // len(indexes))
        logs = []
        for index in indexes:
            text = await read_unit_log(self.engine, self.job.id, self.units[index].name, share)
            if text is not None:
                logs.append((index, text))
        if not logs:
            return None
        return merge_logs(logs) if self.interdependent and worker is None else logs[0][1]


def group_of(job: Job, settings: JobSettings, engine: JobEngine) -> UnitGroup:
    """The job's group: its one unit, or (a cluster) one per worker on the cluster's own network,
    each told its peers."""
    if job.workers <= 1:
        return UnitGroup(job, [only_unit(job, settings)], settings, engine)
    names = [worker_name(settings, job.id, i) for i in range(job.workers)]
    recorded = {int(u["worker"]): u for u in job.units}
    units = [Unit(i, name, worker_server_name(job_server_name(job.id), i), recorded.get(i, {}).get("lease_id"),
                  tuple(recorded.get(i, {}).get("gpus") or ()), worker_env(names, i), (name,))
             for i, name in enumerate(names)]
    return UnitGroup(job, units, settings, engine, network=network_name(settings, job.id))


def node_quiet_for(state: UnitState, since: dict[int, float], index: int, now: float) -> float | None:
    """Seconds unit `index`'s node has been quiet (its unit UNKNOWN, a node named), else None
    (and its count starts again).  An engine that did not answer at all names no node."""
    if state.phase == UNKNOWN and state.node:
        return now - since.setdefault(index, now)
    since.pop(index, None)
    return None


async def remove_unit(engine: JobEngine, name: str) -> bool:
    """Remove a job unit, running or not; True once done (or already gone)."""
    if await engine.remove(name):
        return True
    log.error("Could not remove job unit %s", name)
    return False


async def read_unit_log(engine: JobEngine, job_id: int, name: str, limit: int) -> str | None:
    """The unit's output so far, its last `limit` bytes; None if it is gone (or unreadable).

    Only the log's tail is read, never the whole of it: Docker's `tail` counts log entries (a
    line, or 16 KiB of one), so ask for a few and for more until they give `limit` bytes or
    the whole log."""
    entries, got = max(64, limit // LOG_ENTRY_MAX), None
    try:
        while True:
            raw = await engine.logs(name, entries)
            whole = got is not None and len(raw) == len(got)  # more entries gave no more
            if whole or len(raw) >= limit or entries > limit:
                break
            got, entries = raw, entries * 8
    except UnitGone:
        return None
    except Exception as exc:
        log.warning("Could not read job %s's log: %s", job_id, exc)
        return None
    if whole or len(raw) <= limit:
        return cap(raw, limit)
    return "[... earlier output not kept ...]\n" + raw[-limit:].decode(errors="replace")


def cap(raw: bytes, limit: int) -> str:
    """The last `limit` bytes of `raw` as text, saying when the start was cut."""
    if len(raw) <= limit:
        return raw.decode(errors="replace")
    return f"[... first {len(raw) - limit} bytes not kept ...]\n" + raw[-limit:].decode(errors="replace")
