"""Placement spends scarce GPUs last: a request goes first to the hosts that fewer host-tagged
profiles ask for (GPUPool.set_host_demand), so one that names no host leaves the tagged nodes'
GPUs to the profiles that need them; pure, then on a real SQLite ledger."""

from __future__ import annotations

import asyncio

import pytest

from spawner.inventory import StaticInventory
from spawner.pool import GPUPool, InvalidRequest
from spawner.pool.leasing.placement import choose


def far(host, a, b):
    return 50


def free_of(**hosts: int) -> dict:
    return {h: [(i, f"{h}-gpu{i}") for i in range(n)] for h, n in hosts.items()}


def test_an_untagged_request_goes_to_the_host_fewer_profiles_ask_for():
    free = free_of(a100=2, t4=2)
    assert choose(free, None, 1, far)[0] == "a100"  # without demand: best fit, then the name
    assert choose(free, None, 1, far, demand={"a100": 1})[0] == "t4"
    # Fewer asks beats best fit: t4 has more free GPUs, yet a100 is what a tagged profile needs.
    assert choose(free_of(a100=1, t4=2), None, 1, far, demand={"a100": 1})[0] == "t4"
    # Among equally asked-for hosts, best fit as before.
    assert choose(free_of(a=2, b=1), None, 1, far, demand={"a": 1, "b": 1})[0] == "b"
    # The scarce host is still used once the others cannot fit.
    assert choose(free_of(a100=2, t4=1), None, 2, far, demand={"a100": 1})[0] == "a100"


def test_a_tagged_request_keeps_to_its_hosts_and_among_them_spends_the_less_asked_for_first():
    assert choose(free_of(a100=2, t4=2), ["a100"], 1, far, demand={"a100": 3})[0] == "a100"
    # Two profiles ask for the A100 node, one (this one) for the V100 node as well.
    assert choose(free_of(a100=2, v100=2), ["a100", "v100"], 1, far, demand={"a100": 2, "v100": 1})[0] == "v100"


def two_host_pool(tmp_path) -> GPUPool:
    url = f"sqlite:///{tmp_path / 'ledger.sqlite'}"
    for host in ("a100-node", "t4-node"):
        inv = StaticInventory(host=host, gpus_list=[{"uuid": f"GPU-{host}-{i}", "index": i} for i in range(2)])
        GPUPool(inventory=inv, db_url=url).sync_inventory()
    return GPUPool(db_url=url, poll_interval=0.05)  # no inventory: every host (as on Swarm)


def test_plain_servers_leave_the_tagged_nodes_gpus_for_the_profiles_that_need_them(tmp_path):
    pool = two_host_pool(tmp_path)
    try:
        pool.set_host_demand({"a100-node": 1})
        plain = [pool.try_acquire(f"u{i}", "", 1) for i in range(2)]
        assert {lease.host for lease in plain} == {"t4-node"}
        # The next a100 request is served at once instead of queueing behind plain servers.
        tagged = asyncio.run(pool.acquire("ann", "", 1, host=["a100-node"], timeout=1))
        assert tagged.host == "a100-node"
        # With the cheap node full, a plain request still gets the scarce node's last GPU.
        assert pool.try_acquire("u3", "", 1).host == "a100-node"
    finally:
        pool.close()


@pytest.mark.parametrize("bad", [{"a": -1}, {"a": True}, {"a": "1"}, {1: 1}, ["a"]])
def test_bad_host_demand_is_refused_and_changes_nothing(tmp_path, bad):
    pool = two_host_pool(tmp_path)
    try:
        pool.set_host_demand({"a100-node": 1})
        with pytest.raises(InvalidRequest, match="host demand"):
            pool.set_host_demand(bad)
        assert pool.try_acquire("u", "", 1).host == "t4-node"
    finally:
        pool.close()


def test_servers_and_jobs_count_a_hosts_demand_the_same_way():
    """One function for both (the spawner's and the jobs runner's): each host-tagged GPU profile
    adds one to every host it can use; untagged and CPU profiles add nothing."""
    from types import SimpleNamespace as P

    from spawner.pool.leasing.placement import host_demand

    nodes = {"a100-node": {"gpu.model": "a100"}, "t4-node": {"gpu.model": "t4"}}

    def hosts_matching(wanted):
        return [h for h, labels in nodes.items() if all(labels.get(k) == v for k, v in wanted.items())]

    profiles = [P(gpus=1, node_labels=(("gpu.model", "a100"),)), P(gpus=2, node_labels=(("gpu.model", "a100"),)),
                P(gpus=1, node_labels=()), P(gpus=0, node_labels=(("gpu.model", "t4"),))]
    assert host_demand(profiles, hosts_matching) == {"a100-node": 2}
