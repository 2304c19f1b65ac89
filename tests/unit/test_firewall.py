"""The host's rules that keep users' containers apart (spawner/engines/common/firewall.py), as data,
and the doctor's reading of them."""

from __future__ import annotations

from spawner.cli.doctor import FAIL, OK, WARN, target_from_env
from spawner.cli.doctor_checks import host_rules_result
from spawner.engines.common.firewall import FORWARD_CHAIN, INPUT_CHAIN, config_ports, job_bridge_name, rules
from spawner.poolpage import SERVICE_NAME


def test_from_the_hubs_bridge_only_its_ports_on_the_gateway_open_and_every_refusal_comes_after():
    wanted = rules("br-abc", "172.30.0.1", [8081, 8091])
    inputs = [r for chain, r in wanted if chain == INPUT_CHAIN and r[1] == "br-abc"]
    assert inputs[0][-2:] == ["-j", "RETURN"] and "ESTABLISHED,RELATED" in inputs[0]
    assert [r[r.index("--dport") + 1] for r in inputs if "--dport" in r] == ["8081", "8091"]
    assert all(r[r.index("-d") + 1] == "172.30.0.1" for r in inputs if "--dport" in r)
    assert inputs[-1][-3:] == ["REJECT", "--reject-with", "icmp-admin-prohibited"]
    # A cluster's internal bridge reaches nothing on the host; none reaches 169.254.0.0/16.
    assert (INPUT_CHAIN, ["-i", "gpuhub-i+", "-j", "REJECT", "--reject-with", "icmp-admin-prohibited"]) in wanted
    forwards = [r for chain, r in wanted if chain == FORWARD_CHAIN]
    assert {r[1] for r in forwards if "169.254.0.0/16" in r} == {"br-abc", "gpuhub-o+", "gpuhub-i+"}
    assert ["-i", "br-abc", "-o", "br-abc", "-j", "REJECT", "--reject-with", "icmp-admin-prohibited"] in forwards
    # No way out at all when the admin says so; the same rules once, whatever the order asked.
    closed = rules("br-abc", "172.30.0.1", [8091, 8081, 8081], outbound=False)
    assert (FORWARD_CHAIN, ["-i", "br-abc", "-j", "REJECT", "--reject-with", "icmp-admin-prohibited"]) in closed
    assert [r for r in closed if r in wanted] == wanted


def test_a_clusters_bridge_is_named_by_its_kind_within_linuxs_15_characters():
    inner, outer = job_bridge_name("gpuhub-job-12-net", False), job_bridge_name("gpuhub-job-12-net", True)
    assert inner.startswith("gpuhub-i") and outer.startswith("gpuhub-o") and len(inner) == len(outer) == 15
    assert job_bridge_name("gpuhub-job-13-net", False) != inner


def test_the_doctor_reads_the_ports_the_hub_opens_from_its_config():
    target = target_from_env("root", env={"GPUHUB_HUB_PORT": "9081", "GPUHUB_POOL_PAGE_PORT": "9091",
                                          "GPUHUB_BIND_URL": "http://0.0.0.0:8000", "GPUHUB_DATA_DIR": "/tmp/x"})
    assert config_ports(target.config) == [8000, 9081, 9091]
    assert SERVICE_NAME == "gpu-pool"


def test_the_doctors_verdict_on_the_host_rules():
    assert host_rules_result("net", [], True, None, [8081]).status == OK
    missing = host_rules_result("net", ["-A GPUHUB-INPUT -i br-abc -j REJECT"], True, None, [8081])
    assert missing.status == FAIL and "-A GPUHUB-INPUT -i br-abc -j REJECT" in missing.detail and missing.fix
    assert host_rules_result("net", [], False, None, [8081]).status == WARN  # made before enable_icc=false
    assert host_rules_result("net", None, False, None).status == WARN  # not made yet
    assert "root" in host_rules_result("net", None, False, "Permission denied").fix


def test_an_opening_that_is_not_a_port_is_refused_when_the_config_is_read():
    import pytest
    from traitlets import TraitError
    from traitlets.config import Config

    from spawner.engines.common.firewall import HostFirewall

    config = Config()
    config.HostFirewall.allowed_ports = [3142, 70000]
    with pytest.raises(TraitError, match="70000"):
        HostFirewall(config=config)
    assert HostFirewall().allowed_ports == [] and HostFirewall().outbound and HostFirewall().enabled


def test_the_doctor_on_swarm_asks_for_an_encrypted_overlay():
    from spawner.cli.doctor_checks import overlay_result

    assert overlay_result("gpuhub", {"Options": {"encrypted": ""}}).status == OK
    plain = overlay_result("gpuhub", {"Options": {}})
    assert plain.status == WARN and "--opt encrypted" in plain.fix
    assert overlay_result("gpuhub", None).status == FAIL
