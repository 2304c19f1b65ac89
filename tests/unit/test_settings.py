"""GPUHUB_* settings: defaults, and errors that name the setting."""

import pytest

from spawner.settings import SettingsError, load_settings


def test_defaults_listen_on_loopback_with_nvml_and_directory_login():
    s = load_settings({})
    assert s.bind_url == "http://127.0.0.1:8000"
    assert s.inventory == "nvml" and s.authenticator == "ldap"
    assert s.pool_db_url.startswith("sqlite:///") and s.pool_db_url.endswith("gpu-pool.sqlite")
    assert s.max_gpus_per_user is None


@pytest.mark.parametrize("env, setting", [
    ({"GPUHUB_INVENTORY": "magic"}, "GPUHUB_INVENTORY"),
    ({"GPUHUB_SIMULATED_GPUS": "four"}, "GPUHUB_SIMULATED_GPUS"),
    ({"GPUHUB_SIMULATED_GPUS": "-1"}, "GPUHUB_SIMULATED_GPUS"),
    ({"GPUHUB_BIND_URL": "127.0.0.1:8000"}, "GPUHUB_BIND_URL"),
    ({"GPUHUB_AUTHENTICATOR": "dummy"}, "GPUHUB_DUMMY_PASSWORD"),
    ({"GPUHUB_CLEANUP_SERVERS": "maybe"}, "GPUHUB_CLEANUP_SERVERS"),
    ({"GPUHUB_HUB_PORT": "8000"}, "GPUHUB_HUB_PORT"),
    ({"GPUHUB_PROFILES_FILE": "/nonexistent/profiles.json"}, "GPUHUB_PROFILES_FILE"),
    ({"GPUHUB_GPU_IDLE_PERCENT": "150"}, "GPUHUB_GPU_IDLE_PERCENT"),
    ({"GPUHUB_LEASE_WAIT_TIMEOUT": "-5"}, "GPUHUB_LEASE_WAIT_TIMEOUT"),
])
def test_bad_settings_stop_the_hub_with_the_settings_name(env, setting):
    with pytest.raises(SettingsError) as err:
        load_settings(env)
    assert setting in str(err.value)


def test_profiles_file_replaces_the_default_profiles(tmp_path):
    f = tmp_path / "profiles.json"
    f.write_text('[{"slug": "only", "display_name": "Only", "image": "img"}]')
    assert load_settings({"GPUHUB_PROFILES_FILE": str(f)}).profiles[0]["slug"] == "only"
