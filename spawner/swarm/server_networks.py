"""Each server's own overlay network on Swarm: the server and the hub's container, nothing else.

On one host the hub's bridge keeps servers apart (enable_icc=false, docker/firewall.py);
an overlay has no such switch: every task on one overlay reaches every other one's
listening ports.  So each server gets an attachable overlay of its own, encrypted when
the servers' overlay (c.GPUDockerSpawner.network_name) is, and only the hub's container
(where the hub, its proxy and its services run) joins it, under the hub's connect name
as an alias, so the server reaches the hub API by that name.  The spawner makes the
network before the service and removes it after; a hub that restarts joins its running
servers' networks again at its first poll; the reconciler removes a network whose
service is gone (`sweep`).

Which container is the hub's: `c.GPUSwarmSpawner.hub_containers` when set, else the
container whose files this process runs in (/proc/self/mountinfo), else the container
on the servers' overlay whose network namespace this process is in (a hub entered into
a container's namespace from the host).
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import threading
import time
from collections.abc import Iterable, Mapping

from ..labels import LABEL_POOL, LABEL_USER, PREFIX

# On a server's own network: the service it was made for.
LABEL_SERVER_NETWORK = f"{PREFIX}.server-network"
# A network whose service is gone is removed once it has been seen so this long (a start
# makes the network a moment before its service).
ORPHAN_SECONDS = 30.0
# How long a stop waits for Swarm to let go of the network (its task shutting down).
REMOVE_WAIT_SECONDS = 10.0

# A mount of a container's own /etc/hostname, /etc/hosts or /etc/resolv.conf: Docker
# binds them from /var/lib/docker/containers/<id>/ into every container.
_OWN_FILE = re.compile(r"/containers/([0-9a-f]{64})/(?:hostname|hosts|resolv\.conf) /etc/(?:hostname|hosts|resolv\.conf) ")


def network_name(service_name: str) -> str:
    """The name of a server's own network (never a job's: those end in -<id>-net or -isolated)."""
    return f"{service_name}-server-net"


def overlay_options(servers_overlay: Mapping) -> dict[str, str]:
    """The driver options of an overlay of one server or job: encrypted (IPsec between nodes)
    when the servers' overlay (`docker network inspect`) is."""
    options = servers_overlay.get("Options") or {}
    return {"encrypted": ""} if "encrypted" in options else {}


def container_in_mountinfo(text: str) -> str | None:
    """The id of the container whose files /proc/self/mountinfo (`text`) shows, if any: pure."""
    for line in text.splitlines():
        found = _OWN_FILE.search(line)
        if found:
            return found.group(1)
    return None


_found: list[str] = []  # the hub's containers, found once per process (spawns look at once)
_finding = threading.Lock()


def hub_containers(api, configured: Iterable[str], servers_network: str) -> list[str]:
    """The containers to join to each server's network (see the module docstring); [] if none found."""
    if configured:
        return list(dict.fromkeys(configured))
    with _finding:
        if not _found:
            _found.extend(_find_own_container(api, servers_network))
        return list(_found)


def _find_own_container(api, servers_network: str) -> list[str]:
    with contextlib.suppress(OSError):
        with open("/proc/self/mountinfo") as f:
            own = container_in_mountinfo(f.read())
        if own:
            return [own]
    try:
        mine = os.stat("/proc/self/ns/net").st_ino
    except OSError:
        return []
    filters = {"network": servers_network} if servers_network else {}
    found = []
    for summary in api.containers(filters=filters):
        pid = (api.inspect_container(summary["Id"]).get("State") or {}).get("Pid") or 0
        with contextlib.suppress(OSError):
            if pid and os.stat(f"/proc/{pid}/ns/net").st_ino == mine:
                found.append(summary["Id"])
    return found


def ensure_network(api, name: str, labels: Mapping[str, str], options: Mapping[str, str]) -> None:
    """Make the attachable overlay `name` unless it exists."""
    import docker.errors

    try:
        api.inspect_network(name)
    except docker.errors.NotFound:
        api.create_network(name, driver="overlay", attachable=True, labels=dict(labels), options=dict(options))


def connect(api, name: str, containers: Iterable[str], alias: str) -> None:
    """Join each container to network `name` (under `alias`, if one is given); one already
    there stays.  Raises docker.errors.NotFound when the network is gone."""
    import docker.errors

    for container in containers:
        try:
            api.connect_container_to_network(container, name, aliases=[alias] if alias else None)
        except docker.errors.APIError as exc:
            if exc.status_code == 404:
                raise
            # Already there (another spawn of this server's joined it first): Docker says so
            # as "already exists" or "already attached", by version.
            if "already" not in str(exc):
                raise


def remove(api, name: str, wait: float = REMOVE_WAIT_SECONDS) -> bool:
    """Disconnect the containers still on network `name` (the hub's) and remove it, waiting up to
    `wait` seconds for Swarm to let go of a stopping task.  True once it is gone."""
    import docker.errors

    deadline = time.monotonic() + wait
    while True:
        try:
            info = api.inspect_network(name)
        except docker.errors.NotFound:
            return True
        for container in info.get("Containers") or {}:
            with contextlib.suppress(docker.errors.APIError):
                api.disconnect_container_from_network(container, name, force=True)
        try:
            api.remove_network(info["Id"])
            return True
        except docker.errors.NotFound:
            return True
        except docker.errors.APIError:
            if time.monotonic() > deadline:
                return False
        time.sleep(0.5)


def labels_for(service_name: str, user: str, pool_id: str) -> dict[str, str]:
    return {LABEL_SERVER_NETWORK: service_name, LABEL_USER: user, LABEL_POOL: pool_id}


_orphan_since: dict[str, float] = {}  # network id -> when a pass first saw its service gone


def sweep(api, pool_id: str, log: logging.Logger | None = None, min_age: float = ORPHAN_SECONDS) -> list[str]:
    """Remove this ledger's server networks whose service is gone (seen so for `min_age` s).
    Returns the names removed."""
    networks = api.networks(filters={"label": [LABEL_SERVER_NETWORK, f"{LABEL_POOL}={pool_id}"]})
    services = {s["Spec"]["Name"] for s in api.services(filters={"label": f"{LABEL_POOL}={pool_id}"})}
    now = time.monotonic()
    removed, seen = [], set()
    for net in networks:
        if (net.get("Labels") or {}).get(LABEL_SERVER_NETWORK) in services:
            continue
        seen.add(net["Id"])
        if now - _orphan_since.setdefault(net["Id"], now) < min_age:
            continue
        if remove(api, net["Name"], wait=0):
            removed.append(net["Name"])
            if log:
                log.info("Removed network %s: its server is gone", net["Name"])
    for gone in set(_orphan_since) - seen:
        _orphan_since.pop(gone, None)
    return removed
