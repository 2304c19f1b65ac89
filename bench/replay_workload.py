"""The replay bench's workload: a lab's week of GPU requests, seeded, each part's parameters here.

bench/replay.py drives the real pool with it.  The parameters are chosen to have the shape the
published traces of shared GPU clusters report, not fitted to them:

- Jeon et al., "Analysis of Large-Scale Multi-Tenant GPU Clusters for DNN Training Workloads",
  USENIX ATC'19 (Microsoft Philly): job run times spread over minutes to days (several orders
  of magnitude); most jobs use one GPU, distributed ones 2-8+ GPUs and queue longer (gang
  placement); 25-49 % of reserved GPU minutes ran at 0 % utilisation.
- Weng et al., "MLaaS in the Wild: Workload Analysis and Scheduling in Large-Scale
  Heterogeneous GPU Clusters", USENIX NSDI'22 (Alibaba PAI): median instance GPU utilisation
  1.5 % (mean 10.5 %); submissions follow the working day (diurnal, lower at weekends); a
  small fraction of users submits most of the work (heavy-tailed per-user load); interactive
  and notebook instances are the least utilised.

Everything is in seconds from the week's start (a Monday 00:00 UTC, `EPOCH`).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from datetime import UTC, datetime

EPOCH = datetime(2026, 1, 5, tzinfo=UTC)  # a Monday
DAY = 86400.0
WEEK = 7 * DAY

# --- sizes ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Size:
    hosts: int
    gpus_per_host: int
    users: int


SIZES = {"small": Size(hosts=1, gpus_per_host=8, users=30), "large": Size(hosts=8, gpus_per_host=8, users=300)}

# --- when people work (PAI: diurnal, weekends lower) ----------------------------------------

# Relative arrival rate by hour of day (UTC taken as the lab's local time), weekdays.
HOUR_WEIGHTS = (0.1, 0.05, 0.05, 0.05, 0.05, 0.1, 0.2, 0.4, 0.8, 1.0, 1.0, 1.0,
                0.7, 0.9, 1.0, 1.0, 0.9, 0.8, 0.6, 0.5, 0.4, 0.3, 0.2, 0.15)
WEEKEND_FACTOR = 0.25  # Saturday and Sunday, relative to a weekday

# --- users (PAI: a few heavy users, many light ones) ----------------------------------------

HEAVY_FRACTION = 0.1  # of the users
HEAVY_JOB_WEIGHT = 8.0  # a heavy user submits this many times a light user's jobs
SESSIONS_PER_WEEKDAY = {"heavy": 1.0, "light": 0.4}  # interactive sessions a user opens per weekday (mean)

# --- interactive sessions (PAI: notebooks are the least utilised; Philly: idle reservations) --

SESSION_GPUS = ((1, 0.85), (2, 0.15))  # (GPUs, probability)
SESSION_SPAN_MEDIAN = 2.0 * 3600  # lognormal: the time from the first to the last busy phase's end
SESSION_SPAN_SIGMA = 0.8
SESSION_SPAN_MAX = 9 * 3600
BUSY_MEDIAN, BUSY_SIGMA = 6 * 60.0, 1.0  # a busy phase: cells running (lognormal)
IDLE_MEDIAN, IDLE_SIGMA = 15 * 60.0, 1.0  # an idle phase between them: reading, thinking, away
ABANDON_PROBABILITY = 0.25  # the server is left running after the work, until the next morning
ABANDON_STOP_HOUR = (8, 10)  # ... when the user stops it (uniform in these hours, next day)
CLOSE_AFTER = (60.0, 600.0)  # otherwise the user stops it this long after the last busy phase

# --- batch jobs (Philly: run times over orders of magnitude, mostly 1 GPU, some gangs) -----

JOB_DURATION_MEDIAN, JOB_DURATION_SIGMA = 25 * 60.0, 1.7  # lognormal
JOB_DURATION_MIN, JOB_DURATION_MAX = 60.0, 86400.0  # 1 min .. 1 day (the jobs' default limit)
JOB_GPUS = ((1, 0.75), (2, 0.15), (4, 0.10))
GANG_WORKERS = ((2, 0.06), (4, 0.04))  # (workers of 1 GPU each, probability); the rest: one container
JOB_LIMIT_FACTOR = 2.0  # a job declares a time limit of this many times its run time (holds_for)
OFFERED_LOAD = 0.70  # jobs are added until sessions + jobs would hold this share of the GPU-hours

# --- a course's booking ---------------------------------------------------------------------

BOOKING_DAY, BOOKING_HOUR, BOOKING_HOURS = 1, 14, 2.0  # Tuesday 14:00-16:00
BOOKING_MADE = 9 * 3600.0  # booked on Monday 09:00 (ahead of the notice)
BOOKING_SHARE = 0.5  # of one host's GPUs
COURSE_GROUP = "course-101"  # its members: as many students as GPUs booked, each at the session only
ATTENDEE_LATE = 600.0  # attendees arrive within this many seconds of the start
EXERCISE_BUSY, EXERCISE_IDLE = 10 * 60.0, 3 * 60.0  # the course's cells: mostly busy

# --- budgets (this product's GPU-hour budgets: the lab's own settings) ----------------------

BUDGET_TIMES_FAIR = 2.0  # each user's weekly budget: this many times capacity / users


@dataclass
class Request:
    """One spawn or one job: what the user asks and what they would do with it."""

    id: int
    kind: str  # "session" or "job"
    user: str
    groups: tuple[str, ...]
    arrive: float
    gpus: int
    workers: int = 1
    # session: busy intervals relative to its start, and when (relative) the user stops it
    busy: tuple[tuple[float, float], ...] = ()
    hold: float = 0.0
    limit: float | None = None  # a job's declared time limit (holds_for)
    course: bool = False  # an attendee of the booked course

    @property
    def total(self) -> int:
        return self.gpus * self.workers

    def busy_seconds(self) -> float:
        return sum(b - a for a, b in self.busy)


@dataclass
class Booking:
    group: str
    gpus: int
    made: float
    starts: float
    ends: float


@dataclass
class Trace:
    hosts: int
    gpus_per_host: int
    users: list[str]
    heavy: set[str]
    groups: dict[str, tuple[str, ...]]
    requests: list[Request]
    bookings: list[Booking] = field(default_factory=list)
    user_budget: float | None = None  # GPU-hours per user per week (applied by policies with budgets)
    horizon: float = WEEK

    @property
    def capacity(self) -> int:
        return self.hosts * self.gpus_per_host

    def offered_gpu_hours(self) -> float:
        return sum(r.total * r.hold for r in self.requests) / 3600


def _pick(rng: random.Random, table) -> int:
    x, acc = rng.random(), 0.0
    for value, p in table:
        acc += p
        if x < acc:
            return value
    return table[-1][0]


def _lognormal(rng: random.Random, median: float, sigma: float) -> float:
    return rng.lognormvariate(math.log(median), sigma)


def _arrival(rng: random.Random, day: int | None = None) -> float:
    """A moment of the week drawn from the working-day profile (on `day`, if given)."""
    days = [day] if day is not None else list(range(7))
    weights = [(d, h, HOUR_WEIGHTS[h] * (WEEKEND_FACTOR if d >= 5 else 1.0)) for d in days for h in range(24)]
    x = rng.random() * sum(w for _, _, w in weights)
    for d, h, w in weights:
        x -= w
        if x <= 0:
            return d * DAY + h * 3600 + rng.random() * 3600
    return days[-1] * DAY + 23 * 3600


def _phases(rng: random.Random, span: float, busy_median: float, busy_sigma: float, idle_median: float,
            idle_sigma: float) -> tuple[tuple[float, float], ...]:
    """Alternating busy and idle phases from 0 (a busy phase first) until `span`."""
    out, t = [], 0.0
    while t < span:
        b = min(span, t + max(30.0, _lognormal(rng, busy_median, busy_sigma)))
        out.append((round(t), round(b)))
        t = b + max(30.0, _lognormal(rng, idle_median, idle_sigma))
    return tuple((a, b) for a, b in out if b > a)


def _session(rng: random.Random, rid: int, user: str, groups, arrive: float) -> Request:
    span = min(SESSION_SPAN_MAX, _lognormal(rng, SESSION_SPAN_MEDIAN, SESSION_SPAN_SIGMA))
    busy = _phases(rng, span, BUSY_MEDIAN, BUSY_SIGMA, IDLE_MEDIAN, IDLE_SIGMA)
    last = busy[-1][1]
    if rng.random() < ABANDON_PROBABILITY:
        day = int((arrive + last) // DAY) + 1
        stop = day * DAY + rng.uniform(*ABANDON_STOP_HOUR) * 3600
        hold = stop - arrive
    else:
        hold = last + rng.uniform(*CLOSE_AFTER)
    return Request(rid, "session", user, groups, round(arrive), _pick(rng, SESSION_GPUS), busy=busy,
                   hold=round(hold))


def _job(rng: random.Random, rid: int, user: str, groups, arrive: float) -> Request:
    duration = min(JOB_DURATION_MAX, max(JOB_DURATION_MIN, _lognormal(rng, JOB_DURATION_MEDIAN,
                                                                       JOB_DURATION_SIGMA)))
    workers = _pick(rng, GANG_WORKERS + ((1, 1.0),))
    gpus = 1 if workers > 1 else _pick(rng, JOB_GPUS)
    duration = round(duration)
    return Request(rid, "job", user, groups, round(arrive), gpus, workers, busy=((0, duration),), hold=duration,
                   limit=min(JOB_DURATION_MAX, JOB_LIMIT_FACTOR * duration))


def generate(size: Size, seed: int = 1) -> Trace:
    """The week's requests for `size`, the same for the same seed."""
    rng = random.Random(seed)
    users = [f"u{i:03d}" for i in range(size.users)]
    heavy = set(rng.sample(users, max(1, round(HEAVY_FRACTION * size.users))))
    booked = max(1, round(BOOKING_SHARE * size.gpus_per_host))
    course = [f"s{i:02d}" for i in range(booked)]  # the course's students (besides the lab's users)
    groups = {u: ((COURSE_GROUP,) if u in course else ()) for u in users + course}
    requests: list[Request] = []
    for user in users:
        rate = SESSIONS_PER_WEEKDAY["heavy" if user in heavy else "light"]
        for day in range(7):
            mean = rate * (WEEKEND_FACTOR if day >= 5 else 1.0)
            n = int(mean) + (1 if rng.random() < mean - int(mean) else 0)
            for _ in range(n):
                requests.append(_session(rng, len(requests), user, groups[user], _arrival(rng, day)))
    bookings = []
    start = BOOKING_DAY * DAY + BOOKING_HOUR * 3600
    bookings.append(Booking(COURSE_GROUP, booked, BOOKING_MADE, start, start + BOOKING_HOURS * 3600))
    for user in course:
        span = BOOKING_HOURS * 3600 - ATTENDEE_LATE
        busy = _phases(rng, span, EXERCISE_BUSY, 0.3, EXERCISE_IDLE, 0.3)
        requests.append(Request(len(requests), "session", user, groups[user],
                                round(start + rng.uniform(0, ATTENDEE_LATE)), 1, busy=busy, hold=round(span),
                                course=True))
    capacity = size.hosts * size.gpus_per_host * WEEK / 3600
    target = OFFERED_LOAD * capacity - sum(r.total * r.hold for r in requests) / 3600
    weights = [HEAVY_JOB_WEIGHT if u in heavy else 1.0 for u in users]
    while target > 0:
        user = rng.choices(users, weights)[0]
        job = _job(rng, len(requests), user, groups[user], _arrival(rng))
        requests.append(job)
        target -= job.total * job.hold / 3600
    requests.sort(key=lambda r: (r.arrive, r.id))
    budget = BUDGET_TIMES_FAIR * capacity / size.users
    return Trace(size.hosts, size.gpus_per_host, users + course, heavy, groups, requests, bookings, round(budget, 1))
