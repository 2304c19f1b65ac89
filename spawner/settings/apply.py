"""Settings applied to a traitlets config: what jupyterhub_config.py sets from Settings.

The one place that knows which class's option each setting becomes (JupyterHub,
the proxy, GPUDockerSpawner, the pool, the authenticator, the culler).
"""

from __future__ import annotations

import contextlib
import fcntl
import re
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

from ..engines import engine
from ..engines.common.firewall import ICC_OPTION
from .directory import DirectorySettings
from .hub import Settings, default_profiles, hub_port
from .parsing import SettingsError


def docker_network_gateway(name: str) -> str:
    """The gateway address of the Docker bridge `name`, made here if missing.

    The hub listens on that address only: containers on the bridge reach it,
    nothing outside this machine can.  Docker lets two networks share a name, and two
    processes that start at once (two hubs, a hub and `gpu-pool`) may both make it: every
    process keeps the oldest of that name and removes the others while they are empty, so
    all agree on one bridge and a name never becomes ambiguous to Docker.
    """
    import docker

    try:
        client = docker.from_env()
        with _creating(name):
            if not _named(client, name):
                # Its containers cannot reach each other (they reach the gateway, where the hub listens).
                client.networks.create(name, driver="bridge", options={ICC_OPTION: "false"},
                                       check_duplicate=True)
        keep, *others = _named(client, name)
        for other in others:
            if not other.attrs.get("Containers"):
                with contextlib.suppress(docker.errors.APIError):
                    other.remove()
        keep.reload()
        return keep.attrs["IPAM"]["Config"][0]["Gateway"]
    except Exception as exc:
        raise SettingsError(
            f"GPUHUB_DOCKER_NETWORK={name!r}: cannot reach Docker to find or create the bridge ({exc})"
        ) from None


@contextlib.contextmanager
def _creating(name: str) -> Iterator[None]:
    """One process of this machine at a time looks for the bridge and makes it: Docker's own
    duplicate check is not atomic, so without this a start that finished first could keep a
    network that a slower one's was older than."""
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", name)
    with open(Path(tempfile.gettempdir()) / f"gpuhub-network-{safe}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _named(client, name: str) -> list:
    """The networks called exactly `name`, oldest first (Docker's name filter also matches parts)."""
    found = [n for n in client.networks.list(names=[name]) if n.name == name]
    return sorted(found, key=lambda n: (_created(n.attrs.get("Created", "")), n.id))


def _created(text: str) -> tuple[str, int]:
    """Docker's creation time as a sortable key: Go's RFC 3339 trims the fraction's trailing
    zeros, so as text ".1Z" would sort after ".12Z"."""
    match = re.match(r"(.*T\d\d:\d\d:\d\d)(?:\.(\d+))?(.*)$", text)
    if match is None:
        return (text, 0)
    whole, fraction, zone = match.groups()
    return (whole + zone, int((fraction or "0")[:9].ljust(9, "0")))


def servers_ports(settings: Settings) -> list[int]:
    """The host ports users' containers reach on the bridge's gateway: the hub's API, the gpu-pool
    service's (its JupyterLab panel, `gpu-job`) and the proxy's public port."""
    from urllib.parse import urlparse

    from ..engines.common.firewall import hub_ports

    bound = urlparse(settings.bind_url)
    public = bound.port or (443 if bound.scheme == "https" else 80)
    return hub_ports(hub_port(settings), settings.pool_page_port if settings.pool_page else None, public)


def configure_directory(c, directory: DirectorySettings) -> None:
    """Set c.DirectoryAuthenticator from the GPUHUB_DIRECTORY_* settings."""
    for name, value in directory.authenticator_config().items():
        setattr(c.DirectoryAuthenticator, name, value)


def _inside_the_hub() -> bool:
    """True when this config is being loaded by a JupyterHub process."""
    try:
        from jupyterhub.app import JupyterHub
    except ImportError:
        return False
    return JupyterHub.initialized()


def apply_settings(c, settings: Settings) -> None:
    """Fill a traitlets config object from `settings`.

    Outside a hub process (`gpu-pool --config`, `gpu-pool doctor`, tests) this only sets
    values.  In the hub, loading its config is its start: `start_with_the_hub` then makes what
    the start needs (JupyterHub offers no earlier hook; its database lives in the data directory).
    """
    data = settings.data_dir

    c.JupyterHub.bind_url = settings.bind_url
    if settings.ssl_cert:
        # JupyterHub's own TLS: the proxy serves HTTPS on the public port.
        c.JupyterHub.ssl_cert = settings.ssl_cert
        c.JupyterHub.ssl_key = settings.ssl_key
    c.JupyterHub.db_url = f"sqlite:///{data / 'jupyterhub.sqlite'}"
    c.JupyterHub.cookie_secret_file = settings.cookie_secret_file or str(data / "jupyterhub_cookie_secret")
    if settings.crypt_keys:
        # JUPYTERHUB_CRYPT_KEY_FILE (a Docker secret): JupyterHub reads only the variable itself.
        c.CryptKeeper.keys = list(settings.crypt_keys)
    if settings.cleanup_servers is not None:
        c.JupyterHub.cleanup_servers = settings.cleanup_servers
    c.ConfigurableHTTPProxy.api_url = f"http://127.0.0.1:{settings.proxy_api_port}"
    c.ConfigurableHTTPProxy.pid_file = str(data / "jupyterhub-proxy.pid")

    if settings.hub_port is not None:
        c.JupyterHub.hub_port = settings.hub_port
    lending_engine = engine(settings.spawner)
    if lending_engine.spans_nodes:
        # The hub runs in a container on the overlay: it listens there, servers on any node reach it.
        c.JupyterHub.hub_ip = "0.0.0.0"
        c.JupyterHub.hub_connect_ip = settings.hub_connect_ip
    elif _inside_the_hub():
        # Only the hub needs the bridge; `gpu-pool --config` reads this file too
        # and must not create Docker networks.
        gateway = docker_network_gateway(settings.docker_network)
        c.JupyterHub.hub_ip = gateway
        c.JupyterHub.hub_connect_ip = gateway
        from ..engines.common.firewall import install_when_the_hub_starts

        install_when_the_hub_starts(settings.docker_network, servers_ports(settings))

    c.JupyterHub.spawner_class = lending_engine.entry_point
    if lending_engine.spans_nodes:
        # The engine of many nodes, GPUSwarmSpawner: a GPUDockerSpawner on Swarm services, so
        # every c.GPUDockerSpawner option below applies to it too.
        c.GPUSwarmSpawner.home_volume_driver_options = dict(settings.swarm_home_options)
        c.GPUSwarmSpawner.home_root_volume_options = dict(settings.swarm_homes_root_options)
        c.GPUSwarmSpawner.cpu_constraints = list(settings.swarm_cpu_constraints)
        if settings.swarm_node_labels:
            c.SwarmInventory.lending_node_labels = dict(settings.swarm_node_labels)
    c.GPUDockerSpawner.network_name = settings.docker_network
    c.GPUDockerSpawner.prefix = settings.container_prefix
    if settings.home_volume:
        c.GPUDockerSpawner.home_volume_name = settings.home_volume
    c.GPUDockerSpawner.pull_policy = "never"  # images are built here, never pulled
    c.GPUDockerSpawner.inventory_kind = settings.inventory
    if settings.gpu_host:
        c.Inventory.host = settings.gpu_host
    c.GPUDockerSpawner.profiles = settings.profiles or default_profiles(settings)
    if settings.lease_wait_timeout is not None:
        c.GPUDockerSpawner.lease_wait_timeout = settings.lease_wait_timeout
    c.GPUDockerSpawner.http_timeout = 120
    if settings.simulated_gpus is not None:
        c.SimulatedInventory.count = settings.simulated_gpus
    if settings.simulated_cuda_version is not None:
        c.SimulatedInventory.cuda_version = settings.simulated_cuda_version
    if settings.simulated_utilization_file:
        c.SimulatedInventory.utilization_file = settings.simulated_utilization_file
    c.GPUPool.db_url = settings.pool_db_url
    if settings.max_gpus_per_user is not None:
        c.GPUPool.max_gpus_per_user = settings.max_gpus_per_user
    if settings.gpu_hour_budget is not None:
        c.GPUPool.gpu_hour_budget = settings.gpu_hour_budget

    if settings.authenticator == "dummy":
        print("WARNING: GPUHUB_AUTHENTICATOR=dummy: every user name logs in with one shared "
              "password. For tests only.", file=sys.stderr)
        c.JupyterHub.authenticator_class = "dummy"
        c.DummyAuthenticator.password = settings.dummy_password
        c.Authenticator.allow_all = True
    else:
        c.JupyterHub.authenticator_class = "gpu-directory"
        if settings.directory is not None:
            configure_directory(c, settings.directory)
        else:
            print("GPUHUB_DIRECTORY is not set: the directory login takes its settings from "
                  "c.DirectoryAuthenticator in a config file loaded after this one "
                  "(see hub_config/examples/).", file=sys.stderr)
    if settings.admin_users:
        c.Authenticator.admin_users = set(settings.admin_users)

    if settings.cull:
        from .culler import configure_culler

        configure_culler(c, settings)
    if settings.pool_page:
        from .pool_service import configure_pool_page
        from .service_file import write_when_the_hub_starts

        configure_pool_page(c, settings)
        write_when_the_hub_starts(settings)
    if settings.jobs:
        from .pool_jobs import configure_jobs

        configure_jobs(c, settings)
    if settings.ssh:
        from .ssh_service import configure_ssh

        configure_ssh(c, settings)
    # The services, roles and custom scopes of every part above, and the servers' environment
    # and token scopes: built by one function, each set once.
    from .services import set_hub_services

    set_hub_services(c, settings)

    if _inside_the_hub():
        start_with_the_hub(settings)


def start_with_the_hub(settings: Settings) -> None:
    """What the hub needs made when it starts: its data directory, and the reconciler's task
    (scheduled on the hub's loop; it first waits until the hub has started)."""
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    from ..engines.common.reconciler import start_in_hub

    start_in_hub()
