"""gpu-swarm's pure parts: what the manager's node and task answers mean, the settings, the profiles.

The node and task dicts have the shape of Docker 20.10's API answers (as
`docker node inspect` / `docker inspect TASK` print them); the real Swarm
runs in tests/integration/test_swarm.py.
"""

from __future__ import annotations

import pytest

from spawner.engines.swarm.tasks import task_holds, task_ip
from spawner.inventory.swarm import SwarmInventory, memory_mib, node_gpus, node_lends
from spawner.pool import GPUPool
from spawner.profiles import Profile, ProfileConfigError
from spawner.settings import SettingsError, load_settings


def node(host, uuids, state="ready", availability="active", labels=None, node_id=None):
    return {
        "ID": node_id or f"id-{host}",
        "Description": {"Hostname": host, "Resources": {"GenericResources": [
            {"NamedResourceSpec": {"Kind": "GPU", "Value": u}} for u in uuids] + [
            {"DiscreteResourceSpec": {"Kind": "SSD", "Value": 1}}]}},
        "Spec": {"Availability": availability, "Labels": labels or {}},
        "Status": {"State": state},
    }


class Manager:
    """The manager's node list, as data (docker.DockerClient().api.nodes())."""

    def __init__(self, nodes, tasks=()):
        self.nodes_list = nodes
        self.tasks_list = list(tasks)
        self.api = self

    def nodes(self):
        return self.nodes_list

    def tasks(self, filters=None):
        return self.tasks_list


def test_node_gpus_and_whether_a_node_lends():
    n = node("a", ["GPU-2", "GPU-1"])
    assert node_gpus(n) == ["GPU-1", "GPU-2"]
    assert node_lends(n)
    assert not node_lends(node("a", ["GPU-1"], availability="drain"))
    assert not node_lends(node("a", ["GPU-1"], availability="pause"))
    assert not node_lends(node("a", ["GPU-1"], state="down"))


@pytest.mark.parametrize("text, mib", [("80g", 81920), ("16G", 16384), ("40960m", 40960), ("24GiB", 24576),
                                       ("", 0), (None, 0), ("lots", 0)])
def test_memory_labels(text, mib):
    assert memory_mib(text) == mib


def test_inventory_lists_lending_nodes_and_speaks_for_the_others():
    manager = Manager([node("a", ["GPU-a0", "GPU-a1"], labels={"gpu.model": "a100", "gpu.memory": "80g"}),
                       node("b", ["GPU-b0"], availability="drain", labels={"gpu.model": "t4"}),
                       node("cpu", [])])
    inv = SwarmInventory(client=manager, cache_seconds=0)
    assert [(g.host, g.uuid, g.index, g.name, g.memory_mib) for g in inv.gpus()] == [
        ("a", "GPU-a0", 0, "a100", 81920), ("a", "GPU-a1", 1, "a100", 81920)]
    assert inv.hosts() == {"a", "b"}
    assert inv.hosts_matching({"gpu.model": "t4"}) == ["b"]
    assert inv.hosts_matching({}) == ["a", "b"]
    # A node that left the swarm is still spoken for: its GPUs go missing in the ledger.
    manager.nodes_list = manager.nodes_list[:1]
    assert inv.hosts() == {"a", "b"}


def test_two_nodes_with_one_name_lend_nothing():
    inv = SwarmInventory(client=Manager([node("a", ["GPU-1"], node_id="x"), node("a", ["GPU-2"], node_id="y")]),
                         cache_seconds=0)
    assert inv.gpus() == []


def test_pool_lends_any_node_and_marks_a_drained_nodes_gpus_missing(tmp_path):
    manager = Manager([node("a", ["GPU-a0"]), node("b", ["GPU-b0", "GPU-b1"])])
    pool = GPUPool(db_url=f"sqlite:///{tmp_path / 'l.sqlite'}",
                   inventory=SwarmInventory(client=manager, cache_seconds=0))
    first = pool.try_acquire("u1", "", 1)
    assert first.host == "a"  # best fit: the node with the fewest free GPUs
    manager.nodes_list[1] = node("b", ["GPU-b0", "GPU-b1"], availability="drain")
    pool.sync_inventory()
    assert {g.gpu.uuid: g.state for g in pool.gpus()} == {"GPU-a0": "lent", "GPU-b0": "missing",
                                                         "GPU-b1": "missing"}
    assert pool.try_acquire("u2", "", 1) is None
    # A request may be limited to several hosts (a profile's node labels).
    manager.nodes_list[1] = node("b", ["GPU-b0", "GPU-b1"])
    pool.sync_inventory()
    assert pool.try_acquire("u3", "", 1, host=["b"]).host == "b"
    pool.close()


def test_which_tasks_still_hold_their_gpus(monkeypatch):
    from spawner.engines.swarm import tasks

    clock = [1000.0]
    monkeypatch.setattr(tasks.time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(tasks, "DOWN_NODES", tasks.DownNodes(grace=300))
    running = {"Status": {"State": "running"}, "NodeID": "n1"}
    assert task_holds(running, {"n1": "ready"})
    assert task_holds({"Status": {"State": "pending"}}, {})
    assert not task_holds({"Status": {"State": "shutdown"}, "NodeID": "n1"}, {"n1": "ready"})
    assert not task_holds({"Status": {"State": "failed"}, "NodeID": "n1"}, {"n1": "ready"})
    # A node that went quiet may still run its task: it holds for the grace period, from when
    # this process first saw the node quiet, then counts as gone.
    tasks.DOWN_NODES.note({"n1": "down"})
    assert task_holds(running, {"n1": "down"})
    clock[0] += 299
    tasks.DOWN_NODES.note({"n1": "unknown"})  # still quiet: the grace counts from the first sight
    assert task_holds(running, {"n1": "unknown"}) and tasks.DOWN_NODES.quiet_for("n1") == 299
    clock[0] += 2
    assert not task_holds(running, {"n1": "down"})
    tasks.DOWN_NODES.note({"n1": "ready"})  # back: a later silence starts a new grace
    assert tasks.DOWN_NODES.quiet_for("n1") is None


def test_a_node_back_from_down_lends_a_gpu_only_once_its_stopped_task_has_stopped():
    from spawner.engines.common.labels import LABEL_GPUS

    def task(state, desired, gpus):
        return {"NodeID": "id-a", "Status": {"State": state}, "DesiredState": desired,
                "Spec": {"ContainerSpec": {"Labels": {LABEL_GPUS: gpus}}}}

    manager = Manager([node("a", ["GPU-a0", "GPU-a1", "GPU-a2"])],
                      tasks=[task("running", "shutdown", "GPU-a0"),  # told to stop, not yet stopped
                             task("running", "running", "GPU-a1"),  # a live server (its lease holds it)
                             task("complete", "shutdown", "GPU-a2")])  # stopped
    inv = SwarmInventory(client=manager, cache_seconds=0)
    assert [g.uuid for g in inv.gpus()] == ["GPU-a1", "GPU-a2"]
    manager.tasks_list[0]["Status"]["State"] = "shutdown"
    assert [g.uuid for g in inv.gpus()] == ["GPU-a0", "GPU-a1", "GPU-a2"]


def test_task_address_on_the_overlay():
    task = {"NetworksAttachments": [
        {"Network": {"ID": "i1", "Spec": {"Name": "ingress"}}, "Addresses": ["10.0.0.5/24"]},
        {"Network": {"ID": "i2", "Spec": {"Name": "hubnet"}}, "Addresses": ["10.0.1.7/24"]}]}
    assert task_ip(task, "hubnet") == "10.0.1.7"
    assert task_ip(task, "i2") == "10.0.1.7"
    assert task_ip(task, "other") is None


def test_swarm_settings_need_postgresql_and_the_hubs_overlay_address():
    with pytest.raises(SettingsError, match="PostgreSQL"):
        load_settings({"GPUHUB_SPAWNER": "swarm", "GPUHUB_HUB_CONNECT_IP": "10.0.1.2"})
    with pytest.raises(SettingsError, match="GPUHUB_HUB_CONNECT_IP"):
        load_settings({"GPUHUB_SPAWNER": "swarm", "GPUHUB_POOL_DB_URL": "postgresql+psycopg://u:p@db/gpupool"})
    with pytest.raises(SettingsError, match="GPUHUB_SWARM_HOME_OPTIONS"):
        load_settings({"GPUHUB_SWARM_HOME_OPTIONS": "[1]"})
    s = load_settings({"GPUHUB_SPAWNER": "swarm", "GPUHUB_POOL_DB_URL": "postgresql+psycopg://u:p@db/gpupool",
                       "GPUHUB_HUB_CONNECT_IP": "10.0.1.2",
                       "GPUHUB_SWARM_CPU_CONSTRAINTS": "node.role==worker, node.labels.cpu==true"})
    assert s.inventory == "swarm"
    assert s.swarm_cpu_constraints == ("node.role==worker", "node.labels.cpu==true")
    # Batch jobs run on Swarm too: on by default, as Swarm services of any GPU node.
    assert s.jobs is True
    assert not load_settings({"GPUHUB_SPAWNER": "swarm", "GPUHUB_POOL_DB_URL": "postgresql+psycopg://u:p@db/gpupool",
                              "GPUHUB_HUB_CONNECT_IP": "10.0.1.2", "GPUHUB_JOBS": "false"}).jobs


def test_jobs_on_swarm_get_the_swarm_engine_and_the_spawners_home_storage(tmp_path):
    from traitlets.config import Config

    from spawner.engines import make_job_engine
    from spawner.engines.swarm.job_services import SwarmJobEngine
    from spawner.settings import apply_settings
    from spawner.settings.pool_jobs import job_settings

    s = load_settings({"GPUHUB_SPAWNER": "swarm", "GPUHUB_POOL_DB_URL": "postgresql+psycopg://u:p@db/gpupool",
                       "GPUHUB_HUB_CONNECT_IP": "10.0.1.2", "GPUHUB_DATA_DIR": str(tmp_path),
                       "GPUHUB_SWARM_HOME_OPTIONS": '{"type": "nfs", "device": ":/homes/{username}"}',
                       "GPUHUB_SWARM_CPU_CONSTRAINTS": "node.role==worker"})
    c = Config()
    apply_settings(c, s)
    js = job_settings(c, s)
    assert js.engine == "swarm" and js.host == ""  # any node's GPUs
    assert js.home_volume_driver_options == {"type": "nfs", "device": ":/homes/{username}"}
    assert js.cpu_constraints == ["node.role==worker"]
    engine = make_job_engine(js)
    assert isinstance(engine, SwarmJobEngine)
    assert engine.home_volume_create_kwargs("ann") == {"driver": "local",
                                                        "driver_opts": {"type": "nfs", "device": ":/homes/ann"}}


def test_swarm_settings_choose_gpu_swarm():
    from traitlets.config import Config

    from spawner.settings import apply_settings

    c = Config()
    apply_settings(c, load_settings({
        "GPUHUB_SPAWNER": "swarm", "GPUHUB_POOL_DB_URL": "postgresql+psycopg://u:p@db/gpupool",
        "GPUHUB_HUB_CONNECT_IP": "10.0.1.2", "GPUHUB_AUTHENTICATOR": "dummy", "GPUHUB_DUMMY_PASSWORD": "x",
        "GPUHUB_CULL": "false", "GPUHUB_POOL_PAGE": "false",
        "GPUHUB_SWARM_HOME_OPTIONS": '{"type": "nfs", "o": "addr=10.0.0.5", "device": ":/homes/{username}"}'}))
    assert c.JupyterHub.spawner_class == "gpu-swarm"
    from importlib.metadata import entry_points

    from spawner.engines.swarm import GPUSwarmSpawner

    assert entry_points(group="jupyterhub.spawners")["gpu-swarm"].load() is GPUSwarmSpawner
    assert (c.JupyterHub.hub_ip, c.JupyterHub.hub_connect_ip) == ("0.0.0.0", "10.0.1.2")
    assert c.GPUSwarmSpawner.home_volume_driver_options["device"] == ":/homes/{username}"


def test_profile_node_labels():
    p = Profile.from_config({"slug": "a", "display_name": "A", "image": "i", "gpus": 1,
                             "node_labels": {"gpu.model": "a100"}})
    assert dict(p.node_labels) == {"gpu.model": "a100"}
    with pytest.raises(ProfileConfigError, match="node_labels"):
        Profile.from_config({"slug": "a", "display_name": "A", "image": "i", "node_labels": ["a100"]})


def test_spawn_form_counts_a_tagged_profiles_own_gpus():
    from spawner.profiles import options_form_html

    profiles = [Profile("any", "Any GPU", "i", gpus=1),
                Profile("a100", "A100", "i", gpus=1, node_labels=(("gpu.model", "a100"),))]
    html = options_form_html(profiles, "", {"free": 3, "lent": 1}, {"a100": {"free": 0, "lent": 2}})
    assert "1 GPU(s); 3 of 4 free now" in html
    assert "1 GPU(s); 0 of 2 free now" in html


def test_a_hub_lends_only_from_the_nodes_that_carry_its_labels(tmp_path):
    # One Swarm, two labs (or another workload): the other nodes are not in this hub's pool.
    from traitlets.config import Config

    from spawner.settings import apply_settings
    from spawner.settings.service_file import service_config

    manager = Manager([node("lab-a", ["GPU-a"], labels={"gpuhub.pool": "lab"}),
                       node("other", ["GPU-o"], labels={"gpuhub.pool": "physics"}),
                       node("bare", ["GPU-b"])])
    assert SwarmInventory(client=manager).hosts() == {"lab-a", "other", "bare"}
    env = {"GPUHUB_SPAWNER": "swarm", "GPUHUB_POOL_DB_URL": "postgresql+psycopg://u:p@db/gpupool",
           "GPUHUB_HUB_CONNECT_IP": "10.0.1.2", "GPUHUB_DATA_DIR": str(tmp_path),
           "GPUHUB_SWARM_NODE_LABELS": " gpuhub.pool = lab "}
    settings = load_settings(env)
    c = Config()
    apply_settings(c, settings)
    lab = SwarmInventory(client=manager, config=c)
    assert lab.hosts() == {"lab-a"} and [g.uuid for g in lab.gpus()] == ["GPU-a"]
    # The pool service's jobs lease from the same nodes as the hub's servers.
    handed = Config(service_config(c, settings))
    assert SwarmInventory(client=manager, config=handed).hosts() == {"lab-a"}
    # Unset writes nothing; a malformed value is refused, naming the setting.
    env.pop("GPUHUB_SWARM_NODE_LABELS")
    unset = Config()
    apply_settings(unset, load_settings(env))
    assert "SwarmInventory" not in unset
    with pytest.raises(SettingsError, match="GPUHUB_SWARM_NODE_LABELS"):
        load_settings({**env, "GPUHUB_SWARM_NODE_LABELS": "gpuhub.pool"})


def test_the_swarm_spawners_old_dotted_name_still_works_with_a_deprecation_warning():
    # The docs once said `spawner.swarm.GPUSwarmSpawner`: a hub config that names it keeps working.
    import importlib
    import sys
    import warnings

    from spawner.engines.swarm import GPUSwarmSpawner

    sys.modules.pop("spawner.swarm", None)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        old = importlib.import_module("spawner.swarm")
    assert old.GPUSwarmSpawner is GPUSwarmSpawner
    assert any(issubclass(w.category, DeprecationWarning) and "gpu-swarm" in str(w.message) for w in caught)
