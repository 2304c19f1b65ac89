#!/usr/bin/env python3
"""A lab's week, replayed through the real GPU pool on a virtual clock (issue 37).

    .venv/bin/python bench/replay.py [--size small|large] [--seed 1]

The workload (bench/replay_workload.py, its parameters and sources there) is one seeded week of
interactive sessions with busy and idle phases, batch jobs, 2- and 4-worker gangs, a course's
booking and heavy and light users.  Each policy replays the same trace through a fresh GPUPool
on an SQLite ledger in a temporary directory, with `GPUPool.clock` set to the replay's virtual
clock: the grant, the queue and its order (FIFO or fair-share, backfill, `fifo_after`), the
bookings, the budgets and the gang leases are the pool's own code.  The containers are doubled
at the lowest layer: a server or a job holds its lease(s) for its trace time and is busy or idle
as the trace says.  The idle culler's decisions are GPUCullPolicy.decide's (culling/policy.py,
with deadline.idle_rule), at the culler's own pace (`cull_every`), fed the activity the hub would
have seen: the servers report it every `activity_interval`, and under the product's policy work
that follows a quiet spell longer than `quiet_after` (a third of the shortest idle limit) is known
at once (the images' gpuhub_activity extension posts it to the hub as it starts).

Waiting: `acquire()`'s wait runs on the event loop's clock (its timeout, heartbeats and polls),
which cannot run virtually.  The replay makes the same ledger calls the wait makes, at each
event of the virtual clock: a request joins the queue with the wait's first write
(`GPUPool.grant_or_queue`); whenever GPUs free up (a release, a cull, a booking's start,
its grace or its end, a waiter leaving) every waiter's heartbeat is written and the pool's read
of the queue (`read_queue`, the watch's) says which waiters a grant would serve, and those try in
the queue's order, as the watch would make them.  A spawn gives up after the spawner's
`lease_wait_timeout`, a job after the runner's `queue_timeout`, each with the wait's last try.

The policies (each a set of this product's own settings):

- fifo: FIFO, no backfill, no culling, no bookings or budgets (vanilla DockerSpawner with a
  GPU counter);
- fifo+cull1h: the same with jupyterhub-idle-culler's usual settings (1 h idle, a pass every
  10 min, JupyterHub's 5-minute activity reports);
- product: this product's defaults (GPUPool's and the hub Settings' defaults: fair-share,
  15 s backfill, 15 min GPU idle limit, 5 min while requests wait, a pass a minute) and the
  lab's bookings and budgets of the workload.

Metrics (see `Metrics`): GPU-hours lent / capacity; busy / lent; waits of interactive starts
and jobs (p50/p95/p99; a request that gave up counts with the time it waited); Jain's index of
each user's work done against the work they were due (their offered busy GPU-hours, cut to a
max-min fair share of the capacity when demand exceeds it); bookings honoured (every attendee
served within `HONOURED_WAIT` of arriving); busy servers culled by the idle rule (must be 0); idle
servers culled, and of them those whose user came back for more of the session's work (a new spawn,
the kernels' state lost); stops by budget or booking; cancelled work (requests that gave up or were
refused, and the busy GPU-hours they and the stops lost).
"""

from __future__ import annotations

import argparse
import heapq
import math
import os
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field, fields, replace
from datetime import datetime, timedelta
from typing import Any

from traitlets import TraitType

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench import replay_workload as wl  # noqa: E402
from spawner.culling.deadline import CullRules  # noqa: E402
from spawner.culling.policy import GPUCullPolicy, LedgerBookings, LedgerBudgets, LedgerContention  # noqa: E402
from spawner.inventory.machine import StaticInventory  # noqa: E402
from spawner.jobs.runner_settings import JobSettings  # noqa: E402
from spawner.lending import GPULendingSpawner  # noqa: E402
from spawner.pool import (  # noqa: E402
    GPUPool,
    PoolError,  # noqa: E402
)
from spawner.settings.culler import (  # noqa: E402
    activity_interval,
    culler_config,
    culler_options,
    quiet_after,
    rules_from_config,
)
from spawner.settings.hub import Settings  # noqa: E402

# What the ledger records as each run's end.
END_REASONS = {("session", "stopped"): "stopped", ("session", "culled"): "culled", ("session", "budget"): "budget",
               ("session", "booking"): "booking", ("job", "stopped"): "job-finished"}
HONOURED_WAIT = 60.0  # a booking is honoured when each attendee had a GPU within this many seconds
SERIES_STEP = 600.0  # the plots' GPUs lent and busy: averages over steps of this many seconds


# --- the policies -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Policy:
    name: str
    pool: dict  # GPUPool settings
    rules: CullRules | None  # None: no culler
    cull_every: float = 60.0
    activity_interval: float = 300.0
    # Work after a quiet spell longer than this reaches the hub at once; None: only at reports.
    quiet_after: float | None = None
    contention: bool = False  # the contended timeout reads the ledger's queue
    bookings: bool = False
    budgets: bool = False
    lease_wait_timeout: float = GPULendingSpawner.class_traits()["lease_wait_timeout"].default_value
    queue_timeout: float = JobSettings.queue_timeout
    # Borrowing (issue 38): jobs may go beyond their user's share (the pool's max_gpus_per_user);
    # a reclaimed job heeds the notice `heed_after` s after it (then saves and exits), else is
    # stopped at the grace, losing its work since its last checkpoint (one every `checkpoint_every`
    # s of its run, as BackupAndRestore's epochs), and queues again in its first place.
    borrow: bool = False
    heed_after: float = 30.0
    checkpoint_every: float = 600.0


def policies(product_pool: dict | None = None, product_hub: dict | None = None) -> list[Policy]:
    """The three policies; `product_pool`, `product_hub`: GPUPool settings and hub Settings fields
    (spawner/settings/hub.py) that replace the product's defaults."""
    vanilla = {"queue_order": "fifo", "backfill_window": 0.0}
    product = replace(Settings(), **(product_hub or {}))  # the hub's defaults; the pool's are GPUPool's own
    culler = culler_config(product)  # the culler's options as the hub would set them
    return [
        Policy("fifo", vanilla, None),
        Policy("fifo+cull1h", vanilla, CullRules(3600, 3600), cull_every=600, activity_interval=300),
        Policy("product", dict(product_pool or {}), rules_from_config(culler),
               cull_every=culler_options(culler).cull_every,
               activity_interval=activity_interval(culler, product.activity_interval), quiet_after=quiet_after(culler),
               contention=True, bookings=True, budgets=True),
    ]


def borrowing_policies(quota: int, product_pool: dict | None = None, product_hub: dict | None = None
                       ) -> list[Policy]:
    """The product's policy with a per-user limit of `quota` GPUs, borrowing off and on."""
    product = policies(product_pool, product_hub)[-1]
    pool = {**product.pool, "max_gpus_per_user": quota}
    return [replace(product, name=f"product, quota {quota}", pool=pool),
            replace(product, name=f"product, quota {quota}, jobs borrow", pool=pool, borrow=True)]


# --- the virtual clock --------------------------------------------------------------------------


class VirtualClock:
    """Seconds since the trace's start; `GPUPool.clock` reads it as a datetime."""

    def __init__(self, epoch: datetime = wl.EPOCH):
        self.epoch = epoch
        self.t = 0.0

    def __call__(self) -> datetime:
        return self.epoch + timedelta(seconds=self.t)

    def at(self, t: float) -> datetime:
        return self.epoch + timedelta(seconds=t)


class ReplayInventory(StaticInventory):
    """The trace's hosts and GPUs (several hosts: requests may land on any of them)."""

    multi_host = True

    def hosts(self) -> set[str]:
        return {g.host for g in self.gpus()}


def inventory(hosts: int, per_host: int) -> ReplayInventory:
    return ReplayInventory(host="node-0", gpus_list=[
        {"uuid": f"GPU-{h:02d}-{i:02d}", "index": i, "host": f"node-{h}"}
        for h in range(hosts) for i in range(per_host)])


# --- a request's life in the replay ---------------------------------------------------------------


@dataclass
class Run:
    """One request of the trace (a spawn, a respawn after a cull, a job) as the replay lives it."""

    req: wl.Request
    arrive: float
    busy: tuple[tuple[float, float], ...]  # relative to its start
    hold: float  # relative to its start
    respawn: bool = False
    waiter_id: int | None = None
    pool_req: Any = None
    started: float | None = None
    leases: tuple = ()
    ended: float | None = None
    end: str = ""  # stopped, culled, budget, booking, reclaimed, gave-up, refused, horizon
    since: float | None = None  # a job queued again after a reclaim: when it first arrived
    attempt: int = 1

    def busy_abs(self) -> list[tuple[float, float]]:
        s = self.started or 0.0
        return [(s + a, s + b) for a, b in self.busy]

    def busy_at(self, t: float) -> bool:
        s = self.started or 0.0
        return any(s + a <= t < s + b for a, b in self.busy)


@dataclass
class Metrics:
    policy: str
    capacity_gpu_hours: float
    lent_gpu_hours: float
    busy_gpu_hours: float
    interactive_waits: list[float]
    job_waits: list[float]
    jain: float
    bookings: int
    bookings_honoured: int
    busy_culled: int
    idle_culled: int
    stopped_budget: int
    stopped_booking: int
    gave_up: int
    refused: int
    lost_busy_gpu_hours: float
    free_while_waiting_gpu_hours: float = 0.0
    idle_while_waiting_gpu_hours: float = 0.0  # lent but idle while a request waited
    respawns: int = 0  # idle servers culled whose users came back for more work (their kernels' state lost)
    runtime_s: float = 0.0
    done: dict = field(default_factory=dict)  # user -> busy GPU-hours done
    due: dict = field(default_factory=dict)  # user -> busy GPU-hours due
    borrowed_gpu_hours: float = 0.0
    reclaimed_gpu_hours: float = 0.0  # of the borrowed leases that ended reclaimed
    reclaims: int = 0
    reclaim_lost_gpu_minutes: float = 0.0  # work between the last checkpoint and the stop
    # GPUs lent and GPUs busy, each averaged over consecutive SERIES_STEP-second steps of the week
    lent_series: list[float] = field(default_factory=list)
    busy_series: list[float] = field(default_factory=list)

    @property
    def lent_share(self) -> float:
        return self.lent_gpu_hours / self.capacity_gpu_hours if self.capacity_gpu_hours else 0.0

    @property
    def busy_share(self) -> float:
        return self.busy_gpu_hours / self.lent_gpu_hours if self.lent_gpu_hours else 0.0


def percentile(values: list[float], q: float) -> float:
    """The nearest-rank percentile (0 for no values)."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def jain(xs: list[float]) -> float:
    """Jain's fairness index: (sum x)^2 / (n sum x^2); 1 when all are equal."""
    if not xs or not any(xs):
        return 1.0
    return sum(xs) ** 2 / (len(xs) * sum(x * x for x in xs))


def max_min_due(demand: dict[str, float], capacity: float) -> dict[str, float]:
    """Each user's max-min fair share of `capacity` for their `demand` (water-filling)."""
    due, left, users = {}, capacity, sorted(demand, key=lambda u: demand[u])
    for i, u in enumerate(users):
        share = left / (len(users) - i)
        due[u] = min(demand[u], share)
        left -= due[u]
    return due


def _overlap(intervals, a: float, b: float) -> float:
    return sum(max(0.0, min(y, b) - max(x, a)) for x, y in intervals)


def step_averages(intervals, horizon: float, step: float = SERIES_STEP) -> list[float]:
    """The mean of a sum of weighted intervals ((start, end, weight), ...) over each `step` of
    [0, horizon): e.g. the GPUs lent in each 10 minutes of the week."""
    out = [0.0] * max(1, math.ceil(horizon / step))
    for a, b, w in intervals:
        a, b = max(a, 0.0), min(b, horizon)
        i = int(a // step)
        while a < b:
            end = min(b, (i + 1) * step)
            out[i] += w * (end - a) / step
            a, i = end, i + 1
    return out


# --- the replay -------------------------------------------------------------------------------------


class Replay:
    def __init__(self, trace: wl.Trace, policy: Policy, directory: str):
        self.trace, self.policy = trace, policy
        self.clock = VirtualClock()
        settings = dict(policy.pool)
        if policy.budgets and trace.user_budget is not None:
            settings["gpu_hour_budget"] = trace.user_budget
        self.pool = GPUPool(inventory=inventory(trace.hosts, trace.gpus_per_host),
                            db_url=f"sqlite:///{os.path.join(directory, policy.name + '.sqlite')}",
                            clock=self.clock, **settings)
        self.pool.sync_inventory()
        self.events: list = []
        self.seq = 0
        self.waiting: dict[int, Run] = {}  # run id -> run
        self.running: dict[int, Run] = {}
        self.runs: list[Run] = []
        self.lease_run: dict[int, Run] = {}
        self.culls: list[tuple[Run, float, str, bool, bool]] = []  # (run, when, why, busy, came back)
        self.windows = [(b.starts, b.ends) for b in trace.bookings] if policy.bookings else []
        self.policy_fn = None
        if policy.rules is not None:
            self.policy_fn = GPUCullPolicy(
                policy.rules.cpu_timeout, policy.rules.gpu_timeout, rules=policy.rules, clock=lambda: self.clock.t,
                contention=LedgerContention(self.pool.queue, clock=lambda: self.clock.t) if policy.contention else None,
                over_budget=self._over_budget if policy.budgets else None,
                booked_out=self._booked_out if policy.bookings else None)
            self._budget_check = LedgerBudgets(self.pool)
            self._booking_check = LedgerBookings(self.pool)
        self.shortest = policy.rules.shortest if policy.rules is not None else math.inf
        self.used: dict[str, list[tuple[float, float, int]]] = defaultdict(list)  # user -> (start, end, gpus)
        self.free_while_waiting = 0.0  # GPU-seconds
        self.waited: list[tuple[float, float]] = []  # the times when a request waited, in order
        self.asked: set[int] = set()  # borrowed lease ids seen asked back
        self.reclaim_lost = 0.0  # GPU-seconds

    # --- the event queue ---------------------------------------------------------------------

    def at(self, t: float, fn: Callable, *args) -> None:
        heapq.heappush(self.events, (t, self.seq, fn, args))
        self.seq += 1

    def run(self) -> None:
        horizon = self.trace.horizon
        for r in self.trace.requests:
            self.at(r.arrive, self.arrive, Run(r, r.arrive, r.busy, r.hold))
        for b in self.trace.bookings:
            if self.policy.bookings:
                self.at(b.made, self.book, b)
                for t in (b.starts, b.starts + self.pool.booking_grace, b.ends):
                    self.at(t, self.serve)
        if self.policy_fn is not None:
            self.at(self.policy.cull_every, self.cull_pass)
        while self.events and self.events[0][0] <= horizon:
            t, _, fn, args = heapq.heappop(self.events)
            self._account(t)
            self.clock.t = t
            fn(*args)
        self._account(horizon)
        self.clock.t = horizon
        for run in list(self.running.values()):
            run.ended, run.end = horizon, "horizon"
        for run in self.waiting.values():
            run.ended, run.end = horizon, "horizon"

    def _account(self, t: float) -> None:
        """GPU-seconds left free while requests waited, up to `t` (the state since the last event)."""
        if self.waiting:
            free = self.trace.capacity - sum(r.req.total for r in self.running.values())
            self.free_while_waiting += free * (t - self.clock.t)
            if t > self.clock.t:
                if self.waited and self.waited[-1][1] == self.clock.t:
                    self.waited[-1] = (self.waited[-1][0], t)
                else:
                    self.waited.append((self.clock.t, t))

    # --- the ledger calls of a wait (see the module docstring) ---------------------------------

    def _turn(self, run: Run, waiter_id: int | None, enqueue: bool):
        outcome = self.pool.grant_or_queue(run.pool_req, waiter_id, enqueue)
        if self.policy.borrow:
            self._asked_back()
        return outcome

    # --- borrowing: the jobs runner's part of a reclaim (spawner/jobs/reclaim.py) ----------------

    def _asked_back(self) -> None:
        """Borrowed leases a waiter within its share just asked back: their jobs heed the notice
        after `heed_after` or are stopped at the grace."""
        for lease in self.pool.reclaiming():
            if lease.id in self.asked or lease.id not in self.lease_run:
                continue
            run = self.lease_run[lease.id]
            self.asked.update(l.id for l in run.leases)
            self.at(self.clock.t + min(self.policy.heed_after, self.pool.reclaim_grace), self.reclaimed, run)

    def reclaimed(self, run: Run) -> None:
        if id(run) not in self.running or run.ended is not None:
            return
        del self.running[id(run)]
        run.ended, run.end = self.clock.t, "reclaimed"
        self.pool.release_all([lease.id for lease in run.leases], "reclaimed")
        ran = self.clock.t - (run.started or self.clock.t)
        kept = ran - ran % self.policy.checkpoint_every  # up to its last checkpoint
        self.reclaim_lost += run.req.total * (ran - kept)
        self.used[run.req.user].append((run.started or 0.0, run.ended, run.req.total))
        left = max(run.hold - kept, 1.0)
        again = Run(run.req, self.clock.t, ((0.0, left),), left, since=run.since if run.since is not None
                    else run.arrive, attempt=run.attempt + 1)
        self.arrive(again)
        self.serve()

    def _heartbeats(self) -> None:
        ids = [r.waiter_id for r in self.waiting.values() if r.waiter_id is not None]
        if ids:
            self.pool.heartbeat(ids)

    def arrive(self, run: Run) -> None:
        r = run.req
        self.runs.append(run)
        self._heartbeats()
        borrow = self.policy.borrow and r.kind == "job"
        run.pool_req = self.pool.request_for(
            r.user, f"{r.kind}-{len(self.runs)}", r.gpus, r.groups, None, r.workers, holds_for=r.limit, borrow=borrow,
            since=self.clock.at(run.since) if borrow and run.since is not None else None)
        try:
            outcome = self._turn(run, None, True)
        except PoolError:
            run.ended, run.end = self.clock.t, "refused"
            return
        if outcome.leases:
            self.start(run, outcome.leases)
            return
        run.waiter_id = outcome.waiter_id
        self.waiting[id(run)] = run
        timeout = self.policy.lease_wait_timeout if r.kind == "session" else self.policy.queue_timeout
        self.at(self.clock.t + timeout, self.give_up, run)

    def give_up(self, run: Run) -> None:
        if id(run) not in self.waiting:
            return
        self._heartbeats()
        try:
            last = self._turn(run, run.waiter_id, False)  # the wait's last try
        except PoolError:
            last = None
        del self.waiting[id(run)]
        if last is not None and last.leases:
            self.start(run, last.leases)
            return
        if last is not None and last.waiter_id is not None:
            run.waiter_id = last.waiter_id
        if run.waiter_id is not None:
            self.pool.leave_queue(run.waiter_id)
        run.ended, run.end = self.clock.t, "gave-up" if last is not None else "refused"
        self.serve()  # a big waiter leaving may let smaller ones through

    def serve(self) -> None:
        """Serve the waiters a grant would serve now, in the queue's order (as the watch would)."""
        while self.waiting:
            self._heartbeats()
            by_waiter = {r.waiter_id: r for r in self.waiting.values()}
            views = self.pool.read_queue({w: r.pool_req for w, r in by_waiter.items()}) or {}
            asking = sorted((v.position, w) for w, v in views.items() if v.ask or not v.present)
            progressed = False
            for _, wid in asking:
                run = by_waiter[wid]
                try:
                    outcome = self._turn(run, wid, True)
                except PoolError:  # it became impossible (over its budget now)
                    self.pool.leave_queue(wid)
                    del self.waiting[id(run)]
                    run.ended, run.end = self.clock.t, "refused"
                    progressed = True
                    continue
                if outcome.leases:
                    del self.waiting[id(run)]
                    self.start(run, outcome.leases)
                    progressed = True
                else:
                    run.waiter_id = outcome.waiter_id
            if not progressed:
                return

    # --- the doubled containers ----------------------------------------------------------------

    def start(self, run: Run, leases) -> None:
        run.started, run.leases = self.clock.t, tuple(leases)
        self.running[id(run)] = run
        for lease in leases:
            self.lease_run[lease.id] = run
        self.at(run.started + run.hold, self.finish, run, "stopped")

    def finish(self, run: Run, reason: str) -> None:
        if id(run) not in self.running or run.ended is not None:
            return
        del self.running[id(run)]
        run.ended, run.end = self.clock.t, reason
        self.pool.release_all([lease.id for lease in run.leases], END_REASONS[(run.req.kind, reason)])
        self.used[run.req.user].append((run.started or 0.0, run.ended, run.req.total))
        self.serve()

    def book(self, b: wl.Booking) -> None:
        self.pool.book("teacher", b.gpus, self.clock.at(b.starts), self.clock.at(b.ends), group=b.group,
                       admin=True, by="teacher")

    # --- the culler ---------------------------------------------------------------------------------

    def hub_last_activity(self, run: Run, t: float) -> float:
        """The last activity the hub knows of at `t`: reported every activity_interval from the start,
        and a busy phase's start at once when it follows more than `quiet_after` of quiet (the
        server's start counts as activity, as jupyter-server's `started` does)."""
        s = run.started or 0.0
        interval = self.policy.activity_interval
        quiet = self.policy.quiet_after
        report = s + math.floor((t - s) / interval) * interval
        last = s
        previous = 0.0  # the server's own last activity before each phase, relative to its start
        for a, b in run.busy:
            if s + a <= report:
                last = max(last, min(s + b, report))
            if quiet is not None and a - previous > quiet and s + a <= t:
                last = max(last, s + a)  # posted at once
            previous = max(previous, b)
        return last

    def _used_seconds(self, user: str, t: float) -> float:
        since = t - self.pool.budget_period
        done = sum(g * max(0.0, e - max(s, since)) for s, e, g in self.used[user])
        return done + sum(r.req.total * (t - (r.started or t)) for r in self.running.values() if r.req.user == user)

    def _over_budget(self, lease_id: int) -> str | None:
        run = self.lease_run.get(lease_id)
        budget = self.trace.user_budget
        if run is None or budget is None or self._used_seconds(run.req.user, self.clock.t) < 0.9 * budget * 3600:
            return None  # (far from the budget: the ledger need not be asked)
        return self._budget_check(lease_id)

    def _booked_out(self, lease_id: int) -> str | None:
        t = self.clock.t
        if not any(s <= t < e for s, e in self.windows):
            return None
        return self._booking_check(lease_id)

    def cull_pass(self) -> None:
        t = self.clock.t
        self.at(t + self.policy.cull_every, self.cull_pass)
        assert self.policy_fn is not None
        self._heartbeats()  # the waiters are alive (their heartbeats come every few seconds): contention reads them
        culled = []
        in_window = any(s <= t < e for s, e in self.windows)
        for run in list(self.running.values()):
            if run.req.kind != "session":
                continue  # jobs are not the culler's
            inactive = t - self.hub_last_activity(run, t)
            near_budget = self.trace.user_budget is not None and self.policy.budgets and \
                self._used_seconds(run.req.user, t) >= 0.9 * self.trace.user_budget * 3600
            if inactive < self.shortest and not in_window and not near_budget:
                continue  # nothing the culler could decide on it now
            lease = run.leases[0]
            model = {"name": "", "url": f"/user/{run.req.user}/", "started": None,
                     "state": {"gpu_lease_id": lease.id, "gpu_uuids": list(lease.gpu_uuids), "gpu_host": lease.host,
                               "profile": f"tf-gpu-{run.req.gpus}"}}
            verdict = self.policy_fn.decide(timedelta(seconds=inactive), model)
            if verdict.cull:
                culled.append((run, verdict.end_reason))
        for run, reason in culled:
            busy = run.busy_at(t)
            self.finish(run, reason)
            # The user comes back for the work still to do: a new spawn at the next busy phase.
            rel = t - (run.started or 0.0)
            later = [(a, b) for a, b in run.busy if b > rel]
            self.culls.append((run, t, reason, busy, bool(later)))
            if later:
                back = max(rel, later[0][0])
                rest = tuple((max(a, back) - back, b - back) for a, b in later)
                again = Run(run.req, (run.started or 0.0) + back, rest, run.hold - back, respawn=True)
                self.at(again.arrive, self.arrive, again)

    # --- the figures ------------------------------------------------------------------------------

    def metrics(self, runtime: float) -> Metrics:
        horizon = self.trace.horizon
        capacity = self.trace.capacity * horizon / 3600
        lent = 0.0
        for lease in self.pool.history():
            start = (lease.started_at - self.clock.epoch).total_seconds()
            end = (lease.ended_at - self.clock.epoch).total_seconds() if lease.ended_at else horizon
            lent += len(lease.gpu_uuids) * max(0.0, min(end, horizon) - start) / 3600
        done: dict[str, float] = defaultdict(float)
        for run in self.runs:
            if run.started is not None:
                done[run.req.user] += run.req.total * _overlap(run.busy_abs(), run.started,
                                                               min(run.ended or horizon, horizon)) / 3600
        busy = sum(done.values())
        idle_while_waiting = 0.0
        for run in self.runs:
            if run.started is None:
                continue
            end = min(run.ended or horizon, horizon)
            lent_waiting = _overlap(self.waited, run.started, end)
            if lent_waiting:
                busy_waiting = sum(_overlap(self.waited, max(a, run.started), min(b, end))
                                   for a, b in run.busy_abs() if min(b, end) > max(a, run.started))
                idle_while_waiting += run.req.total * (lent_waiting - busy_waiting) / 3600
        held = [(run.started, min(run.ended or horizon, horizon), run.req.total) for run in self.runs
                if run.started is not None]
        working = [(max(a, run.started), min(b, run.ended or horizon, horizon), run.req.total) for run in self.runs
                   if run.started is not None for a, b in run.busy_abs()]
        demand: dict[str, float] = defaultdict(float)
        for r in self.trace.requests:
            demand[r.user] += r.total * _overlap([(r.arrive + a, r.arrive + b) for a, b in r.busy], 0, horizon) / 3600
        due = max_min_due(dict(demand), capacity)
        xs = [done[u] / due[u] for u in due if due[u] > 0]
        inter = [((run.started if run.started is not None else (run.ended or horizon)) - run.arrive)
                 for run in self.runs if run.req.kind == "session" and run.end != "refused"]
        jobs = [((run.started if run.started is not None else (run.ended or horizon)) - run.arrive)
                for run in self.runs if run.req.kind == "job" and run.end != "refused"]
        honoured = 0
        attendees = [run for run in self.runs if run.req.course and not run.respawn]
        if attendees and all(run.started is not None and run.started - run.arrive <= HONOURED_WAIT
                             for run in attendees):
            honoured = 1
        lost = sum(r.req.total * r.req.busy_seconds() / 3600 for r in self.runs if r.end in ("gave-up", "refused"))
        for run, t, _, _, _ in self.culls:
            rel = t - (run.started or 0.0)
            if run.end in ("budget", "booking"):
                lost += run.req.total * _overlap(run.busy, rel, math.inf) / 3600
        return Metrics(
            self.policy.name, capacity, lent, busy, inter, jobs, jain(xs), len(self.trace.bookings), honoured,
            sum(1 for _, _, why, b, _ in self.culls if why == "culled" and b),
            sum(1 for _, _, why, b, _ in self.culls if why == "culled" and not b),
            sum(1 for _, _, why, _, _ in self.culls if why == "budget"),
            sum(1 for _, _, why, _, _ in self.culls if why == "booking"),
            sum(1 for r in self.runs if r.end == "gave-up"), sum(1 for r in self.runs if r.end == "refused"),
            lost, self.free_while_waiting / 3600, idle_while_waiting,
            sum(1 for _, _, why, b, back in self.culls if why == "culled" and not b and back), runtime, dict(done), due,
            *self._borrowed_hours(horizon), step_averages(held, horizon), step_averages(working, horizon))

    def _borrowed_hours(self, horizon: float) -> tuple[float, float, int, float]:
        """(borrowed GPU-hours, of them reclaimed, reclaims, GPU-minutes of work lost to them)."""
        borrowed = reclaimed = 0.0
        for lease in self.pool.history():
            if not lease.borrowed:
                continue
            start = (lease.started_at - self.clock.epoch).total_seconds()
            end = (lease.ended_at - self.clock.epoch).total_seconds() if lease.ended_at else horizon
            hours = len(lease.gpu_uuids) * max(0.0, min(end, horizon) - start) / 3600
            borrowed += hours
            if lease.end_reason == "reclaimed":
                reclaimed += hours
        return borrowed, reclaimed, sum(1 for r in self.runs if r.end == "reclaimed"), self.reclaim_lost / 60


def replay(trace: wl.Trace, policy: Policy) -> Metrics:
    with tempfile.TemporaryDirectory(prefix="gpuhub-replay-") as directory:
        t0 = time.perf_counter()
        r = Replay(trace, policy, directory)
        try:
            r.run()
            return r.metrics(time.perf_counter() - t0)
        finally:
            r.pool.close()


def _minutes(s: float) -> str:
    return f"{s / 60:.1f}"


def table(rows: list[Metrics]) -> str:
    lines = [
        "| policy | lent / capacity | busy / lent | interactive wait p50 / p95 / p99 (min) | job wait p50 / p95 / p99 "
        "(min) | Jain | bookings honoured | busy culled | idle culled (came back) | budget / booking stops "
        "| gave up / refused | busy GPU-h lost | GPU-h free / lent idle while requests waited | replay (s) |",
        "|" + "---|" * 14,
    ]
    for m in rows:
        iw, jw = m.interactive_waits, m.job_waits
        lines.append(
            f"| {m.policy} | {m.lent_gpu_hours:.0f} / {m.capacity_gpu_hours:.0f} GPU-h ({m.lent_share:.0%}) "
            f"| {m.busy_share:.0%} "
            f"| {_minutes(percentile(iw, .5))} / {_minutes(percentile(iw, .95))} / {_minutes(percentile(iw, .99))} "
            f"| {_minutes(percentile(jw, .5))} / {_minutes(percentile(jw, .95))} / {_minutes(percentile(jw, .99))} "
            f"| {m.jain:.3f} | {m.bookings_honoured}/{m.bookings} | {m.busy_culled} | {m.idle_culled} ({m.respawns}) "
            f"| {m.stopped_budget} / {m.stopped_booking} | {m.gave_up} / {m.refused} | {m.lost_busy_gpu_hours:.1f} "
            f"| {m.free_while_waiting_gpu_hours:.0f} / {m.idle_while_waiting_gpu_hours:.0f} | {m.runtime_s:.1f} |")
    return "\n".join(lines)


def borrowing_table(rows: list[Metrics]) -> str:
    lines = ["| policy | lent / capacity | interactive wait p95 (min) | job wait p95 (min) | borrowed GPU-h "
             "| reclaimed GPU-h | reclaims | work lost to reclaims (GPU-min) | gave up / refused |", "|" + "---|" * 9]
    for m in rows:
        lines.append(
            f"| {m.policy} | {m.lent_gpu_hours:.0f} / {m.capacity_gpu_hours:.0f} GPU-h ({m.lent_share:.0%}) "
            f"| {_minutes(percentile(m.interactive_waits, .95))} | {_minutes(percentile(m.job_waits, .95))} "
            f"| {m.borrowed_gpu_hours:.1f} | {m.reclaimed_gpu_hours:.1f} | {m.reclaims} "
            f"| {m.reclaim_lost_gpu_minutes:.0f} | {m.gave_up} / {m.refused} |")
    return "\n".join(lines)


def goals_table(rows: list[tuple[str, Metrics]]) -> str:
    """The product's figures against the issue's goals for its defaults, one row per (size, seed)."""
    lines = ["| week | busy / lent (goal >= 85 %) | interactive wait p95 (goal <= 5 min) | Jain (goal >= 0.9) "
             "| busy culled (goal 0) | idle culled (came back) | gave up / refused | lent idle while requests waited "
             "(GPU-h) |", "|" + "---|" * 8]
    for week, m in rows:
        lines.append(f"| {week} | {m.busy_share:.0%} | {_minutes(percentile(m.interactive_waits, .95))} "
                     f"| {m.jain:.3f} | {m.busy_culled} | {m.idle_culled} ({m.respawns}) | {m.gave_up} / {m.refused} "
                     f"| {m.idle_while_waiting_gpu_hours:.1f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", choices=sorted(wl.SIZES), default="small")
    parser.add_argument("--seed", type=int, nargs="+", default=[1], metavar="SEED",
                        help="the week's seed; several (--seed 1 2 3): one table each, then the product's "
                             "figures against the goals, one row per seed")
    parser.add_argument("--policy", action="append", help="only these policies (default: all three)")
    parser.add_argument("--borrowing", type=int, default=None, metavar="QUOTA",
                        help="instead: the product policy with a per-user limit of QUOTA GPUs, with jobs "
                             "borrowing beyond it off and on, side by side")
    parser.add_argument("--set", action="append", default=[], metavar="NAME=NUMBER",
                        help="a GPUPool setting or a hub Settings field of the product policy, e.g. "
                             "backfill_window=600 or activity_interval=30")
    parser.add_argument("--plots", metavar="DIR", default=None,
                        help="also write each week's plots into DIR as PNG (needs matplotlib, the bench "
                             "extra): replay-SIZE-seedN-gpus.png (GPUs lent and busy over the week, per "
                             "policy) and replay-SIZE-seedN-waits.png (the waits' distributions)")
    args = parser.parse_args(argv)
    overrides: dict[str, float] = {}
    hub: dict[str, Any] = {}
    for item in args.set:
        name, _, value = item.partition("=")
        if hasattr(GPUPool, name) and isinstance(getattr(GPUPool, name, None), TraitType):
            overrides[name] = float(value)
        elif name in {f.name for f in fields(Settings)}:
            hub[name] = type(getattr(Settings(), name) or 0)(float(value))
        else:
            parser.error(f"--set {item}: neither a GPUPool setting nor a hub Settings field")
    if args.plots is not None and args.borrowing is not None:
        parser.error("--plots draws the three policies' weeks, not --borrowing's")
    size = wl.SIZES[args.size]
    goals: list[tuple[str, Metrics]] = []
    for seed in args.seed:
        trace = wl.generate(size, seed)
        sessions = sum(r.kind == "session" for r in trace.requests)
        jobs = [r for r in trace.requests if r.kind == "job"]
        print(f"{args.size}: {size.hosts} host(s) x {size.gpus_per_host} GPUs, {size.users} users "
              f"({len(trace.heavy)} heavy), seed {seed}: {sessions} sessions, {len(jobs)} jobs "
              f"({sum(r.workers > 1 for r in jobs)} gangs), {len(trace.bookings)} booking(s); offered "
              f"{trace.offered_gpu_hours():.0f} GPU-h held ({trace.offered_gpu_hours() / (trace.capacity * 168):.0%} "
              f"of capacity), of it busy {sum(r.total * r.busy_seconds() for r in trace.requests) / 3600:.0f} GPU-h; "
              f"budget {trace.user_budget} GPU-h per user per week (product only)")
        rows = []
        chosen = (borrowing_policies(args.borrowing, overrides, hub) if args.borrowing is not None else
                  [p for p in policies(overrides, hub) if not args.policy or p.name in args.policy])
        t0 = time.perf_counter()
        for policy in chosen:
            rows.append(replay(trace, policy))
            print(f"  {policy.name}: {rows[-1].runtime_s:.1f} s", file=sys.stderr)
        print(f"  the week's replays: {time.perf_counter() - t0:.1f} s", file=sys.stderr)
        print(borrowing_table(rows) if args.borrowing is not None else table(rows))
        goals += [(f"{args.size}, seed {seed}", m) for m in rows if m.policy == "product"]
        if args.plots is not None:
            from bench import replay_plots

            name = f"replay-{args.size}-seed{seed}"
            for path in replay_plots.plot(rows, trace.capacity, trace.horizon, SERIES_STEP, args.plots, name,
                                          title=f"{args.size} week, seed {seed}"):
                print(f"  plot: {path}", file=sys.stderr)
        if len(args.seed) > 1:
            print()
    if len(goals) > 1:
        print(goals_table(goals))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
