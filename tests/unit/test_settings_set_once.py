"""The hub's configuration in the Littlest JupyterHub's shape: each GPUHUB_* variable sets one
`Class.option`, an unset one writes nothing (the option's own default stands), and what the
settings build is set, never appended to or changed in place."""

from __future__ import annotations

import copy
import json

import pytest
from traitlets.config import Config

from spawner.inventory import SimulatedInventory
from spawner.jobs.runner_settings import JobSettings
from spawner.lending import GPULendingSpawner
from spawner.settings import apply_settings, load_settings
from spawner.settings import services as services_module
from spawner.settings.service_file import service_config

pytestmark = pytest.mark.unit

# GPUHUB_X: (section, option, a value to give it, what the option then holds)
ONE_OPTION_EACH = {
    "GPUHUB_LEASE_WAIT_TIMEOUT": ("GPUDockerSpawner", "lease_wait_timeout", "42", 42.0),
    "GPUHUB_SIMULATED_GPUS": ("SimulatedInventory", "count", "2", 2),
    "GPUHUB_SIMULATED_CUDA_VERSION": ("SimulatedInventory", "cuda_version", "11.8", "11.8"),
    "GPUHUB_HUB_PORT": ("JupyterHub", "hub_port", "8181", 8181),
    "GPUHUB_MAX_GPUS_PER_USER": ("GPUPool", "max_gpus_per_user", "1", 1),
    "GPUHUB_GPU_HOUR_BUDGET": ("GPUPool", "gpu_hour_budget", "40", 40.0),
    "GPUHUB_GPU_HOST": ("Inventory", "host", "gpu-a", "gpu-a"),
    "GPUHUB_HOME_VOLUME": ("GPUDockerSpawner", "home_volume_name", "homes-{username}", "homes-{username}"),
    "GPUHUB_CLEANUP_SERVERS": ("JupyterHub", "cleanup_servers", "false", False),
    # The culler's (settings/culler.py): its file is written from c.GPUIdleCuller.
    "GPUHUB_CULL_TIMEOUT_CPU": ("GPUIdleCuller", "cpu_timeout", "1200", 1200),
    "GPUHUB_CULL_TIMEOUT_GPU": ("GPUIdleCuller", "gpu_timeout", "600", 600),
    "GPUHUB_CULL_TIMEOUT_GPU_CONTENDED": ("GPUIdleCuller", "gpu_contended_timeout", "0", 0),
    "GPUHUB_CULL_EVERY": ("GPUIdleCuller", "cull_every", "30", 30),
    "GPUHUB_GPU_IDLE_PERCENT": ("GPUIdleCuller", "gpu_idle_percent", "10", 10.0),
    "GPUHUB_GPU_IDLE_MINUTES": ("GPUIdleCuller", "gpu_idle_seconds", "5", 300.0),
}


def _env(tmp_path, **more):
    return {"GPUHUB_DATA_DIR": str(tmp_path), "GPUHUB_AUTHENTICATOR": "dummy", "GPUHUB_DUMMY_PASSWORD": "x",
            **more}


def _applied(env) -> Config:
    c = Config()
    apply_settings(c, load_settings(env))
    return c


def test_an_unset_variable_writes_nothing_and_the_options_own_default_stands(tmp_path):
    c = _applied(_env(tmp_path))
    written = {name: f"c.{section}.{option}" for name, (section, option, _, _) in ONE_OPTION_EACH.items()
               if option in c[section]}
    assert written == {}
    # ...so what the hub runs with is each option's own default, written once on its trait.
    assert GPULendingSpawner(config=c).lease_wait_timeout == GPULendingSpawner.class_traits()[
        "lease_wait_timeout"].default_value
    assert SimulatedInventory(config=c).count == SimulatedInventory.class_traits()["count"].default_value
    jobs = service_config(c, load_settings(_env(tmp_path)))["JobSettings"]
    assert (jobs["max_seconds"], jobs["log_max_bytes"]) == (JobSettings.max_seconds, JobSettings.log_max_bytes)


@pytest.mark.parametrize("name", sorted(ONE_OPTION_EACH))
def test_a_set_variable_writes_its_one_option(tmp_path, name):
    section, option, given, held = ONE_OPTION_EACH[name]
    bare, c = _applied(_env(tmp_path)), _applied(_env(tmp_path, **{name: given}))
    assert c[section][option] == held
    changed = {(s, o) for s in c for o in c[s] if o not in bare[s] or c[s][o] != bare[s][o]}
    # its own option and nothing else but the gpu-pool service's copy of the inventory's count
    # (read from c.SimulatedInventory, for the page's utilisation readings)
    assert changed - {("PoolPageSettings", "simulated_gpus")} == {(section, option)}


def _admins_own(c: Config) -> dict:
    """What an admin's config loaded before hub_config already holds."""
    c.JupyterHub.services = [{"name": "mine", "api_token": "t" * 32}]
    c.JupyterHub.load_roles = [{"name": "user", "scopes": ["self", "read:groups"]},
                               {"name": "mine", "scopes": ["read:users"], "services": ["mine"]}]
    c.JupyterHub.custom_scopes = {"custom:mine": {"description": "mine"}}
    c.GPUDockerSpawner.environment.update({"TZ": "UTC"})
    return {"services": c.JupyterHub.services, "load_roles": c.JupyterHub.load_roles,
            "custom_scopes": c.JupyterHub.custom_scopes, "environment": c.GPUDockerSpawner.environment}


def _built(c: Config) -> str:
    env = c.GPUDockerSpawner.environment
    return json.dumps({"hub": {k: c.JupyterHub[k] for k in ("services", "load_roles", "custom_scopes")},
                       "environment": env, "token": c.GPUDockerSpawner.server_token_scopes}, sort_keys=True,
                      default=repr)  # a value computed at each spawn (settings/culler.py ReportEvery)


def test_the_built_config_is_set_never_mutated_and_building_twice_changes_nothing(tmp_path):
    env = _env(tmp_path, GPUHUB_SSH="true")
    c = Config()
    c.JupyterHub.hub_connect_ip = "192.0.2.1"
    theirs = _admins_own(c)
    before = copy.deepcopy({k: v if k != "environment" else v.to_dict() for k, v in theirs.items()})
    apply_settings(c, load_settings(env))
    # The admin's own values are kept in the result, and the objects they set are untouched.
    assert {k: v if k != "environment" else v.to_dict() for k, v in theirs.items()} == before
    once = _built(c)
    services = {s["name"] for s in c.JupyterHub.services}
    assert services == {"mine", "idle-culler", "gpu-pool", "gpu-ssh"}
    user = next(r for r in c.JupyterHub.load_roles if r["name"] == "user")
    assert user["scopes"][:2] == ["self", "read:groups"]
    assert c.GPUDockerSpawner.environment["TZ"] == "UTC"
    # Built again over its own result: the same config.
    apply_settings(c, load_settings(env))
    assert _built(c) == once


def test_the_parts_build_the_same_config_in_any_order(tmp_path, monkeypatch):
    settings = load_settings(_env(tmp_path, GPUHUB_SSH="true"))
    c = Config()
    c.JupyterHub.hub_connect_ip = "192.0.2.1"
    forward = services_module.hub_services(c, settings)
    parts = services_module.parts
    monkeypatch.setattr(services_module, "parts", lambda c, s: list(reversed(parts(c, s))))
    backward = services_module.hub_services(c, settings)

    def unordered(values):
        return {key: sorted(json.dumps(v, sort_keys=True) for v in value) if isinstance(value, list)
                else json.dumps(value, sort_keys=True, default=repr) for key, value in values.items()}

    def scopes_unordered(values):
        out = unordered(values)
        out["JupyterHub", "load_roles"] = sorted(
            json.dumps({**r, "scopes": sorted(r["scopes"])}, sort_keys=True)
            for r in values["JupyterHub", "load_roles"])
        out["JupyterHub", "services"] = sorted(
            json.dumps({**s, "oauth_client_allowed_scopes": sorted(s.get("oauth_client_allowed_scopes", []))},
                       sort_keys=True) for s in values["JupyterHub", "services"])
        return out

    assert scopes_unordered(forward) == scopes_unordered(backward)
