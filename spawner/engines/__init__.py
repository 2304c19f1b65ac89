"""The engines that run users' servers and jobs, each behind one record, looked up by name.

    common/   what both engines stand on: the spawner base on dockerspawner, containers'
              hardening, homes, labels, readiness, the reconciler loop, jobs as containers,
              and the one adapter over docker-py's private parts
    docker/   one host's dockerd (`gpu-docker`)
    swarm/    the nodes of a Docker Swarm (`gpu-swarm`)

Whoever picks the engine (the hub's settings from GPUHUB_SPAWNER, the gpu-pool service from
the settings the hub hands over) calls `engine(name)` and hands each part what it needs: the
jobs runner gets its units' engine, the pool an inventory.  Nothing below the engines (the
inventory, the pool, the jobs package) imports one, and no engine imports its sibling
(tests/unit/test_layout.py).
"""

from __future__ import annotations

from .common.record import Engine

__all__ = ["ENGINE_NAMES", "Engine", "engine", "make_job_engine"]

ENGINE_NAMES = ("docker", "swarm")


def engine(name: str) -> Engine:
    """The engine called `name` ("docker" or "swarm"); ValueError for any other name."""
    if name == "docker":
        from .docker import ENGINE
    elif name == "swarm":
        from .swarm import ENGINE
    else:
        raise ValueError(f"unknown engine {name!r}; choose one of {', '.join(ENGINE_NAMES)}")
    return ENGINE


def make_job_engine(settings, docker_api=None):
    """The jobs runner's units' engine for JobSettings `settings` (its `engine` names one)."""
    return engine(settings.engine).job_engine(settings, docker_api)
