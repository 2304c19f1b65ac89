"""no-new-privileges on every Swarm node: what the probe's tasks mean, when the spec carries the
flag, and the doctor's line per node (pure; the real Swarm is in tests/integration/test_swarm_nodes.py)."""

from __future__ import annotations

import logging

import pytest

from spawner.cli.doctor_checks import FAIL, OK, WARN
from spawner.cli.doctor_swarm import node_result
from spawner.engines.swarm.lockdown import NodeLockdown, Verdict, probe_spec, spec_carries_it, verdict_of, version_tuple


def node(host, engine="20.10.24+dfsg1", uuids=(), state="ready", availability="active"):
    return {"ID": f"id-{host}",
            "Description": {"Hostname": host, "Engine": {"EngineVersion": engine},
                            "Resources": {"GenericResources": [{"NamedResourceSpec": {"Kind": "GPU", "Value": u}}
                                                               for u in uuids]}},
            "Spec": {"Availability": availability}, "Status": {"State": state}}


def task(state, code=None, err=""):
    return {"NodeID": "n", "Status": {"State": state, "Err": err, "ContainerStatus": {"ExitCode": code}}}


@pytest.mark.parametrize("text, parsed", [("20.10.24+dfsg1", (20, 10, 24)), ("1.44", (1, 44)),
                                          ("25.0.3-ce", (25, 0, 3)), ("", ()), ("x", ())])
def test_version_tuple(text, parsed):
    assert version_tuple(text) == parsed


def test_the_spec_carries_the_flag_only_from_api_1_44_on_nodes_with_docker_25():
    assert spec_carries_it("1.44", "25.0.0")
    assert not spec_carries_it("1.41", "25.0.0")  # an old manager drops the field
    assert not spec_carries_it("1.47", "20.10.24+dfsg1")  # an old node ignores it
    assert not spec_carries_it(None, None)


def test_what_a_probe_task_says():
    assert verdict_of(task("complete", 0), 0).enforced is True
    assert verdict_of(task("failed", 1), 0).enforced is False
    unknown = verdict_of(task("rejected", err="No such image: x"), 0)
    assert unknown.enforced is None and "No such image" in unknown.detail
    assert verdict_of(task("failed", 126), 0).enforced is None  # not grep's "absent": a broken image
    assert verdict_of(None, 0).enforced is None


def test_the_probe_runs_as_nobody_without_capabilities_gpus_or_restarts():
    old = probe_spec("img", "1.41")
    spec = old["ContainerSpec"]
    assert spec["User"] == "65534:65534" and spec["CapabilityDrop"] == ["ALL"]
    assert "NVIDIA_VISIBLE_DEVICES=void" in spec["Env"]
    assert old["RestartPolicy"]["Condition"] == "none" and old["Resources"]["Limits"]["Pids"] == 64
    assert "Privileges" not in spec  # a 20.10 manager: the node's daemon must set it
    assert probe_spec("img", "1.44")["ContainerSpec"]["Privileges"] == {"NoNewPrivileges": True}


def test_verdicts_are_kept_and_only_missing_ones_probed(monkeypatch):
    import spawner.engines.swarm.lockdown as lockdown

    probed = []

    def fake_probe(client, nodes, image, prefix, log):
        probed.append([n["ID"] for n in nodes])
        return {n["ID"]: Verdict(True, "ok", lockdown.time.monotonic()) for n in nodes}

    monkeypatch.setattr(lockdown, "probe", fake_probe)
    cache = NodeLockdown()
    a, b = node("a"), node("b")
    assert set(cache.verdicts(None, [a], "img", "p", logging.getLogger())) == {"id-a"}
    assert set(cache.verdicts(None, [a, b], "img", "p", logging.getLogger())) == {"id-a", "id-b"}
    assert probed == [["id-a"], ["id-b"]]


def test_the_doctor_line_per_node():
    passed, failed, unsure = Verdict(True, "enforced", 0), Verdict(False, "runs WITHOUT it", 0), Verdict(None, "?", 0)
    gpus = ("GPU-1", "GPU-2")
    ok = node_result(node("a", uuids=gpus), "1.41", passed, set(gpus))
    assert ok.status == OK and "same GPUs" in ok.detail
    bad = node_result(node("b", uuids=gpus), "1.41", failed, set(gpus))
    assert bad.status == FAIL and "no-new-privileges" in bad.fix and "node b" in bad.fix
    assert node_result(node("c", uuids=gpus), "1.41", unsure, set(gpus)).status == WARN
    # Docker 25 on both ends: the spec carries it, no probe needed.
    assert node_result(node("d", engine="25.0.1", uuids=gpus), "1.44", None, set(gpus)).status == OK
    mismatch = node_result(node("e", uuids=gpus), "1.41", passed, {"GPU-1", "GPU-9"})
    assert mismatch.status == FAIL and "GPU-9" in mismatch.detail and "GPU-2" in mismatch.detail
    assert "node-generic-resources" in mismatch.fix
    no_agent = node_result(node("f", uuids=gpus), "1.41", passed, set())
    assert no_agent.status == WARN and "gpu-pool agent" in no_agent.fix
    assert node_result(node("g", uuids=gpus, state="down"), "1.41", None, None).status == WARN


def test_a_swarm_jobs_unit_avoids_the_refused_nodes_and_asks_for_no_new_privileges_where_it_can():
    """The jobs' engine applies the servers' lock-down check to each unit's service spec."""
    from spawner.engines.swarm.job_services import SwarmJobEngine
    from spawner.jobs.engine import UnitSpec
    from spawner.jobs.runner_settings import JobSettings

    engine = SwarmJobEngine(JobSettings(engine="swarm", prefix="gpuhub", cpu_constraints=["node.role==worker"]))
    spec = UnitSpec(name="gpuhub-job-7", image="img", command=["true"], user="1000:100", env={}, labels={},
                    working_dir="/home/jovyan", volumes={})
    old = engine.service_args(spec, {"n3": "lax-node"}, spec_nnp=False)["task_template"]
    assert old["Placement"]["Constraints"] == ["node.role==worker", "node.id!=n3"]
    assert "Privileges" not in old["ContainerSpec"]  # API 1.41: the node's daemon must enforce it
    new = engine.service_args(spec, {}, spec_nnp=True)["task_template"]
    assert new["ContainerSpec"]["Privileges"] == {"NoNewPrivileges": True}
    assert new["Placement"]["Constraints"] == ["node.role==worker"]
