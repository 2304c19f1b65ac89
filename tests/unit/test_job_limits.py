"""Per-user job limits without services: the options, the refusals, why a job waits, and
the ledger refusing concurrent submissions past a limit together (a real SQLite ledger)."""

from __future__ import annotations

import threading

import pytest
from traitlets import TraitError
from traitlets.config import Config

from spawner.jobs.limits import JobLimits
from spawner.jobs.request import BadJob
from spawner.profiles import DEFAULT_PROFILES, load_profiles
from spawner.settings.pool_jobs import job_limits

PROFILES = {p.slug: p for p in load_profiles(DEFAULT_PROFILES + [
    {"slug": "nolimit", "display_name": "No limit", "image": "img"}])}
CPU, GPU = PROFILES["tf-cpu"], PROFILES["tf-gpu-1"]  # 2 and 4 CPUs


def test_the_defaults_are_four_running_twenty_queued_sixteen_cpus_and_each_is_documented():
    limits = JobLimits()
    assert (limits.max_running, limits.max_queued, limits.max_cpus, limits.profile_limits) == (4, 20, 16.0, {})
    for trait in JobLimits.class_own_traits(config=True).values():
        assert len(trait.help) > 80, trait.name


@pytest.mark.parametrize("options, message", [
    ({"max_running": -1}, "max_running"),
    ({"max_queued": -1}, "max_queued"),
    ({"max_cpus": 0}, "max_cpus"),
    ({"max_workers": 0}, "max_workers"),
    ({"profile_limits": {"tf-cpu": {"runing": 1}}}, "keys"),
    ({"profile_limits": {"tf-cpu": {"running": "2"}}}, "int"),
    ({"profile_limits": {"tf-cpu": 2}}, "dict"),
])
def test_bad_limits_are_refused_with_the_options_name(options, message):
    with pytest.raises(TraitError, match=message):
        JobLimits(**options)
    # In the hub's config, at its start.
    c = Config()
    for key, value in options.items():
        setattr(c.JobLimits, key, value)
    with pytest.raises(TraitError, match=message):
        job_limits(c)


def test_a_submission_past_the_queue_cap_is_refused_with_429_saying_the_limit_and_what_the_user_has():
    limits = JobLimits(max_queued=3)
    limits.check_submission(CPU, [("tf-cpu", "running")] * 4 + [("tf-cpu", "queued")] * 2)
    with pytest.raises(BadJob) as refused:
        limits.check_submission(CPU, [("tf-cpu", "running")] * 4 + [("tf-gpu-1", "queued")] * 3)
    assert refused.value.status == 429
    assert str(refused.value).startswith("You have 3 jobs queued and 4 running; at most 3 may wait at once")
    assert "cancel" in str(refused.value)


def test_a_profiles_own_queue_cap():
    limits = JobLimits(profile_limits={"tf-gpu-1": {"queued": 1}})
    limits.check_submission(CPU, [("tf-gpu-1", "queued")])
    with pytest.raises(BadJob) as refused:
        limits.check_submission(GPU, [("tf-gpu-1", "queued"), ("tf-cpu", "queued")])
    assert refused.value.status == 429 and "1 tf-gpu-1 job queued; at most 1" in str(refused.value)


def test_a_profile_bigger_than_the_cpu_quota_is_refused_at_once_with_403():
    with pytest.raises(BadJob) as refused:
        JobLimits(max_cpus=3).check_submission(GPU, [])
    assert refused.value.status == 403 and "4 CPUs" in str(refused.value) and "at most 3 CPUs" in str(refused.value)
    JobLimits(max_cpus=None).check_submission(GPU, [])  # None: no CPU quota


def test_why_a_job_waits_running_places_a_profiles_cap_and_cpus():
    limits = JobLimits(max_running=2, max_cpus=5, profile_limits={"tf-gpu-1": {"running": 1}})
    assert limits.wait_reason(CPU, []) is None
    assert "2 jobs running" in limits.wait_reason(CPU, [("x", 0.1), ("y", 0.1)])
    assert "1 tf-gpu-1 job running" in limits.wait_reason(GPU, [("tf-gpu-1", 1.0)])
    assert "use 4 of your 5 CPUs" in limits.wait_reason(CPU, [("tf-gpu-1", 4.0)])
    assert limits.wait_reason(CPU, [("tf-cpu", 3.0)]) is None  # 3 + 2 fits 5 exactly
    # A profile without a CPU limit counts as the whole host.
    assert JobLimits.job_cpus(PROFILES["nolimit"], host_cpus=16) == 16.0
    assert JobLimits.job_cpus(CPU, host_cpus=16) == 2.0


def test_concurrent_submissions_cannot_pass_the_queue_cap_together(tmp_path):
    from spawner.pool import GPUPool
    from spawner.pool.ledger.job_records import JobLedger

    pool = GPUPool(db_url=f"sqlite:///{tmp_path / 'ledger.sqlite'}")
    ledger = JobLedger(pool)
    limits = JobLimits(max_queued=5)
    made, refused = [], []

    def submit():
        try:
            made.append(ledger.create("pat", [], "tf-cpu", ["true"], "", 60, "h", 1000, 100,
                                      check=lambda active: limits.check_submission(CPU, active)))
        except BadJob as exc:
            refused.append(exc.status)

    try:
        threads = [threading.Thread(target=submit) for _ in range(20)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert len(made) == 5 and refused == [429] * 15
        assert len(ledger.jobs("pat", active_only=True)) == 5
        # Another user's queue is their own.
        ledger.create("bob", [], "tf-cpu", ["true"], "", 60, "h", 1000, 100,
                      check=lambda active: limits.check_submission(CPU, active))
    finally:
        pool.close()


def test_a_clusters_workers_each_count_their_cpus():
    limits = JobLimits(max_cpus=8)
    limits.check_submission(GPU, [], workers=2)  # 2 x 4 CPUs
    with pytest.raises(BadJob, match="3 workers of profile tf-gpu-1 use 12 CPUs.*or fewer workers") as refused:
        limits.check_submission(GPU, [], workers=3)
    assert refused.value.status == 403
    assert "8 CPUs" in limits.wait_reason(GPU, [("tf-cpu", 2.0)], workers=2)
    assert limits.wait_reason(GPU, [], workers=2) is None
