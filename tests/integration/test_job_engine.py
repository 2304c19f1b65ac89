"""The jobs' engine boundary on the real dockerd: units of one job on a network of their own.

What a cluster job (several containers of one job) is built on: each unit locked down as a
server is, reaching the other by its alias on the job's internal network, its exit code and
log read back, stopped, listed for the reconciler, removed.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets

from spawner.engines.common.job_containers import DockerJobEngine
from spawner.engines.common.labels import LABEL_JOB, LABEL_POOL
from spawner.jobs.engine import ENDED, RUNNING, JobEngine, UnitSpec
from spawner.jobs.runner_settings import JobSettings


def _unit(tag: str, name: str, command: list[str], network: str, aliases=()) -> UnitSpec:
    return UnitSpec(name=f"gpuhub-je{tag}-{name}", image="", command=command, user="1000:100", env={"A": "1"},
                    labels={LABEL_JOB: "1", LABEL_POOL: f"pool-{tag}"}, working_dir="/", volumes={},
                    network=network, aliases=tuple(aliases))


def test_two_units_of_one_job_talk_on_its_network_and_are_read_stopped_and_removed(docker_client, base_image):
    tag = secrets.token_hex(3)
    engine = DockerJobEngine(JobSettings(prefix=f"gpuhub-je{tag}"))
    assert isinstance(engine, JobEngine)
    network = f"gpuhub-je{tag}-net"

    async def scenario():
        await engine.create_network(network, {LABEL_POOL: f"pool-{tag}"})
        await engine.create_network(network, {})  # again: nothing new
        server = _unit(tag, "ps", ["sleep", "300"], network, aliases=["ps-0"])
        worker = _unit(tag, "worker", ["sh", "-c", "getent hosts ps-0 && echo reached; exit 3"], network)
        for unit in (server, worker):
            await engine.create(UnitSpec(**{**unit.__dict__, "image": base_image}))
        ended = await engine.wait(worker.name, 60)
        running = await engine.inspect(server.name)
        log = (await engine.logs(worker.name, 64)).decode()
        listed = {u.name: u.phase for u in await engine.units(f"pool-{tag}")}
        stopped = await engine.stop(server.name, 1)
        after = await engine.inspect(server.name)
        removed = [await engine.remove(u.name) for u in (server, worker)]
        gone = await engine.inspect(server.name)
        return ended, running, log, listed, stopped, after, removed, gone

    try:
        ended, running, log, listed, stopped, after, removed, gone = asyncio.run(scenario())
        assert ended.phase == ENDED and ended.exit_code == 3
        assert "reached" in log  # the worker found the server by its alias
        assert running.phase == RUNNING
        assert listed == {f"gpuhub-je{tag}-ps": RUNNING, f"gpuhub-je{tag}-worker": ENDED}
        assert stopped and after.phase == ENDED and all(removed) and gone is None
        [net] = docker_client.networks.list(names=[network])
        assert net.attrs["Internal"]  # no route out of the job's own network
    finally:
        for name in ("ps", "worker"):
            with contextlib.suppress(Exception):
                docker_client.containers.get(f"gpuhub-je{tag}-{name}").remove(force=True)
        asyncio.run(engine.remove_network(network))
    assert not docker_client.networks.list(names=[network])


def test_a_unit_is_locked_down_whatever_its_spec(docker_client, base_image):
    tag = secrets.token_hex(3)
    engine = DockerJobEngine(JobSettings(prefix=f"gpuhub-je{tag}", container_limits={"pids_limit": 99}))
    unit = UnitSpec(name=f"gpuhub-je{tag}-one", image=base_image, command=["sleep", "30"], user="1000:100",
                    env={}, labels={}, working_dir="/", volumes={})
    try:
        asyncio.run(engine.create(unit))
        host = docker_client.containers.get(unit.name).attrs["HostConfig"]
        assert host["SecurityOpt"] == ["no-new-privileges"] and host["CapDrop"] == ["ALL"]
        assert host["PidsLimit"] == 99 and host["NetworkMode"] == "none" and host["Runtime"] == "runc"
        assert not host["Privileged"]
    finally:
        asyncio.run(engine.remove(unit.name))
