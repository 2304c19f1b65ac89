"""hub_config/swarm-stack.yml and swarm.env, read as `docker stack deploy` reads them (no Docker):
who gets the socket, where each service runs, which secrets the settings read."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from traitlets.config import Config

from spawner.settings import apply_settings, load_settings

REPO = Path(__file__).resolve().parents[2]
STACK = REPO / "hub_config" / "swarm-stack.yml"
ENV_FILE = REPO / "hub_config" / "swarm.env"
SOCKET = "/var/run/docker.sock"


def stack() -> dict:
    return yaml.safe_load(STACK.read_text())


def docker_env_file(path: Path) -> dict[str, str]:
    """Docker's env-file rules: KEY=value, the value literal; `#` lines are comments."""
    env = {}
    for line in path.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            key, _, value = line.partition("=")
            env[key] = value
    return env


def test_the_hub_alone_gets_the_docker_socket_on_a_manager_with_its_port_in_host_mode():
    services = stack()["services"]
    hub, agent = services["hub"], services["agent"]
    assert f"{SOCKET}:{SOCKET}" in hub["volumes"]
    assert not any(SOCKET in str(v) for name, s in services.items() if name != "hub" for v in s.get("volumes", []))
    assert hub["deploy"]["placement"]["constraints"] == ["node.role == manager"]
    assert hub["deploy"]["replicas"] == 1 and hub["deploy"]["update_config"]["order"] == "stop-first"
    [port] = hub["ports"]
    assert port["mode"] == "host" and port["target"] == 8000
    # servers reach the hub by its alias on the servers' overlay
    assert hub["networks"]["gpuhub"]["aliases"] == [hub["environment"]["GPUHUB_HUB_CONNECT_IP"]]
    assert stack()["networks"]["gpuhub"]["name"] == hub["environment"]["GPUHUB_DOCKER_NETWORK"]
    # the agent: one task on every GPU node, from the hub's image, named after its node, read-only
    assert agent["deploy"]["mode"] == "global"
    assert agent["deploy"]["placement"]["constraints"] == ["node.labels.gpu == true"]
    assert agent["image"] == hub["image"] and agent["hostname"] == "{{.Node.Hostname}}"
    assert agent["read_only"] is True and "ports" not in agent and "user" not in agent  # the image's non-root user
    assert agent["command"][:2] == ["gpu-pool", "agent"]
    # VIPs need IPVS, which Swarm nodes may lack: name-based endpoints
    assert {s["deploy"]["endpoint_mode"] for s in services.values()} == {"dnsrr"}


def test_servers_and_leases_outlive_the_hub():
    assert stack()["services"]["hub"]["environment"]["GPUHUB_CLEANUP_SERVERS"] == "false"


def test_every_secret_the_settings_read_is_a_docker_secret_readable_by_the_hubs_user_only():
    data = stack()
    for name, service in data["services"].items():
        mounted = {s["source"]: s for s in service.get("secrets", [])}
        files = {k: v for k, v in service["environment"].items() if k.endswith("_FILE")}
        assert files, name
        for variable, path in files.items():
            source = path.removeprefix("/run/secrets/")
            assert path.startswith("/run/secrets/") and source in mounted, (name, variable)
            assert mounted[source]["mode"] == 0o400 and mounted[source]["uid"] == "1000", (name, source)
            assert data["secrets"][source] == {"external": True}
    hub_files = set(data["services"]["hub"]["environment"])
    assert {"GPUHUB_POOL_DB_URL_FILE", "GPUHUB_COOKIE_SECRET_FILE", "JUPYTERHUB_CRYPT_KEY_FILE",
            "GPUHUB_DIRECTORY_BIND_PASSWORD_FILE"} <= hub_files
    # the uid the secrets are given to is the image's hub user
    assert "ARG HUB_UID=1000" in (REPO / "images" / "hub" / "Dockerfile").read_text()


def test_the_env_file_holds_no_secret_and_nothing_the_stack_file_sets():
    env = docker_env_file(ENV_FILE)
    fixed = set(stack()["services"]["hub"]["environment"])
    assert not set(env) & fixed
    assert not any(word in key for key in env for word in ("PASSWORD", "CRYPT_KEY", "DB_URL", "SECRET"))
    source = "".join(p.read_text() for p in (REPO / "spawner" / "settings").glob("*.py"))
    for key in env:
        assert f'"{key}"' in source, f"{key} is not a setting"


def test_the_stack_with_its_settings_and_secrets_is_a_valid_swarm_hub(tmp_path, monkeypatch):
    """What the hub's container sees: the stack's environment over swarm.env, the secrets as files."""
    hub = stack()["services"]["hub"]
    values = {"gpuhub-pool-db-url": "postgresql+psycopg://gpuhub:pw@db.lab/gpupool\n",
              "gpuhub-cookie-secret": "c" * 64 + "\n", "gpuhub-crypt-key": "a" * 64 + "\n",
              "gpuhub-directory-bind-password": "Service-Secret\n"}
    env = {**docker_env_file(ENV_FILE), **hub["environment"], "GPUHUB_DATA_DIR": str(tmp_path)}
    for key, path in list(env.items()):
        if key.endswith("_FILE") and path.startswith("/run/secrets/"):
            local = tmp_path / path.removeprefix("/run/secrets/")
            local.write_text(values[local.name])
            local.chmod(0o400)
            env[key] = str(local)
    settings = load_settings(env)
    assert settings.spawner == "swarm" and settings.pool_db_url.startswith("postgresql+psycopg://")
    assert settings.directory.bind_password == "Service-Secret" and settings.crypt_keys == ("a" * 64,)
    assert settings.swarm_home_options["type"] == "nfs"  # JSON, as Docker's env file gives it
    c = Config()
    apply_settings(c, settings)
    assert c.JupyterHub.hub_ip == "0.0.0.0" and c.JupyterHub.hub_connect_ip == "gpuhub-hub"
    assert c.JupyterHub.cleanup_servers is False
    assert c.JupyterHub.cookie_secret_file == str(tmp_path / "gpuhub-cookie-secret")


@pytest.mark.parametrize("service", ["hub", "agent"])
def test_the_image_is_one_setting(service):
    assert stack()["services"][service]["image"] == "${GPUHUB_HUB_IMAGE:-gpuhub/hub:latest}"


def test_the_agent_takes_its_inventory_from_its_services_environment(monkeypatch, capsys):
    """A stack file can change the agent's inventory without replacing its command (an override
    file's `command` is appended to the base's by `docker stack deploy`, not replaced)."""
    from spawner.cli.main import _parser, main

    monkeypatch.setenv("GPUHUB_AGENT_INVENTORY", "simulated")
    monkeypatch.setenv("GPUHUB_SIMULATED_GPUS", "2")
    monkeypatch.setenv("GPUHUB_SIMULATED_UTILIZATION_FILE", "/etc/gpuhub/utilization.json")
    args = _parser().parse_args(stack()["services"]["agent"]["command"][1:])
    assert (args.inventory, args.simulated_gpus, args.utilization_file) == (
        "simulated", 2, "/etc/gpuhub/utilization.json")
    monkeypatch.setenv("GPUHUB_AGENT_INVENTORY", "magic")
    assert main(["agent"]) == 2
    assert "GPUHUB_AGENT_INVENTORY='magic' must be one of: nvml, static, simulated" in capsys.readouterr().err
