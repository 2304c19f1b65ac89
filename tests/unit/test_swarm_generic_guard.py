"""The generic-resource guard is used only where Swarm's managers can carry it (moby/moby#44378).

Node dicts have the shape of `docker node inspect`; the real Swarm's managers (Debian's Docker
20.10) are checked in tests/integration/test_swarm.py::test_drained_node_gets_nothing_new.
"""

from __future__ import annotations

import asyncio

import pytest
from tornado import web

from spawner.cli.doctor_checks import OK, WARN
from spawner.cli.doctor_swarm import guard_result
from spawner.engines.swarm.generic_guard import GuardCheck, verdict_of
from spawner.engines.swarm.spawner import GPUSwarmSpawner


def node(host, engine, role="worker"):
    entry = {"ID": f"id-{host}", "Description": {"Hostname": host, "Engine": {"EngineVersion": engine}},
             "Spec": {"Role": role, "Availability": "active"}, "Status": {"State": "ready"}}
    if role == "manager":
        entry["ManagerStatus"] = {"Reachability": "reachable"}
    return entry


def test_a_manager_older_than_docker_23_makes_the_guard_unusable_and_is_named():
    verdict = verdict_of([node("m1", "24.0.7", "manager"), node("m2", "20.10.24+dfsg1", "manager"),
                          node("w1", "19.03.1")])
    assert not verdict.usable
    assert "m2 (Docker 20.10.24+dfsg1)" in verdict.detail and "m1" not in verdict.detail
    assert "w1" not in verdict.detail  # a worker's engine does not run the constraint enforcer


def test_managers_on_docker_23_or_newer_carry_it_whatever_the_workers_run():
    assert verdict_of([node("m1", "23.0.0", "manager"), node("m2", "27.3.1", "manager"),
                       node("w1", "20.10.24")]).usable


def test_no_manager_listed_is_not_a_yes():
    assert not verdict_of([node("w1", "27.0.0")]).usable


def test_the_verdict_is_kept_between_spawns_and_looked_up_again_later(monkeypatch):
    from spawner.engines.swarm import generic_guard

    class Manager:
        calls = 0

        def nodes(self):
            Manager.calls += 1
            return [node("m1", "20.10.24", "manager")]

    check, manager = GuardCheck(), Manager()
    assert not check.verdict(manager).usable and not check.verdict(manager).usable
    assert Manager.calls == 1
    monkeypatch.setattr(generic_guard, "RECHECK_SECONDS", -1.0)
    check.verdict(manager)
    assert Manager.calls == 2


def test_doctor_warns_with_the_fix_or_says_ok():
    old = guard_result([node("m1", "20.10.24", "manager")])
    assert old.status == WARN and "m1 (Docker 20.10.24)" in old.detail and "23.0" in old.fix
    assert guard_result([node("m1", "25.0.3", "manager")]).status == OK


class RejectedTask:
    """A spawner whose service's only task stays rejected (no replacement comes)."""

    def __init__(self, states):
        self.states = list(states)

    async def __call__(self):
        state = self.states.pop(0) if len(self.states) > 1 else self.states[0]
        return {"Status": {"State": state, "Err": "assigned node no longer meets constraints"}}


def spawner_with(states, guarded=True):
    spawner = GPUSwarmSpawner.__new__(GPUSwarmSpawner)
    spawner._guarded = guarded
    spawner.gpu_host = "gpu-node-1"
    spawner.REJECTED_WAIT_SECONDS = 0.5
    spawner.get_task = RejectedTask(states)
    return spawner


def test_a_guarded_start_whose_task_stays_rejected_fails_with_swarms_reason():
    with pytest.raises(web.HTTPError) as raised:
        asyncio.run(asyncio.wait_for(spawner_with(["rejected"]).start_object(), 10))
    assert raised.value.status_code == 500
    assert "assigned node no longer meets constraints" in raised.value.log_message


def test_a_guarded_start_waits_for_the_retry_after_a_rejection():
    asyncio.run(asyncio.wait_for(spawner_with(["rejected", "rejected", "pending", "running"]).start_object(), 10))


def test_an_unguarded_rejection_fails_at_once():
    with pytest.raises(web.HTTPError):
        asyncio.run(asyncio.wait_for(spawner_with(["rejected", "running"], guarded=False).start_object(), 10))
