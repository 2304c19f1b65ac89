"""Each server on its own overlay, reached through a relay: servers on Swarm cannot reach each other.

On one host, rules of the hub's own keep users' containers apart (engines/common/firewall.py).  On
Swarm the servers' traffic between nodes never passes a host's FORWARD chain (it is VXLAN
between the nodes' overlay namespaces), and Swarm has no network policy.  So no server
shares a network with another: each server's service is attached only to an overlay of its
own (`<service>-net-<6 hex digits>`, new at each start; attachable, encrypted when the servers'
overlay is), and one small
container, the server's *relay*, is on both that overlay and the hub's (c.GPUDockerSpawner.
network_name).  The relay is a TCP forwarder and nothing else:

- on the hub's overlay it forwards the server's port (and the SSH gateway's port into the
  server) to the server, accepting connections only from the hub's address (the hub's
  connect host as the relay resolves it, where the hub's proxy, services and SSH gateway
  run too): a job or any other container on the hub's overlay gets nothing;
- on the server's overlay it answers as `jupyterhub` and forwards the ports of the hub's
  URLs in the server's environment (the hub's API, the gpu-pool service) to the hub: the
  server's environment names `jupyterhub` instead of the hub's address;
- with GPUSwarmSpawner.outbound_proxy, it is the server's HTTPS proxy (PROXY_PORT, named in
  the server's HTTPS_PROXY): `CONNECT host:port` only, to an address that is not link-local,
  not a node's, not the relay's gateway, and public or in outbound_proxy_networks.

The server's own overlay is internal: Docker gives its task no docker_gwbridge and so no
route out at all (no cloud metadata address, no node's ports, whatever the node's firewall);
the relay, on the servers' overlay too, has the route the proxy uses.

Why a relay rather than joining the hub's container to each server's overlay: a hub deployed
as a Swarm service (`docker stack deploy`, hub_config/swarm-stack.yml) runs in a container
that Swarm manages, and Docker connects a managed container only to networks already known
on its node, without asking the manager for an address (moby's `findAndAttachNetwork`): a
new overlay is known on a node only once a task there uses it, so `POST
/networks/<name>/connect` for the hub answers 404 "network not found"; adding the network to
the hub's own service instead restarts the hub.  The relay is an ordinary container on the
manager the hub's Docker client talks to, which Docker attaches through the manager like
`docker run --network`, and it is independent of the hub's container: a hub restarted in a
new container (an upgrade) reaches every running server through the same relays.

The relay runs the server's own image's `python3` (stdlib only, the program below), as
nobody, read-only, without capabilities, with no-new-privileges and a helper's pids and
memory bounds; it holds at most RELAY_MAX_CONNECTIONS connections at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import secrets
import time
from collections.abc import Mapping
from datetime import UTC, datetime

from ..common.labels import LABEL_POOL, PREFIX

# The server an overlay of a server's own, or a relay, belongs to: its service's name.
LABEL_SERVER_NET = f"{PREFIX}.server-network"
LABEL_RELAY = f"{PREFIX}.server-relay"
# The name the relay answers to on the server's own overlay, in place of the hub's address.
HUB_ALIAS = "jupyterhub"
# A job's proxy (a relay with the proxy only) on the job's own overlay: its container's label
# (naming the overlay) and the name the job reaches it by.
LABEL_JOB_PROXY = f"{PREFIX}.job-proxy"
JOB_PROXY_ALIAS = "gpuhub-proxy"
RELAY_MAX_CONNECTIONS = 256
# The relay's HTTPS proxy's port (GPUSwarmSpawner.outbound_proxy), on the server's own overlay.
PROXY_PORT = 3128
RELAY_MEMORY = "96m"
# How long a stopped server's overlay is retried for removal (Swarm refuses while its task
# still shuts down); after that the reconciler removes it.
NETWORK_DROP_SECONDS = 60.0
# How long a relay or a job's proxy may take to listen once started (a python3 start on a busy
# manager); the line RELAY_PROGRAM prints once every socket listens.
RELAY_READY_SECONDS = 60.0
READY_LINE = "relay ready"

# The relay (run as `python3 -c RELAY_PROGRAM SPEC`): each forward listens on 0.0.0.0:listen and
# joins every accepted connection to host:port; one with "check" accepts only a peer whose
# address is one of the "allow" hosts' (resolved again at most once a second on a miss).
RELAY_PROGRAM = r'''
import asyncio, ipaddress, json, socket, sys, time

SPEC = json.loads(sys.argv[1])
PROXY = SPEC.get("proxy") or {}
SLOTS = asyncio.Semaphore(SPEC["max_connections"])
ALLOWED = {"at": -1e9, "ips": set()}


async def allowed(peer):
    if peer in ALLOWED["ips"]:
        return True
    if time.monotonic() - ALLOWED["at"] < 1.0:
        return False
    ips = set()
    for host in SPEC["allow"]:
        try:
            for info in await asyncio.get_running_loop().getaddrinfo(host, None, type=socket.SOCK_STREAM):
                ips.add(info[4][0])
        except OSError:
            pass
    ALLOWED.update(at=time.monotonic(), ips=ips)
    return peer in ips


async def pipe(reader, writer):
    try:
        while True:
            data = await reader.read(65536)
            if not data:
                break
            writer.write(data)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()
    except OSError:
        pass


def close(writer):
    try:
        writer.close()
    except OSError:
        pass


def forwarder(rule):
    async def handle(reader, writer):
        peer = (writer.get_extra_info("peername") or ("",))[0]
        if (rule["check"] and not await allowed(peer)) or SLOTS.locked():
            close(writer)
            return
        async with SLOTS:
            try:
                up_reader, up_writer = await asyncio.wait_for(
                    asyncio.open_connection(rule["host"], rule["port"]), 10)
            except (OSError, asyncio.TimeoutError):
                close(writer)
                return
            try:
                await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))
            finally:
                close(up_writer)
                close(writer)
    return handle


def gateways():
    """The IPv4 gateways of this container's routes (/proc/net/route: little-endian hex)."""
    found = set()
    try:
        with open("/proc/net/route") as table:
            for line in table.read().splitlines()[1:]:
                fields = line.split()
                if len(fields) > 2 and fields[2] != "00000000":
                    found.add(str(ipaddress.IPv4Address(bytes.fromhex(fields[2])[::-1])))
    except (OSError, ValueError):
        pass
    return found


def refused(address):
    """Why the proxy will not connect to `address` (an IP), or "" when it may."""
    ip = ipaddress.ip_address(address.split("%")[0])
    if getattr(ip, "ipv4_mapped", None):
        ip = ip.ipv4_mapped
    if ip.is_link_local:
        return "a link-local address (the cloud metadata service)"
    if str(ip) in PROXY["refuse"]:
        return "an address of a Swarm node"
    if any(ip in net for net in PROXY["allow"]):
        return ""
    if not ip.is_global:
        return "not a public address"
    return ""


async def answer(writer, status):
    try:
        writer.write(("HTTP/1.1 " + status + "\r\nConnection: close\r\nContent-Length: 0\r\n\r\n").encode())
        await writer.drain()
    except OSError:
        pass
    close(writer)


async def proxy(reader, writer):
    if SLOTS.locked():
        close(writer)
        return
    async with SLOTS:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
            method, target = head.split(b"\r\n", 1)[0].decode("latin-1").split(" ")[:2]
        except (OSError, ValueError, asyncio.TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            await answer(writer, "400 Bad Request")
            return
        if method != "CONNECT":
            await answer(writer, "405 Only CONNECT host:port (HTTPS) is proxied")
            return
        host, _, port = target.rpartition(":")
        host, port = host.strip("[]"), int(port) if port.isdigit() else 0
        if not host or not 0 < port < 65536:
            await answer(writer, "400 Bad Request: CONNECT host:port")
            return
        try:
            infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except OSError:
            await answer(writer, "502 Name not resolved")
            return
        # Every address the name has must be allowed: none is tried that is not.
        why = [refused(info[4][0]) for info in infos]
        if not infos or any(why):
            await answer(writer, "403 Refused: " + next((w for w in why if w), "no address"))
            return
        # IPv4 first (a container often has no IPv6 route), each address in turn.
        up_reader = up_writer = None
        for address in sorted({info[4][0] for info in infos}, key=lambda a: ":" in a):
            try:
                up_reader, up_writer = await asyncio.wait_for(asyncio.open_connection(address, port), 10)
                break
            except (OSError, asyncio.TimeoutError):
                continue
        if up_writer is None:
            await answer(writer, "502 Could not connect")
            return
        try:
            writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
            await writer.drain()
            await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))
        except OSError:
            pass
        finally:
            close(up_writer)
            close(writer)


async def main():
    for rule in SPEC["forwards"]:
        await asyncio.start_server(forwarder(rule), "0.0.0.0", rule["listen"], reuse_address=True)
    if PROXY:
        PROXY["allow"] = [ipaddress.ip_network(n, strict=False) for n in PROXY["allow"]]
        # The relay's own gateways (docker_gwbridge's: its node) are refused as the nodes are.
        PROXY["refuse"] = set(PROXY["refuse"]) | gateways()
        await asyncio.start_server(proxy, "0.0.0.0", PROXY["listen"], reuse_address=True)
    print("relay ready", flush=True)  # READY_LINE
    await asyncio.Event().wait()


asyncio.run(main())
'''


def overlay_options(servers_overlay: Mapping) -> dict[str, str]:
    """The driver options of an overlay of a server's or a job's own: encrypted (IPsec between
    nodes) when the servers' overlay (`docker network inspect`) is."""
    options = servers_overlay.get("Options") or {}
    return {"encrypted": ""} if "encrypted" in options else {}


def new_network_name(service: str) -> str:
    """A name for the overlay of one run of the server whose service is `service`: new at each
    start, so that a stopped run's overlay, removed in the background once its task is gone, is
    never the one a quick restart of the same server attaches to (its label names the server)."""
    return f"{service}-net-{secrets.token_hex(3)}"


def proxy_of(network: str) -> str:
    """The proxy container of a job's own overlay `network` (a job with `job_network`)."""
    return f"{network}-proxy"


def relay_of(service: str) -> str:
    """The relay container of the server whose service is `service`."""
    return f"{service}-relay"


def hub_ports(env: Mapping[str, str], hub_host: str) -> list[int]:
    """The ports of the URLs in `env` that name the hub's host `hub_host` (with a port)."""
    pattern = re.compile(rf"://{re.escape(hub_host)}:(\d+)")
    return sorted({int(port) for value in env.values() for port in pattern.findall(str(value))})


def through_relay(env: Mapping[str, str], hub_host: str) -> dict[str, str]:
    """`env` with each URL's host `hub_host` replaced by the relay's name on the server's overlay."""
    pattern = re.compile(rf"://{re.escape(hub_host)}(?=[:/]|$)")
    return {key: pattern.sub(f"://{HUB_ALIAS}", str(value)) for key, value in env.items()}


def relay_spec(service: str, server_ports: list[int], hub_host: str, to_hub: list[int],
               proxy: Mapping | None = None) -> dict:
    """What the relay program forwards (see RELAY_PROGRAM); `proxy`: its HTTPS proxy to the
    outside world (`proxy_spec`), or None for none."""
    listens = [*server_ports, *to_hub, *([proxy["listen"]] if proxy else [])]
    clash = sorted({p for p in listens if listens.count(p) > 1})
    if clash:
        raise ValueError(f"the port(s) {clash} are both the server's, the hub's or the proxy's: "
                         "the relay cannot forward both")
    forwards = [{"listen": p, "host": service, "port": p, "check": True} for p in server_ports]
    forwards += [{"listen": p, "host": hub_host, "port": p, "check": False} for p in to_hub]
    spec = {"forwards": forwards, "allow": [hub_host], "max_connections": RELAY_MAX_CONNECTIONS}
    if proxy:
        spec["proxy"] = dict(proxy)
    return spec


def node_addresses(nodes: list[Mapping]) -> list[str]:
    """Every address the Swarm's nodes are known by (`docker node inspect`: each node's own
    address and a manager's listening address), which the relay's proxy refuses."""
    found = set()
    for node in nodes:
        found.add(((node.get("Status") or {}).get("Addr") or "").strip())
        manager = ((node.get("ManagerStatus") or {}).get("Addr") or "").strip()
        found.add(manager.rpartition(":")[0].strip("[]") if ":" in manager else manager)
    return sorted(a for a in found if a and a != "0.0.0.0")


def proxy_spec(nodes: list[Mapping], allowed_networks: list[str]) -> dict:
    """The relay's HTTPS proxy: on PROXY_PORT, refusing link-local addresses and the nodes'
    addresses always, and any other address that is not public unless `allowed_networks`
    (CIDRs) hold it."""
    return {"listen": PROXY_PORT, "refuse": node_addresses(nodes), "allow": list(allowed_networks)}


def proxy_env(proxy_url: str) -> dict[str, str]:
    """The environment that sends a server's HTTPS clients (pip, conda, git, curl) through the
    relay's proxy, and nothing meant for the hub."""
    no_proxy = f"{HUB_ALIAS},localhost,127.0.0.1"
    return {"HTTPS_PROXY": proxy_url, "https_proxy": proxy_url, "NO_PROXY": no_proxy, "no_proxy": no_proxy}


def created_age(created: str, now: float | None = None) -> float:
    """Seconds since Docker's `Created` time (RFC 3339, e.g. '2026-12-06T04:20:00.123456789Z'),
    or an epoch number (containers); 0 when unreadable (too young to judge)."""
    now = time.time() if now is None else now
    if isinstance(created, (int, float)):
        return now - created
    try:
        at = datetime.strptime(str(created)[:19], "%Y-%m-%dT%H:%M:%S").replace(tzinfo=UTC)
    except ValueError:
        return 0.0
    offset = re.search(r"([+-])(\d\d):(\d\d)$", str(created))
    stamp = at.timestamp()
    if offset:
        sign = 1 if offset.group(1) == "+" else -1
        stamp -= sign * (int(offset.group(2)) * 3600 + int(offset.group(3)) * 60)
    return now - stamp


def sweep(api, pool_id: str, log=None, min_age: float = 30.0) -> list[str]:
    """Remove the relays and server overlays of this ledger whose server's service is gone and
    that are older than `min_age` seconds (a start makes them just before its service).  Blocking;
    returns what was removed.  `api`: a docker APIClient on a manager."""
    import docker.errors

    services = {s["Spec"]["Name"] for s in api.services()}
    removed = []
    for container in api.containers(all=True, filters={"label": [LABEL_RELAY, f"{LABEL_POOL}={pool_id}"]}):
        owner = (container.get("Labels") or {}).get(LABEL_RELAY, "")
        if owner in services or created_age(container.get("Created", 0)) < min_age:
            continue
        with contextlib.suppress(docker.errors.NotFound):
            api.remove_container(container["Id"], force=True)
        removed.append(relay_of(owner))
    for network in api.networks(filters={"label": [LABEL_SERVER_NET, f"{LABEL_POOL}={pool_id}"]}):
        owner = (network.get("Labels") or {}).get(LABEL_SERVER_NET, "")
        if owner in services or created_age(network.get("Created", "")) < min_age:
            continue
        try:
            api.remove_network(network["Id"])
            removed.append(network.get("Name", owner))
        except docker.errors.NotFound:
            pass
        except docker.errors.APIError as exc:  # its task still shuts down: the next pass
            if log:
                log.info("Server network %s not removed yet: %s", network.get("Name"), exc)
    if removed and log:
        log.info("Removed the relays and networks of servers that are gone: %s", ", ".join(removed))
    return removed


async def drop_network(spawner, name: str, seconds: float = NETWORK_DROP_SECONDS) -> bool:
    """Remove a stopped server's overlay once Swarm lets it (its task gone); True when gone."""
    import docker.errors

    deadline = time.monotonic() + seconds
    while True:
        try:
            await spawner.docker("remove_network", name)
            return True
        except docker.errors.NotFound:
            return True
        except docker.errors.APIError as exc:
            if time.monotonic() > deadline:
                spawner.log.info("Network %s is still in use (%s); the reconciler removes it later", name, exc)
                return False
        await asyncio.sleep(0.5)


class RelayNotReady(RuntimeError):
    """A relay or proxy that exited, or did not listen in time; str() says which, with its log."""


async def wait_ready(docker_call, name: str, seconds: float = RELAY_READY_SECONDS) -> None:
    """Until relay container `name` listens (its READY_LINE).  Whatever starts after it counts on
    it at once: a job's first `pip install` through its proxy, a server's first call to the hub;
    started but not yet listening, the relay's address answers "connection refused".  Raises
    RelayNotReady if it exits (its log's last lines) or is not ready in `seconds`.
    `docker_call(method, *args, **kwargs)`: an awaitable docker APIClient call."""
    import docker.errors

    deadline = time.monotonic() + seconds
    while True:
        try:
            printed = (await docker_call("logs", name, stdout=True, stderr=True, tail=20)).decode(errors="replace")
            if READY_LINE in printed:
                return
            state = (await docker_call("inspect_container", name)).get("State") or {}
        except docker.errors.NotFound:
            # Not there yet: another unit's create holds the name (its 409) before Docker shows it.
            printed, state = "", {"Status": "not made yet"}
        last = " | ".join(printed.strip().splitlines()[-3:]) or "no output"
        if state.get("Status") in ("exited", "dead"):
            raise RelayNotReady(f"{name} exited ({state.get('ExitCode')}) before it listened: {last}")
        if time.monotonic() > deadline:
            raise RelayNotReady(f"{name} did not listen within {seconds:g} s ({state.get('Status')}): {last}")
        await asyncio.sleep(0.2)


def program_command(spec: dict) -> list[str]:
    return ["python3", "-c", RELAY_PROGRAM, json.dumps(spec, separators=(",", ":"))]
