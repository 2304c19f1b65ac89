"""The Docker engine: one host's dockerd runs each server as a container with device requests.

    spawner    GPUDockerSpawner (`gpu-docker`)

Its jobs are containers on the same dockerd (engines/common/job_containers.py), its reconcile
pass the containers' (engines/common/reconcile_containers.py), its host's rules
engines/common/firewall.py: the Swarm engine builds on the first two.
"""

from ..common.job_containers import DockerJobEngine
from ..common.record import Engine
from .spawner import GPUDockerSpawner

ENGINE = Engine(name="docker", entry_point="gpu-docker", spawner_class=GPUDockerSpawner,
                job_engine=DockerJobEngine, inventory_kind=None, spans_nodes=False)

__all__ = ["ENGINE", "GPUDockerSpawner"]
