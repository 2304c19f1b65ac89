"""Hubs running `gpu-swarm` on the harness's Swarm (devservices/swarm.py), for the tests and the benchmarks.

Each hub runs in a helper container's network namespace on the overlay (`start_hub_site`),
with its own PostgreSQL database; tests/fixtures/swarm.py wraps it in `make_swarm_hub`.
"""

from __future__ import annotations

import contextlib
import json
import secrets
from pathlib import Path

from .hub import cleanup_hub, prepare_hub
from .postgres import create_database
from .swarm import Swarm, _docker0_gateway, docker, start_hub_site


def prepare_swarm_hub(swarm: Swarm, postgres_server, forward_port: int, image: str, directory: Path,
                      extra_config: str = "", env: dict | None = None, db_url: str | None = None,
                      index: int = 1):
    """A gpu-swarm hub (not yet started) in a new helper's network namespace, with its own
    PostgreSQL database unless `db_url` is given.  Used by the fixture and the benchmarks."""
    site = start_hub_site(swarm, image, index)
    if db_url is None:
        db_url = create_database(postgres_server, f"swarm_{swarm.session}_{secrets.token_hex(3)}")
    gateway = _docker0_gateway()
    db_url = db_url.replace(f"127.0.0.1:{postgres_server.port}", f"{gateway}:{forward_port}")
    homes = str(swarm.homes_root)
    hub_env = {
        "GPUHUB_SPAWNER": "swarm",
        "GPUHUB_INVENTORY": "swarm",
        "GPUHUB_POOL_DB_URL": db_url,
        "GPUHUB_HUB_CONNECT_IP": site.overlay_ip,
        "GPUHUB_SWARM_CPU_CONSTRAINTS": f"node.labels.gpuhub.test-session=={swarm.session}",
        # The manager may hold other sessions' nodes (another checkout's tests): lend only this one's.
        "GPUHUB_SWARM_NODE_LABELS": f"gpuhub.test-session={swarm.session}",
        "GPUHUB_SWARM_HOME_OPTIONS": json.dumps({"type": "none", "o": "bind", "device": f"{homes}/{{username}}"}),
        "GPUHUB_SWARM_HOMES_ROOT_OPTIONS": json.dumps({"type": "none", "o": "bind", "device": homes}),
        "GPUHUB_POOL_PAGE": "false",
        **(env or {}),
    }
    hub = prepare_hub(directory, image, swarm.network, extra_config, hub_env)
    hub.env["GPUHUB_BIND_URL"] = f"http://{site.bridge_ip}:{hub.port}"
    hub.address = site.bridge_ip
    hub.launcher = site.launcher
    hub.site = site
    return hub


def remove_server_relays(prefix: str) -> None:
    """Remove the relays and servers' own overlays (spawner/engines/swarm/relay.py) named `<prefix>-...`
    that a hub left (its servers removed without it); an overlay whose task still shuts down is
    retried for a while, then left to the Swarm's end."""
    from spawner.engines.swarm.relay import LABEL_RELAY, LABEL_SERVER_NET

    from .waiting import until

    for container in docker("ps", "-aq", "--filter", f"label={LABEL_RELAY}", "--filter", f"name={prefix}-",
                            check=False).split():
        docker("rm", "-f", container, check=False)

    def gone() -> bool:
        nets = docker("network", "ls", "-q", "--filter", f"label={LABEL_SERVER_NET}", "--filter",
                      f"name={prefix}-", check=False).split()
        for net in nets:
            docker("network", "rm", net, check=False)
        return not nets
    # One in use by a task still shutting down after that goes with the Swarm.
    with contextlib.suppress(AssertionError):
        until(gone, 30, "the servers' own overlays removed", interval=1)


def cleanup_swarm_hub(hub, docker_client) -> None:
    """Stop the hub; remove its services, containers, volumes and helper."""
    hub.stop()
    for service in docker("service", "ls", "-q", "--filter", f"name={hub.prefix}-", check=False).split():
        docker("service", "rm", service, check=False)
    remove_server_relays(hub.prefix)
    cleanup_hub(hub, docker_client)
    docker("rm", "-f", hub.site.container, check=False)


def profiles_config(image: str) -> str:
    """The Swarm hubs' profiles (tests and benchmarks): CPU, 1 GPU, and one per GPU model (node label gpu.model)."""
    return f"""
c.GPUDockerSpawner.profiles = [
    {{"slug": "tf-cpu", "display_name": "CPU", "image": {image!r}, "gpus": 0}},
    {{"slug": "tf-gpu-1", "display_name": "1 GPU", "image": {image!r}, "gpus": 1}},
    {{"slug": "a100", "display_name": "1 A100", "image": {image!r}, "gpus": 1,
      "node_labels": {{"gpu.model": "a100"}}}},
    {{"slug": "t4", "display_name": "1 T4", "image": {image!r}, "gpus": 1,
      "node_labels": {{"gpu.model": "t4"}}}},
]
c.Spawner.poll_interval = 3
"""
