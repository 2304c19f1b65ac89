"""Inventories: simulated, static, and NVML (through a stand-in for the NVML library)."""

from __future__ import annotations

import json

import pytest
from traitlets import TraitError
from traitlets.config import Config

from spawner.inventory import (
    GPU,
    TOPOLOGY_INTERNAL,
    TOPOLOGY_SINGLE,
    TOPOLOGY_SYSTEM,
    InventoryError,
    NVMLInventory,
    SimulatedInventory,
    StaticInventory,
)
from spawner.inventory.kinds import inventory_from_config
from tests.fixtures.nvml import FakeNVML


def test_simulated_gpus_are_deterministic_per_host_and_index():
    a = SimulatedInventory(count=3, host="node-a").gpus()
    again = SimulatedInventory(count=3, host="node-a").gpus()
    b = SimulatedInventory(count=3, host="node-b").gpus()
    assert a == again
    assert [g.index for g in a] == [0, 1, 2]
    assert all(g.uuid.startswith("GPU-") and g.host == "node-a" and g.name == "Simulated GPU" for g in a)
    assert len({g.uuid for g in a + b}) == 6  # no uuid shared between hosts


def test_simulated_cuda_version_and_topology():
    inv = SimulatedInventory(count=4, host="h", cuda_version="12.2")
    assert inv.cuda_driver_version() == (12, 2)
    g = [x.uuid for x in inv.gpus()]
    assert inv.distance(g[0], g[0]) == TOPOLOGY_INTERNAL
    assert inv.distance(g[0], g[1]) == TOPOLOGY_SINGLE
    assert inv.distance(g[0], g[2]) > inv.distance(g[2], g[3])


def test_simulated_utilization_reads_the_file_tests_control(tmp_path):
    path = tmp_path / "util.json"
    inv = SimulatedInventory(count=2, host="h", utilization_file=str(path))
    uuid0, uuid1 = (g.uuid for g in inv.gpus())
    assert inv.utilization(uuid0) == 0.0  # missing file: idle
    path.write_text(json.dumps({uuid0: 87.5}))
    assert inv.utilization(uuid0) == 87.5
    assert inv.utilization(uuid1) == 0.0
    assert inv.utilization("GPU-not-here") is None


def test_simulated_memory_in_use_reads_the_files_object_form(tmp_path):
    path = tmp_path / "util.json"
    inv = SimulatedInventory(count=3, host="h", utilization_file=str(path))
    uuid0, uuid1, uuid2 = (g.uuid for g in inv.gpus())
    assert inv.memory_used_mib(uuid0) == 0  # missing file: idle, nothing in use
    path.write_text(json.dumps({uuid0: {"utilization": 37, "memory_used_mib": 1200}, uuid1: 50}))
    assert (inv.utilization(uuid0), inv.memory_used_mib(uuid0)) == (37.0, 1200)
    assert (inv.utilization(uuid1), inv.memory_used_mib(uuid1)) == (50.0, None)  # a percent: memory unknown
    assert (inv.utilization(uuid2), inv.memory_used_mib(uuid2)) == (0.0, 0)
    path.write_text(json.dumps({uuid0: {"utilization": "busy"}}))
    assert (inv.utilization(uuid0), inv.memory_used_mib(uuid0)) == (None, None)  # unreadable: unknown
    assert inv.memory_used_mib("GPU-not-here") is None


def test_simulated_rejects_bad_values():
    with pytest.raises(TraitError, match="count"):
        SimulatedInventory(count=-1)
    with pytest.raises(TraitError, match="CUDA version"):
        SimulatedInventory(cuda_version="twelve")


def test_static_inventory_from_config():
    c = Config()
    c.StaticInventory.host = "gpu-box"
    c.StaticInventory.cuda_version = "12.4"
    c.StaticInventory.gpus_list = [
        {"uuid": "GPU-bbb", "index": 1, "name": "A100", "memory_mib": 40960},
        {"uuid": "GPU-aaa", "index": 0, "name": "A100", "memory_mib": 40960},
    ]
    inv = inventory_from_config("static", config=c)
    assert isinstance(inv, StaticInventory)
    assert inv.gpus() == [
        GPU("gpu-box", "GPU-aaa", 0, "A100", 40960),
        GPU("gpu-box", "GPU-bbb", 1, "A100", 40960),
    ]
    assert inv.cuda_driver_version() == (12, 4)


@pytest.mark.parametrize(
    "entry, message",
    [
        ({"index": 0}, "uuid"),
        ({"uuid": "GPU-x"}, "index"),
        ({"uuid": "GPU-x", "index": -1}, "index"),
    ],
)
def test_static_inventory_rejects_bad_entries(entry, message):
    with pytest.raises(TraitError, match=message):
        StaticInventory(gpus_list=[entry])


def test_static_inventory_rejects_duplicates():
    with pytest.raises(TraitError, match="twice"):
        StaticInventory(gpus_list=[{"uuid": "GPU-x", "index": 0}, {"uuid": "GPU-x", "index": 1}])


def test_static_mig_instances_of_one_gpu_are_closest():
    inv = StaticInventory(
        host="h",
        gpus_list=[
            {"uuid": "MIG-1", "index": 0, "parent_uuid": "GPU-p"},
            {"uuid": "MIG-2", "index": 0, "parent_uuid": "GPU-p"},
            {"uuid": "GPU-q", "index": 1},
        ],
    )
    assert inv.distance("MIG-1", "MIG-2") == TOPOLOGY_INTERNAL
    assert inv.distance("MIG-1", "GPU-q") == TOPOLOGY_SYSTEM
    assert inv.cuda_driver_version() is None


def test_unknown_inventory_kind_names_the_choices():
    with pytest.raises(ValueError, match="nvml, simulated, static"):
        inventory_from_config("magic")


def test_inventory_reads_its_options_from_config():
    c = Config()
    c.SimulatedInventory.count = 7
    c.Inventory.host = "from-config"
    inv = inventory_from_config("simulated", config=c)
    assert len(inv.gpus()) == 7
    assert inv.host == "from-config"


# --- NVML, through a stand-in for the library (no GPU exists here) -------------


def _device(uuid, switch=0, **kw):
    return dict(uuid=uuid, name="NVIDIA H100", mib=81559, switch=switch, **kw)


def test_nvml_lists_healthy_gpus_and_skips_lost_ones():
    nv = FakeNVML({
        0: _device("GPU-0", util=40),
        1: _device("GPU-1", lost=True),
        2: _device("GPU-2", pending_reset=True),
        3: _device("GPU-3", switch=0),
    })
    inv = NVMLInventory(nvml=nv, host="h")
    gpus = inv.gpus()
    assert [(g.uuid, g.index, g.name, g.memory_mib) for g in gpus] == [
        ("GPU-0", 0, "NVIDIA H100", 81559),
        ("GPU-3", 3, "NVIDIA H100", 81559),
    ]
    assert inv.cuda_driver_version() == (12, 4)
    assert inv.utilization("GPU-0") == 40.0
    assert inv.memory_used_mib("GPU-0") == 0
    nv.devices[0]["used_mib"] = 1229
    assert inv.memory_used_mib("GPU-0") == 1229
    assert inv.memory_used_mib("GPU-not-here") is None  # NVML cannot find it: unknown
    assert inv.distance("GPU-0", "GPU-3") == 10


def test_nvml_lends_mig_instances_when_mig_is_on():
    nv = FakeNVML({
        0: _device("GPU-p", migs=[{"uuid": "MIG-a", "name": "1g.10gb", "mib": 9856},
                                  {"uuid": "MIG-b", "name": "1g.10gb", "mib": 9856}]),
        1: _device("GPU-q", migs=None, switch=1),  # MIG capable but off: the whole GPU
    })
    inv = NVMLInventory(nvml=nv, host="h")
    units = inv.gpus()
    assert [(g.uuid, g.index, g.parent_uuid) for g in units] == [
        ("MIG-a", 0, "GPU-p"), ("MIG-b", 0, "GPU-p"), ("GPU-q", 1, None)]
    assert inv.distance("MIG-a", "MIG-b") == TOPOLOGY_INTERNAL
    assert inv.distance("MIG-a", "GPU-q") == 50


def test_nvml_without_a_driver_says_what_to_use_instead():
    inv = NVMLInventory(nvml=FakeNVML({}, library=False), host="h")
    with pytest.raises(InventoryError, match="static' or 'simulated"):
        inv.gpus()


def test_real_nvml_without_a_driver_fails_clearly():
    # The machines running this suite have no NVIDIA driver; on one that has,
    # this checks that the real library answers.
    inv = NVMLInventory(host="h")
    try:
        gpus = inv.gpus()
    except InventoryError as e:
        assert "NVML is not available" in str(e)
    else:
        assert all(g.uuid.startswith(("GPU-", "MIG-")) for g in gpus)
