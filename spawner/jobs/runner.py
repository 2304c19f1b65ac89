"""JobRunner: runs batch jobs in the gpu-pool service, from queue to freed GPUs.

A job first waits for room within its user's job limits (limits.py: running
jobs, per profile, CPUs), then in the pool's fair queue like a notebook spawn
(same quotas: its lease is the user's), runs in a locked-down container given
exactly its leased GPUs, and ends succeeded / failed / cancelled / timed-out.  Its lease
ends only once Docker confirms the container no longer runs.  Every step is
recorded in the ledger first, so a runner that restarts (the hub was killed)
finds its jobs again: running containers are watched on, queued jobs queue
again, and a job whose start was cut short starts again on its lease.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from datetime import UTC, datetime

from ..engines.common.labels import pool_identity
from ..identity import container_identity
from ..pool import GPUPool, PoolError
from ..pool.leasing.placement import host_demand
from ..pool.ledger.job_records import (
    CANCELLED,
    END_REASONS,
    FAILED,
    QUEUED,
    RUNNING,
    STARTING,
    SUCCEEDED,
    TIMED_OUT,
    Job,
    JobLedger,
    job_server_name,
)
from ..pool.ledger.off_loop import ledger_call
from . import cluster
from .engine import ENDED, UNKNOWN, JobEngine, JobRefused, UnitGone
from .engine import RUNNING as RUNNING_UNIT
from .fair_use import FairUseStops
from .limits import JobLimits
from .notebook import resolve_in_home
from .reclaim import Reclaims
from .request import BadJob, Submission
from .runner_settings import JobSettings
from .spec import container_name, unit_spec

log = logging.getLogger("gpu-pool-page")
LEDGER_TIMEOUT = 10.0
POLL_SECONDS = 0.5
# The most bytes of one Docker log entry: a longer line is split into entries of this size.
LOG_ENTRY_MAX = 16 * 1024
STOP_GRACE_SECONDS = 5
# How young a read of the Swarm's nodes into the ledger may be to stand for "now" (_sync_inventory).
SYNC_FRESH_SECONDS = 1.0


class JobError(Exception):
    """A job request refused; `status` is the HTTP status, str() the message."""

    def __init__(self, message: str, status: int = 400):
        super().__init__(message)
        self.status = status


class JobRunner:
    def __init__(self, pool: GPUPool, settings: JobSettings, engine: JobEngine):
        # `engine` runs the units (engines/: make_job_engine(settings)): handed in, so the jobs
        # package knows no engine.
        self.pool = pool
        self.settings = settings
        self.ledger = JobLedger(pool)
        self.profiles = {p.slug: p for p in settings.profile_objects()}
        self.engine = engine
        self._tasks: dict[int, asyncio.Task] = {}
        self._acquiring: dict[int, asyncio.Future] = {}
        self._cancel: set[int] = set()
        self.limits = JobLimits(**settings.limits)
                # Jobs holding a running place (job id -> (user, profile slug, CPUs)), from the
        # moment they may take GPUs until they end; `_room` is set when one leaves.
        self._running: dict[int, tuple[str, str, float]] = {}
        self._room = asyncio.Event()
        self._background: list[asyncio.Task] = []
        # The newest jobs as the pool page shows them, refreshed in the background.
        self.snapshot: list[dict] = []
        self._moves: dict[int, asyncio.Event] = {}  # job id -> set when the runner moves it on
        self.fair_use = FairUseStops(self)  # budgets and bookings while jobs run (fair_use.py)
        self.reclaims = Reclaims(self)  # borrowed leases asked back (reclaim.py)
        self._synced_at = float("-inf")  # when _sync_inventory last read the Swarm (loop time)

    # ------------------------------------------------------------ plumbing

    async def _sync_inventory(self) -> None:
        """On Swarm, the ledger learns the nodes as Swarm reports them now before a job leases
        (the service's pool then has the Swarm inventory; on one host it has none).  A sync
        younger than SYNC_FRESH_SECONDS stands: a job's submission and its lease a moment
        later need not read the Swarm twice."""
        inventory = self.pool.inventory
        if inventory is None or not inventory.multi_host:
            return
        now = asyncio.get_running_loop().time()
        if now - self._synced_at < SYNC_FRESH_SECONDS:
            return
        self._synced_at = now
        inventory.forget_cache()
        try:
            await self.call(self.pool.sync_inventory)
        except Exception as exc:  # the ledger's last view then stands
            log.warning("Could not read the Swarm's nodes before leasing: %s", exc)
            return
        # As the spawner does: GPUs that only some profiles may use (a tagged node's) go last.
        demand = await asyncio.to_thread(host_demand, list(self.profiles.values()), inventory.hosts_matching)
        self.pool.set_host_demand(demand)

    async def call(self, fn, *args, **kwargs):
        return await ledger_call(fn, *args, timeout=LEDGER_TIMEOUT, **kwargs)

    @property
    def pool_id(self) -> str:
        return pool_identity(self.pool)

    # ------------------------------------------------------------ start/stop

    async def start(self) -> None:
        """Find the jobs of this host again (retried while the ledger does not answer), then
        reconcile; stop with the hub."""
        self._background.append(asyncio.create_task(self._take_up_then_reconcile()))
        self._background.append(asyncio.create_task(self._refresh_snapshot()))
        self._background.append(asyncio.create_task(self.fair_use.forever()))
        self._background.append(asyncio.create_task(self.reclaims.forever()))

    async def _take_up_then_reconcile(self) -> None:
        from .reconcile import reconcile_forever

        while True:
            try:
                await self._take_up()
                break
            except PoolError as exc:
                log.error("Cannot read the jobs yet (%s); trying again in 5 s", exc)
                await asyncio.sleep(5.0)
        await reconcile_forever(self)

    async def _take_up(self) -> None:
        held = {lease.server_name: lease
                for lease in await self.call(self.pool.leases, None, self.settings.host or None)}
        # Oldest first: jobs holding GPUs keep their running places, queued ones queue in order.
        for job in sorted(await self.call(self.ledger.jobs, None, True, 10000), key=lambda j: j.id):
            if job.host != self.settings.host or job.id in self._tasks:
                continue
            lease = held.get(job_server_name(job.id))
            gang = sorted((l for name, l in held.items() if name.startswith(job_server_name(job.id) + "/worker-")),
                          key=lambda l: int(l.server_name.rsplit("-", 1)[1]))
            if job.state == QUEUED and job.is_cluster and len(gang) == job.workers:
                # A cluster leased just before the last service stopped: use its leases.
                job = await cluster.record_leases(self, job, gang) or job
            elif job.state == QUEUED and lease is not None:
                # Leased just before the last service stopped, not yet recorded: use that
                # lease rather than queue for a second one.
                job = await self.call(self.ledger.update, job.id, (QUEUED,), state=STARTING, lease_id=lease.id,
                                      gpu_uuids=lease.gpu_uuids) or job
            log.info("Job %s of %s found %s; taking it up again", job.id, job.user, job.state)
            self._spawn(job)

    async def _refresh_snapshot(self, every: float = 2.0, rows: int = 200) -> None:
        while True:
            try:
                now = datetime.now(UTC)
                self.snapshot = [
                    {**j.to_dict(), "duration_s": round(((j.ended_at or now) - j.started_at).total_seconds())
                     if j.started_at else None}
                    for j in await self.call(self.ledger.jobs, None, False, rows)]
            except PoolError as exc:
                log.warning("Could not read the jobs for the page: %s", exc)
            await asyncio.sleep(every)

    async def stop(self) -> None:
        """Stop watching (jobs keep running: the next service takes them up)."""
        for task in [*self._tasks.values(), *self._background]:
            task.cancel()
        await asyncio.gather(*self._tasks.values(), *self._background, return_exceptions=True)

    # ------------------------------------------------------------ requests

    async def submit(self, user: str, groups, auth_state: dict | None, sub: Submission,
                     schedule_id: int | None = None) -> Job:
        """Record a job and queue it; refused (JobError) before any lease or container.
        `schedule_id`: the schedule whose firing it is."""
        try:
            uid, gid = container_identity(auth_state, self.settings.fallback_uid, self.settings.fallback_gid)
        except Exception as exc:  # IdentityRefused
            raise JobError(getattr(exc, "log_message", str(exc)), 403) from None
        if sub.notebook:
            await self._check_notebook(user, sub.notebook)
        if sub.profile.gpus:
            await self._sync_inventory()
            try:
                hosts = await self.engine.lease_hosts(dict(sub.profile.node_labels), sub.profile.image)
                await self.call(self.pool.check_request, user, sub.profile.gpus, groups, hosts, "job/", sub.workers,
                                sub.borrow)
            except JobRefused as exc:
                raise JobError(str(exc), 409) from None
            except PoolError as exc:
                raise JobError(str(exc), exc.status_code) from None
        try:
            job = await self.call(self.ledger.create, user, groups, sub.profile.slug, sub.command, sub.workdir,
                                  sub.timeout_s, self.settings.host, uid, gid,
                                  check=functools.partial(self.limits.check_submission, sub.profile,
                                                          workers=sub.workers),
                                  workers=sub.workers, borrow=sub.borrow, requeue=sub.requeue,
                                  notebook=sub.notebook or None, parameters=sub.parameters,
                                  schedule_id=schedule_id)
        except BadJob as exc:
            log.info("Job of %s refused: %s", user, exc)
            raise JobError(str(exc), exc.status) from None
        # Not its argv: it may hold what a user typed (a token, a password); the ledger has it.
        log.info("Job %s of %s queued: profile %s, a command of %d argument(s)", job.id, user, job.profile,
                 len(job.command))
        self._spawn(job)
        return job

    async def _check_notebook(self, user: str, path: str) -> None:
        """A notebook that is not there, or whose path leads out of the home through a symlink,
        is refused now (400) where the engine can show the home; else its container checks."""
        try:
            home = await self.engine.home_dir(user)
        except Exception as exc:
            log.warning("Could not look at %s's home for notebook %r: %s", user, path, exc)
            return
        if home == "":
            raise JobError(f"There is no notebook {path!r} in your home (you have no home yet: start a "
                           "server once)", 400)
        if home is not None:
            try:
                await asyncio.to_thread(resolve_in_home, home, self.settings.home_mount_point, path)
            except BadJob as exc:
                raise JobError(str(exc), exc.status) from None

    async def cancel(self, job_id: int) -> Job:
        """Cancel: a queued job leaves the queue, a running one is stopped; returns once its
        GPUs are free (or, if Docker cannot stop it, once that is recorded)."""
        job = await self.call(self.ledger.get, job_id)
        if job is None or not job.active:
            return job
        if job.host != self.settings.host:
            raise JobError(f"Job {job.id} runs on {job.host}; cancel it through that host's hub", 409)
        self._cancel.add(job_id)
        acquiring = self._acquiring.get(job_id)
        if acquiring is not None:
            acquiring.cancel()
        task = self._tasks.get(job_id)
        if task is None:  # nothing watches it (cannot happen once started); end it here
            await self._finish(job, CANCELLED, message="cancelled")
        else:
            await asyncio.wait({task}, timeout=60)
        return await self.call(self.ledger.get, job_id)

    async def position(self, job: Job) -> int | None:
        """The job's place in the pool's queue while it waits."""
        if job.state != QUEUED:
            return None
        name = job_server_name(job.id)
        for waiter in await self.call(self.pool.queue):
            if waiter.user == job.user and waiter.server_name == name:
                return waiter.position
        return None

    def moved(self, job_id: int) -> asyncio.Event:
        """An event set the next time this runner moves the job on (leased, started, ended):
        what a log follower of a queued job waits on, instead of reading the ledger."""
        return self._moves.setdefault(job_id, asyncio.Event())

    def _tell(self, job_id: int) -> None:
        event = self._moves.pop(job_id, None)
        if event is not None:
            event.set()

    # ------------------------------------------------------------ a job's life

    def _spawn(self, job: Job) -> None:
        if job.state != QUEUED:  # it holds its GPUs already (taken up after a restart)
            self._hold_place(job)
        task = asyncio.create_task(self._run(job))
        self._tasks[job.id] = task
        job_id = job.id
        task.add_done_callback(lambda _t: self._tasks.pop(job_id, None))

    async def _run(self, job: Job) -> None:
        job_id = job.id  # `job` becomes None when a step ends it (cancelled, refused)
        try:
            profile = self.profiles.get(job.profile)
            if profile is None:
                await self._finish(job, FAILED, message=f"profile {job.profile!r} is no longer configured")
                return
            # `job` stays the latest record (never None): the `finally` below needs its id.
            while True:
                if job.state == QUEUED:
                    leased = await self._lease(job, profile)
                    if leased is None:
                        return
                    job = leased
                    self._tell(job_id)
                if job.state == STARTING:
                    launched = await self._launch(job, profile)
                    if launched is None:
                        return
                    job = launched
                    self._tell(job_id)
                if job.state != RUNNING:
                    return
                again = await self._watch(job)
                if again is None:
                    return
                # Reclaimed and queued again: its running place is given up while it queues.
                job = again
                self._leave_place(job_id)
                self._tell(job_id)
        except asyncio.CancelledError:
            raise  # the service stops; the job runs on and is taken up again
        except Exception as exc:
            log.exception("Job %s failed", job_id)
            job = await self.call(self.ledger.get, job_id)
            message = getattr(exc, "log_message", None) or str(exc) or type(exc).__name__
            if job is not None:
                await self._finish(job, FAILED, message=message)
        finally:
            self._cancel.discard(job_id)
            self._tell(job_id)
            self._leave_place(job_id)

    # ------------------------------------------------------------ job limits

    def _hold_place(self, job: Job) -> None:
        profile = self.profiles.get(job.profile)
        cpus = self.limits.job_cpus(profile, workers=job.workers) if profile is not None else 0.0
        self._running[job.id] = (job.user, job.profile, cpus)

    def _leave_place(self, job_id: int) -> None:
        if self._running.pop(job_id, None) is not None:
            self._room.set()
            self._room = asyncio.Event()

    async def _wait_for_place(self, job: Job, profile) -> None:
        """Until the user's limits leave room for the job (JobLimits); says why it waits."""
        said = None
        while True:
            why = self.limits.wait_reason(profile, [(slug, cpus) for user, slug, cpus in self._running.values()
                                                     if user == job.user], workers=job.workers)
            if why is None:
                self._hold_place(job)
                if said is not None:
                    await self.call(self.ledger.update, job.id, (QUEUED,), message=None)
                return
            if why != said:
                await self.call(self.ledger.update, job.id, (QUEUED,), message=why)
                said = why
                continue  # the ledger call let others run: look again
            await self._room.wait()

    async def _lease(self, job: Job, profile) -> Job | None:
        """Wait for room within the user's job limits, then in the fair queue for the
        profile's GPUs; the job STARTING, or None if cancelled."""
        async def place_then_gpus():
            await self._wait_for_place(job, profile)
            if not profile.gpus:
                return None
            await self._sync_inventory()
            hosts = await self.engine.lease_hosts(dict(profile.node_labels), profile.image)
            if job.is_cluster:
                return await cluster.lease(self, job, profile, hosts)
            return await self.pool.acquire(job.user, job_server_name(job.id), profile.gpus, job.groups,
                                           timeout=self.settings.queue_timeout, host=hosts,
                                           holds_for=job.holds_for, borrow=job.borrow, since=job.submitted_at)

        acquiring = asyncio.ensure_future(place_then_gpus())
        self._acquiring[job.id] = acquiring
        try:
            lease = await acquiring
        except asyncio.CancelledError:
            if job.id not in self._cancel:
                raise
            log.info("Job %s of %s cancelled while queued", job.id, job.user)
            await self.call(self.ledger.update, job.id, (QUEUED,), "ended_at", state=CANCELLED,
                            message="cancelled while queued")
            return None
        except (PoolError, JobRefused) as exc:
            await self.call(self.ledger.update, job.id, (QUEUED,), "ended_at", state=FAILED, message=str(exc))
            return None
        finally:
            self._acquiring.pop(job.id, None)
        if job.is_cluster:
            started = await cluster.record_leases(self, job, lease)
            if started is None and lease:  # ended meanwhile (an admin): hand the GPUs back
                await self.call(self.pool.release_all, [l.id for l in lease], END_REASONS[CANCELLED])
            return started
        if lease is None:  # a CPU job: its place within the limits is all it waited for
            return await self.call(self.ledger.update, job.id, (QUEUED,), state=STARTING)
        started = await self.call(self.ledger.update, job.id, (QUEUED,), state=STARTING, lease_id=lease.id,
                                  gpu_uuids=lease.gpu_uuids)
        if started is None:  # ended meanwhile (an admin): hand the GPUs back
            await self.call(self.pool.release, lease.id, END_REASONS[CANCELLED])
            return None
        log.info("Job %s of %s leased %s", job.id, job.user, ", ".join(lease.gpu_uuids))
        return started

    async def job_node(self, job: Job) -> str:
        """The host the job's unit runs on: its GPUs' (a CPU job: the engine's choice, "")."""
        return (await self.job_placement(job))[0]

    async def job_placement(self, job: Job) -> tuple[str, float | None]:
        """(the job's node, as job_node; its stop grace: GPUPool.reclaim_grace on a borrowed lease,
        else None, the engine's own)."""
        if job.lease_id is None:
            return self.settings.host, None
        lease = await self.call(self.pool.lease, job.lease_id)
        if lease is None:
            return self.settings.host, None
        return lease.host, float(self.pool.reclaim_grace) if lease.borrowed else None

    async def _launch(self, job: Job, profile) -> Job | None:
        """Create and start the job's unit on its lease (again, after a restart)."""
        if job.is_cluster:
            return await cluster.launch(self, job, profile)
        name = container_name(self.settings, job.id)
        found = await self.engine.inspect(name)
        if found is not None and found.phase == UNKNOWN:
            raise RuntimeError(f"the engine cannot tell whether its container {name} runs: {found.message}")
        if found is not None and found.phase == RUNNING_UNIT:
            # Started before a restart cut the record short: it is the job.
            return await self.call(self.ledger.update, job.id, (STARTING,), "started_at", state=RUNNING,
                                    container=name)
        if found is not None:
            await self.engine.remove(name)
        if job.id in self._cancel:
            await self._finish(job, CANCELLED, message="cancelled before it started")
            return None
        # A job running as the fallback identity never takes over a home that a
        # directory uid owns (engines/common/homes.py refuses, as for a server).
        directory = (job.uid, job.gid) != (self.settings.fallback_uid, self.settings.fallback_gid)
        volume = await self.engine.prepare_home(job.user, profile.image, job.uid, job.gid, directory)
        spec = unit_spec(job, profile, self.settings, volume, self.pool_id, *await self.job_placement(job))
        await self.engine.create(spec)
        log.info("Job %s of %s runs in %s%s", job.id, job.user, name, f" on {spec.host}" if spec.host else "")
        return await self.call(self.ledger.update, job.id, (STARTING,), "started_at", state=RUNNING,
                               container=name)

    async def _watch(self, job: Job) -> Job | None:
        """Until the unit exits, the timeout passes, a cancel comes or its borrowed lease is
        reclaimed; the job queued again (reclaimed), else None (it ended)."""
        loop = asyncio.get_running_loop()
        # The ledger's clock is this machine's for SQLite and close to it for PostgreSQL.
        elapsed = (datetime.now(UTC) - job.started_at).total_seconds() if job.started_at else 0.0
        deadline = loop.time() + job.timeout_s - max(elapsed, 0.0)
        if job.is_cluster:
            end, code, why = await cluster.watch(self, job, deadline, POLL_SECONDS)
            if end == cluster.RECLAIMED:
                return await self.reclaims.end(job)
            await self._finish(job, end, exit_code=code, message=why)
            return None
        unit = job.container or container_name(self.settings, job.id)
        while True:
            state = await self.engine.wait(unit, max(0.0, min(POLL_SECONDS, deadline - loop.time())))
            if state is None:
                await self._finish(job, FAILED, message="its container was removed from outside")
                return None
            if job.id not in self._cancel and await self.reclaims.turn(job, [unit], state.phase == ENDED):
                return await self.reclaims.end(job)
            if state.phase == ENDED:
                code = state.exit_code
                why = None if code == 0 else (f"exited with code {code}" if code is not None
                                               else f"ended without an exit code: {state.message or 'no reason given'}")
                await self._finish(job, SUCCEEDED if code == 0 else FAILED, exit_code=code, message=why)
                return None
            if job.id in self._cancel:
                await self._finish(job, CANCELLED, message=self.fair_use.message(job))
                return None
            if loop.time() >= deadline:
                await self._finish(job, TIMED_OUT, message=f"stopped after its timeout of {job.timeout_s} s")
                return None

    async def _finish(self, job: Job, state: str, exit_code: int | None = None, message: str | None = None) -> None:
        """Stop the container and keep its log; remove it; end the lease once Docker confirms
        nothing runs; record the end.  A job reads as ended only with its unit gone and its
        GPUs free (the lease contract), never while the engine still removes it."""
        if job.is_cluster:
            await cluster.finish(self, job, state, exit_code, message)
            return
        # An engine whose stop may take the log with it (Swarm removes a scaled-down task's
        # container) has it read before, too.
        settles = self.engine.log_settle_seconds > 0
        early = await self.read_log(job) if job.container and settles else None
        stopped = await self._stop_container(job)
        output = await self.final_log(job) if job.container else None
        if not output and early:
            output = early
        if stopped:  # a removal that fails is left to the job reconciler (a stopped unit of an ended job)
            await self.remove_container(job.container or container_name(self.settings, job.id))
        if job.lease_id is not None:
            if stopped:
                await self.call(self.pool.release, job.lease_id, self.fair_use.end_reason(job, state))
            else:  # the job reconciler removes it and ends the lease later
                await self.call(self.pool.set_problem, job.lease_id,
                                f"job {job.id}'s container would not stop; retried by the job reconciler")
        ended = await self.call(self.ledger.update, job.id, (QUEUED, STARTING, RUNNING), "ended_at",
                                state=state, exit_code=exit_code, message=message,
                                **({"log": output} if output is not None else {}))
        if ended is not None:
            log.info("Job %s of %s %s%s", job.id, job.user, state, f": {message}" if message else "")
        self.fair_use.forget(job)
        self.reclaims.forget(job)

    async def _stop_container(self, job: Job) -> bool:
        """True once the engine confirms the job's unit (if any) no longer runs."""
        return await self.stop_unit(job, job.container or container_name(self.settings, job.id))

    async def stop_unit(self, job: Job, name: str) -> bool:
        """True once the engine confirms the unit `name` of `job` (if any) no longer runs."""
        try:
            if await self.engine.stop(name, STOP_GRACE_SECONDS):
                return True
        except Exception as exc:
            log.error("Could not stop job %s's unit %s: %s", job.id, name, exc)
            return False
        log.error("Could not stop job %s's unit %s", job.id, name)
        return False

    async def remove_container(self, name: str) -> bool:
        if await self.engine.remove(name):
            return True
        log.error("Could not remove job unit %s", name)
        return False

    async def final_log(self, job: Job) -> str | None:
        """The ended unit's log to keep.  An engine whose logs arrive after its task ends
        (Swarm's come from the node) says how long to look again while it reads empty."""
        output = await self.read_log(job)
        settle = self.engine.log_settle_seconds
        loop = asyncio.get_running_loop()
        until = loop.time() + settle
        while output == "" and loop.time() < until:
            await asyncio.sleep(0.25)
            output = await self.read_log(job)
        return output

    async def read_log(self, job: Job) -> str | None:
        """The unit's output so far, its last `log_max_bytes` bytes; None if it is gone.

        Only the log's tail is read, never the whole of it: Docker's `tail` counts log
        entries (a line, or 16 KiB of one), so ask for a few and for more until they
        give `log_max_bytes` or the whole log.  A cluster's: every worker's, each line marked."""
        if job.is_cluster:
            return await cluster.read_log(self, job)
        limit = self.settings.log_max_bytes
        entries, got = max(64, limit // LOG_ENTRY_MAX), None
        name = job.container or container_name(self.settings, job.id)
        try:
            while True:
                raw = await self.engine.logs(name, entries)
                whole = got is not None and len(raw) == len(got)  # more entries gave no more
                if whole or len(raw) >= limit or entries > limit:
                    break
                got, entries = raw, entries * 8
        except UnitGone:
            return None
        except Exception as exc:
            log.warning("Could not read job %s's log: %s", job.id, exc)
            return None
        if whole or len(raw) <= limit:
            return cap(raw, limit)
        return "[... earlier output not kept ...]\n" + raw[-limit:].decode(errors="replace")


def cap(raw: bytes, limit: int) -> str:
    """The last `limit` bytes of `raw` as text, saying when the start was cut."""
    if len(raw) <= limit:
        return raw.decode(errors="replace")
    return f"[... first {len(raw) - limit} bytes not kept ...]\n" + raw[-limit:].decode(errors="replace")
