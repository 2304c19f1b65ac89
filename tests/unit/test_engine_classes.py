"""The two engines' spawner classes: what they share, what each keeps, and one configuration.

`GPUDockerSpawner` and `GPUSwarmSpawner` both stand on
`engines.common.container_spawner.GPUContainerSpawner` with their own dockerspawner
class, so a Swarm server never runs a Docker-engine method (a container
create, a device request, a Docker `lease_holders`) that happens to sit
above SwarmSpawner's in the method order.  Deployments configure both as
`c.GPUDockerSpawner.*`: that section must keep reaching the Swarm spawner,
at the precedence it had when the Swarm spawner subclassed the Docker one.
"""

from __future__ import annotations

import copy
import inspect
import types

import pytest
from dockerspawner import DockerSpawner, SwarmSpawner
from traitlets.config import Config

from spawner.engines.common.container_spawner import GPUContainerSpawner
from spawner.engines.docker.spawner import GPUDockerSpawner
from spawner.engines.swarm import GPUSwarmSpawner
from spawner.lending import spawner as lending

pytestmark = pytest.mark.unit


def test_the_swarm_engine_inherits_none_of_the_docker_engine_s_own_methods():
    assert not issubclass(GPUSwarmSpawner, GPUDockerSpawner)
    assert [c.__name__ for c in GPUSwarmSpawner.__mro__ if c.__module__.startswith("spawner.engines.docker")] == []
    docker_only = {name: member for name, member in vars(GPUDockerSpawner).items() if not name.startswith("__")}
    # The Docker engine's own: a container made with device requests, its containers as holders.
    assert {"create_object", "lease_holders", "start_server", "reconcile_pass",
            "_remove_stale_container", "_our_container_config"} <= set(docker_only)
    for name, member in docker_only.items():
        assert inspect.getattr_static(GPUSwarmSpawner, name, None) is not member, name
    # Where the Swarm engine has none of its own, dockerspawner's SwarmSpawner answers.
    assert GPUSwarmSpawner.start_object is not DockerSpawner.start_object
    # remove_object is the Swarm engine's own (the service, then its relay: engines/swarm/relay.py), on SwarmSpawner's.
    assert inspect.getattr_static(GPUSwarmSpawner, "remove_object").__module__ == "spawner.engines.swarm.spawner"
    assert inspect.getattr_static(GPUSwarmSpawner, "remove_object") is not vars(DockerSpawner)["remove_object"]


def test_the_docker_engine_has_nothing_of_swarm():
    assert not issubclass(GPUDockerSpawner, SwarmSpawner)
    assert [c.__name__ for c in GPUDockerSpawner.__mro__ if c.__module__.startswith("spawner.engines.swarm")] == []


def test_both_engines_share_the_container_base_and_its_options():
    for engine in (GPUDockerSpawner, GPUSwarmSpawner):
        assert issubclass(engine, GPUContainerSpawner)
        assert {"home_volume_name", "home_mount_point", "shm_size", "home_volume_prep_image",
                "home_prep_timeout", "ssh_state_dir", "profiles"} <= set(engine.class_trait_names(config=True))
    # Each shared option is declared once, on the base.
    assert not GPUDockerSpawner.class_own_traits(config=True)


def _user(name="ann"):
    return types.SimpleNamespace(name=name, groups=[], url=f"/user/{name}/", id=1, settings={}, server=None)


@pytest.fixture
def config():
    c = Config()
    c.GPUPool.db_url = "postgresql+psycopg://hub@127.0.0.1:9/ledger"  # never connected to here
    yield c
    pool = lending._shared_pools.pop(id(c), None)
    if pool is not None:
        pool.close()


def make(engine, config):
    return engine(user=_user(), config=config, orm_spawner=types.SimpleNamespace(name="", server=None))


@pytest.mark.parametrize("engine", [GPUDockerSpawner, GPUSwarmSpawner])
def test_a_gpudockerspawner_setting_reaches_either_engine(config, engine):
    # As apply_settings writes them: shared options, dockerspawner's, the lending spawner's.
    config.GPUDockerSpawner.inventory_kind = "simulated"
    config.GPUDockerSpawner.home_volume_name = "team-home-{username}"
    config.GPUDockerSpawner.network_name = "gpuhub-net"
    config.GPUDockerSpawner.lease_wait_timeout = 42.0
    config.GPUDockerSpawner.ssh_state_dir = "/srv/ssh"
    spawner = make(engine, config)
    assert spawner.inventory_kind == "simulated"
    assert spawner.home_volume_name == "team-home-{username}"
    assert spawner.volumes == {"team-home-{username}": {"bind": "/home/jovyan", "mode": "rw"}}
    assert spawner.network_name == "gpuhub-net"
    assert spawner.lease_wait_timeout == 42.0
    assert spawner.ssh_state_dir == "/srv/ssh"


def test_the_swarm_spawner_s_own_section_wins_over_gpudockerspawner_s_which_wins_over_dockerspawner_s(config):
    config.GPUDockerSpawner.inventory_kind = "simulated"
    config.DockerSpawner.shm_size = "1g"
    config.SwarmSpawner.shm_size = "1g"
    config.GPUContainerSpawner.shm_size = "2g"
    config.GPUDockerSpawner.shm_size = "8g"
    config.GPUSwarmSpawner.shm_size = "4g"
    config.GPUDockerSpawner.prefix = "team"
    assert make(GPUSwarmSpawner, config).shm_size == "4g"
    assert make(GPUDockerSpawner, config).shm_size == "8g"
    assert make(GPUSwarmSpawner, config).prefix == "team"
    assert GPUSwarmSpawner.section_names()[-3:] == ["GPUContainerSpawner", "GPUDockerSpawner", "GPUSwarmSpawner"]


def test_a_config_set_after_the_spawner_was_made_still_reaches_it(config):
    # traitlets reloads a changed config through the same sections.
    config.GPUDockerSpawner.inventory_kind = "simulated"
    spawner = make(GPUSwarmSpawner, config)
    changed = copy.deepcopy(config)
    changed.GPUDockerSpawner.home_mount_point = "/home/user"
    spawner.config = changed
    assert spawner.home_mount_point == "/home/user"


@pytest.mark.parametrize("engine", [GPUDockerSpawner, GPUSwarmSpawner])
@pytest.mark.parametrize("escape, name, job_unit", [
    ("legacy", "job-5", "gpuhub-job-5"),  # legacy escaping keeps '-': job 5's container
    ("legacy", "job-5-w0", "gpuhub-job-5-w0"),  # a cluster's worker
    ("default", "job%", "gpuhub-job-25"),  # the default escape writes '%' as '-25'
])
def test_a_user_whose_server_would_take_a_jobs_container_name_is_refused_before_anything(
        config, engine, escape, name, job_unit):
    """Such a server would find job 5's container under its own name: DockerSpawner removes a
    leftover container of its name at start (and stops the container of its name at stop), so
    another user's job would be ended.  The start is refused first: no lease, no Docker call,
    and the spawner sees no container of that name."""
    import asyncio

    from tornado import web

    if escape == "legacy":
        config.GPUDockerSpawner.escape = escape
    config.GPUDockerSpawner.prefix = "gpuhub"
    spawner = engine(user=_user(name), config=config, orm_spawner=types.SimpleNamespace(name="", server=None))

    async def docker(*args, **kwargs):
        raise AssertionError(f"Docker was called: {args}")
    spawner.docker = docker
    with pytest.raises(web.HTTPError) as refused:
        asyncio.run(spawner.start())
    assert refused.value.status_code == 409
    assert refused.value.log_message.startswith(f"Your server's container would be named {job_unit}, ")
    assert "DockerSpawner.escape" in refused.value.log_message
    assert asyncio.run(spawner.get_object()) is None  # stop and poll never reach the job's unit


@pytest.mark.parametrize("escape, name", [("legacy", "job-x"), ("legacy", "jobs-5"), ("legacy", "JOB-5"),
                                          ("legacy", "job-5-net"), ("default", "job-5"), ("legacy", "ann"),
                                          ("default", "job")])
def test_other_names_are_not_the_jobs(config, escape, name):
    if escape == "legacy":
        config.GPUDockerSpawner.escape = escape
    config.GPUDockerSpawner.prefix = "gpuhub"
    spawner = GPUDockerSpawner(user=_user(name), config=config, orm_spawner=types.SimpleNamespace(name="", server=None))
    spawner.check_object_name()  # nothing raised
