"""Schedules: cron strings, the shortest interval, the missed-firing rule (once, not once per
slot) and the scheduler's firings with an injected clock, on a real SQLite ledger; the jobs
a firing submits are recorded by the real JobRunner, whose containers are never started."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import pytest
from traitlets import TraitError
from traitlets.config import Config

from spawner.engines import make_job_engine
from spawner.inventory import SimulatedInventory
from spawner.jobs import cron
from spawner.jobs.request import BadJob
from spawner.jobs.runner import JobRunner
from spawner.jobs.runner_settings import JobSettings
from spawner.jobs.scheduler import Scheduler
from spawner.jobs.schedules import ScheduleLimits, check_schedule
from spawner.pool import GPUPool
from spawner.pool.ledger.job_records import QUEUED
from spawner.profiles import DEFAULT_PROFILES, load_profiles

NOW = datetime(2026, 12, 4, 19, 7, 30, tzinfo=UTC)
PROFILES = load_profiles(DEFAULT_PROFILES)


@pytest.mark.parametrize("bad", ["", "   ", "* * * *", "* * * * * *", "61 * * * *", "0 25 * * *", "0 3 30 2 *",
                                 "@reboot", "every day", "0 3 * * * ; rm -rf /", "\x00 3 * * *", "x" * 500, None, 5,
                                 ["0", "3"]])
def test_a_bad_cron_string_is_refused_showing_the_next_three_times_of_a_good_one(bad):
    with pytest.raises(cron.BadCron) as refused:
        cron.check_cron(bad, NOW)
    message = str(refused.value)
    assert "'0 3 * * *'" in message
    assert "2026-12-05 03:00 UTC, 2026-12-06 03:00 UTC and 2026-12-07 03:00 UTC" in message, message


@pytest.mark.parametrize("good, normal", [("0 3 * * *", "0 3 * * *"), ("  */15  9-17 * * 1-5 ", "*/15 9-17 * * 1-5"),
                                          ("@daily", "@daily"), ("30 2 1 * *", "30 2 1 * *")])
def test_a_good_cron_string_is_kept_normalised(good, normal):
    assert cron.check_cron(good, NOW) == normal


def test_the_shortest_interval_is_measured_between_any_two_firings():
    assert cron.shortest_interval("* * * * *", NOW) == timedelta(minutes=1)
    assert cron.shortest_interval("0,5 3 * * *", NOW) == timedelta(minutes=5)  # twice a night, 5 min apart
    assert cron.shortest_interval("0 3 * * *", NOW) == timedelta(days=1)
    assert cron.shortest_interval("@hourly", NOW) == timedelta(hours=1)


def test_a_missed_firing_runs_once_then_the_next_slot_after_now():
    due = datetime(2026, 12, 1, 3, 0, tzinfo=UTC)  # nightly; three nights missed while the service was down
    fire, following = cron.next_firing("0 3 * * *", due, NOW)
    assert fire and following == datetime(2026, 12, 5, 3, 0, tzinfo=UTC)
    again, same = cron.next_firing("0 3 * * *", following, NOW)  # looked at again: not due, nothing fires
    assert not again and same == following
    hourly = cron.next_firing("0 * * * *", NOW - timedelta(days=2), NOW)
    assert hourly == (True, datetime(2026, 12, 4, 20, 0, tzinfo=UTC))  # one firing for 48 missed slots


def body(**extra):
    return {"cron": "0 3 * * *", "profile": "tf-cpu", "notebook": "train.ipynb", "parameters": {"epochs": 5},
            **extra}


def test_a_schedule_is_checked_like_a_job_and_gets_a_bounded_timeout():
    limits = ScheduleLimits()
    asked = check_schedule(body(), PROFILES, [], 86400, limits, NOW)
    assert asked.cron == "0 3 * * *" and asked.name == "train.ipynb"
    assert asked.body == {"profile": "tf-cpu", "notebook": "train.ipynb", "parameters": {"epochs": 5},
                          "timeout": limits.max_run_seconds}
    assert asked.submission.notebook == "train.ipynb" and asked.submission.timeout_s == limits.max_run_seconds
    command = check_schedule({"cron": "@daily", "profile": "tf-cpu", "command": ["python", "x.py"], "timeout": 60},
                             PROFILES, [], 86400, limits, NOW)
    assert command.body["command"] == ["python", "x.py"] and command.submission.timeout_s == 60


@pytest.mark.parametrize("change, status, says", [
    ({"cron": "*/5 * * * *"}, 400, "ScheduleLimits.min_interval_minutes"),
    ({"cron": "* * * * *"}, 400, "at most every 15 minutes"),
    ({"cron": "bad"}, 400, "would fire at"),
    ({"timeout": 10**6}, 400, "ScheduleLimits.max_run_seconds"),
    ({"notebook": "../other/train.ipynb"}, 400, "inside your home"),
    ({"notebook": "/etc/passwd.ipynb"}, 400, "inside your home"),
    ({"parameters": {"blob": "x" * 20000}}, 400, "JobLimits.max_parameters_bytes"),
    ({"workers": 2}, 400, "Unsupported"),
    ({"image": "evil"}, 400, "Unsupported"),
    ({"profile": "nope"}, 400, "nope"),
    ({"name": "a\nb"}, 400, "'name'"),
])
def test_a_bad_schedule_is_refused_naming_what_and_the_limit(change, status, says):
    with pytest.raises(BadJob) as refused:
        check_schedule(body(**change), PROFILES, [], 86400, ScheduleLimits(), NOW)
    assert refused.value.status == status and says in str(refused.value), str(refused.value)


def test_a_lower_shortest_interval_lets_a_one_minute_schedule_in_and_limits_check_themselves():
    asked = check_schedule(body(cron="* * * * *"), PROFILES, [], 86400, ScheduleLimits(min_interval_minutes=1), NOW)
    assert asked.cron == "* * * * *"
    for key, value in (("min_interval_minutes", 0), ("max_run_seconds", 0), ("max_per_user", -1)):
        with pytest.raises(TraitError):
            ScheduleLimits(**{key: value})
    c = Config()
    c.ScheduleLimits.max_per_user = 2
    limits = ScheduleLimits(config=c)
    limits.check_count(1)
    with pytest.raises(BadJob) as refused:
        limits.check_count(2)
    assert refused.value.status == 429 and "ScheduleLimits.max_per_user" in str(refused.value)
    for trait in ScheduleLimits.class_own_traits(config=True).values():
        assert len(trait.help) > 80, trait.name  # documented where it is defined


class Clock:
    def __init__(self, now: datetime):
        self.now = now

    def __call__(self) -> datetime:
        return self.now


def scheduler_on(tmp_path, clock: Clock, users: dict) -> tuple[Scheduler, JobRunner, list]:
    host = "sched-host"
    pool = GPUPool(db_url=f"sqlite:///{tmp_path / 'ledger.sqlite'}", inventory=SimulatedInventory(count=1, host=host))
    pool.sync_inventory()
    runner = JobRunner(pool, js := JobSettings(profiles=DEFAULT_PROFILES, host=host), make_job_engine(js))
    spawned: list = []
    runner._spawn = spawned.append  # type: ignore[method-assign]  # recorded, never run: no engine here

    async def hub_user(name):
        if name not in users:
            raise BadJob(f"The hub has no user {name!r} any more", 404)
        return users[name]
    return Scheduler(runner, hub_user, clock=clock), runner, spawned


def test_the_scheduler_fires_a_missed_schedule_once_then_on_its_slots(tmp_path):
    clock = Clock(datetime(2026, 12, 1, 2, 0, tzinfo=UTC))
    scheduler, runner, spawned = scheduler_on(tmp_path, clock, {"pat": {"groups": ["ml"], "auth_state": None}})
    made = scheduler.ledger.create("pat", "nightly", "0 3 * * *",
                                   {"profile": "tf-cpu", "command": ["python", "x.py"], "timeout": 60}, "sched-host",
                                   lambda _now: cron.next_times("0 3 * * *", clock(), 1)[0])
    assert made.next_at == datetime(2026, 12, 1, 3, 0, tzinfo=UTC)

    async def scenario():
        fired = [await scheduler.tick()]  # 02:00: not due
        clock.now = datetime(2026, 12, 4, 19, 0, tzinfo=UTC)  # the service was down for three nights
        fired.append(await scheduler.tick())
        fired.append(await scheduler.tick())  # looked at again at once: nothing more
        clock.now = datetime(2026, 12, 5, 3, 0, 2, tzinfo=UTC)
        fired.append(await scheduler.tick())
        return fired

    try:
        fired = asyncio.run(scenario())
        jobs = runner.ledger.jobs("pat")
        schedule = scheduler.ledger.get(made.id)
    finally:
        runner.pool.close()
    assert fired == [[], [made.id], [], [made.id]]
    assert len(jobs) == 2 and len(spawned) == 2, jobs  # one for the three missed nights, one on time
    assert all(j.schedule_id == made.id and j.state == QUEUED and j.command == ("python", "x.py") for j in jobs)
    assert jobs[0].groups == ("ml",) and jobs[0].timeout_s == 60
    assert schedule.fired == 2 and schedule.last_job_id == jobs[0].id and schedule.last_error is None
    assert schedule.next_at == datetime(2026, 12, 6, 3, 0, tzinfo=UTC)


def test_a_firing_that_is_refused_records_why_and_a_paused_schedule_does_not_fire(tmp_path):
    clock = Clock(datetime(2026, 12, 4, 19, 0, tzinfo=UTC))
    scheduler, runner, spawned = scheduler_on(tmp_path, clock, {"pat": {"groups": []}})
    first = lambda _now: cron.next_times("0 * * * *", clock(), 1)[0]  # noqa: E731
    gone = scheduler.ledger.create("bob", "b", "0 * * * *", {"profile": "tf-cpu", "command": ["true"]},
                                   "sched-host", first)
    paused = scheduler.ledger.create("pat", "p", "0 * * * *", {"profile": "tf-cpu", "command": ["true"]},
                                     "sched-host", first)
    other_host = scheduler.ledger.create("pat", "o", "0 * * * *", {"profile": "tf-cpu", "command": ["true"]},
                                         "elsewhere", first)
    scheduler.ledger.set_paused(paused.id, True, None)
    clock.now = datetime(2026, 12, 4, 20, 0, 1, tzinfo=UTC)
    try:
        fired = asyncio.run(scheduler.tick())
        refused = scheduler.ledger.get(gone.id)
        jobs = runner.ledger.jobs()
        kept = scheduler.ledger.get(other_host.id)
    finally:
        runner.pool.close()
    assert fired == [gone.id] and jobs == [] and spawned == []
    assert refused.last_job_id is None and "no user 'bob'" in refused.last_error
    assert refused.next_at == datetime(2026, 12, 4, 21, 0, tzinfo=UTC)  # tried again on its next slot
    assert kept.fired == 0  # another host's service fires it


def test_two_services_claiming_one_slot_fire_it_once(tmp_path):
    clock = Clock(datetime(2026, 12, 4, 19, 0, tzinfo=UTC))
    scheduler, runner, _ = scheduler_on(tmp_path, clock, {})
    made = scheduler.ledger.create("pat", "n", "0 3 * * *", {"profile": "tf-cpu", "command": ["true"]}, "sched-host",
                                   lambda _now: datetime(2026, 12, 4, 3, 0, tzinfo=UTC))
    try:
        following = datetime(2026, 12, 5, 3, 0, tzinfo=UTC)
        wins = [scheduler.ledger.claim(made.id, made.next_at, following) for _ in range(2)]
    finally:
        runner.pool.close()
    assert wins == [True, False]


def test_a_version_12_ledger_gains_schedules_and_notebook_jobs_in_place(tmp_path):
    import sqlalchemy as sa

    from spawner.pool import SCHEMA_VERSION
    from spawner.pool.ledger.job_records import JobLedger

    url = f"sqlite:///{tmp_path / 'old.sqlite'}"
    GPUPool(db_url=url).gpus()
    engine = sa.create_engine(url)
    with engine.begin() as conn:  # as schema 12 left it
        conn.execute(sa.text("DROP TABLE gpu_pool_schedules"))
        for column in ("notebook", "parameters", "schedule_id"):
            conn.execute(sa.text(f"ALTER TABLE gpu_pool_jobs DROP COLUMN {column}"))
        conn.execute(sa.text("UPDATE gpu_pool_meta SET value='12' WHERE key='schema_version'"))
    pool = GPUPool(db_url=url)
    try:
        job = JobLedger(pool).create("pat", [], "tf-cpu", ["true"], "work", 60, "h", 1, 1, notebook="work/a.ipynb",
                                     parameters={"epochs": 5}, schedule_id=None)
        assert job.to_dict()["output"] == f"work/a.job-{job.id}.ipynb" and job.parameters == {"epochs": 5}
        from spawner.pool.ledger.schedule_records import ScheduleLedger

        made = ScheduleLedger(pool).create("pat", "n", "@daily", {"profile": "tf-cpu", "command": ["true"]}, "h",
                                           lambda now: now)
        assert made.to_dict()["cron"] == "@daily"
    finally:
        pool.close()
    with engine.begin() as conn:
        assert conn.execute(sa.text("SELECT value FROM gpu_pool_meta WHERE key='schema_version'")).scalar() \
            == str(SCHEMA_VERSION) == "14"
    engine.dispose()


def gpu_job():
    """The notebook images' gpu-job module, loaded from its source (as the CLI reference does)."""
    import importlib.machinery
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "images" / "jupyter" / "gpuhub_job" / "__init__.py"
    loader = importlib.machinery.SourceFileLoader("gpu_job_for_tests", str(path))
    spec = importlib.util.spec_from_loader("gpu_job_for_tests", loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def test_gpu_job_sends_a_notebook_with_typed_parameters_and_a_schedule(monkeypatch, tmp_path):
    module = gpu_job()
    home = tmp_path / "home"
    (home / "work").mkdir(parents=True)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(home / "work")
    sent = []
    monkeypatch.setattr(module, "request", lambda args, method, path, body=None, stream=False, api="jobs":
                        sent.append((api, method, path, body)) or {"schedules": []})
    monkeypatch.setattr(module, "show", lambda job: None)
    monkeypatch.setattr(module, "show_schedule", lambda schedule: None)
    module.main(["--url", "http://x/", "submit", "--profile", "tf-gpu-1", "--notebook", "train.ipynb",
                 "-p", "epochs", "5", "-p", "rate", "0.1", "-p", "name", "run a", "-p", "fast", "true"])
    module.main(["--url", "http://x/", "schedule", "create", "--cron", "0 3 * * *", "--profile", "tf-cpu",
                 "--", "python", "x.py"])
    module.main(["--url", "http://x/", "schedule", "pause", "3"])
    assert sent[0] == ("jobs", "POST", "", {"profile": "tf-gpu-1", "notebook": "work/train.ipynb",
                                            "parameters": {"epochs": 5, "rate": 0.1, "name": "run a", "fast": True}})
    assert sent[1] == ("schedules", "POST", "", {"cron": "0 3 * * *", "profile": "tf-cpu",
                                                 "command": ["python", "x.py"], "workdir": "work"})
    assert sent[2] == ("schedules", "POST", "/3/pause", {})
    with pytest.raises(SystemExit):  # a notebook and a command at once
        module.main(["--url", "http://x/", "submit", "--profile", "p", "--notebook", "a.ipynb", "--", "python"])
