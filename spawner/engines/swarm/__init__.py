"""The Swarm engine: one GPU pool across the nodes of a Docker Swarm.

    spawner       GPUSwarmSpawner (`gpu-swarm`): a server is a service pinned to its leased node
    job_services  SwarmJobEngine: the jobs runner's units as Swarm services
    tasks         reading Swarm's tasks: which still hold a lease, where a task can be reached
    reconcile     the reconciler's pass over every node
    relay         the relay that keeps servers on overlays of their own
    lockdown, generic_guard, homes, stopping: what a Swarm service needs that a container does not
"""

from ..common.record import Engine
from .job_services import SwarmJobEngine
from .spawner import GPUSwarmSpawner

ENGINE = Engine(name="swarm", entry_point="gpu-swarm", spawner_class=GPUSwarmSpawner,
                job_engine=SwarmJobEngine, inventory_kind="swarm", spans_nodes=True)

__all__ = ["ENGINE", "GPUSwarmSpawner"]
