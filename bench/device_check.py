"""The NVML path on a real NVIDIA GPU: inventory, the agent's readings, the culler's idle rule, the doctor.

On a GPU machine, from the repository root, in one command (Python 3.12, nvidia-ml-py and
PyTorch there; traitlets and SQLAlchemy carried as wheels in .whl/, see
docs/contributing/device-check.md for how to download them):

    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target .whl/site .whl/*.whl &&
        PYTHONPATH=.whl/site PYTHONUNBUFFERED=1 timeout 240 python3 bench/device_check.py

Here, with no GPU: the same code against the project's NVML stand-in (devservices/fake_nvml.py),
the busy phase played by the stand-in's utilisation and a clock that does not wait:

    .venv/bin/python bench/device_check.py --dry-run

What it does, each step through the project's own code (nothing re-implemented):

1. lists the GPUs as the hub and `gpu-pool agent --inventory nvml` do (NVMLInventory, built by
   inventory_kinds.inventory_from_config): uuid, index, model, memory, MIG units, the driver's
   CUDA version; beside them the raw NVML facts the inventory does not keep (driver version, MIG
   mode, the CUDA version as NVML encodes it), to compare;
2. runs three phases, idle, busy (a PyTorch bf16 matrix-product loop on the GPU, ~20 s) and idle
   again, sampling once a second: each sample is one pass of the per-node agent (Agent.run_once)
   into a throw-away SQLite ledger, then the culler's GPU-idle rule (cull_policy.GPUCullPolicy,
   threshold 5 % as GPUIdleCuller's default for nvml) judges one GPU server per leasable unit,
   twice: reading NVML as the culler does on one host (CullerUtilization "nvml") and reading
   the agent's ledger as it does on Swarm (CullerUtilization "swarm");
3. runs the doctor's NVML section (Doctor.check_nvml and check_inventory);
4. prints all of it as one table and exits 0 when each phase got the expected verdict (the
   loaded GPU: idle, busy, idle; the others idle throughout) and no doctor line failed, else 1.

The rule's window is shortened (gpu_idle_seconds 5 s instead of 1800 s), not changed.  About
45 s on the GPU; it imports neither JupyterHub, tornado nor Docker (the device machine has none).
"""

from __future__ import annotations

import argparse
import contextlib
import getpass
import json
import logging
import socket
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from datetime import timedelta
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from traitlets.config import Config  # noqa: E402

from spawner.cli.agent import Agent  # noqa: E402
from spawner.cli.doctor import FAIL, OK, Doctor, Target  # noqa: E402
from spawner.culling.policy import DEFAULT_GPU_IDLE_PERCENT, CullerUtilization, GPUCullPolicy  # noqa: E402
from spawner.inventory import InventoryError  # noqa: E402
from spawner.inventory.kinds import inventory_from_config  # noqa: E402
from spawner.pool import GPUPool  # noqa: E402

log = logging.getLogger("device-check")

IDLE, BUSY, UNKNOWN = "idle", "busy", "unknown"


@dataclass
class Row:
    section: str
    gpu: str
    uuid: str
    item: str
    result: str
    detail: str = ""


@dataclass
class Plan:
    interval: float = 1.0  # between samples: the agent's --interval and the culler's cull_every, shortened
    idle_seconds: float = 5.0  # the rule's gpu_idle_seconds for this check (1800 in production)
    percent: float = DEFAULT_GPU_IDLE_PERCENT  # the rule's gpu_idle_percent, as the culler's nvml default
    # (name, loaded, samples).  The idle phases outlast the window by a few samples: NVML averages
    # utilisation over its own sampling period, so the first reading after a change may lag.
    phases: tuple = (("idle", False, 10), ("busy", True, 20), ("idle again", False, 12))


@dataclass
class Report:
    rows: list[Row] = field(default_factory=list)
    samples: list[dict] = field(default_factory=list)  # every sample, for --json
    ok: bool = True

    def add(self, *args, **kwargs) -> None:
        self.rows.append(Row(*args, **kwargs))


# --- clocks and loads ----------------------------------------------------------


class RealClock:
    now = staticmethod(time.monotonic)
    sleep = staticmethod(time.sleep)


class VirtualClock:
    """The dry run's clock: sleeping moves it on at once."""

    def __init__(self):
        self.t = 1000.0

    def now(self) -> float:
        return self.t

    def sleep(self, seconds: float) -> None:
        self.t += seconds


class StandInLoad:
    """The dry run's busy GPU: the stand-in reports `percent` for `uuid` while it runs."""

    def __init__(self, nvml, uuid: str, percent: float = 97.0):
        self.device = nvml.nvmlDeviceGetHandleByUUID(uuid)
        self.uuid = uuid
        self.percent = percent
        self.what = f"stand-in utilisation {percent:g} %"

    def start(self) -> None:
        self.device["util"] = self.percent

    def stop(self) -> None:
        self.device["util"] = 0


class TorchLoad:
    """A bf16 matrix-product loop on CUDA device 0, in a thread, between start() and stop()."""

    def __init__(self, size: int = 8192):
        import torch

        if not torch.cuda.is_available():
            raise RuntimeError("PyTorch sees no CUDA device")
        self.torch = torch
        self.size = size
        dev = torch.device("cuda", 0)
        props = torch.cuda.get_device_properties(dev)
        raw = str(getattr(props, "uuid", "") or "")
        self.uuid = raw if raw.startswith(("GPU-", "MIG-")) or not raw else f"GPU-{raw}"
        self.a = torch.randn(size, size, device=dev, dtype=torch.bfloat16)
        self.b = torch.randn(size, size, device=dev, dtype=torch.bfloat16)
        self.c = torch.empty_like(self.a)
        torch.matmul(self.a, self.b, out=self.c)  # the context and the kernel, before the idle phase
        torch.cuda.synchronize()
        self.what = f"torch {torch.__version__} bf16 {size}x{size} matmul loop on {props.name}"
        self._stop = threading.Event()
        self._first = threading.Event()
        self._thread = None
        self.products = 0
        self.seconds = 0.0

    def _loop(self) -> None:
        t0 = time.monotonic()
        while not self._stop.is_set():
            for _ in range(20):
                self.torch.matmul(self.a, self.b, out=self.c)
            self.torch.cuda.synchronize()
            self.products += 20
            self._first.set()
        self.seconds = time.monotonic() - t0

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="matmul-load", daemon=True)
        self._thread.start()
        if not self._first.wait(60):
            raise RuntimeError("the matrix loop did not finish its first batch in 60 s")

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(60)
        if self.seconds:
            tflops = 2 * self.size**3 * self.products / self.seconds / 1e12
            self.what += f": {self.products} products in {self.seconds:.1f} s, {tflops:.0f} TFLOP/s"


# --- the check -----------------------------------------------------------------


@contextlib.contextmanager
def nvml_library(standin):
    """`import pynvml` gives `standin` inside (the dry run); the real library when it is None."""
    if standin is None:
        yield
        return
    missing = object()
    saved = sys.modules.get("pynvml", missing)
    sys.modules["pynvml"] = standin
    try:
        yield
    finally:
        if saved is missing:
            sys.modules.pop("pynvml", None)
        else:
            sys.modules["pynvml"] = saved


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _raw(call, *args):
    """(value, None) or (None, 'NVMLError_...: message') of one raw NVML call."""
    try:
        return call(*args), None
    except Exception as e:  # the real library's errors are NVMLError subclasses, named by the code
        return None, f"{type(e).__name__}: {e}"


def _mig_mode(nv, index: int) -> str:
    handle, err = _raw(nv.nvmlDeviceGetHandleByIndex, index)
    if err:
        return f"unreadable ({err})"
    mode, err = _raw(nv.nvmlDeviceGetMigMode, handle)
    if err:
        return "not supported" if "NotSupported" in err else f"unreadable ({err})"
    current, pending = (int(m) for m in mode)
    name = {nv.NVML_DEVICE_MIG_ENABLE: "on"}.get(current, "off")
    if pending != current:
        name += f" (pending {'on' if pending == nv.NVML_DEVICE_MIG_ENABLE else 'off'}: needs a GPU reset)"
    return name


def inventory_rows(report: Report, inventory, units) -> None:
    nv = inventory.nvml  # the library the inventory itself uses
    driver, derr = _raw(nv.nvmlSystemGetDriverVersion)
    raw_cuda, cerr = _raw(nv.nvmlSystemGetCudaDriverVersion)
    cuda = inventory.cuda_driver_version()
    count, nerr = _raw(nv.nvmlDeviceGetCount)
    report.add("inventory", "-", "-", "driver", _text(driver) if driver is not None else "unknown",
               (f"CUDA {cuda[0]}.{cuda[1]}" if cuda else "CUDA unknown")
               + f" (NVMLInventory); nvmlSystemGetCudaDriverVersion = {raw_cuda if raw_cuda is not None else cerr}"
               + (f"; driver: {derr}" if derr else ""))
    modes = {i: _mig_mode(nv, i) for i in range(count or 0)}
    for g in units:
        if g.parent_uuid:
            siblings = [u for u in units if u.parent_uuid == g.parent_uuid]
            mig = f"MIG {modes.get(g.index, '?')}: unit {siblings.index(g) + 1} of {len(siblings)} of {g.parent_uuid}"
        else:
            mig = f"MIG {modes.get(g.index, '?')} (whole GPU lent)"
        report.add("inventory", str(g.index), g.uuid, g.name, f"{g.memory_mib} MiB",
                   f"{mig}; bus {g.pci_bus_id or '?'}")
    listed = {g.index for g in units}
    for i in range(count or 0):
        if i not in listed:
            report.add("inventory", str(i), "-", "left out", "not lent",
                       "NVML lists it, the inventory does not (lost, in error, or waiting for a reset)")
    report.add("inventory", "-", "-", "units", f"{len(units)} to lend",
               f"from {count if count is not None else nerr} NVML device(s) on host {inventory.host}")


def _verdict(verdict, reading) -> str:
    if verdict.cull:
        return IDLE
    return UNKNOWN if reading is None else BUSY


class NoLoad:
    """Stands for a load that could not start: the busy phase then shows what an idle GPU reads."""

    uuid = None

    def __init__(self, why: str):
        self.what = why

    def start(self) -> None:
        pass

    def stop(self) -> None:
        pass


def run_check(plan: Plan, clock, load_factory, standin=None, host: str | None = None,
              report: Report | None = None) -> Report:
    """The whole check; `standin` replaces the NVML library (the dry run), `load_factory(nvml)` makes the load.

    Rows go into `report` as they are made, so a caller that catches an error still has them.
    """
    report = report if report is not None else Report()
    with nvml_library(standin), tempfile.TemporaryDirectory(prefix="device-check-") as tmp:
        config = Config()
        config.Inventory.host = host or socket.gethostname()
        inventory = inventory_from_config("nvml", config)  # as `gpu-pool agent --inventory nvml` builds it
        try:
            units = inventory.gpus()
            inventory_rows(report, inventory, units)
        except InventoryError as e:
            report.add("inventory", "-", "-", "gpus", FAIL, str(e))
            units = []
        if not units:
            report.ok = False
            doctor_rows(report, inventory.host, Path(tmp))
            report.add("summary", "-", "-", "verdicts", FAIL, "no GPU to judge")
            return report
        try:
            load = load_factory(inventory.nvml)
        except Exception as e:  # no CUDA for PyTorch: still read and judge, and say so
            load = NoLoad(f"no load: {type(e).__name__}: {e}")
            report.ok = False
        loaded = next((g.uuid for g in units if g.uuid == load.uuid), None)
        if loaded is None and len(units) == 1:
            loaded = units[0].uuid  # one GPU: that is the one the load runs on
        report.add("load", "-", loaded or "?", "busy phase", "ready", load.what)

        db_url = f"sqlite:///{Path(tmp) / 'ledger.sqlite'}"
        pool = GPUPool(db_url=db_url)
        agent = Agent(pool, inventory, interval=plan.interval, logger=log)
        max_age = max(60.0, 5 * plan.interval)
        rule = dict(cpu_timeout=3600, gpu_timeout=900, gpu_idle_percent=plan.percent,
                    gpu_idle_seconds=plan.idle_seconds, clock=clock.now, log=log)
        judges = {
            "nvml": GPUCullPolicy(utilization=CullerUtilization("nvml", 0, "", log), **rule),
            "ledger": GPUCullPolicy(utilization=CullerUtilization("swarm", 0, "", log, max_age, db_url), **rule),
        }
        servers = {g.uuid: {"name": "", "url": f"/user/device-check-{i}/",
                            "state": {"gpu_lease_id": i + 1, "gpu_uuids": [g.uuid], "gpu_host": inventory.host}}
                   for i, g in enumerate(units)}
        try:
            for phase, busy, count in plan.phases:
                if busy:
                    load.start()
                seen: dict[str, list] = {g.uuid: [] for g in units}
                culled = {(name, g.uuid): 0 for name in judges for g in units}
                last = {}
                try:
                    for n in range(count):
                        if n:
                            clock.sleep(plan.interval)
                        wrote = agent.run_once()
                        ledger = pool.gpu_readings(max_age, host=inventory.host)
                        for g in units:
                            reading = ledger.get((inventory.host, g.uuid))
                            value = reading.utilization if reading else None
                            seen[g.uuid].append(value)
                            for name, judge in judges.items():
                                v = judge.decide(timedelta(0), servers[g.uuid])
                                culled[(name, g.uuid)] += v.cull
                                last[(name, g.uuid)] = v
                            report.samples.append({"phase": phase, "n": n, "uuid": g.uuid, "agent_wrote": wrote,
                                                   "ledger_utilization": value,
                                                   **{f"{k}_cull": last[(k, g.uuid)].cull for k in judges}})
                finally:
                    if busy:
                        load.stop()
                for g in units:
                    values = seen[g.uuid]
                    verdicts = {name: _verdict(last[(name, g.uuid)], values[-1]) for name in judges}
                    expected = BUSY if busy and g.uuid == loaded else IDLE
                    agreed = len(set(verdicts.values())) == 1
                    result = verdicts["nvml"] if agreed else " ".join(f"{k}={v}" for k, v in verdicts.items())
                    if not (agreed and result == expected):
                        report.ok = False
                        result += f" (expected {expected})"
                    known = [v for v in values if v is not None]
                    span = f"{min(known):g}-{max(known):g} %" if known else "unknown"
                    reasons = {last[(k, g.uuid)].reason for k in judges}
                    report.add("reading", str(g.index), g.uuid, phase, result,
                               f"agent's ledger {span} over {len(values)} samples; culled at "
                               + " and ".join(f"{culled[(k, g.uuid)]}/{len(values)} ({k})" for k in judges)
                               + "; last: " + (reasons.pop() if len(reasons) == 1 else " | ".join(
                                   f"{k}: {last[(k, g.uuid)].reason}" for k in judges)))
        finally:
            pool.close()

        doctor_rows(report, inventory.host, Path(tmp))
        report.add("summary", "-", loaded or "?", "verdicts", OK if report.ok else FAIL,
                   "the loaded GPU read idle, busy, idle and the others idle, by both readings of the "
                   "culler's rule; no doctor line failed" if report.ok else "see the rows marked 'expected'")
    return report


def doctor_rows(report: Report, host: str, data_dir: Path) -> None:
    """The doctor's NVML section (its nvml and gpus lines) for a hub configured with the nvml inventory."""
    config = Config()
    config.GPUDockerSpawner.inventory_kind = "nvml"
    config.Inventory.host = host
    doctor = Doctor(Target(config=config, data_dir=data_dir, hub_user=getpass.getuser()))
    doctor.check_nvml()
    doctor.check_inventory()
    for r in doctor.results:
        report.add("doctor", "-", "-", r.check, r.status, r.detail + (f"; fix: {r.fix}" if r.fix and r.status != OK
                                                                      else ""))
        report.ok &= r.status != FAIL


def render(rows: list[Row]) -> str:
    header = Row("section", "gpu", "uuid", "item", "result", "detail")
    cols = ["section", "gpu", "uuid", "item", "result"]
    width = {c: max(len(getattr(r, c)) for r in [header, *rows]) for c in cols}
    lines = []
    for r in [header, *rows]:
        lines.append("  ".join(getattr(r, c).ljust(width[c]) for c in cols) + "  " + r.detail)
    return "\n".join(lines)


# --- the dry run's stand-in ------------------------------------------------------


def standin_nvml():
    """Three GPUs: an H200 with MIG off, one with two MIG instances, an L4 without MIG."""
    from devservices.fake_nvml import FakeNVML

    return FakeNVML({
        0: {"uuid": "GPU-00000000-0000-0000-0000-0000000000a0", "name": "NVIDIA H200", "mib": 143771,
            "switch": 0, "bus": "00000000:18:00.0", "migs": None},
        1: {"uuid": "GPU-00000000-0000-0000-0000-0000000000a1", "name": "NVIDIA H200", "mib": 143771,
            "switch": 0, "bus": "00000000:2A:00.0", "migs": [
                {"uuid": "MIG-00000000-0000-0000-0000-0000000000b0", "name": "NVIDIA H200 MIG 3g.71gb", "mib": 71424},
                {"uuid": "MIG-00000000-0000-0000-0000-0000000000b1", "name": "NVIDIA H200 MIG 3g.71gb", "mib": 71424},
            ]},
        2: {"uuid": "GPU-00000000-0000-0000-0000-0000000000a2", "name": "NVIDIA L4", "mib": 23034,
            "switch": 1, "bus": "00000000:3B:00.0"},
    })


def dry_run(busy_percent: float = 97.0, plan: Plan | None = None, host: str = "dry-run-node", nvml=None,
            report: Report | None = None) -> Report:
    """The check against the stand-in (`nvml`, else standin_nvml()): GPU 0 at `busy_percent` in the busy phase."""
    nv = nvml if nvml is not None else standin_nvml()
    return run_check(plan or Plan(), VirtualClock(), lambda _nvml: StandInLoad(nv, nv.devices[0]["uuid"], busy_percent),
                     standin=nv, host=host, report=report)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dry-run", action="store_true",
                        help="the NVML stand-in and a clock that does not wait, instead of the GPU")
    parser.add_argument("--host", help="the node's name in the throw-away ledger (default: hostname)")
    parser.add_argument("--json", metavar="FILE", help="also write the rows and every sample here")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    t0 = time.monotonic()
    report = Report()
    failure = None
    try:
        if args.dry_run:
            title = "device check, dry run (NVML stand-in devservices/fake_nvml.py, virtual clock)"
            dry_run(host=args.host or "dry-run-node", report=report)
        else:
            title = "device check on the real NVML"
            run_check(Plan(), RealClock(), lambda _nvml: TorchLoad(), host=args.host, report=report)
    except Exception:  # one run on a lent machine: keep the rows made so far, then the error
        import traceback

        failure = traceback.format_exc()
        report.ok = False
    print(f"{title}: {time.monotonic() - t0:.1f} s")
    print(render(report.rows))
    if failure:
        print(f"the check broke off:\n{failure}")
    if args.json:
        Path(args.json).write_text(json.dumps({"ok": report.ok, "rows": [asdict(r) for r in report.rows],
                                               "samples": report.samples}, indent=1))
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
