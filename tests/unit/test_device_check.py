"""bench/device_check.py, dry run: the NVML stand-in read by the inventory, the agent and the
culler's GPU-idle rule, and the doctor's NVML section, as the check runs them on a real GPU."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench import device_check

REPO = Path(__file__).resolve().parents[2]
PHASES = ["idle", "busy", "idle again"]
GPU0, GPU1, GPU2 = (f"GPU-00000000-0000-0000-0000-0000000000a{i}" for i in range(3))
MIG0, MIG1 = (f"MIG-00000000-0000-0000-0000-0000000000b{i}" for i in range(2))


def rows(report, section):
    return [r for r in report.rows if r.section == section]


def verdicts(report, uuid):
    """The rule's verdict for `uuid` in each phase, in order."""
    return [r.result for r in rows(report, "reading") if r.uuid == uuid]


@pytest.fixture(scope="module")
def report():
    return device_check.dry_run()


def test_the_inventory_rows_hold_uuid_index_model_memory_mig_and_the_driver(report):
    units = [(r.gpu, r.uuid, r.item, r.result) for r in rows(report, "inventory") if r.uuid != "-"]
    assert units == [
        ("0", GPU0, "NVIDIA H200", "143771 MiB"),
        ("1", MIG0, "NVIDIA H200 MIG 3g.71gb", "71424 MiB"),
        ("1", MIG1, "NVIDIA H200 MIG 3g.71gb", "71424 MiB"),
        ("2", GPU2, "NVIDIA L4", "23034 MiB"),
    ]
    detail = {r.uuid: r.detail for r in rows(report, "inventory")}
    assert detail[GPU0].startswith("MIG off (whole GPU lent)")
    assert detail[MIG0].startswith(f"MIG on: unit 1 of 2 of {GPU1}")
    assert detail[MIG1].startswith(f"MIG on: unit 2 of 2 of {GPU1}")
    assert detail[GPU2].startswith("MIG not supported (whole GPU lent)")
    by_item = {r.item: r for r in rows(report, "inventory") if r.uuid == "-"}
    assert by_item["driver"].result == "550.54.15"
    assert "CUDA 12.4 (NVMLInventory)" in by_item["driver"].detail and "= 12040" in by_item["driver"].detail
    assert by_item["units"].result == "4 to lend"
    assert "from 3 NVML device(s) on host dry-run-node" in by_item["units"].detail


def test_the_loaded_gpu_reads_idle_busy_idle_and_the_others_idle_throughout(report):
    assert [r.item for r in rows(report, "reading") if r.uuid == GPU0] == PHASES
    assert verdicts(report, GPU0) == ["idle", "busy", "idle"]
    for other in (MIG0, MIG1, GPU2):
        assert verdicts(report, other) == ["idle", "idle", "idle"]
    detail = {r.item: r.detail for r in rows(report, "reading") if r.uuid == GPU0}
    assert "97-97 % over 20 samples" in detail["busy"] and "0/20 (nvml) and 0/20 (ledger)" in detail["busy"]
    # The rule's window (5 s, a sample a second) passes before the first cull, and again after the load.
    assert "culled at 5/10 (nvml) and 5/10 (ledger)" in detail["idle"]
    assert "culled at 7/12 (nvml) and 7/12 (ledger)" in detail["idle again"]
    # Every sample went through the agent into the ledger, and both readings of the rule agreed.
    assert report.samples and all(s["agent_wrote"] for s in report.samples)
    assert all(s["nvml_cull"] == s["ledger_cull"] for s in report.samples)
    assert report.ok
    summary, = rows(report, "summary")
    assert (summary.uuid, summary.result) == (GPU0, "ok")


def test_the_doctors_nvml_section_reads_the_same_library(report):
    doctor = {r.item: (r.result, r.detail) for r in rows(report, "doctor")}
    assert doctor["nvml"] == ("ok", "driver 550.54.15, CUDA 12.4")
    assert doctor["gpus"][0] == "ok"
    assert doctor["gpus"][1].startswith("4 to lend on host dry-run-node (2 whole GPUs, 2 MIG units")


@pytest.mark.parametrize("percent, verdict", [(0, "idle"), (4.9, "idle"), (5, "busy"), (100, "busy")])
def test_the_busy_phase_verdict_is_the_culler_threshold_not_the_phase(percent, verdict):
    # 5 % is the culler's threshold with real GPUs: under it a GPU is idle even while "loaded".
    report = device_check.dry_run(busy_percent=percent)
    busy = next(r for r in rows(report, "reading") if r.uuid == GPU0 and r.item == "busy")
    assert busy.result.split()[0] == verdict
    assert report.ok is (verdict == "busy")
    if verdict == "idle":
        assert "(expected busy)" in busy.result and rows(report, "summary")[0].result == "FAIL"


def test_utilisation_nvml_cannot_read_is_unknown_never_idle():
    nv = device_check.standin_nvml()

    def not_supported(handle):
        raise nv.NVMLError_NotSupported("Not Supported")

    nv.nvmlDeviceGetUtilizationRates = not_supported
    report = device_check.dry_run(nvml=nv)
    results = [r.result for r in rows(report, "reading")]
    assert len(results) == 12 and all(r.startswith("unknown") for r in results)
    assert all(s["ledger_utilization"] is None and not s["nvml_cull"] for s in report.samples)
    assert not report.ok


def test_a_lost_gpu_is_shown_left_out():
    nv = device_check.standin_nvml()
    nv.devices[2]["lost"] = True
    report = device_check.dry_run(nvml=nv)
    left, = [r for r in rows(report, "inventory") if r.item == "left out"]
    assert left.gpu == "2" and left.result == "not lent"
    assert GPU2 not in {r.uuid for r in rows(report, "reading")}
    assert report.ok  # the other GPUs still read idle, busy, idle as expected


BLOCKER = """
import runpy, sys

class NotOnTheDeviceMachine:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {blocked!r}:
            raise ImportError(name + " is not on the device machine")
        return None

sys.meta_path.insert(0, NotOnTheDeviceMachine())
sys.argv = ["bench/device_check.py", "--dry-run", "--json", {out!r}]
runpy.run_path("bench/device_check.py", run_name="__main__")
"""


@pytest.mark.docs_cli
def test_the_command_needs_no_jupyterhub_tornado_docker_torch_or_pytest(tmp_path):
    # The device machine has Python, nvidia-ml-py and PyTorch, plus the carried traitlets and
    # SQLAlchemy; the dry run must not need even NVML or PyTorch.
    blocked = {"jupyterhub", "jupyterhub_idle_culler", "tornado", "docker", "dockerspawner", "ldap3",
               "prometheus_client", "torch", "pynvml", "pytest"}
    out = tmp_path / "check.json"
    done = subprocess.run([sys.executable, "-c", BLOCKER.format(blocked=sorted(blocked), out=str(out))],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "section    gpu  uuid" in done.stdout
    data = json.loads(out.read_text())
    assert data["ok"] is True
    assert [r["result"] for r in data["rows"] if r["section"] == "reading" and r["uuid"] == GPU0] == \
        ["idle", "busy", "idle"]


class FakeTorch:
    """The few calls TorchLoad makes, for a machine without CUDA (its products cost nothing)."""

    __version__ = "0.0-fake"
    bfloat16 = "bf16"

    def __init__(self, uuid):
        import threading
        import types

        self.props = types.SimpleNamespace(name="NVIDIA H200", uuid=uuid)
        self.products = 0
        self.synced = threading.Event()
        self.cuda = types.SimpleNamespace(is_available=lambda: True, get_device_properties=lambda dev: self.props,
                                          synchronize=self._synchronize)

    def _synchronize(self):
        self.synced.set()
        self.synced.wait(0.001)  # a real synchronize blocks; this one must not spin the CPU

    def device(self, kind, index):
        return (kind, index)

    def randn(self, *shape, device=None, dtype=None):
        return object()

    def empty_like(self, tensor):
        return object()

    def matmul(self, a, b, out=None):
        self.products += 1


def test_the_torch_load_names_its_gpu_by_nvml_uuid_and_runs_only_between_start_and_stop(monkeypatch):
    # PyTorch gives the uuid without NVML's "GPU-" prefix; the check must still find that GPU.
    torch = FakeTorch(GPU0.removeprefix("GPU-"))
    monkeypatch.setitem(sys.modules, "torch", torch)
    load = device_check.TorchLoad(size=64)
    assert load.uuid == GPU0 and torch.products == 1  # the warm-up product, before the idle phase
    load.start()
    load.stop()
    after = torch.products
    assert after > 1 and load.products == after - 1
    assert not load._thread.is_alive()
    assert "bf16 64x64 matmul loop on NVIDIA H200" in load.what and "TFLOP/s" in load.what
    report = device_check.run_check(device_check.Plan(), device_check.VirtualClock(),
                                    lambda _nvml: device_check.TorchLoad(size=64),
                                    standin=device_check.standin_nvml(), host="n")
    load_row, = rows(report, "load")
    assert load_row.uuid == GPU0  # the load's GPU is the one expected busy
    # The stand-in's utilisation does not follow a fake load: the busy phase reads idle, and says so.
    assert verdicts(report, GPU0) == ["idle", "idle (expected busy)", "idle"] and not report.ok
