"""What GPUs a host has: from NVML, from a static list in the config, or simulated.

An inventory answers four questions about one Docker host: which GPUs may be
lent (`gpus()`), which CUDA version its driver supports (for the image
compatibility check), how busy a GPU is, and how close two GPUs are in the
PCIe/NVLink topology (so a multi-GPU lease gets GPUs that talk fast).

Every GPU is keyed by (host, uuid); the uuid is what Docker's device request
receives (`--gpus device=GPU-...` or `MIG-...`).  The pool (spawner.pool)
records the inventory in its ledger; the inventory itself keeps no state.

Kinds:

- ``nvml``: the real GPUs of the machine the hub runs on, read through NVML
  (the `nvidia-ml-py` distribution, imported as `pynvml`).  With MIG enabled
  on a GPU, its MIG instances are the leasable units.  A GPU NVML reports as
  lost, or whose queries fail, or that waits for a reset after memory errors,
  is left out.
- ``static``: a list of GPUs written in the config, for a Docker host the hub
  cannot query (remote daemon) or to pin exactly which GPUs are lent.
- ``simulated``: N fake GPUs, for the demo and the tests on machines without
  NVIDIA hardware.
"""

from __future__ import annotations

import hashlib
import json
import socket
import threading
from dataclasses import dataclass
from typing import Any

from traitlets import Dict, Int, List, TraitError, Unicode, default, validate
from traitlets.config import LoggingConfigurable

# NVML topology levels (nvmlGpuTopologyLevel_t): lower = closer.
TOPOLOGY_INTERNAL = 0  # same board (or MIG instances of one GPU)
TOPOLOGY_SINGLE = 10  # one PCIe switch between them
TOPOLOGY_MULTIPLE = 20  # several PCIe switches, no host bridge
TOPOLOGY_HOSTBRIDGE = 30  # the same host bridge
TOPOLOGY_NODE = 40  # the same NUMA node, different host bridges
TOPOLOGY_SYSTEM = 50  # across NUMA nodes (SMP interconnect)


@dataclass(frozen=True)
class GPU:
    """One leasable unit: a whole GPU, or a MIG instance of one."""

    host: str
    """Docker host the GPU is attached to."""
    uuid: str
    """NVML UUID ("GPU-..." or "MIG-..."); what Docker's device request gets."""
    index: int
    """NVML index on its host (for a MIG instance: its parent's index)."""
    name: str
    memory_mib: int
    parent_uuid: str | None = None
    """The parent GPU's uuid, for MIG instances."""
    pci_bus_id: str | None = None


class InventoryError(RuntimeError):
    """The inventory cannot be read (no NVML, bad static list)."""


class Inventory(LoggingConfigurable):
    """Base class: the GPUs of one Docker host."""

    host = Unicode(
        config=True,
        help="""Name of the Docker host these GPUs are attached to.

        The ledger keys every GPU by (host, uuid), so one database can serve
        hubs on several hosts.  Defaults to this machine's host name.
        """,
    )

    @default("host")
    def _default_host(self):
        # Computed per instance, not at import: the name is the machine's.
        return socket.gethostname()

    # True for an inventory of several hosts (a Swarm): requests may land on any of them.
    multi_host = False

    def gpus(self) -> list[GPU]:
        """Healthy, leasable units, ordered by index."""
        raise NotImplementedError

    def hosts(self) -> set[str]:
        """The hosts whose GPUs this inventory speaks for: their GPUs it no longer lists are missing."""
        return {self.host}

    def use_readings(self, readings) -> None:
        """Take the ledger's reader of the agents' GPU readings (`GPUPool.gpu_readings`).

        Only an inventory of other machines' GPUs (Swarm) uses it; one machine reads its own."""

    def forget_cache(self) -> None:
        """Drop what was read from elsewhere, so the next call reads it afresh (Swarm: the manager)."""

    def cuda_driver_version(self) -> tuple[int, int] | None:
        """Highest CUDA version the host's driver supports, e.g. (12, 4); None if unknown."""
        return None

    def utilization(self, uuid: str) -> float | None:
        """Current GPU utilization in percent (0-100); None if unknown."""
        return None

    def memory_used_mib(self, uuid: str) -> int | None:
        """GPU memory in use now, in MiB (of `GPU.memory_mib`); None if unknown."""
        return None

    def distance(self, uuid_a: str, uuid_b: str) -> int:
        """NVML topology level between two units: lower means closer (0 = same GPU)."""
        if uuid_a == uuid_b:
            return TOPOLOGY_INTERNAL
        by_uuid = {g.uuid: g for g in self.gpus()}
        a, b = by_uuid.get(uuid_a), by_uuid.get(uuid_b)
        if a and b and a.parent_uuid and a.parent_uuid == b.parent_uuid:
            return TOPOLOGY_INTERNAL
        return TOPOLOGY_SYSTEM


def parse_cuda_version(text: str) -> tuple[int, int] | None:
    """'12.4' -> (12, 4); '' -> None; anything else -> ValueError."""
    text = (text or "").strip()
    if not text:
        return None
    major, _, minor = text.partition(".")
    try:
        return int(major), int(minor or 0)
    except ValueError:
        raise ValueError(f"not a CUDA version (want MAJOR.MINOR, like 12.4): {text!r}") from None


def image_cuda_version(label: str | None) -> tuple[int, int] | None:
    """The CUDA version an image's label declares; None for CPU images ("none"), no label or a bad one."""
    if not label or label.strip().lower() == "none":
        return None
    try:
        return parse_cuda_version(label)
    except ValueError:
        return None


def _checked_cuda_version(owner: str, value: str) -> str:
    """Trait validation shared by the inventories whose CUDA version is configured."""
    try:
        parse_cuda_version(value)
    except ValueError as e:
        raise TraitError(f"{owner}.cuda_version: {e}") from None
    return value


class StaticInventory(Inventory):
    """GPUs listed in the configuration."""

    gpus_list = List(
        Dict(),
        config=True,
        help="""The GPUs of this host, one dict per leasable unit.

        Keys: `uuid` (required; what Docker's device request gets), `index`
        (required), `name`, `memory_mib`, `parent_uuid` (for MIG instances),
        `pci_bus_id`, `host` (defaults to `StaticInventory.host`).  Example:
        `[{"uuid": "GPU-8f6c...", "index": 0, "name": "NVIDIA A100", "memory_mib": 40960}]`.
        """,
    )

    cuda_version = Unicode(
        "",
        config=True,
        help="CUDA version the host's driver supports, as MAJOR.MINOR (e.g. '12.4'); empty if unknown.",
    )

    @validate("gpus_list")
    def _check_gpus_list(self, proposal):
        seen = set()
        for i, entry in enumerate(proposal.value):
            if not isinstance(entry.get("uuid"), str) or not entry["uuid"]:
                raise TraitError(f"StaticInventory.gpus_list[{i}] needs a 'uuid' string")
            index = entry.get("index")
            if not isinstance(index, int) or isinstance(index, bool) or index < 0:
                raise TraitError(f"StaticInventory.gpus_list[{i}] needs an 'index' >= 0")
            if entry["uuid"] in seen:
                raise TraitError(f"StaticInventory.gpus_list lists {entry['uuid']} twice")
            seen.add(entry["uuid"])
        return proposal.value

    @validate("cuda_version")
    def _check_cuda_version(self, proposal):
        return _checked_cuda_version("StaticInventory", proposal.value)

    def gpus(self) -> list[GPU]:
        units = [
            GPU(
                host=e.get("host") or self.host,
                uuid=e["uuid"],
                index=e["index"],
                name=e.get("name", "GPU"),
                memory_mib=int(e.get("memory_mib", 0)),
                parent_uuid=e.get("parent_uuid"),
                pci_bus_id=e.get("pci_bus_id"),
            )
            for e in self.gpus_list
        ]
        return sorted(units, key=lambda g: (g.host, g.index, g.uuid))

    def use_readings(self, readings) -> None:
        """Take the ledger's reader of the agents' GPU readings (`GPUPool.gpu_readings`).

        Only an inventory of other machines' GPUs (Swarm) uses it; one machine reads its own."""

    def forget_cache(self) -> None:
        """Drop what was read from elsewhere, so the next call reads it afresh (Swarm: the manager)."""

    def cuda_driver_version(self) -> tuple[int, int] | None:
        return parse_cuda_version(self.cuda_version)


class SimulatedInventory(Inventory):
    """`count` fake GPUs, for demos and tests on hosts without NVIDIA hardware.

    Uuids are deterministic per (host, index), so a restarted hub finds the
    same GPUs in its ledger.  Topology: GPUs come in pairs behind one PCIe
    switch (0-1, 2-3, ...), pairs sit on one NUMA node per four GPUs, which
    gives the pool's topology preference something real to choose between.
    """

    count = Int(4, config=True, help="How many GPUs to simulate.")

    cuda_version = Unicode(
        "12.4",
        config=True,
        help="CUDA version the simulated driver supports, as MAJOR.MINOR.",
    )

    memory_mib = Int(16384, config=True, help="Memory of each simulated GPU, in MiB.")

    utilization_file = Unicode(
        "",
        config=True,
        help="""A JSON file giving each GPU's utilization, and optionally its memory in use.

        Each value is either a percent (`{"GPU-...": 37}`) or an object with
        the keys `utilization` (percent) and `memory_used_mib` (MiB in use):
        `{"GPU-...": {"utilization": 37, "memory_used_mib": 1200}}`.  Tests and
        demos write it to play a busy or idle GPU.  A missing file, or a GPU
        missing from it, reads as 0 % and 0 MiB; a GPU given only a percent
        reads as unknown memory.
        """,
    )

    @validate("count")
    def _check_count(self, proposal):
        if proposal.value < 0:
            raise TraitError("SimulatedInventory.count must be >= 0")
        return proposal.value

    @validate("cuda_version")
    def _check_cuda_version(self, proposal):
        return _checked_cuda_version("SimulatedInventory", proposal.value)

    @staticmethod
    def uuid_for(host: str, index: int) -> str:
        """The deterministic uuid of simulated GPU `index` on `host`."""
        h = hashlib.sha256(host.encode()).hexdigest()
        return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{index:012x}"

    def gpus(self) -> list[GPU]:
        return [
            GPU(
                host=self.host,
                uuid=self.uuid_for(self.host, i),
                index=i,
                name="Simulated GPU",
                memory_mib=self.memory_mib,
                pci_bus_id=f"00000000:{0x10 + i:02X}:00.0",
            )
            for i in range(self.count)
        ]

    def use_readings(self, readings) -> None:
        """Take the ledger's reader of the agents' GPU readings (`GPUPool.gpu_readings`).

        Only an inventory of other machines' GPUs (Swarm) uses it; one machine reads its own."""

    def forget_cache(self) -> None:
        """Drop what was read from elsewhere, so the next call reads it afresh (Swarm: the manager)."""

    def cuda_driver_version(self) -> tuple[int, int] | None:
        return parse_cuda_version(self.cuda_version)

    def _reading(self, uuid: str) -> dict | None:
        """{"utilization", "memory_used_mib"} of `uuid` from `utilization_file`; None when unknown."""
        if uuid not in {g.uuid for g in self.gpus()}:
            return None
        idle = {"utilization": 0.0, "memory_used_mib": 0}
        if not self.utilization_file:
            return idle
        try:
            with open(self.utilization_file) as f:
                data = json.load(f)
            value = data.get(uuid)
            if value is None:
                return idle
            if isinstance(value, dict):  # {"utilization": 37, "memory_used_mib": 1200}
                memory = value.get("memory_used_mib")
                return {"utilization": float(value.get("utilization", 0.0)),
                        "memory_used_mib": None if memory is None else int(memory)}
            return {"utilization": float(value), "memory_used_mib": None}
        except FileNotFoundError:
            return idle
        except (OSError, ValueError, TypeError, AttributeError) as e:
            self.log.warning("Cannot read utilization file %s: %s", self.utilization_file, e)
            return None

    def utilization(self, uuid: str) -> float | None:
        reading = self._reading(uuid)
        return None if reading is None else reading["utilization"]

    def memory_used_mib(self, uuid: str) -> int | None:
        reading = self._reading(uuid)
        return None if reading is None else reading["memory_used_mib"]

    def distance(self, uuid_a: str, uuid_b: str) -> int:
        index = {g.uuid: g.index for g in self.gpus()}
        if uuid_a not in index or uuid_b not in index:
            return TOPOLOGY_SYSTEM
        a, b = index[uuid_a], index[uuid_b]
        if a == b:
            return TOPOLOGY_INTERNAL
        if a // 2 == b // 2:
            return TOPOLOGY_SINGLE
        if a // 4 == b // 4:
            return TOPOLOGY_NODE
        return TOPOLOGY_SYSTEM


class NVMLInventory(Inventory):
    """The GPUs of this machine, read through NVML (`nvidia-ml-py`).

    NVML only sees the local machine, so `host` must name the Docker host
    that runs on this machine.
    """

    def __init__(self, nvml: Any = None, **kwargs):
        super().__init__(**kwargs)
        # `nvml` lets tests hand in a stand-in for the library on machines
        # without a GPU; production uses the real pynvml module.
        self._nvml = nvml
        self._lock = threading.Lock()
        self._initialized = False

    @property
    def nvml(self):
        with self._lock:
            if self._nvml is None:
                try:
                    import pynvml
                except ImportError as e:  # pragma: no cover - a dependency
                    raise InventoryError("nvidia-ml-py is not installed (pip install nvidia-ml-py)") from e
                self._nvml = pynvml
            if not self._initialized:
                try:
                    self._nvml.nvmlInit()
                except self._nvml.NVMLError as e:
                    raise InventoryError(
                        f"NVML is not available on this machine ({e}); is the NVIDIA driver installed? "
                        "Use the 'static' or 'simulated' inventory on hosts without one."
                    ) from None
                self._initialized = True
            return self._nvml

    def _text(self, value) -> str:
        return value.decode() if isinstance(value, bytes) else str(value)

    def _healthy(self, nv, handle) -> bool:
        """False when the GPU waits for a reset after memory errors."""
        try:
            remapped = nv.nvmlDeviceGetRemappedRows(handle)
            # (corrected rows, uncorrected rows, remapping pending, remapping failed)
            if remapped[2] or remapped[3]:
                return False
        except nv.NVMLError_NotSupported:
            pass
        except AttributeError:  # older nvidia-ml-py
            pass
        return True

    def gpus(self) -> list[GPU]:
        nv = self.nvml
        units: list[GPU] = []
        for index in range(nv.nvmlDeviceGetCount()):
            try:
                handle = nv.nvmlDeviceGetHandleByIndex(index)
                uuid = self._text(nv.nvmlDeviceGetUUID(handle))
                name = self._text(nv.nvmlDeviceGetName(handle))
                memory_mib = nv.nvmlDeviceGetMemoryInfo(handle).total // (1024 * 1024)
                pci = nv.nvmlDeviceGetPciInfo(handle)
                bus_id = self._text(getattr(pci, "busId", "")) or None
                if not self._healthy(nv, handle):
                    self.log.warning("GPU %d (%s) needs a reset after memory errors; not lending it", index, uuid)
                    continue
                mig_units = self._mig_units(nv, handle, index, uuid, bus_id)
            except nv.NVMLError as e:
                # GPU lost (fell off the bus), in error, or half-initialised: never lend it.
                self.log.warning("GPU %d is lost or in error (%s); not lending it", index, e)
                continue
            if mig_units is None:
                units.append(GPU(self.host, uuid, index, name, int(memory_mib), None, bus_id))
            else:
                units.extend(mig_units)
        return units

    def _mig_units(self, nv, handle, index, parent_uuid, bus_id) -> list[GPU] | None:
        """The MIG instances of a GPU, or None when MIG is off (lend the whole GPU)."""
        try:
            current, _pending = nv.nvmlDeviceGetMigMode(handle)
        except nv.NVMLError_NotSupported:
            return None
        if current != nv.NVML_DEVICE_MIG_ENABLE:
            return None
        units = []
        for slot in range(nv.nvmlDeviceGetMaxMigDeviceCount(handle)):
            try:
                mig = nv.nvmlDeviceGetMigDeviceHandleByIndex(handle, slot)
            except nv.NVMLError_NotFound:
                continue  # an empty slot: no instance created there
            units.append(
                GPU(
                    host=self.host,
                    uuid=self._text(nv.nvmlDeviceGetUUID(mig)),
                    index=index,
                    name=self._text(nv.nvmlDeviceGetName(mig)),
                    memory_mib=int(nv.nvmlDeviceGetMemoryInfo(mig).total // (1024 * 1024)),
                    parent_uuid=parent_uuid,
                    pci_bus_id=bus_id,
                )
            )
        return units

    def use_readings(self, readings) -> None:
        """Take the ledger's reader of the agents' GPU readings (`GPUPool.gpu_readings`).

        Only an inventory of other machines' GPUs (Swarm) uses it; one machine reads its own."""

    def forget_cache(self) -> None:
        """Drop what was read from elsewhere, so the next call reads it afresh (Swarm: the manager)."""

    def cuda_driver_version(self) -> tuple[int, int] | None:
        nv = self.nvml
        try:
            version = nv.nvmlSystemGetCudaDriverVersion()  # e.g. 12040
        except nv.NVMLError:
            return None
        return version // 1000, (version % 1000) // 10

    def _handle(self, nv, uuid: str):
        return nv.nvmlDeviceGetHandleByUUID(uuid.encode() if isinstance(uuid, str) else uuid)

    def utilization(self, uuid: str) -> float | None:
        nv = self.nvml
        try:
            handle = self._handle(nv, uuid)
            if uuid.startswith("MIG-"):
                # NVML reports no utilization per MIG instance; the parent's is the best we have.
                handle = nv.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(handle)
            return float(nv.nvmlDeviceGetUtilizationRates(handle).gpu)
        except nv.NVMLError:
            return None

    def memory_used_mib(self, uuid: str) -> int | None:
        nv = self.nvml
        try:
            # A MIG instance's handle answers for its own memory slice.
            return int(nv.nvmlDeviceGetMemoryInfo(self._handle(nv, uuid)).used // (1024 * 1024))
        except nv.NVMLError:
            return None

    def distance(self, uuid_a: str, uuid_b: str) -> int:
        if uuid_a == uuid_b:
            return TOPOLOGY_INTERNAL
        nv = self.nvml
        try:
            ha, hb = self._handle(nv, uuid_a), self._handle(nv, uuid_b)
            if uuid_a.startswith("MIG-"):
                ha = nv.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(ha)
            if uuid_b.startswith("MIG-"):
                hb = nv.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(hb)
            if self._text(nv.nvmlDeviceGetUUID(ha)) == self._text(nv.nvmlDeviceGetUUID(hb)):
                return TOPOLOGY_INTERNAL  # two MIG instances of one GPU
            return int(nv.nvmlDeviceGetTopologyCommonAncestor(ha, hb))
        except nv.NVMLError:
            return TOPOLOGY_SYSTEM
