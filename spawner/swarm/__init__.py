"""The Swarm engine: one GPU pool across the nodes of a Docker Swarm.

    spawner    GPUSwarmSpawner (`gpu-swarm`): a server is a service pinned to its leased node
    tasks      reading Swarm's tasks: which still hold a lease, where a task can be reached
    reconcile  the reconciler's pass over every node
"""

from .spawner import GPUSwarmSpawner

__all__ = ["GPUSwarmSpawner"]
