"""What GPUs a host or a Swarm node has: NVML, a static list, simulated, or read from Swarm.

    machine   the kinds of one machine (NVML, static, simulated) and what a GPU is
    swarm     every node of a Docker Swarm, from the manager
    kinds     every kind by name, and the factory the hub and the CLI build one with
    agent     `gpu-pool agent`: each node's utilisation, written to the ledger
"""

from .kinds import inventory_from_config
from .machine import (
    GPU,
    TOPOLOGY_HOSTBRIDGE,
    TOPOLOGY_INTERNAL,
    TOPOLOGY_MULTIPLE,
    TOPOLOGY_NODE,
    TOPOLOGY_SINGLE,
    TOPOLOGY_SYSTEM,
    Inventory,
    InventoryError,
    NVMLInventory,
    SimulatedInventory,
    StaticInventory,
    image_cuda_version,
    parse_cuda_version,
)

__all__ = [
    "GPU", "Inventory", "InventoryError", "NVMLInventory", "SimulatedInventory", "StaticInventory",
    "TOPOLOGY_HOSTBRIDGE", "TOPOLOGY_INTERNAL", "TOPOLOGY_MULTIPLE", "TOPOLOGY_NODE", "TOPOLOGY_SINGLE",
    "TOPOLOGY_SYSTEM", "image_cuda_version", "inventory_from_config", "parse_cuda_version",
]
