"""Cluster jobs: one job, several containers (workers), started together and ended together.

A job with `workers` N > 1 gets N leases of its profile's GPUs in one grant
(GPUPool.acquire_gang: all or nothing, one queue entry), then one unit per worker on
its lease's host, all on a network of their own that only they share (internal: no
route out, no hub; with the profile's `job_network`, on one Docker host a route out through the
host's NAT and the hub's API under the host's rules, engines/common/firewall.py, on Swarm an
HTTPS proxy of the network's own, engines/swarm/job_services.py; never the hub's
shared network, where any user's server would reach the workers' unauthenticated gRPC port).
Each worker gets `TF_CONFIG` naming every worker by a stable name
(its unit name, an alias on that network) and its own index; worker 0 is the chief.

The runner (runner.py) calls these steps for a cluster where it calls its own for one
container.  The rules: the chief's exit 0 is the cluster's success (the others are then
stopped); any worker that exits non-zero, is killed or vanishes ends the cluster as
failed, naming the worker; so does a worker whose node stays quiet (Swarm: down) for
`JobSettings.node_down_grace` s, the servers' grace (its peers cannot go on without it,
and a node back within it lets the cluster carry on); cancel and timeout stop every
worker; the GPUs go back, the leases of every worker whose stop the engine confirmed in
one transaction, and a quiet node's worker's only once that node confirms its task gone
(the job reconciler's pass).  After a restart a cluster with a worker missing is ended,
never left half alive.
"""

from __future__ import annotations

import asyncio
import json
import logging

from ..engines.common.containers import config_digest, lease_labels, runtime_env
from ..engines.common.labels import LABEL_JOB, LABEL_POOL
from ..pool.ledger.job_records import (
    CANCELLED,
    FAILED,
    QUEUED,
    RUNNING,
    STARTING,
    SUCCEEDED,
    TIMED_OUT,
    Job,
    job_server_name,
)
from ..pool.validation import worker_server_name
from ..profiles import Profile
from .engine import ENDED, UNKNOWN, UnitGone, UnitSpec, UnitState
from .engine import RUNNING as RUNNING_UNIT
from .runner_settings import JobSettings
from .spec import WORKDIR_WRAPPER, container_name, job_env, workdir_path

# What `watch` returns when the cluster's borrowed leases are reclaimed (not a job state: the
# runner queues it again, reclaim.py).
RECLAIMED = "reclaimed"

log = logging.getLogger("gpu-pool-page")
# The port every worker's TensorFlow server listens on (each worker is its own container).
TF_PORT = 2222


# ------------------------------------------------------------ pure: names, TF_CONFIG, specs


def worker_name(settings: JobSettings, job_id: int, index: int) -> str:
    """Worker `index`'s unit name, also its name on the cluster's network."""
    return f"{container_name(settings, job_id)}-w{index}"


def network_name(settings: JobSettings, job_id: int) -> str:
    return f"{container_name(settings, job_id)}-net"


def tf_config(names: list[str], index: int, port: int = TF_PORT) -> str:
    """TensorFlow's cluster spec for worker `index` of the workers called `names` (0: the chief)."""
    return json.dumps({"cluster": {"worker": [f"{n}:{port}" for n in names]},
                       "task": {"type": "worker", "index": index}}, sort_keys=True)


def worker_specs(job: Job, profile: Profile, settings: JobSettings, home_volume: str, pool_id: str,
                 stop_grace: float | None = None) -> list[UnitSpec]:
    """The cluster's units, one per worker in `job.units` (each on its lease's host, with its GPUs);
    `stop_grace`: as UnitSpec's (a borrowed cluster's notice)."""
    names = [worker_name(settings, job.id, u["worker"]) for u in job.units]
    network = network_name(settings, job.id)
    specs = []
    for unit, name in zip(job.units, names):
        index, gpus, host = unit["worker"], tuple(unit["gpus"]), unit["host"]
        digest = config_digest(unit["lease_id"], gpus, profile.image, profile.cpu_limit, profile.mem_limit,
                               job.uid, job.gid)
        labels = lease_labels(job.user, worker_server_name(job_server_name(job.id), index), gpus, host,
                              unit["lease_id"], pool_id, digest)
        labels[LABEL_JOB] = str(job.id)
        env = {**job_env(job, settings), "GPUHUB_JOB_WORKER": str(index), "GPUHUB_JOB_WORKERS": str(job.workers),
               "TF_CONFIG": tf_config(names, index), **runtime_env(profile.cpu_limit, gpus)}
        specs.append(UnitSpec(
            name=name, image=profile.image,
            command=["/bin/sh", "-c", WORKDIR_WRAPPER, workdir_path(settings, job.workdir), *job.command],
            user=f"{job.uid}:{job.gid}", env=env, labels=labels, working_dir=settings.home_mount_point,
            volumes={home_volume: settings.home_mount_point}, gpus=gpus,
            host=host if host != settings.host else "",
            # The cluster's own network only, never the hub's shared one (where every user's
            # server could reach the workers' unauthenticated gRPC port).
            network=network, aliases=(name,),
            cpu_limit=profile.cpu_limit or None, mem_limit=profile.mem_limit or None, shm_size=settings.shm_size,
            stop_grace=stop_grace,
        ))
    return specs


def units_of(leases, workers: int, host: str) -> list[dict]:
    """What the job records of its workers: each one's host, lease and GPUs (a CPU cluster: none)."""
    if not leases:
        return [{"worker": i, "host": host, "lease_id": None, "gpus": []} for i in range(workers)]
    return [{"worker": i, "host": lease.host, "lease_id": lease.id, "gpus": list(lease.gpu_uuids)}
            for i, lease in enumerate(leases)]


def merge_logs(logs: list[tuple[int, str]]) -> str:
    """Every worker's output, each line marked `[worker i]`, worker by worker."""
    out = []
    for index, text in logs:
        out += [f"[worker {index}] {line}" for line in text.splitlines()]
    return "\n".join(out) + ("\n" if out else "")


def worker_log(merged: str, index: int) -> str:
    """Worker `index`'s share of a merged log (merge_logs' output), unmarked: what an ended
    cluster's `?worker=i` shows, its workers' containers being gone."""
    mark = f"[worker {index}] "
    lines = [line[len(mark):] for line in merged.splitlines() if line.startswith(mark)]
    return "\n".join(lines) + ("\n" if lines else "")


# ------------------------------------------------------------ the runner's steps


async def lease(runner, job: Job, profile: Profile, hosts) -> tuple | None:
    """Every worker's GPUs in one grant (None for a CPU cluster), waiting in the fair queue."""
    if not profile.gpus:
        return None
    return await runner.pool.acquire_gang(job.user, job_server_name(job.id), profile.gpus, job.workers,
                                          job.groups, timeout=runner.settings.queue_timeout, host=hosts,
                                          holds_for=job.holds_for)


async def record_leases(runner, job: Job, leases) -> Job | None:
    units = units_of(leases or (), job.workers, runner.settings.host)
    gpus = [g for u in units for g in u["gpus"]]
    return await runner.call(runner.ledger.update, job.id, (QUEUED,), state=STARTING,
                             lease_id=units[0]["lease_id"], gpu_uuids=gpus, units=units)


async def launch(runner, job: Job, profile: Profile) -> Job | None:
    """Every worker's unit on the cluster's network (again, after a restart): all running, or
    none (a half-made cluster is taken down and made again)."""
    engine, settings = runner.engine, runner.settings
    names = [worker_name(settings, job.id, u["worker"]) for u in job.units]
    found = [await engine.inspect(n) for n in names]
    if found and all(f is not None and f.phase == RUNNING_UNIT for f in found):
        return await runner.call(runner.ledger.update, job.id, (STARTING,), "started_at", state=RUNNING,
                                 container=names[0])
    for name, state in zip(names, found):
        if state is not None:
            await engine.remove(name)
    if job.id in runner._cancel:
        await finish(runner, job, CANCELLED, message="cancelled before it started")
        return None
    directory = (job.uid, job.gid) != (settings.fallback_uid, settings.fallback_gid)
    volume = await engine.prepare_home(job.user, profile.image, job.uid, job.gid, directory)
    # A profile with job_network gives the cluster's own network a route out instead of the hub's.
    await engine.create_network(network_name(settings, job.id),
                                {LABEL_JOB: str(job.id), LABEL_POOL: runner.pool_id}, outbound=profile.job_network)
    specs = worker_specs(job, profile, settings, volume, runner.pool_id, await borrowed_grace(runner, job))
    # All at once: the workers wait for each other in TensorFlow's own start-up.
    results = await asyncio.gather(*(engine.create(s) for s in specs), return_exceptions=True)
    failed = [(s, r) for s, r in zip(specs, results) if isinstance(r, BaseException)]
    if failed:
        spec, exc = failed[0]
        raise RuntimeError(f"worker {specs.index(spec)} ({spec.name}) could not start: {exc}")
    log.info("Cluster job %s of %s runs in %s", job.id, job.user, ", ".join(
        f"{s.name}{' on ' + s.host if s.host else ''}" for s in specs))
    return await runner.call(runner.ledger.update, job.id, (STARTING,), "started_at", state=RUNNING,
                             container=names[0])


async def borrowed_grace(runner, job: Job) -> float | None:
    """GPUPool.reclaim_grace when any of the cluster's leases is borrowed (it is reclaimed as a
    whole), else None."""
    for unit in job.units:
        lease = await runner.call(runner.pool.lease, unit["lease_id"]) if unit.get("lease_id") else None
        if lease is not None and lease.borrowed:
            return float(runner.pool.reclaim_grace)
    return None


async def watch(runner, job: Job, deadline: float, poll: float) -> tuple[str, int | None, str | None]:
    """Until the cluster ends: (state, the chief's exit code, message)."""
    loop = asyncio.get_running_loop()
    names = [worker_name(runner.settings, job.id, u["worker"]) for u in job.units]
    quiet_since: dict[int, float] = {}  # worker index -> when its node was first seen quiet
    while True:
        # Wait on the chief (its end is the common one); look at the others each turn.
        chief = await runner.engine.wait(names[0], max(0.0, min(poll, deadline - loop.time())))
        states = [chief] + [await runner.engine.inspect(n) for n in names[1:]]
        # Its borrowed leases asked back: told, then stopped (a worker's exit is the notice heeded).
        if job.id not in runner._cancel and await runner.reclaims.turn(
                job, names, any(s is not None and s.phase == ENDED for s in states)):
            return RECLAIMED, None, None
        for index, state in enumerate(states):
            if state is None:
                return FAILED, None, f"worker {index}'s container ({names[index]}) was removed from outside"
            if state.phase == ENDED and state.exit_code != 0:
                why = (f"exited with code {state.exit_code}" if state.exit_code is not None
                       else f"ended without an exit code: {state.message or 'no reason given'}")
                return FAILED, states[0].exit_code if states[0].phase == ENDED else None, f"worker {index} {why}"
            quiet = node_quiet_for(state, quiet_since, index, loop.time())
            if quiet is not None and quiet >= runner.settings.node_down_grace:
                return FAILED, None, (f"worker {index}'s node {state.node} has not answered for {quiet:.0f} s "
                                      f"({state.message}); the other workers were stopped")
        if chief.phase == ENDED:  # exit 0: the cluster's success
            return SUCCEEDED, 0, None
        if job.id in runner._cancel:
            return CANCELLED, None, runner.fair_use.message(job)
        if loop.time() >= deadline:
            return TIMED_OUT, None, f"stopped after its timeout of {job.timeout_s} s"


def node_quiet_for(state: UnitState, since: dict[int, float], index: int, now: float) -> float | None:
    """Seconds worker `index`'s node has been quiet (its unit UNKNOWN, a node named), else None
    (and its count starts again).  An engine that did not answer at all names no node."""
    if state.phase == UNKNOWN and state.node:
        return now - since.setdefault(index, now)
    since.pop(index, None)
    return None


async def finish(runner, job: Job, state: str, exit_code: int | None = None, message: str | None = None) -> None:
    """Stop every worker and keep their logs; remove the units and the network; end every
    worker's lease (one transaction) once the engine confirms no worker runs; record the end.
    The removal comes first (the lease contract): a cluster reads as ended, its leases as ended,
    only once its workers are gone, not while the engine still removes them."""
    engine, settings = runner.engine, runner.settings
    names = [worker_name(settings, job.id, i) for i in range(job.workers)]
    # Read before the stop as well: Swarm drops a stopped service's tasks, and their logs with them.
    before = await read_log(runner, job)
    stopped = await asyncio.gather(*(runner.stop_unit(job, n) for n in names))
    after = await read_log(runner, job)
    output = after if after is not None and len(after) >= len(before or "") else before
    if all(stopped):  # a removal that fails is left to the job reconciler (a stopped unit of an ended job)
        for name in names:
            await runner.remove_container(name)
        await engine.remove_network(network_name(settings, job.id))
    # Each worker's lease ends once its own unit is confirmed stopped; the others' wait for the
    # job reconciler, which removes what still runs (a quiet node's, once it answers).
    leases = worker_leases(job)
    done = [lease_id for index, lease_id in leases.items() if stopped[index]]
    if done:
        await runner.call(runner.pool.release_all, done, runner.fair_use.end_reason(job, state))
    for index, lease_id in leases.items():
        if not stopped[index]:
            await runner.call(runner.pool.set_problem, lease_id,
                              f"cluster job {job.id}'s worker {index} would not stop (its node: "
                              f"{unit_host(job, index) or 'unknown'}); retried by the job reconciler")
    ended = await runner.call(runner.ledger.update, job.id, (QUEUED, STARTING, RUNNING), "ended_at",
                              state=state, exit_code=exit_code, message=message,
                              **({"log": output} if output is not None else {}))
    if ended is not None:
        log.info("Cluster job %s of %s %s%s", job.id, job.user, state, f": {message}" if message else "")
    runner.fair_use.forget(job)


async def read_log(runner, job: Job, worker: int | None = None) -> str | None:
    """The workers' output, merged with `[worker i]` marks (or one worker's, unmarked); None if
    no worker's unit is there any more.  Each worker's share is its last log_max_bytes / N."""
    indexes = range(job.workers) if worker is None else [worker]
    share = max(1024, runner.settings.log_max_bytes // len(indexes))
    logs = []
    for index in indexes:
        try:
            raw = await runner.engine.logs(worker_name(runner.settings, job.id, index), max(64, share // 80))
        except UnitGone:
            continue
        except Exception as exc:
            log.warning("Could not read job %s worker %s's log: %s", job.id, index, exc)
            continue
        text = raw[-share:].decode(errors="replace")
        logs.append((index, text))
    if not logs:
        return None
    return logs[0][1] if worker is not None else merge_logs(logs)


def worker_leases(job: Job) -> dict[int, int]:
    """worker index -> its lease id (a CPU cluster has none)."""
    return {int(u["worker"]): u["lease_id"] for u in job.units if u.get("lease_id") is not None}


def unit_host(job: Job, index: int) -> str:
    return next((u.get("host", "") for u in job.units if int(u["worker"]) == index), "")
