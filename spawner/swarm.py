"""Deprecated: the Swarm engine moved to `spawner.engines.swarm` (use `gpu-swarm`).

A hub config that names `spawner.swarm.GPUSwarmSpawner`, as the docs once did, keeps working
with a warning; `c.JupyterHub.spawner_class = "gpu-swarm"` names the same class.
"""

import warnings

from .engines.swarm import GPUSwarmSpawner

warnings.warn("spawner.swarm.GPUSwarmSpawner moved: set c.JupyterHub.spawner_class = 'gpu-swarm'",
              DeprecationWarning, stacklevel=2)

__all__ = ["GPUSwarmSpawner"]
