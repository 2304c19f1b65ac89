"""The in-lab GPU status's pure parts: the culler's deadline (one rule for the culler and
the pool service), free GPUs per profile, and the notice of an ended lease."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from spawner.culling.policy import GPUCullPolicy, cull_deadline, server_idle_limit
from spawner.pool.models import Lease
from spawner.poolpage.handlers.lab import ENDED_NOTICE, ended_part, free_per_profile
from spawner.profiles import load_profiles

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
GPU_STATE = {"gpu_lease_id": 3, "gpu_uuids": ["GPU-a"]}


def test_the_deadline_shown_is_the_moment_the_culler_culls():
    policy = GPUCullPolicy(cpu_timeout=3600, gpu_timeout=900)
    for state in (GPU_STATE, {}):
        last = NOW - timedelta(seconds=100)
        deadline = cull_deadline(last, state, 3600, 900)
        assert deadline == last + timedelta(seconds=server_idle_limit(state, 3600, 900))
        just_before = deadline - timedelta(seconds=1) - last
        assert not policy.decide(just_before, {"state": state}).cull
        assert policy.decide(deadline - last, {"state": state}).cull
    assert cull_deadline(NOW, GPU_STATE, 3600, 900) == NOW + timedelta(seconds=900)
    assert cull_deadline(NOW, {}, 3600, 900) == NOW + timedelta(seconds=3600)
    # no activity yet (the culler keeps it), or no culling: no deadline
    assert cull_deadline(None, GPU_STATE, 3600, 900) is None
    assert cull_deadline(NOW, GPU_STATE, 3600, 0) is None


def gpu(host: str, state: str, lease_id=None) -> dict:
    return {"host": host, "state": state, "lease_id": lease_id}


def test_free_per_profile_counts_one_host_at_a_time():
    profiles = load_profiles([
        {"slug": "cpu", "display_name": "CPU", "image": "i", "gpus": 0},
        {"slug": "one", "display_name": "One GPU", "image": "i", "gpus": 1},
        {"slug": "two", "display_name": "Two GPUs", "image": "i", "gpus": 2},
    ])
    gpus = [gpu("a", "free"), gpu("a", "lent", 1), gpu("b", "free"), gpu("b", "drained")]
    rows = free_per_profile(gpus, profiles)
    # two GPUs are free, but on two hosts: a 2-GPU server cannot start now
    assert [(r["slug"], r["available"]) for r in rows] == [("one", True), ("two", False)]
    assert free_per_profile([], profiles)[0]["available"] is False


def lease(server: str, ended: datetime | None, reason: str | None, lease_id: int = 1) -> Lease:
    return Lease(id=lease_id, user="pat", server_name=server, host="h", gpu_uuids=("GPU-a",), groups=(),
                 started_at=NOW - timedelta(hours=2), ended_at=ended, end_reason=reason)


def test_an_ended_lease_is_told_for_an_hour_and_only_for_its_server():
    history = [lease("", NOW - timedelta(minutes=5), "admin", 1),
               lease("other", NOW - timedelta(minutes=1), "stopped", 2)]
    assert ended_part(history, "", NOW) == {"id": 1, "ended_at": "2026-12-01T11:55:00+00:00", "reason": "admin",
                                            "by_admin": True}
    assert ended_part(history, "other", NOW)["by_admin"] is False
    assert ended_part(history, "", NOW + ENDED_NOTICE) is None
    assert ended_part([lease("", None, None)], "", NOW) is None


def test_free_per_profile_counts_the_gpus_each_profile_may_be_lent():
    profiles = load_profiles([
        {"slug": "any", "display_name": "Any GPU", "image": "i", "gpus": 1},
        {"slug": "a100", "display_name": "A100", "image": "i", "gpus": 1, "node_labels": {"gpu.model": "a100"}},
    ])
    gpus = [gpu("a", "free"), gpu("a", "free"), gpu("b", "free"), gpu("b", "lent", 1)]
    labels = {"a": {"gpu.model": "t4"}, "b": {"gpu.model": "a100"}}

    def hosts_matching(wanted):
        return [h for h, have in labels.items() if all(have.get(k) == v for k, v in wanted.items())]

    rows = {r["slug"]: r for r in free_per_profile(gpus, profiles, hosts_matching)}
    assert (rows["any"]["free"], rows["any"]["available"]) == (3, True)
    assert (rows["a100"]["free"], rows["a100"]["available"]) == (1, True)
    gpus[2] = gpu("b", "lent", 2)  # the a100 node's last free GPU lent: none left for that profile
    rows = {r["slug"]: r for r in free_per_profile(gpus, profiles, hosts_matching)}
    assert (rows["a100"]["free"], rows["a100"]["available"]) == (0, False) and rows["any"]["free"] == 2


def test_the_hub_tells_the_service_its_spawners_profiles_for_the_lab_panel():
    import json

    from traitlets.config import Config

    from spawner.poolpage.service_config import PoolPageSettings
    from spawner.settings.service_file import render_service_config

    c = Config()
    c.GPUDockerSpawner.profiles = [{"slug": "only", "display_name": "Only", "image": "i", "gpus": 1}]

    class _Settings:
        jobs = False
        cull = True
        activity_interval = 0

    written = json.loads(render_service_config(c, _Settings()))
    page = PoolPageSettings(config=Config(written))
    assert [p["slug"] for p in page.profiles] == ["only"]
