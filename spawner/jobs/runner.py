"""JobRunner: runs batch jobs in the gpu-pool service, from queue to freed GPUs.

A job first waits for room within its user's job limits (places.py, limits.py: running jobs,
per profile, CPUs), then in the pool's fair queue like a notebook spawn (same quotas: its
lease is the user's), runs as a group of units (group.py: one container, or a cluster's
workers) given exactly its leased GPUs, and ends succeeded / failed / cancelled / timed-out.
Every job goes the same way, whatever its number of units.  Its leases end only once the
engine confirms its units no longer run.  Every step is recorded in the ledger first, so a
runner that restarts (the hub was killed) finds its jobs again: running units are watched
on, queued jobs queue again, and a job whose start was cut short starts again on its leases.
The pool's fair use (bookings, budgets) is its own check, asked each round with this
runner's jobs (pool/fair_use/stops.py); the runner stops what it names (stops.py).
"""

from __future__ import annotations

import asyncio
import functools
import logging
from datetime import UTC, datetime

from ..engines.common.labels import pool_identity
from ..identity import container_identity
from ..pool import GPUPool, PoolError
from ..pool.fair_use.stops import fair_use_stops
from ..pool.leasing.placement import host_demand
from ..pool.ledger.job_records import (
    CANCELLED,
    END_REASONS,
    FAILED,
    QUEUED,
    RUNNING,
    STARTING,
    Job,
    JobLedger,
    job_server_name,
)
from ..pool.ledger.off_loop import ledger_call
from ..profiles import Profile
from .engine import RUNNING as RUNNING_UNIT
from .engine import UNKNOWN, JobEngine, JobRefused
from .group import RECLAIMED, STOPPING, UnitGroup, group_of, remove_unit
from .limits import JobLimits
from .notebook import resolve_in_home
from .places import RunningPlaces
from .reclaim import Reclaims
from .request import BadJob, Submission
from .runner_settings import JobSettings
from .stops import Stops

log = logging.getLogger("gpu-pool-page")
LEDGER_TIMEOUT = 10.0
POLL_SECONDS = 0.5
# How young a read of the Swarm's nodes into the ledger may be to stand for "now" (_sync_inventory).
SYNC_FRESH_SECONDS = 1.0
# How often the pool is asked which running jobs its fair use stops (a culler round).
FAIR_USE_EVERY = 30.0


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
        self.stops = Stops()  # the jobs being stopped, and why (an owner's cancel, the pool's fair use)
        self.limits = JobLimits(**settings.limits)
        # Jobs holding a running place, from the moment they may take GPUs until they end.
        self.places = RunningPlaces(self.limits, self.profiles)
        self._background: list[asyncio.Task] = []
        # The newest jobs as the pool page shows them, refreshed in the background.
        self.snapshot: list[dict] = []
        self._moves: dict[int, asyncio.Event] = {}  # job id -> set when the runner moves it on
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

    def group(self, job: Job) -> UnitGroup:
        """The job's group of units (group.py)."""
        return group_of(job, self.settings, self.engine)

    def watches(self, job_id: int) -> bool:
        """Whether this runner watches the job now."""
        return job_id in self._tasks

    # ------------------------------------------------------------ start/stop

    async def start(self) -> None:
        """Find the jobs of this host again (retried while the ledger does not answer), then
        reconcile; stop with the hub."""
        self._background.append(asyncio.create_task(self._take_up_then_reconcile()))
        self._background.append(asyncio.create_task(self._refresh_snapshot()))
        self._background.append(asyncio.create_task(self._fair_use_forever()))
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
        active = await self.call(self.pool.leases, None, self.settings.host or None)
        held = {lease.server_name: lease for lease in active}
        # Oldest first: jobs holding GPUs keep their running places, queued ones queue in order.
        for job in sorted(await self.call(self.ledger.jobs, None, True, 10000), key=lambda j: j.id):
            if job.host != self.settings.host or job.id in self._tasks:
                continue
            leases = [held.get(name) for name in self.group(job).lease_names]
            if job.state == QUEUED and all(lease is not None for lease in leases):
                # Leased just before the last service stopped, not yet recorded: use those
                # leases rather than queue for more.
                job = await self._record_leases(job, leases) or job
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

    # ------------------------------------------------------------ fair use

    async def _fair_use_forever(self, every: float = FAIR_USE_EVERY) -> None:
        while True:
            await asyncio.sleep(every)
            try:
                await self.stop_for_fair_use()
            except PoolError as exc:  # the next round tries again; nothing is stopped unchecked
                log.warning("Could not check the running jobs' budgets and bookings: %s", exc)

    async def stop_for_fair_use(self) -> list[int]:
        """Ask the pool which of this host's running jobs its fair use stops (a booking of their
        GPUs for someone else, their holder's budget) and stop them, each at its next watch turn,
        with the pool's reason; the ids of the jobs stopped."""
        jobs = [job for job in await self.call(self.ledger.jobs, None, True, 10000)
                if job.host == self.settings.host and job.id not in self.stops]
        stops = await self.call(fair_use_stops, self.pool, jobs, log)
        for stop in stops:
            self.stops.ask(stop.job_id, stop.message, stop.reason)
        return [stop.job_id for stop in stops]

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
            await self.check_notebook(user, sub.notebook)
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

    async def check_notebook(self, user: str, path: str) -> None:
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
        self.stops.ask(job_id)
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
            self.places.hold(job)
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
                self.places.leave(job_id)
                self._tell(job_id)
        except asyncio.CancelledError:
            raise  # the service stops; the job runs on and is taken up again
        except Exception as exc:
            log.exception("Job %s failed", job_id)
            current = await self.call(self.ledger.get, job_id)
            message = getattr(exc, "log_message", None) or str(exc) or type(exc).__name__
            if current is not None:
                await self._finish(current, FAILED, message=message)
        finally:
            self.stops.forget(job_id)
            self._tell(job_id)
            self.places.leave(job_id)

    async def _lease(self, job: Job, profile: Profile) -> Job | None:
        """Wait for room within the user's job limits, then in the fair queue for every unit's
        GPUs (one grant); the job STARTING, or None if cancelled."""
        group = self.group(job)

        async def say(why: str | None) -> None:
            await self.call(self.ledger.update, job.id, (QUEUED,), message=why)

        async def place_then_gpus() -> list:
            await self.places.wait_for(job, profile, say)
            if not profile.gpus:
                return []  # a CPU job: its place within the limits is all it waited for
            await self._sync_inventory()
            hosts = await self.engine.lease_hosts(dict(profile.node_labels), profile.image)
            return await group.acquire(self.pool, profile.gpus, hosts, self.settings.queue_timeout)

        acquiring = asyncio.ensure_future(place_then_gpus())
        self._acquiring[job.id] = acquiring
        try:
            leases = await acquiring
        except asyncio.CancelledError:
            if job.id not in self.stops:
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
        started = await self._record_leases(job, leases)
        if started is None and leases:  # ended meanwhile (an admin): hand the GPUs back
            await self.call(self.pool.release_all, [lease.id for lease in leases], END_REASONS[CANCELLED])
            return None
        if leases:
            log.info("Job %s of %s leased %s", job.id, job.user,
                     ", ".join(g for lease in leases for g in lease.gpu_uuids))
        return started

    async def _record_leases(self, job: Job, leases) -> Job | None:
        """The job STARTING on `leases` (its units', in order; none for a CPU job); None if it
        ended meanwhile."""
        return await self.call(self.ledger.update, job.id, (QUEUED,), state=STARTING,
                               **self.group(job).lease_record(leases))

    async def _launch(self, job: Job, profile: Profile) -> Job | None:
        """Create and start the job's units on their leases (again, after a restart): all
        running, or none (a half-made group is taken down and made again)."""
        group = self.group(job)
        found = await group.found()
        unknown = next((f for f in found if f is not None and f.phase == UNKNOWN), None)
        if unknown is not None:
            raise RuntimeError(f"the engine cannot tell whether its container {unknown.name} runs: {unknown.message}")
        if all(f is not None and f.phase == RUNNING_UNIT for f in found):
            # Started before a restart cut the record short: they are the job.
            return await self.call(self.ledger.update, job.id, (STARTING,), "started_at", state=RUNNING,
                                   container=group.names[0])
        for name, state in zip(group.names, found):
            if state is not None:
                await self.engine.remove(name)
        if job.id in self.stops:
            await self._finish(job, CANCELLED, message="cancelled before it started")
            return None
        # A job running as the fallback identity never takes over a home that a
        # directory uid owns (engines/common/homes.py refuses, as for a server).
        directory = (job.uid, job.gid) != (self.settings.fallback_uid, self.settings.fallback_gid)
        volume = await self.engine.prepare_home(job.user, profile.image, job.uid, job.gid, directory)
        # Each unit on its lease's host; a borrowed group (reclaimed as a whole) gets the reclaim's notice.
        leases = [await self.call(self.pool.lease, lease_id) if lease_id is not None else None
                  for lease_id in group.lease_ids]
        hosts = [lease.host if lease is not None else self.settings.host for lease in leases]
        borrowed = any(lease is not None and lease.borrowed for lease in leases)
        specs = group.specs(profile, volume, self.pool_id, hosts,
                            float(self.pool.reclaim_grace) if borrowed else None)
        # A profile with job_network gives a group's own network a route out instead of the hub's.
        await group.create(specs, self.pool_id, outbound=profile.job_network)
        log.info("%s %s of %s runs in %s", group.noun, job.id, job.user, ", ".join(
            f"{s.name}{' on ' + s.host if s.host else ''}" for s in specs))
        return await self.call(self.ledger.update, job.id, (STARTING,), "started_at", state=RUNNING,
                               container=group.names[0])

    async def _watch(self, job: Job) -> Job | None:
        """Until its units end, the timeout passes, a stop comes or its borrowed leases are
        reclaimed; the job queued again (reclaimed), else None (it ended)."""
        loop = asyncio.get_running_loop()
        # The ledger's clock is this machine's for SQLite and close to it for PostgreSQL.
        elapsed = (datetime.now(UTC) - job.started_at).total_seconds() if job.started_at else 0.0
        deadline = loop.time() + job.timeout_s - max(elapsed, 0.0)
        state, code, why = await self.group(job).watch(
            deadline, POLL_SECONDS, lambda: job.id in self.stops,
            lambda names, ended: self.reclaims.turn(job, names, ended), self.settings.node_down_grace)
        if state == RECLAIMED:
            return await self.reclaims.end(job)
        if state == STOPPING:
            state, why = CANCELLED, self.stops.message(job.id)
        await self._finish(job, state, exit_code=code, message=why)
        return None

    async def _finish(self, job: Job, state: str, exit_code: int | None = None, message: str | None = None) -> None:
        """Stop every unit and keep their log; remove them (and the group's network); end each
        unit's lease once the engine confirms it no longer runs; record the end.  A job reads as
        ended only with its units gone and its GPUs free (the lease contract), never while the
        engine still removes them."""
        group = self.group(job)
        # An engine whose stop may take the log with it (Swarm removes a scaled-down task's
        # container) has it read before, too.
        before = await self.read_log(job) if self.engine.log_settle_seconds > 0 else None
        stopped = await group.stop()
        after = await self.final_log(job)
        output = after if after is not None and len(after) >= len(before or "") else before
        if all(stopped):  # a removal that fails is left to the job reconciler (a stopped unit of an ended job)
            await group.remove()
        # Each unit's lease ends once its own unit is confirmed stopped; the others' wait for the
        # job reconciler, which removes what still runs (a quiet node's, once it answers).
        leases = {index: lease_id for index, lease_id in enumerate(group.lease_ids) if lease_id is not None}
        done = [lease_id for index, lease_id in leases.items() if stopped[index]]
        if done:
            await self.call(self.pool.release_all, done, self.stops.end_reason(job.id, state))
        for index, lease_id in leases.items():
            if not stopped[index]:
                host = next((u.get("host", "") for u in job.units if int(u["worker"]) == index), "")
                await self.call(self.pool.set_problem, lease_id, group.stuck_words(index, host))
        ended = await self.call(self.ledger.update, job.id, (QUEUED, STARTING, RUNNING), "ended_at",
                                state=state, exit_code=exit_code, message=message,
                                **({"log": output} if output is not None else {}))
        if ended is not None:
            log.info("%s %s of %s %s%s", group.noun, job.id, job.user, state, f": {message}" if message else "")
        self.stops.forget(job.id)
        self.reclaims.forget(job)

    async def remove_container(self, name: str) -> bool:
        """Remove a job unit (the job reconciler's), running or not; True once done."""
        return await remove_unit(self.engine, name)

    async def final_log(self, job: Job) -> str | None:
        """The ended units' log to keep.  An engine whose logs arrive after its task ends
        (Swarm's come from the node) says how long to look again while it reads empty."""
        output = await self.read_log(job)
        settle = self.engine.log_settle_seconds
        loop = asyncio.get_running_loop()
        until = loop.time() + settle
        while output == "" and loop.time() < until:
            await asyncio.sleep(0.25)
            output = await self.read_log(job)
        return output

    async def read_log(self, job: Job, worker: int | None = None) -> str | None:
        """The job's output so far, its last `log_max_bytes` bytes (a cluster's: every worker's,
        each line marked, or worker `worker`'s alone); None if its units are gone."""
        return await self.group(job).read_log(self.settings.log_max_bytes, worker)
