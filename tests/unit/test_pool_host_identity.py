"""One physical GPU is never lent under two host names (a renamed machine, a recreated hub container)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from spawner.inventory import StaticInventory
from spawner.pool import GPUPool, HostConflict, PoolUnavailable

GPUS = [{"uuid": "GPU-11111111-aaaa", "index": 0}, {"uuid": "GPU-22222222-bbbb", "index": 1}]


def hub(url: str, host: str) -> GPUPool:
    """The pool of a hub whose machine is called `host` (its NVML uuids do not change with the name)."""
    return GPUPool(inventory=StaticInventory(host=host, gpus_list=GPUS), db_url=url)


@pytest.mark.docs_cli
def test_a_renamed_host_refuses_to_lend_its_gpus_a_second_time(tmp_path):
    url = f"sqlite:///{tmp_path / 'ledger.sqlite'}"
    before = hub(url, "gpu-box")
    alice = before.try_acquire("alice", "", 2)
    before.close()

    renamed = hub(url, "gpu-box-7f3a")  # same machine, same GPUs, a new host name
    with pytest.raises(HostConflict) as info:
        renamed.try_acquire("bob", "", 1)
    message = str(info.value)
    assert "under host name 'gpu-box'" in message and "calls its host 'gpu-box-7f3a'" in message
    assert "c.Inventory.host = 'gpu-box'" in message
    assert "gpu-pool rehome 'gpu-box' 'gpu-box-7f3a'" in message
    assert isinstance(info.value, PoolUnavailable) and not info.value.transient
    # Nothing was lent: alice's lease is still the only one on these GPUs.
    assert [l.id for l in GPUPool(db_url=url).leases()] == [alice.id]

    # The fix the message names: the gpu-pool command moves the records to the new name.
    cli = subprocess.run([sys.executable, "-m", "spawner.cli", "--db-url", url, "rehome", "gpu-box", "gpu-box-7f3a"],
                         capture_output=True, text=True, timeout=60)
    assert cli.returncode == 0, cli.stderr
    assert "Moved 2 GPU(s) and 1 active lease(s)" in cli.stdout
    renamed = hub(url, "gpu-box-7f3a")
    assert renamed.try_acquire("bob", "", 1) is None  # alice still holds both, now under the new name
    assert [l.id for l in renamed.leases(host="gpu-box-7f3a")] == [alice.id]
    # Its reconciler now sees alice's lease under this host's name.
    assert renamed.reconcile("gpu-box-7f3a", [alice.id]) == []


def test_keeping_the_old_name_works_and_gpus_marked_missing_elsewhere_do_not_conflict(tmp_path):
    url = f"sqlite:///{tmp_path / 'ledger.sqlite'}"
    hub(url, "gpu-box").sync_inventory()
    # The other fix the message names: the hub keeps calling its host by the old name.
    assert hub(url, "gpu-box").try_acquire("alice", "", 1) is not None

    # A card moved to another machine after its old host marked it missing and its lease ended.
    old = GPUPool(inventory=StaticInventory(host="old-box", gpus_list=[{"uuid": "GPU-moved", "index": 0}]),
                  db_url=url)
    lease = old.try_acquire("carol", "", 1)
    old.release(lease.id)
    GPUPool(inventory=StaticInventory(host="old-box", gpus_list=[]), db_url=url).sync_inventory()
    new = GPUPool(inventory=StaticInventory(host="new-box", gpus_list=[{"uuid": "GPU-moved", "index": 0}]),
                  db_url=url)
    assert new.try_acquire("dave", "", 1).gpu_uuids == ("GPU-moved",)


def test_the_gpuhub_gpu_host_setting_names_this_host_in_the_ledger(tmp_path):
    from traitlets.config import Config

    from spawner.inventory.kinds import inventory_from_config
    from spawner.settings import apply_settings, load_settings

    c = Config()
    apply_settings(c, load_settings({"GPUHUB_GPU_HOST": "gpu-box", "GPUHUB_DATA_DIR": str(tmp_path),
                                     "GPUHUB_AUTHENTICATOR": "dummy", "GPUHUB_DUMMY_PASSWORD": "x",
                                     "GPUHUB_CULL": "false"}))
    assert inventory_from_config("static", config=c).host == "gpu-box"
