"""Every kind of GPU inventory by name, and the factory the hub and the CLI build one with.

Kept apart from inventory.py (the kinds of one machine) so that the Swarm
inventory, which builds on those, is one more entry here, not an import circle.
"""

from __future__ import annotations

from typing import Any

from .machine import Inventory, NVMLInventory, SimulatedInventory, StaticInventory
from .swarm import SwarmInventory

INVENTORY_KINDS = {
    "nvml": NVMLInventory,
    "static": StaticInventory,
    "simulated": SimulatedInventory,
    "swarm": SwarmInventory,
}


def inventory_from_config(kind: str, config=None, parent=None) -> Inventory:
    """Build the inventory named `kind` ("nvml", "static", "simulated" or "swarm").

    Its options come from `config` (c.NVMLInventory / c.StaticInventory /
    c.SimulatedInventory sections, plus c.Inventory.host) or from `parent`'s config.
    """
    if kind not in INVENTORY_KINDS:
        raise ValueError(f"unknown GPU inventory {kind!r}; choose one of {', '.join(sorted(INVENTORY_KINDS))}")
    cls = INVENTORY_KINDS[kind]
    kwargs: dict[str, Any] = {}
    if config is not None:
        kwargs["config"] = config
    if parent is not None:
        kwargs["parent"] = parent
    return cls(**kwargs)
