"""`gpu-pool agent`: the per-node GPU agent that reports each GPU's utilisation and memory in use
to the ledger.

On Swarm the hub cannot read NVML on other nodes.  This small loop runs on each
GPU node (a Swarm global service), reads the node's GPUs through the usual
inventory classes, and writes one reading per GPU to the ledger every interval;
the hub's SwarmInventory and the idle culler read them back (pool/hosts/readings.py).
"""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Callable

from ..inventory.machine import Inventory, InventoryError
from ..pool import PoolError, PoolUnavailable

log = logging.getLogger("gpu-pool.agent")


class Agent:
    """Reads `inventory` and records its readings in `pool` every `interval` seconds until stopped."""

    def __init__(self, pool, inventory: Inventory, interval: float, logger: logging.Logger | None = None):
        if not interval > 0:
            raise ValueError("the agent's interval must be > 0 seconds")
        self.pool = pool
        self.inventory = inventory
        self.interval = interval
        self.log = logger or log
        self.stopping = threading.Event()
        self._failing = False  # log an outage once, and its end

    def sample(self) -> tuple[dict[str, dict], str | None]:
        """({uuid: {"utilization": % or None, "memory_used_mib": MiB or None}}, the driver's CUDA
        version) of this node's GPUs."""
        units = self.inventory.gpus()
        cuda = self.inventory.cuda_driver_version()
        readings = {}
        for gpu in units:
            reading = {}
            for key, read in (("utilization", self.inventory.utilization),
                              ("memory_used_mib", self.inventory.memory_used_mib)):
                try:
                    reading[key] = read(gpu.uuid)
                except Exception as exc:  # one GPU in error: unknown, the others still count
                    self.log.warning("Cannot read the %s of GPU %s: %s", key.replace("_", " "), gpu.uuid, exc)
                    reading[key] = None
            readings[gpu.uuid] = reading
        return readings, (f"{cuda[0]}.{cuda[1]}" if cuda else None)

    def run_once(self) -> bool:
        """One reading written to the ledger; False (logged, never raised) when that failed."""
        try:
            readings, cuda = self.sample()
            self.pool.record_readings(self.inventory.host, readings, cuda)
        except PoolUnavailable as exc:  # its message never holds the password
            level = logging.DEBUG if self._failing else logging.WARNING
            self.log.log(level, "The GPU ledger is unreachable (retrying every %g s): %s", self.interval, exc)
            self._failing = True
            return False
        except (InventoryError, PoolError) as exc:
            self.log.error("Cannot report this node's GPUs (retrying every %g s): %s", self.interval, exc)
            self._failing = True
            return False
        if self._failing:
            self.log.info("Reporting %d GPU(s) of %s to the ledger again", len(readings), self.inventory.host)
        self._failing = False
        return True

    def run(self) -> None:
        """Report every `interval` seconds until `stop()` (or SIGTERM through `stop_on_signals`)."""
        self.log.info("Reporting the GPUs of %s to %s every %g s", self.inventory.host,
                      getattr(self.pool, "safe_url", "the ledger"), self.interval)
        while not self.stopping.is_set():
            self.run_once()
            self.stopping.wait(self.interval)
        self.log.info("Stopped")

    def stop(self, *_args) -> None:
        self.stopping.set()

    def stop_on_signals(self, install: Callable = signal.signal) -> None:
        """SIGTERM (docker stop, a Swarm update) and SIGINT end the loop after the current reading."""
        for sig in (signal.SIGTERM, signal.SIGINT):
            install(sig, self.stop)
