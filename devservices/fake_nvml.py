"""A stand-in for the NVML library (`pynvml`, from nvidia-ml-py), over described devices.

The parts NVMLInventory, the doctor and bench/device_check.py use.  Each device is a
dict: uuid, name, mib, switch, and optionally util (percent, read live: change it to
play a busy GPU), used_mib (MiB of memory in use, read live too), bus, lost, pending_reset,
migs (absent: MIG not supported; None: MIG capable but off; a list of {uuid, name, mib}:
MIG on, those instances), mig_pending (the MIG mode after the next reset, when it differs).
Imports nothing but the standard library, so the device check's dry run can use it
where only that check's own needs are installed.
"""

from __future__ import annotations

import types


class FakeNVML(types.SimpleNamespace):
    """pynvml, as far as the project uses it, over `devices` ({index: device dict}, see above)."""

    class NVMLError(Exception):
        pass

    class NVMLError_NotSupported(NVMLError):
        pass

    class NVMLError_NotFound(NVMLError):
        pass

    class NVMLError_GpuIsLost(NVMLError):
        pass

    class NVMLError_LibraryNotFound(NVMLError):
        pass

    NVML_DEVICE_MIG_DISABLE = 0
    NVML_DEVICE_MIG_ENABLE = 1

    def __init__(self, devices, cuda=12040, library=True, driver="550.54.15"):
        super().__init__()
        self.devices = devices  # index -> dict
        self.cuda = cuda
        self.library = library
        self.driver = driver

    def nvmlInit(self):
        if not self.library:
            raise self.NVMLError_LibraryNotFound("NVML Shared Library Not Found")

    def nvmlShutdown(self):
        pass

    def nvmlSystemGetDriverVersion(self):
        return self.driver

    def nvmlDeviceGetCount(self):
        return len(self.devices)

    def nvmlDeviceGetHandleByIndex(self, i):
        d = self.devices[i]
        if d.get("lost"):
            raise self.NVMLError_GpuIsLost("GPU is lost")
        return d

    def nvmlDeviceGetUUID(self, h):
        return h["uuid"]

    def nvmlDeviceGetName(self, h):
        return h["name"].encode()  # older nvidia-ml-py returns bytes

    def nvmlDeviceGetMemoryInfo(self, h):
        mib = 1024 * 1024
        return types.SimpleNamespace(total=h["mib"] * mib, used=h.get("used_mib", 0) * mib,
                                     free=(h["mib"] - h.get("used_mib", 0)) * mib)

    def nvmlDeviceGetPciInfo(self, h):
        return types.SimpleNamespace(busId=h.get("bus", "00000000:01:00.0"))

    def nvmlDeviceGetRemappedRows(self, h):
        return (0, 0, h.get("pending_reset", False), False)

    def nvmlDeviceGetMigMode(self, h):
        if "migs" not in h:
            raise self.NVMLError_NotSupported("no MIG")
        # (current, pending): the pending mode equals the current one unless a change awaits a reset.
        current = 1 if h["migs"] is not None else 0
        return (current, h.get("mig_pending", current))

    def nvmlDeviceGetMaxMigDeviceCount(self, h):
        return 7

    def nvmlDeviceGetMigDeviceHandleByIndex(self, h, slot):
        migs = h["migs"] or []
        if slot >= len(migs):
            raise self.NVMLError_NotFound("empty slot")
        return dict(migs[slot], parent=h)

    def nvmlSystemGetCudaDriverVersion(self):
        return self.cuda

    def _all(self):
        for d in self.devices.values():
            yield d
            for m in d.get("migs") or []:
                yield dict(m, parent=d)

    def nvmlDeviceGetHandleByUUID(self, uuid):
        uuid = uuid.decode() if isinstance(uuid, bytes) else uuid
        for h in self._all():
            if h["uuid"] == uuid:
                return h
        raise self.NVMLError_NotFound(uuid)

    def nvmlDeviceGetDeviceHandleFromMigDeviceHandle(self, h):
        return h["parent"]

    def nvmlDeviceGetUtilizationRates(self, h):
        return types.SimpleNamespace(gpu=h.get("util", 0))

    def nvmlDeviceGetTopologyCommonAncestor(self, a, b):
        return 10 if a["switch"] == b["switch"] else 50
