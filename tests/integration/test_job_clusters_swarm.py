"""A cluster job across the harness Swarm's two GPU nodes (run under the machine's Swarm lock).

The jobs runner with the Swarm engine (spawner/engines/swarm/job_services.py) and a ledger filled from the
Swarm's inventory: a cluster of 2 workers x 2 GPUs cannot fit one node (2 GPUs each), so the
gang spans both; each worker's task runs on its lease's node, its runtime sees exactly that
lease's GPUs, and the workers reach each other by the names in TF_CONFIG on the cluster's
internal overlay.
"""

from __future__ import annotations

import asyncio
import json
import secrets

import pytest

from devservices.waiting import async_until, until
from spawner.engines.swarm.job_services import SwarmJobEngine
from spawner.inventory.swarm import SwarmInventory
from spawner.jobs.request import check_submission
from spawner.jobs.runner import JobRunner
from spawner.jobs.runner_settings import JobSettings
from spawner.pool import GPUPool
from tests.fixtures.swarm import docker

pytestmark = pytest.mark.integration

# Each worker says what it was given, waits until its peer's name resolves on the cluster's
# network, then (the chief) holds on a few seconds so that the test can look at both.
COMMAND = ('echo "gpus=$NVIDIA_VISIBLE_DEVICES tf_config=$TF_CONFIG"; '
           'peer=${PREFIX_NAME}-w$((1 - GPUHUB_JOB_WORKER)); '
           'until getent hosts "$peer"; do sleep 0.5; done; echo "reached $peer"; sleep 15')


def swarm_runner(swarm_cluster, image: str, tmp_path, **settings) -> tuple[str, GPUPool, JobRunner]:
    """A jobs runner on the harness Swarm (its own prefix, a 2-GPU profile, homes on the
    harness's shared directory) with a ledger filled from the Swarm's inventory."""
    prefix = f"gpuhub-t{secrets.token_hex(3)}"
    homes = str(swarm_cluster.homes_root)
    job_settings = JobSettings(
        engine="swarm", prefix=prefix, host="",
        profiles=[{"slug": "tf-gpu-2", "display_name": "2 GPUs", "image": image, "gpus": 2, "cpu_limit": 0.5}],
        home_volume=f"{prefix}-home-{{username}}",
        home_volume_driver_options={"type": "none", "o": "bind", "device": f"{homes}/{{username}}"},
        home_root_volume_options={"type": "none", "o": "bind", "device": homes},
        cpu_constraints=[f"node.labels.gpuhub.test-session=={swarm_cluster.session}"], **settings)
    # Only this session's nodes: the manager may hold another checkout's test Swarm too.
    inventory = SwarmInventory(lending_node_labels={"gpuhub.test-session": swarm_cluster.session})
    pool = GPUPool(inventory=inventory, db_url=f"sqlite:///{tmp_path / 'ledger.sqlite'}", poll_interval=0.1)
    pool.sync_inventory()
    return prefix, pool, JobRunner(pool, job_settings, SwarmJobEngine(job_settings))


def clean_up(prefix: str, pool: GPUPool) -> None:
    for service in docker("service", "ls", "-q", "--filter", f"name={prefix}-", check=False).split():
        docker("service", "rm", service, check=False)
    for net in docker("network", "ls", "-q", "--filter", f"name={prefix}-", check=False).split():
        docker("network", "rm", net, check=False)
    pool.close()


def test_a_cluster_spans_both_swarm_nodes_each_worker_on_its_own_leased_gpus(swarm_cluster, notebook_image,
                                                                             tmp_path):
    prefix, pool, runner = swarm_runner(swarm_cluster, notebook_image, tmp_path)
    nodes = {n.hostname for n in swarm_cluster.nodes}

    async def scenario():
        body = {"profile": "tf-gpu-2", "workers": 2,
                "command": ["sh", "-c", COMMAND.replace("${PREFIX_NAME}", f"{prefix}-job-$GPUHUB_JOB_ID")]}
        sub = check_submission(body, list(runner.profiles.values()), (), 600, runner.limits.max_workers)
        job = await runner.submit("pat", (), None, sub)
        seen = {}

        async def ended():
            # While it runs, note what each worker's runtime was given; done once it has ended.
            current = await runner.call(runner.ledger.get, job.id)
            if current.state == "running" and len(seen) < 2:
                for unit in current.units:
                    found = swarm_cluster.task_container(f"{prefix}-job-{job.id}-w{unit['worker']}")
                    if found:
                        node, cid = found
                        record = node.visible_devices().get(cid)
                        if record:
                            seen[unit["worker"]] = (node.hostname, record, unit)
            return None if current.active else current

        current = await async_until(ended, timeout=300, interval=0.5, what="the cluster to end")
        return current, seen, await runner.call(runner.ledger.log, job.id)

    try:
        job, seen, log = asyncio.run(scenario())
        assert job.state == "succeeded", (job, log)
        # The gang spanned both nodes: one worker (and its 2 GPUs) on each.
        assert {u["host"] for u in job.units} == nodes, job.units
        assert len(seen) == 2, seen
        for index, (node, visible, unit) in seen.items():
            assert node == unit["host"] and visible == ",".join(unit["gpus"])
            assert f"[worker {index}] gpus={','.join(unit['gpus'])}" in log
            config = json.loads(log.split(f"[worker {index}] gpus={','.join(unit['gpus'])} tf_config=", 1)[1]
                                .splitlines()[0])
            assert config["task"] == {"type": "worker", "index": index}
            assert config["cluster"]["worker"] == [f"{prefix}-job-{job.id}-w{i}:2222" for i in (0, 1)]
        assert "[worker 0] reached" in log and "[worker 1] reached" in log  # by name, across nodes
        history = [l for l in pool.history() if l.server_name.startswith(f"job/{job.id}/worker-")]
        assert len(history) == 2 and {l.end_reason for l in history} == {"job-finished"} and not pool.leases()
        assert not docker("service", "ls", "-q", "--filter", f"name={prefix}-job-", check=False).split()
        assert not docker("network", "ls", "-q", "--filter", f"name={prefix}-job-", check=False).split()
    finally:
        clean_up(prefix, pool)


TWO_GPUS = """
c.GPUDockerSpawner.profiles.append({"slug": "tf-gpu-2", "display_name": "2 GPUs", "image": %r, "gpus": 2})
"""


def test_a_two_worker_cluster_trains_one_epoch_across_both_nodes_through_a_swarm_hub(
        make_swarm_hub, swarm_cluster, mkl_image):

    from .test_jobs import jobs_api, submit, wait_state
    from .test_poolpage import wait_for_page
    from .test_swarm import profiles_config

    swarm_cluster.load_image(mkl_image)  # the workers' image, on every node
    hub = make_swarm_hub(profiles_config(mkl_image) + TWO_GPUS % mkl_image, env={"GPUHUB_POOL_PAGE": "true"})
    hub.create_user("pat")
    token = hub.user_token("pat")
    wait_for_page(hub, token)
    # 2 workers x 2 GPUs cannot fit one node (2 GPUs each): the gang spans both.
    command = ["sh", "-c", 'echo "gpus=$NVIDIA_VISIBLE_DEVICES"; exec python '
               "/opt/gpuhub/skel/tensorflow-examples/train.py --strategy multiworker --epochs 1 "
               "--model_path model-2w.keras"]
    j = submit(hub, token, {"profile": "tf-gpu-2", "command": command, "workers": 2})
    done = wait_state(hub, token, j["id"], ("succeeded", "failed"), timeout=900)
    log = jobs_api(hub, "GET", f"/{j['id']}/logs", token).text
    assert done["state"] == "succeeded", (done, log[-3000:])
    nodes = {n.hostname: n for n in swarm_cluster.nodes}
    assert {u["host"] for u in done["units"]} == set(nodes), done["units"]
    for unit in done["units"]:
        assert set(unit["gpus"]) <= set(nodes[unit["host"]].gpus)
        assert f"[worker {unit['worker']}] gpus={','.join(unit['gpus'])}" in log
    assert "[worker 0] test accuracy" in log and "model saved to" in log
    assert "[worker 1] test accuracy" in log and "leaves the model to the chief" in log
    assert hub.ledger().leases() == []
    # The lease contract: a job reads as ended only once its units are gone.
    assert not docker("service", "ls", "-q", "--filter", f"name={hub.prefix}-job-{j['id']}-")
    # The chief's model is in the user's home on the shared storage, where every node sees it.
    assert (swarm_cluster.homes_root / "pat" / "model-2w.keras").is_file()


def test_a_cluster_whose_workers_node_goes_quiet_ends_after_the_grace_and_its_lease_waits_for_the_node(
        swarm_cluster, notebook_image, tmp_path):
    from spawner.jobs.reconcile import reconcile_jobs

    prefix, pool, runner = swarm_runner(swarm_cluster, notebook_image, tmp_path, node_down_grace=5.0)
    by_host = {n.hostname: n for n in swarm_cluster.nodes}
    paused: list = []  # the node whose dockerd the test froze, once it has

    def node_state(node) -> str:
        return docker("node", "inspect", "-f", "{{.Status.State}} {{.Spec.Availability}} {{.Status.Message}}",
                      node.node_id, check=False).strip()

    def swarm_state(job_id: int) -> str:
        """What the wait logs: each node's Swarm state and each worker's tasks."""
        nodes = "; ".join(f"{host}: {node_state(node)}" for host, node in sorted(by_host.items()))
        tasks = [docker("service", "ps", "--no-trunc", "--format",
                        "{{.Name}} on {{.Node}}: {{.CurrentState}} (desired {{.DesiredState}}) {{.Error}}",
                        f"{prefix}-job-{job_id}-w{i}", check=False).strip() or f"w{i}: no service"
                 for i in (0, 1)]
        return f"nodes: {nodes}\nunits:\n  " + "\n  ".join(tasks)

    def logged(job_id: int, what: str, every: float = 5.0):
        """A wait's explanation, also logged every `every` s while it waits."""
        last = [0.0]

        def log_now() -> None:
            now = asyncio.get_running_loop().time()
            if now - last[0] >= every:
                last[0] = now
                print(f"[{what}] {swarm_state(job_id)}", flush=True)
        return log_now

    async def scenario():
        # 2 workers x 2 GPUs: one on each node; both just sleep.
        sub = check_submission({"profile": "tf-gpu-2", "workers": 2, "command": ["sleep", "600"]},
                               list(runner.profiles.values()), (), 900, runner.limits.max_workers)
        job = await runner.submit("pat", (), None, sub)
        log_running = logged(job.id, "both workers running")

        async def running():
            log_running()
            current = await runner.call(runner.ledger.get, job.id)
            return current if current.state == "running" and all(
                swarm_cluster.task_container(f"{prefix}-job-{job.id}-w{u['worker']}") for u in current.units) else None

        current = await async_until(running, 300, "both workers running", interval=0.5,
                                    explain=lambda: swarm_state(job.id))
        quiet_unit = next(u for u in current.units if u["worker"] == 1)
        victim = by_host[quiet_unit["host"]]
        docker("pause", victim.container)  # its dockerd frozen: no heartbeats, its task still there
        paused.append(victim)
        log_ended = logged(job.id, "the cluster to end")

        async def ended():
            log_ended()
            found = await runner.call(runner.ledger.get, job.id)
            return found if not found.active else None

        done = await async_until(ended, 180, "the cluster to end after its worker's node went quiet",
                                 interval=0.5, explain=lambda: swarm_state(job.id))
        # Worker 0's lease ended with the cluster; worker 1's is kept while its node is quiet.
        return done, {lease.id for lease in pool.leases()}, quiet_unit, victim

    try:
        try:
            job, active, quiet_unit, victim = asyncio.run(scenario())
            assert job.state == "failed", job
            assert job.message.startswith(f"worker 1's node {victim.hostname} has not answered"), job.message
            chief_lease = next(u["lease_id"] for u in job.units if u["worker"] == 0)
            assert chief_lease not in active and quiet_unit["lease_id"] in active
            [chief_history] = [lease for lease in pool.history() if lease.id == chief_lease]
            assert chief_history.end_reason == "job-failed"
            assert "would not stop" in pool.lease(quiet_unit["lease_id"]).problem
            # No GPU of the quiet node is lendable meanwhile: its worker's lease holds them.
            assert set(pool.lease(quiet_unit["lease_id"]).gpu_uuids) == set(quiet_unit["gpus"])
        finally:
            for node in paused:  # whatever failed, the node runs again for the tests after this one
                docker("unpause", node.container, check=False)
        until(lambda: node_state(victim).startswith("ready"), timeout=90, what=f"node {victim.hostname} back",
              interval=1, explain=lambda: swarm_state(job.id))

        # Back: the job reconciler removes the worker's task there, and only then ends its lease.
        def settled():
            asyncio.run(reconcile_jobs(runner, 0))
            return not pool.leases()
        until(settled, timeout=120, what="the quiet worker's lease ended once its node confirmed", interval=2,
              explain=lambda: swarm_state(job.id))
        [quiet_history] = [lease for lease in pool.history() if lease.id == quiet_unit["lease_id"]]
        assert quiet_history.end_reason == "job-failed"
        assert not victim.docker("ps", "-q", "--filter", f"name={prefix}-job-{job.id}-w1", check=False).split()
    finally:
        clean_up(prefix, pool)
