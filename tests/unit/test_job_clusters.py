"""Cluster jobs without services: each worker's container, TF_CONFIG, merged logs, the form."""

from __future__ import annotations

import json

import pytest

from spawner.engines.common.job_containers import DockerJobEngine
from spawner.engines.common.labels import LABEL_GPUS, LABEL_JOB, LABEL_LEASE, LABEL_SERVER
from spawner.jobs.cluster import merge_logs, tf_config, units_of, worker_log
from spawner.jobs.group import group_of
from spawner.jobs.request import BadJob
from spawner.jobs.runner_settings import JobSettings
from spawner.pool.ledger.job_records import job_id_of
from spawner.pool.models import Lease
from spawner.poolpage.handlers.jobs import form_body

from .test_jobs import PROFILES, _job


def worker_specs(job, profile, settings, home_volume, pool_id):
    """The cluster's units' specs, each worker on its lease's host (as the runner makes them)."""
    return group_of(job, settings, DockerJobEngine(settings)).specs(profile, home_volume, pool_id,
                                                                    [u["host"] for u in job.units])


def test_every_worker_gets_its_own_gpus_and_a_tf_config_naming_all_by_stable_names():
    settings = JobSettings(prefix="gpuhub", host="node1")
    profile = next(p for p in PROFILES if p.slug == "tf-gpu-1")
    leases = [Lease(20 + i, "pat", f"job/12/worker-{i}", "node1", (f"GPU-{i}",), (), None) for i in range(2)]
    job = _job(workers=2, units=tuple(units_of(leases, 2, "node1")))
    specs = worker_specs(job, profile, settings, "gpuhub-home-pat", "ledger1")
    assert [s.name for s in specs] == ["gpuhub-job-12-w0", "gpuhub-job-12-w1"]
    for i, spec in enumerate(specs):
        assert spec.gpus == (f"GPU-{i}",) and spec.network == "gpuhub-job-12-net" and spec.aliases == (spec.name,)
        assert json.loads(spec.env["TF_CONFIG"]) == {
            "cluster": {"worker": ["gpuhub-job-12-w0:2222", "gpuhub-job-12-w1:2222"]},
            "task": {"type": "worker", "index": i}}
        assert spec.labels[LABEL_LEASE] == str(20 + i) and spec.labels[LABEL_GPUS] == f"GPU-{i}"
        assert spec.labels[LABEL_SERVER] == f"job/12/worker-{i}" and spec.labels[LABEL_JOB] == "12"
        assert (spec.env["GPUHUB_JOB_WORKER"], spec.env["GPUHUB_JOB_WORKERS"]) == (str(i), "2")
        assert spec.user == "5001:5000" and spec.volumes == {"gpuhub-home-pat": "/home/jovyan"}
        # The engine locks each worker down as any job's container, on the cluster's network only.
        create, host = DockerJobEngine(settings).create_args(spec)
        assert host["network_mode"] == "gpuhub-job-12-net" and host["cap_drop"] == ["ALL"]
        assert host["device_requests"][0]["DeviceIDs"] == [f"GPU-{i}"]


def test_a_profile_that_allows_jobs_a_network_keeps_each_worker_on_its_clusters_own_only():
    import dataclasses

    from spawner.engines.swarm.job_services import SwarmJobEngine

    settings = JobSettings(prefix="gpuhub", host="node1", network="gpuhub-net")
    profile = dataclasses.replace(next(p for p in PROFILES if p.slug == "tf-gpu-1"), job_network=True)
    leases = [Lease(20 + i, "pat", f"job/12/worker-{i}", "node1", (f"GPU-{i}",), (), None) for i in range(2)]
    job = _job(workers=2, units=tuple(units_of(leases, 2, "node1")))
    for spec in worker_specs(job, profile, settings, "gpuhub-home-pat", "ledger1"):
        # Its peers by name on the cluster's own network; never the hub's shared one, where any
        # user's server would reach its unauthenticated gRPC port.
        assert spec.network == "gpuhub-job-12-net"
        task = SwarmJobEngine(dataclasses.replace(settings, engine="swarm")).service_args(spec)["task_template"]
        assert [(n["Target"], n.get("Aliases")) for n in task["Networks"]] == [("gpuhub-job-12-net", [spec.name])]
        create, host = DockerJobEngine(settings).create_args(spec)
        assert host["network_mode"] == "gpuhub-job-12-net"


def test_tf_config_and_a_cpu_clusters_units():
    assert json.loads(tf_config(["a", "b", "c"], 2)) == {"cluster": {"worker": ["a:2222", "b:2222", "c:2222"]},
                                                         "task": {"type": "worker", "index": 2}}
    assert units_of(None, 2, "node1") == [{"worker": 0, "host": "node1", "lease_id": None, "gpus": []},
                                          {"worker": 1, "host": "node1", "lease_id": None, "gpus": []}]


def test_logs_are_merged_with_each_workers_mark():
    assert merge_logs([(0, "epoch 1\ndone\n"), (1, "epoch 1\n")]) == \
        "[worker 0] epoch 1\n[worker 0] done\n[worker 1] epoch 1\n"
    assert merge_logs([]) == ""


def test_an_ended_clusters_kept_log_gives_each_worker_its_own_lines_unmarked():
    # What ?worker=i shows once the workers' containers are gone: that worker's share of the kept log.
    kept = merge_logs([(0, "epoch 1\n[worker 1] printed by the chief\n"), (1, "epoch 1\nleaves the model\n")])
    assert worker_log(kept, 1) == "epoch 1\nleaves the model\n"
    assert worker_log(kept, 0) == "epoch 1\n[worker 1] printed by the chief\n"
    assert worker_log(kept, 2) == "" and worker_log("", 0) == ""


def test_a_job_id_is_read_from_a_plain_or_a_worker_lease_name():
    assert job_id_of("job/12") == 12 and job_id_of("job/12/worker-3") == 12
    assert job_id_of("") is None and job_id_of("job/x") is None and job_id_of("gpu") is None
    assert _job(workers=2, units=({"worker": 0, "lease_id": 4}, {"worker": 1, "lease_id": 5})).lease_ids == (4, 5)
    assert _job().lease_ids == (7,) and _job(lease_id=None).lease_ids == ()


def test_the_page_form_becomes_a_rest_body():
    fields = {"profile": "tf-gpu-1", "command": "python train.py --note 'two words'", "workers": "2",
              "workdir": "tensorflow-examples", "timeout": ""}
    assert form_body(fields.get) == {"profile": "tf-gpu-1", "command": ["python", "train.py", "--note", "two words"],
                                     "workers": 2, "workdir": "tensorflow-examples"}
    with pytest.raises(BadJob, match="'workers' must be a whole number"):
        form_body({**fields, "workers": "-1"}.get)
    with pytest.raises(BadJob, match="quotes"):
        form_body({**fields, "command": "python 'unclosed"}.get)


class _QuietEngine:
    """Worker 0 runs; worker 1's node goes quiet (Swarm: down) for the turns in `quiet_turns`."""

    def __init__(self, quiet_turns):
        from spawner.jobs.engine import RUNNING, UNKNOWN, UnitState

        self.turn, self.quiet_turns = 0, quiet_turns
        self.running = lambda name: UnitState(name, name, phase=RUNNING, node="gpu-a")
        self.quiet = lambda name: UnitState(name, name, phase=UNKNOWN, node="gpu-b",
                                            message="node gpu-b is down: its task may still run")

    async def wait(self, name, timeout):
        self.turn += 1
        return self.running(name)

    async def inspect(self, name):
        return self.quiet(name) if self.turn in self.quiet_turns else self.running(name)


def _watch(quiet_turns, grace, turns):
    import asyncio

    from spawner.pool.ledger.job_records import Job

    engine = _QuietEngine(quiet_turns)
    job = Job(id=7, user="pat", groups=(), profile="p", command=("true",), workdir="", timeout_s=60, host="",
              uid=1000, gid=100, state="running", lease_id=1, container=None, gpu_uuids=("G0", "G1"),
              exit_code=None, message=None, submitted_at=None, started_at=None, ended_at=None, workers=2,
              units=({"worker": 0, "lease_id": 1, "host": "gpu-a", "gpus": ["G0"]},
                     {"worker": 1, "lease_id": 2, "host": "gpu-b", "gpus": ["G1"]}))
    group = group_of(job, JobSettings(prefix="t"), engine)  # type: ignore[arg-type]  # only wait and inspect

    async def nothing_asked_back(names, ended):
        return False

    async def main():
        loop = asyncio.get_running_loop()
        # The deadline ends the watch after `turns` polls of 0.01 s if nothing else does.
        return await group.watch(loop.time() + turns * 0.01, 0.01, lambda: False, nothing_asked_back, grace)

    return asyncio.run(main())


def test_a_worker_whose_node_stays_quiet_past_the_grace_ends_the_cluster_naming_it():
    state, code, why = _watch(quiet_turns=range(2, 10**6), grace=0.05, turns=500)
    assert state == "failed" and code is None
    assert why.startswith("worker 1's node gpu-b has not answered for") and "node gpu-b is down" in why


def test_a_node_quiet_for_less_than_the_grace_lets_the_cluster_carry_on():
    # Quiet for two turns only, with a grace far longer than the whole watch: it times out instead.
    state, _, why = _watch(quiet_turns={3, 4}, grace=60.0, turns=30)
    assert state == "timed-out", why


def test_a_jobs_own_overlay_is_encrypted_when_the_servers_overlay_is():
    from spawner.engines.swarm.job_services import overlay_options

    assert overlay_options({"Options": {"encrypted": ""}}) == {"encrypted": ""}
    assert overlay_options({"Options": {}}) == {} and overlay_options({}) == {}
