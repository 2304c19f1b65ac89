"""`Engine`: what one engine brings to the rest of the hub, in one record (engines/__init__.py
looks them up by name)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .container_spawner import GPUContainerSpawner


@dataclass(frozen=True)
class Engine:
    """What one engine brings to the rest of the hub."""

    name: str
    # c.JupyterHub.spawner_class: the entry point's name, and the class it names.
    entry_point: str
    spawner_class: type[GPUContainerSpawner]
    # The jobs runner's units on this engine: job_engine(JobSettings, docker_api=None).
    job_engine: Callable[..., Any]
    # The inventory this engine lends from, whatever GPUHUB_INVENTORY says (Swarm: its nodes'
    # labels), or None: the host's own (nvml, static, simulated).
    inventory_kind: str | None
    # Its servers and jobs may run on any node, not only the hub's host.
    spans_nodes: bool

    @property
    def reconcile_pass(self) -> Callable[..., Any]:
        """The reconciler's pass of this engine (the spawner class's `reconcile_pass`)."""
        return self.spawner_class.reconcile_pass
