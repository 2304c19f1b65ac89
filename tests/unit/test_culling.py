"""The cull arbiter's decisions and the hub wiring of the idle culler (no services)."""

from __future__ import annotations

import json
import socket
from datetime import timedelta
from types import SimpleNamespace

import pytest
from traitlets.config import Config

from devservices.waiting import async_until
from spawner.culling.culler import (
    BUSY_SWITCH_ENV,
    SERVICE_NAME,
    CullerUtilization,
    GPUCullPolicy,
    GPUIdleCuller,
)
from spawner.inventory import SimulatedInventory
from spawner.settings import SettingsError, load_settings
from spawner.settings.culler import (
    CULLER_SCOPES,
    HAND_OVER,
    activity_interval,
    culler_config,
    render_hand_over,
)
from spawner.settings.culler import configure_culler as configure_hub_side
from spawner.settings.services import set_hub_services

GPU_A, GPU_B = "GPU-aaaa", "GPU-bbbb"


def gpu_server(*uuids, lease_id=7, url="/user/alice/"):
    return {"name": "", "url": url,
            "state": {"gpu_lease_id": lease_id, "gpu_uuids": list(uuids), "gpu_host": "h1"}}


def cpu_server(url="/user/carol/"):
    return {"name": "", "url": url, "state": {"profile": "tf-cpu"}}


def idle(seconds):
    return timedelta(seconds=seconds)


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


# ------------------------------------------------------------ timeouts


def test_gpu_servers_get_the_shorter_timeout_cpu_servers_the_longer():
    policy = GPUCullPolicy(cpu_timeout=3600, gpu_timeout=900)
    assert policy.decide(idle(899), gpu_server(GPU_A)).cull is False
    assert policy.decide(idle(900), gpu_server(GPU_A)).cull is True
    assert policy.decide(idle(900), cpu_server()).cull is False
    assert policy.decide(idle(3600), cpu_server()).cull is True


def test_arbiter_hook_signature_of_jupyterhub_idle_culler():
    policy = GPUCullPolicy(cpu_timeout=3600, gpu_timeout=900)
    assert policy(inactive=idle(1000), inactive_limit=900, server=gpu_server(GPU_A)) is True
    assert policy(inactive=idle(1000), inactive_limit=900, server=cpu_server()) is False
    assert policy(inactive=None, inactive_limit=900, server=gpu_server(GPU_A)) is False


def test_without_server_state_every_server_gets_the_longer_timeout():
    # A culler role without admin:server_state cannot tell GPU servers apart:
    # never cull a CPU server early for it.
    policy = GPUCullPolicy(cpu_timeout=3600, gpu_timeout=900)
    stateless = {"name": "", "url": "/user/dave/"}
    assert policy.decide(idle(1000), stateless).cull is False
    assert policy.decide(idle(3600), stateless).cull is True


def test_verdict_names_the_rule_and_the_limit():
    verdict = GPUCullPolicy(cpu_timeout=3600, gpu_timeout=900).decide(idle(901), gpu_server(GPU_A))
    assert verdict.reason == "GPU server inactive for 901.0 s (limit 900 s: the GPU servers' idle limit)"


# ------------------------------------------------------------ utilization rule


def utilization_policy(readings: dict, clock: Clock, seconds: float = 60) -> GPUCullPolicy:
    return GPUCullPolicy(cpu_timeout=3600, gpu_timeout=900, gpu_idle_percent=10,
                         gpu_idle_seconds=seconds,
                         utilization=lambda host, uuid: readings.get(uuid), clock=clock)


def test_gpus_under_threshold_for_the_whole_period_are_culled_even_when_active():
    clock, readings = Clock(), {GPU_A: 3.0}
    policy = utilization_policy(readings, clock)
    server = gpu_server(GPU_A)
    assert policy.decide(idle(1), server).cull is False  # first low sample starts the clock
    clock.now += 59
    assert policy.decide(idle(1), server).cull is False
    clock.now += 1
    verdict = policy.decide(idle(1), server)
    assert verdict.cull is True
    assert "under 10%" in verdict.reason


def test_a_busy_reading_restarts_the_period():
    clock, readings = Clock(), {GPU_A: 3.0}
    policy = utilization_policy(readings, clock)
    server = gpu_server(GPU_A)
    policy.decide(idle(1), server)
    clock.now += 50
    readings[GPU_A] = 80.0
    assert policy.decide(idle(1), server).cull is False
    readings[GPU_A] = 0.0
    clock.now += 1
    policy.decide(idle(1), server)
    clock.now += 59
    assert policy.decide(idle(1), server).cull is False
    clock.now += 1
    assert policy.decide(idle(1), server).cull is True


def test_every_leased_gpu_must_be_under_the_threshold():
    clock, readings = Clock(), {GPU_A: 0.0, GPU_B: 50.0}
    policy = utilization_policy(readings, clock)
    server = gpu_server(GPU_A, GPU_B)
    policy.decide(idle(1), server)
    clock.now += 120
    assert policy.decide(idle(1), server).cull is False


def test_unknown_utilization_never_culls():
    clock = Clock()
    policy = utilization_policy({}, clock)  # every reading None
    policy.decide(idle(1), gpu_server(GPU_A))
    clock.now += 3600
    assert policy.decide(idle(1), gpu_server(GPU_A)).cull is False


def test_utilization_rule_leaves_cpu_servers_alone_and_is_off_at_zero():
    clock = Clock()
    policy = utilization_policy({GPU_A: 0.0}, clock)
    policy.decide(idle(1), cpu_server())
    clock.now += 3600
    assert policy.decide(idle(1), cpu_server()).cull is False

    off = GPUCullPolicy(cpu_timeout=3600, gpu_timeout=900, gpu_idle_percent=0,
                        utilization=lambda h, u: 0.0, clock=clock)
    off.decide(idle(1), gpu_server(GPU_A))
    clock.now += 3600
    assert off.decide(idle(1), gpu_server(GPU_A)).cull is False


def test_each_lease_has_its_own_low_period():
    clock, readings = Clock(), {GPU_A: 0.0, GPU_B: 0.0}
    policy = utilization_policy(readings, clock)
    policy.decide(idle(1), gpu_server(GPU_A, lease_id=1))
    clock.now += 40
    policy.decide(idle(1), gpu_server(GPU_B, lease_id=2))
    clock.now += 20
    assert policy.decide(idle(1), gpu_server(GPU_A, lease_id=1)).cull is True
    assert policy.decide(idle(1), gpu_server(GPU_B, lease_id=2)).cull is False


def test_simulated_utilization_is_read_from_the_file_tests_control(tmp_path):
    host = socket.gethostname()
    uuid = SimulatedInventory.uuid_for(host, 2)
    path = tmp_path / "util.json"
    path.write_text(json.dumps({uuid: 42}))
    read = CullerUtilization("simulated", 4, str(path), log=None)
    assert read(host, uuid) == 42.0
    path.write_text(json.dumps({uuid: 7}))
    assert read(host, uuid) == 7.0
    assert read(host, "GPU-not-here") is None


# ------------------------------------------------------------ the culler app


def test_culler_app_takes_its_gpu_options_from_the_command_line(tmp_path):
    app = GPUIdleCuller()
    app.parse_command_line([
        "--cpu-timeout=600", "--gpu-timeout=60", "--cull-every=5", "--inventory=simulated",
        "--gpu-idle-percent=10", "--gpu-idle-seconds=6", f"--utilization-file={tmp_path}/u.json",
    ])
    assert app.timeout == 60  # the smaller of the two: GPU servers are looked at in time
    assert app.cull_every == 5
    policy = app.cull_arbiter_hook
    assert isinstance(policy, GPUCullPolicy)
    assert (policy.cpu_timeout, policy.gpu_timeout) == (600, 60)
    assert (policy.gpu_idle_percent, policy.gpu_idle_seconds) == (10, 6)
    assert policy.gpu_rule_enabled


def test_the_culler_records_its_intent_in_the_ledger_before_it_culls_a_gpu_server(tmp_path, monkeypatch):
    # The spawner ends the lease `culled` only because of this record (JupyterHub names no requester).
    import asyncio
    from datetime import timedelta

    from spawner.pool import GPUPool

    url = f"sqlite:///{tmp_path}/ledger.sqlite"
    pool = GPUPool(inventory=SimulatedInventory(count=2, host="h"), db_url=url)
    lease = pool.try_acquire("alice", "", 1)
    monkeypatch.setenv("GPUHUB_POOL_DB_URL", url)
    app = GPUIdleCuller()
    app.parse_command_line(["--cpu-timeout=600", "--gpu-timeout=60", "--inventory=static"])
    server = gpu_server(*lease.gpu_uuids, lease_id=lease.id)
    kept = app.cull_arbiter_hook(inactive=timedelta(seconds=30), inactive_limit=60, server=server)
    assert kept is False and pool.end_intent(lease.id) is None
    culled = app.cull_arbiter_hook(inactive=timedelta(seconds=90), inactive_limit=60, server=server)
    assert asyncio.run(culled) is True
    assert pool.end_intent(lease.id) == ("culled", "idle-culler")
    pool.close()


def test_culler_app_without_gpu_rule_reads_no_utilization():
    app = GPUIdleCuller()
    app.parse_command_line(["--cpu-timeout=600", "--gpu-timeout=60", "--inventory=nvml",
                            "--gpu-idle-percent=0"])
    assert app.cull_arbiter_hook.gpu_rule_enabled is False


@pytest.mark.parametrize("inventory, percent", [("nvml", 5.0), ("simulated", 0.0), ("static", 0.0)])
def test_culler_app_turns_the_gpu_rule_on_by_default_only_for_real_gpus(inventory, percent):
    app = GPUIdleCuller()
    app.parse_command_line([f"--inventory={inventory}"])
    policy = app.cull_arbiter_hook
    assert (policy.gpu_idle_percent, policy.gpu_idle_seconds) == (percent, 1800.0)
    assert policy.gpu_rule_enabled is (inventory == "nvml")


# ------------------------------------------------------------ hub wiring


def settings(**env):
    return load_settings({"GPUHUB_DATA_DIR": "/nonexistent-data-dir", "GPUHUB_POOL_PAGE": "false", **env})


def configure_culler(c, settings):
    """The culler's part of the hub's config, as apply_settings makes it."""
    configure_hub_side(c, settings)
    set_hub_services(c, settings)


def culler_reading(c, tmp_path) -> GPUIdleCuller:
    """The culler process as the hub starts it: its command line, and the file the hub writes
    from its final config `c` (render_hand_over), loaded as the culler's start() loads it."""
    (service,) = [s for s in c.JupyterHub.services if s["name"] == SERVICE_NAME]
    path = tmp_path / HAND_OVER
    path.write_text(render_hand_over(c))
    argv = [a.replace("/nonexistent-data-dir", str(tmp_path)) for a in service["command"][3:]]
    app = GPUIdleCuller()
    app.parse_command_line(argv)
    app.load_config_file(app.config_file)
    return app


def servers_environment(c) -> dict:
    """The servers' environment as a spawn computes it (callables get the spawner: its config is `c`)."""
    spawner = SimpleNamespace(config=c)
    return {k: v(spawner) if callable(v) else v for k, v in c.GPUDockerSpawner.environment.items()}


def test_configure_culler_adds_the_service_and_a_role_of_only_its_scopes(tmp_path):
    c = Config()
    c.JupyterHub.services = [{"name": "other", "api_token": "x"}]
    configure_culler(c, settings(GPUHUB_CULL_TIMEOUT_GPU="120", GPUHUB_CULL_TIMEOUT_CPU="900",
                                 GPUHUB_CULL_EVERY="30"))
    services = {s["name"]: s for s in c.JupyterHub.services}
    assert set(services) == {"other", SERVICE_NAME}
    # Its settings come in the hub's file, none on the command line (one hand-over format, as the
    # pool service's and the SSH gateway's).
    assert services[SERVICE_NAME]["command"][1:] == ["-m", "spawner.culling",
                                                     f"--config=/nonexistent-data-dir/{HAND_OVER}"]
    culler = culler_reading(c, tmp_path)
    assert (culler.timeout, culler.gpu_timeout, culler.cpu_timeout, culler.cull_every) == (120, 120, 900, 30)
    (role,) = [r for r in c.JupyterHub.load_roles if r["name"] == SERVICE_NAME]
    assert role["services"] == [SERVICE_NAME]
    assert sorted(role["scopes"]) == sorted(CULLER_SCOPES) == sorted([
        "list:users", "read:users:activity", "read:servers", "delete:servers", "admin:server_state"])


def test_configure_culler_twice_keeps_one_service_and_one_role():
    c = Config()
    configure_culler(c, settings())
    configure_culler(c, settings())
    assert [s["name"] for s in c.JupyterHub.services] == [SERVICE_NAME]
    assert [r["name"] for r in c.JupyterHub.load_roles] == [SERVICE_NAME]


def test_unset_cull_variables_write_nothing_and_the_culler_keeps_its_own_defaults(tmp_path):
    c = Config()
    configure_culler(c, settings())
    assert dict(c.GPUIdleCuller) == {"inventory": "nvml"}  # the hub's inventory, nothing else
    assert json.loads(render_hand_over(c)) == {"GPUIdleCuller": {"inventory": "nvml"}}
    culler = culler_reading(c, tmp_path)
    traits = GPUIdleCuller.class_traits()
    assert (culler.cpu_timeout, culler.gpu_timeout, culler.gpu_contended_timeout) == tuple(
        traits[name].default_value for name in ("cpu_timeout", "gpu_timeout", "gpu_contended_timeout"))
    assert culler.cull_every == 60 and culler.timeout == culler.gpu_contended_timeout


def test_the_culler_options_of_a_later_config_file_reach_the_culler_the_servers_and_the_page(tmp_path):
    from spawner.settings.service_file import service_config

    s = settings()
    c = Config()
    configure_culler(c, s)
    # An admin's config file loaded after the GPUHUB_* settings: the hub's final config.
    c.GPUIdleCuller.gpu_timeout = 120
    c.GPUIdleCuller.gpu_contended_timeout = 0
    culler = culler_reading(c, tmp_path)
    assert (culler.gpu_timeout, culler.timeout) == (120, 120)
    assert servers_environment(c)["JUPYTERHUB_ACTIVITY_INTERVAL"] == "40"
    page = service_config(c, s)["PoolPageSettings"]
    assert (page["cull_timeout_gpu"], json.loads(page["cull_rules"])["gpu"], page["idle_after"]) == (120, 120, 80)


def test_the_culler_does_not_run_on_defaults_when_its_file_is_missing(tmp_path):
    app = GPUIdleCuller()
    app.parse_command_line([f"--config={tmp_path}/{HAND_OVER}"])
    with pytest.raises(SystemExit):
        app.start()


@pytest.mark.parametrize("env, expected", [
    # Real GPUs (NVML, the default inventory): on, under 5 % for 30 minutes.
    ({}, {"inventory": "nvml", "gpu_idle_percent": 5, "gpu_idle_seconds": 1800}),
    ({"GPUHUB_GPU_IDLE_MINUTES": "60"}, {"gpu_idle_percent": 5, "gpu_idle_seconds": 3600}),
    # Turned off by hand, or GPUs whose utilisation nobody measures: off.
    ({"GPUHUB_GPU_IDLE_PERCENT": "0"}, {"inventory": "nvml", "gpu_idle_percent": 0}),
    ({"GPUHUB_INVENTORY": "simulated"}, {"inventory": "simulated", "gpu_idle_percent": 0}),
])
def test_gpu_utilisation_rule_is_on_by_default_where_nvml_reads_it(env, expected, tmp_path):
    c = Config()
    configure_culler(c, settings(**env))
    culler = culler_reading(c, tmp_path)
    assert {name: getattr(culler, name) for name in expected} == expected
    assert culler.cull_arbiter_hook.gpu_rule_enabled is (expected["gpu_idle_percent"] == 5)


def test_gpu_rule_options_reach_the_culler_in_seconds(tmp_path):
    c = Config()
    configure_culler(c, settings(GPUHUB_GPU_IDLE_PERCENT="5", GPUHUB_GPU_IDLE_MINUTES="0.1",
                                 GPUHUB_INVENTORY="simulated",
                                 GPUHUB_SIMULATED_UTILIZATION_FILE="/tmp/u.json"))
    culler = culler_reading(c, tmp_path)
    assert (culler.gpu_idle_percent, culler.gpu_idle_seconds, culler.inventory, culler.utilization_file) == (
        5, 6, "simulated", "/tmp/u.json")
    # GPUHUB_SIMULATED_GPUS unset: not in the file, the culler counts as the inventory
    assert "simulated_gpus" not in c.GPUIdleCuller
    assert culler.simulated_gpus == SimulatedInventory().count
    c = Config()
    configure_culler(c, settings(GPUHUB_INVENTORY="simulated", GPUHUB_GPU_IDLE_PERCENT="5", GPUHUB_SIMULATED_GPUS="2"))
    assert culler_reading(c, tmp_path).simulated_gpus == 2


def interval(**env) -> int:
    s = settings(**env)
    return activity_interval(culler_config(s), s.activity_interval)


def test_single_user_servers_report_activity_well_inside_the_shortest_timeout():
    c = Config()
    configure_culler(c, settings(GPUHUB_CULL_TIMEOUT_GPU="900", GPUHUB_CULL_TIMEOUT_GPU_CONTENDED="0"))
    assert servers_environment(c)["JUPYTERHUB_ACTIVITY_INTERVAL"] == "300"
    # the contended timeout (300 s by default) is the shortest: reports every 100 s
    assert interval(GPUHUB_CULL_TIMEOUT_GPU="900") == 100
    assert c.JupyterHub.activity_resolution == 30
    assert interval(GPUHUB_CULL_TIMEOUT_GPU="6", GPUHUB_CULL_TIMEOUT_GPU_CONTENDED="0") == 2
    assert interval(GPUHUB_CULL_TIMEOUT_GPU="1") == 1
    assert interval(GPUHUB_ACTIVITY_INTERVAL="45") == 45
    c = Config()
    configure_culler(c, settings(GPUHUB_CULL_TIMEOUT_GPU="6", GPUHUB_CULL_TIMEOUT_GPU_CONTENDED="0"))
    assert c.JupyterHub.activity_resolution == 2


def test_servers_post_work_after_a_third_of_the_shortest_timeout_of_quiet_and_the_hub_keeps_it():
    c = Config()
    configure_culler(c, settings())
    env = servers_environment(c)
    # the contended timeout (300 s by default) is the shortest
    assert env["GPUHUB_ACTIVITY_QUIET_AFTER"] == "100" == env["JUPYTERHUB_ACTIVITY_INTERVAL"]
    # Reports configured rarer than that: the hub's resolution stays finer than the quiet spell,
    # or it would drop the post that ends one.
    c = Config()
    configure_culler(c, settings(GPUHUB_CULL_TIMEOUT_GPU="45", GPUHUB_ACTIVITY_INTERVAL="120"))
    assert servers_environment(c)["GPUHUB_ACTIVITY_QUIET_AFTER"] == "15"
    assert c.JupyterHub.activity_resolution == 15


def test_busy_kernels_count_through_the_images_extension_and_the_image_keeps_its_command():
    for value in ("", "true", "extension"):
        c = Config()
        configure_culler(c, settings(GPUHUB_CULL_KEEP_BUSY=value))
        assert "cmd" not in c.GPUDockerSpawner  # the image's own start command
        assert c.GPUDockerSpawner.environment[BUSY_SWITCH_ENV] == "1"


def test_the_wrapper_is_deprecated_and_means_the_extension(capsys):
    # It patched a private method of jupyterhub-singleuser through `python -c`; the images'
    # extension does the job, and the image's own start command is never replaced.
    c = Config()
    configure_culler(c, settings(GPUHUB_CULL_KEEP_BUSY="wrapper"))
    assert "cmd" not in c.GPUDockerSpawner
    assert c.GPUDockerSpawner.environment[BUSY_SWITCH_ENV] == "1"
    assert "GPUHUB_CULL_KEEP_BUSY=wrapper is deprecated" in capsys.readouterr().err


def test_busy_kernels_turned_off():
    c = Config()
    configure_culler(c, settings(GPUHUB_CULL_KEEP_BUSY="false"))
    assert "cmd" not in c.GPUDockerSpawner
    assert c.GPUDockerSpawner.environment[BUSY_SWITCH_ENV] == "0"


@pytest.mark.parametrize("env, named", [
    ({"GPUHUB_CULL_KEEP_BUSY": "maybe"}, "GPUHUB_CULL_KEEP_BUSY"),
    ({"GPUHUB_ACTIVITY_INTERVAL": "-1"}, "GPUHUB_ACTIVITY_INTERVAL"),
    ({"GPUHUB_ACTIVITY_INTERVAL": "soon"}, "GPUHUB_ACTIVITY_INTERVAL"),
])
def test_bad_culling_settings_name_the_variable(env, named):
    with pytest.raises(SettingsError, match=named):
        load_settings(env)


# ------------------------------------------------------------ contended and per-profile limits


def test_the_contended_timeout_applies_only_while_someone_waits_on_the_host():
    from spawner.culling.deadline import CullRules

    waiting = {"h": False}
    policy = GPUCullPolicy(cpu_timeout=3600, gpu_timeout=900, rules=CullRules(3600, 900, 300),
                           contention=lambda host: waiting.get(host, False))
    server = gpu_server(GPU_A)
    server["state"]["gpu_host"] = "h"
    assert policy.decide(idle(400), server).cull is False
    waiting["h"] = True
    verdict = policy.decide(idle(400), server)
    assert verdict.cull is True and "limit 300 s: the idle limit while requests wait for GPUs" in verdict.reason
    # a CPU server keeps its own limit whoever waits
    assert policy.decide(idle(400), {"name": "", "url": "/user/c/", "state": {}}).cull is False


def test_profiles_have_their_own_idle_limit_and_maximum_age():
    from datetime import UTC, datetime, timedelta

    from spawner.culling.deadline import CullRules, deadline

    rules = CullRules(3600, 900, 300, profile_idle={"short": 60}, profile_max_age={"short": 7200})
    policy = GPUCullPolicy(cpu_timeout=3600, gpu_timeout=900, rules=rules)
    server = gpu_server(GPU_A)
    server["user_options"] = {"profile": "short"}
    assert policy.decide(idle(61), server).cull is True
    busy_but_old = dict(server, started=(datetime.now(UTC) - timedelta(hours=3)).isoformat())
    verdict = policy.decide(idle(1), busy_but_old)
    assert verdict.cull is True and "maximum age 7200 s" in verdict.reason
    # The deadline the pages show is the same rule's.
    now = datetime.now(UTC)
    d = deadline(rules, last_activity=now, started=now - timedelta(minutes=119.5), is_gpu=True, profile="short",
                 contended=False)
    assert d.at == now + timedelta(seconds=30) and d.by_max_age and "maximum age, 2 h" in d.reason
    d = deadline(rules, last_activity=now, started=now, is_gpu=True, profile=None, contended=True)
    assert d.at == now + timedelta(seconds=300) and d.contended


def test_the_culler_reads_who_waits_from_the_ledger(tmp_path):
    import asyncio

    from spawner.culling.policy import LedgerContention
    from spawner.pool import GPUPool

    pool = GPUPool(inventory=SimulatedInventory(count=1, host="h"), db_url=f"sqlite:///{tmp_path}/l.sqlite",
                   poll_interval=0.05)
    pool.sync_inventory()
    held = pool.try_acquire("alice", "", 1)
    clock = [0.0]
    contention = LedgerContention(GPUPool(db_url=f"sqlite:///{tmp_path}/l.sqlite").queue, clock=lambda: clock[0])
    assert contention("h") is False

    async def main():
        task = asyncio.ensure_future(pool.acquire("bob", "", 1, timeout=30))
        await async_until(pool.queue, timeout=30, what="bob in the queue")
        clock[0] += 10  # the next cull pass reads the queue again
        assert contention("h") is True and contention("other-host") is False
        pool.release(held.id)
        await task
    asyncio.run(main())
    clock[0] += 10
    assert contention("h") is False
