"""GPUSwarmSpawner (`gpu-swarm`): one GPU pool across the nodes of a Docker Swarm.

The Swarm engine of `lending.GPULendingSpawner`, on dockerspawner's
`SwarmSpawner`: the ledger picks the node and the GPU uuids, the service is
pinned to that node by a placement constraint, and its task gets exactly
those GPUs through `NVIDIA_VISIBLE_DEVICES` (the GPU nodes run `nvidia` as
their default runtime; Swarm services cannot take device requests).  CPU
servers get `void`.  What is not the engine it shares with the Docker engine
through `engines.common.container_spawner.GPUContainerSpawner` (profiles, leases,
lock-down, home ownership, and every c.GPUDockerSpawner option, which applies
here too), never the Docker engine's own methods; it answers `lease_holders`
from Swarm's tasks.
"""

from __future__ import annotations

import asyncio
import contextlib
from urllib.parse import urlparse

import docker.errors
from docker.types import (
    ContainerSpec,
    DriverConfig,
    EndpointSpec,
    Mount,
    NetworkAttachmentConfig,
    Placement,
    Resources,
    RestartPolicy,
    TaskTemplate,
)
from docker.utils import parse_bytes
from dockerspawner import SwarmSpawner
from tornado import web
from traitlets import Bool, Dict, Float, List, TraitError, Unicode, default, validate

from ...pool import PoolError
from ...pool.history.queries import counts as counts_of
from ...pool.leasing.placement import host_demand
from ...profiles import Profile, options_form_html
from ..common.container_spawner import GPUContainerSpawner
from ..common.containers import hardened_host_config, lease_labels
from ..common.homes import create_helper, helper_bounds, prepare_home_volume
from ..common.labels import LABEL_POOL, pool_identity
from ..common.readiness import wait_for_server
from .generic_guard import GUARD
from .homes import make_home_directory
from .lockdown import SPEC_API, refused_nodes, version_tuple
from .relay import (
    HUB_ALIAS,
    LABEL_RELAY,
    LABEL_SERVER_NET,
    PROXY_PORT,
    RELAY_MEMORY,
    RelayNotReady,
    drop_network,
    hub_ports,
    new_network_name,
    overlay_options,
    program_command,
    proxy_env,
    proxy_spec,
    relay_of,
    relay_spec,
    through_relay,
    wait_ready,
)
from .stopping import ask_server_to_exit
from .tasks import DOWN_NODES, LIVE_TASK_STATES, lease_holders_in, node_states, task_ip

SQLITE_REFUSED = ("gpu-swarm lends the GPUs of several hosts from one ledger, which must be "
                  "PostgreSQL (GPUPool.db_url / GPUHUB_POOL_DB_URL = postgresql+psycopg://...); "
                  "an SQLite ledger lives on one machine.")


class GPUSwarmSpawner(GPUContainerSpawner, SwarmSpawner):
    """Lends GPUs of any Swarm node from one locked pool (see the module docstring)."""

    home_volume_driver_options = Dict(
        {},
        config=True,
        help="""
        Options of Docker's `local` volume driver for each user's home, so that
        the same home is mounted on whichever node the server lands:
        `{username}` is the escaped user name.  NFS (production):
        `{"type": "nfs", "o": "addr=10.0.0.5,nfsvers=4,rw", "device":
        ":/export/homes/{username}"}`.  Empty: a node-local volume (a user's
        files then stay on the node where they were written).
        """,
    )
    home_root_volume_options = Dict(
        {},
        config=True,
        help="""
        Options of Docker's `local` volume driver for the directory holding
        every home (e.g. `":/export/homes"` over NFS).  The hub mounts it on
        the manager, in a short-lived container without network or
        capabilities, only to create a new user's home directory, owned by
        their uid; the home's hand-over then follows the same rules as on one
        host.  Needed when `home_volume_driver_options` name a directory per user.
        """,
    )
    cpu_constraints = List(
        Unicode(),
        default_value=[],
        config=True,
        help="Swarm placement constraints of servers without GPUs, e.g. `[\"node.role==worker\"]` "
        "or `[\"node.labels.cpu==true\"]`.  GPU servers are always pinned to their GPUs' node.",
    )
    node_down_grace = Float(
        300.0,
        config=True,
        help="""
        Seconds a server whose Swarm node went quiet (down, unknown, disconnected: a
        worker that lost its heartbeat to the manager) is kept, with its lease,
        before the hub treats it as gone.  Its container may still run there, and
        unsaved work with it: meanwhile the lease shows the problem on the pool
        page and in `gpu-pool status`, and its GPUs are not lent.  A node back
        within it carries on; after it, the lease ends, and the returning node's
        GPUs are lent only once it has stopped the task.
        """,
    )
    generic_resource_guard = Bool(
        False,
        config=True,
        help="""
        Also reserve the leased number of GPUs as Swarm generic resources
        (`GPU=N`), so Swarm itself refuses to overcommit a node's GPUs even if
        something outside the ledger started GPU tasks there.  Swarm then picks
        uuids of its own in `DOCKER_RESOURCE_GPU`, which the spawner ignores:
        `NVIDIA_VISIBLE_DEVICES` names the ledger's.  Off by default: the
        ledger already lends each GPU once.  It needs Docker 23.0 or newer on
        every manager (older Swarms reject such tasks, running ones included,
        whenever their node is updated): with an older manager the spawner
        starts servers without the reservation and logs a warning, and
        `gpu-pool doctor` reports it.
        """,
    )

    isolate_servers = Bool(
        True,
        config=True,
        help="""
        Keep users' servers apart on the Swarm: each server's service joins an overlay
        of its own (`<service>-net-<hex>`, new at each start, encrypted when the servers' overlay
        `network_name` is), and a small relay container on the manager, on both that
        overlay and the servers' one, forwards the hub's connections to the server
        (only from the hub's address) and the server's to the hub's ports named in
        its environment (engines/swarm/relay.py).  A server then reaches the hub, its proxy
        and services, never another user's server.  Its own overlay is internal: the
        server has no route out at all, so neither the cloud metadata address
        (169.254.169.254) nor any service of a node (its own or another's) is reachable
        from it; the outside world only through `outbound_proxy`.  False: every server on
        `network_name`, where any server reaches any other's listening ports, and, through
        its node's `docker_gwbridge`, the metadata address and every port the node listens on.
        """,
    )
    outbound_proxy = Bool(
        True,
        config=True,
        help="""
        With `isolate_servers`, give servers the outside world over HTTPS only, through
        an HTTPS proxy in their relay: the server's environment gets
        `HTTPS_PROXY=http://jupyterhub:3128` (and `NO_PROXY` naming the hub), which pip,
        conda, git and curl follow.  The proxy takes `CONNECT host:port` only, and refuses
        any destination one of whose addresses is link-local (169.254.0.0/16, the cloud
        metadata service), an address of a Swarm node, or not public (private, loopback,
        shared ranges: the lab's own network, other containers) unless
        `outbound_proxy_networks` holds it.  False: servers reach the hub and nothing else
        (no package installs from the internet).  Plain HTTP and other protocols never go
        out either way.
        """,
    )
    outbound_proxy_networks = List(
        Unicode(),
        config=True,
        help="""
        Networks (CIDRs, e.g. `["10.20.0.0/24"]`) that are not public and that the
        relay's HTTPS proxy (`outbound_proxy`) still connects to: a package mirror on
        the lab's own network.  Link-local addresses, the Swarm nodes' addresses and
        the relay's gateway are refused even when a network here holds them; any other
        address of a node a network here holds (a Docker bridge's gateway, e.g.
        172.17.0.1) is not: list the mirror's own network, or its /32.
        """,
    )

    @default("outbound_proxy_networks")
    def _no_private_networks(self) -> list[str]:
        return []

    @validate("outbound_proxy_networks")
    def _networks_are_cidrs(self, proposal) -> list[str]:
        import ipaddress

        bad = []
        for value in proposal["value"]:
            try:
                ipaddress.ip_network(value, strict=False)
            except ValueError:
                bad.append(value)
        if bad:
            raise TraitError(f"c.GPUSwarmSpawner.outbound_proxy_networks: {bad} are not networks "
                             "(CIDRs such as 10.20.0.0/24)")
        return proposal["value"]

    @default("inventory_kind")
    def _default_inventory_kind(self):
        return "swarm"

    # Containers behind services are always removed with the service.
    remove = True
    # node id -> (hostname, why) of the nodes no server may run on (see _check_lockdown).
    _refused_nodes: dict[str, tuple[str, str]] = {}
    # Whether this server's lease carries a quiet-node problem to clear (see _note_quiet_node).
    _quiet_noted = False
    # Whether this server's service carries the generic-resource reservation (_use_guard).
    _guarded = False
    # How long a guarded start waits for Swarm to replace a rejected task before it gives up.
    REJECTED_WAIT_SECONDS = 30.0
    _guard_warned = False  # said once per hub process that the managers cannot carry the guard

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if self.pool.is_sqlite:
            raise ValueError(SQLITE_REFUSED)
        # The reconciler and the lease's release read tasks through engines/swarm/tasks.py, with this grace.
        DOWN_NODES.grace = self.node_down_grace

    # Each reconcile pass covers every node of the Swarm (used by reconcile.start_in_hub).
    @staticmethod
    def reconcile_pass(pool, client, host, tracked, log, min_age, starting=()):
        from .reconcile import reconcile_swarm

        return reconcile_swarm(pool, client, tracked, log, min_age, starting)

    # ---------------------------------------------------------------- profiles

    def lease_hosts(self, profile: Profile) -> list[str] | None:
        """The GPU nodes whose labels match the profile's `node_labels` (None: any node), less
        those that would run the server without no-new-privileges (engines/swarm/lockdown.py)."""
        wanted = dict(profile.node_labels)
        hosts = self.pool.inventory.hosts_matching(wanted)  # every GPU node when nothing is wanted
        if wanted and not hosts:
            raise web.HTTPError(409, f"No GPU node carries the labels {wanted} that profile "
                                f"{profile.display_name!r} asks for. Ask an administrator.")
        refused = {host: why for host, why in self._refused_nodes.values() if host in hosts}
        if not refused:
            return hosts if wanted else None
        allowed = [h for h in hosts if h not in refused]
        if not allowed:
            why = "; ".join(f"{h}: {refused[h]}" for h in hosts if h in refused)
            raise web.HTTPError(409, f"No GPU node that profile {profile.display_name!r} may use runs "
                                f"servers with no-new-privileges ({why}). Ask an administrator: "
                                "`gpu-pool doctor` on the Swarm manager names the fix.")
        return allowed

    async def _check_lockdown(self, image: str) -> None:
        """Which nodes may not run servers (their tasks would lack no-new-privileges); logged there."""
        try:
            self._refused_nodes = await refused_nodes(self.client, image, self.prefix, self.log)
        except Exception as exc:  # the manager did not answer: nothing is placed unchecked
            self.log.error("Could not check the Swarm nodes' lock-down: %s", exc)
            raise web.HTTPError(503, "The Swarm manager did not answer, so no node could be checked for "
                                "your server; try again in a minute.") from None

    async def _render_options_form(self) -> str:
        """The spawn form; a profile limited to some nodes shows the free GPUs of those nodes."""
        allowed = self._allowed_profiles()
        try:
            statuses = await self._ledger(self.pool.gpus)
        except PoolError:
            return options_form_html(allowed, self.default_profile, None)
        per_profile = {}
        for profile in allowed:
            if profile.gpus and profile.node_labels:
                hosts = set(self.pool.inventory.hosts_matching(dict(profile.node_labels)))
                per_profile[profile.slug] = counts_of([st for st in statuses if st.gpu.host in hosts], 0)
        return options_form_html(allowed, self.default_profile, counts_of(statuses, 0), per_profile)

    def host_demand(self) -> dict[str, int]:
        """GPU node -> how many of the configured host-tagged profiles can use it: a profile
        that names no labels spends the GPUs fewer such profiles ask for first."""
        return host_demand(self._profiles, self.pool.inventory.hosts_matching)

    async def lease_for_start(self, profile: Profile) -> None:
        # Nodes that joined, left, went down or were drained reach the ledger first.
        inventory = self.pool.inventory
        inventory.forget_cache()
        await self._ledger(self.pool.sync_inventory)
        self.pool.set_host_demand(await asyncio.to_thread(self.host_demand))
        await self._check_lockdown(profile.image)
        await super().lease_for_start(profile)

    # ---------------------------------------------------------------- service

    def _mounts(self, uid: int, gid: int) -> list[Mount]:
        name = self._render_templates(self.home_volume_name)
        options = {k: self._render_templates(v) for k, v in self.home_volume_driver_options.items()}
        driver = DriverConfig("local", options=options) if options else None
        return [
            Mount(target=self.home_mount_point, source=name, type="volume", driver_config=driver,
                  labels={"org.jupyter.gpuhub.user": self.user.name}),
            Mount(target="/dev/shm", source=None, type="tmpfs", tmpfs_size=parse_bytes(self.shm_size)),
        ]

    def home_volume_create_kwargs(self) -> dict:
        options = {k: self._render_templates(v) for k, v in self.home_volume_driver_options.items()}
        return {"driver": "local", "driver_opts": options} if options else {}

    async def create_object(self):
        uid, gid = self.container_identity()
        labels = lease_labels(self.user.name, self.name or "", self.gpu_uuids, self.gpu_host, self.lease_id,
                              pool_identity(self.pool), self._config_digest(uid, gid))
        env = self.get_env()
        env["NVIDIA_VISIBLE_DEVICES"] = ",".join(self.gpu_uuids) if self.gpu_uuids else "void"
        networks = [NetworkAttachmentConfig(self.network_name)] if self.network_name else []
        if self._isolated():
            # Its own overlay, and the relay to the hub (engines/swarm/relay.py), before its task starts.
            env, own = await self._make_relay(env)
            networks = [NetworkAttachmentConfig(own)]
        hardening = hardened_host_config()
        # Configured extras first: ours (identity, labels, environment, lock-down) win.
        spec = {**self.extra_container_spec,
                "image": self.image, "args": await self.get_command(), "env": env, "user": f"{uid}:{gid}",
                "labels": labels, "mounts": self._mounts(uid, gid),
                "cap_add": None, "cap_drop": hardening["cap_drop"]}
        container_spec = ContainerSpec(**spec)
        if version_tuple((await self.docker("version")).get("ApiVersion")) >= SPEC_API:
            # Docker 25+: the task asks for it itself; older nodes are checked (engines/swarm/lockdown.py).
            container_spec["Privileges"] = {**(container_spec.get("Privileges") or {}), "NoNewPrivileges": True}
        self._guarded = bool(self.gpu_uuids) and await self._use_guard()
        resources = Resources(
            mem_limit=self.mem_limit, mem_reservation=self.mem_guarantee,
            cpu_limit=int(self.cpu_limit * 1e9) if self.cpu_limit else None,
            generic_resources={"GPU": len(self.gpu_uuids)} if self._guarded else None,
        )
        # c.ContainerLimits: Swarm takes the pids limit among the task's resource limits (API 1.41).
        limits = self.container_limits
        resources.setdefault("Limits", {})["Pids"] = limits.pids_limit
        constraints = [f"node.hostname=={self.gpu_host}"] if self.gpu_uuids else list(self.cpu_constraints)
        # Never on a node whose tasks would run without no-new-privileges (or that was not checked).
        constraints += [f"node.id!={node}" for node in sorted(self._refused_nodes)]
        task = TaskTemplate(
            container_spec=container_spec, resources=resources,
            # A server that exits stays exited: the hub sees it die and its lease ends.  With
            # the generic-resource guard, Swarm may reject a first task and needs retries.
            restart_policy=(RestartPolicy(condition="on-failure", max_attempts=3)
                            if self._guarded else RestartPolicy(condition="none")),
            placement=Placement(constraints=constraints or None),
            networks=networks,
            log_driver=DriverConfig(limits.log_driver, options=limits.log_options()),
        )
        # dnsrr: no virtual IP (no IPVS needed); the hub reaches the task's own address.
        try:
            service = await self.docker("create_service", task, name=self.service_name, labels=labels,
                                        endpoint_spec=EndpointSpec(mode="dnsrr"))
        except BaseException:
            await self._drop_relay()  # no service, no relay (its overlay goes in the background)
            raise
        while not await self.docker("tasks", filters={"service": self.service_name}):
            await asyncio.sleep(0.1)
        return service

    # ------------------------------------------------------- isolation (relay.py)

    # The background removal of this server's overlays after a stop.
    _network_drop: asyncio.Future | None = None

    def _isolated(self) -> bool:
        return bool(self.network_name) and self.isolate_servers

    async def _make_relay(self, env: dict) -> tuple[dict, str]:
        """This run's own overlay and the server's relay (started); returns the server's
        environment, its hub URLs naming the relay, and the overlay's name."""
        hub_host = urlparse(env.get("JUPYTERHUB_API_URL", "")).hostname
        if not hub_host:
            raise web.HTTPError(500, "The hub's API URL names no host: the server could not be kept apart "
                                "from others (c.GPUSwarmSpawner.isolate_servers). Ask an administrator.")
        pool_id = pool_identity(self.pool)
        # A new overlay at each start: an earlier run's may still be waiting for its task to go
        # (drop_network), and a hub object made after that stop does not hold its removal.
        service, network, relay = self.service_name, new_network_name(self.service_name), relay_of(self.service_name)
        shared = {}
        with contextlib.suppress(docker.errors.NotFound):
            shared = await self.docker("inspect_network", self.network_name)
        # Internal: no docker_gwbridge for the server's task, so no route out of it at all (no
        # metadata address, no node's ports); the relay, on the servers' overlay too, has one.
        await self.docker("create_network", network, driver="overlay", attachable=True, internal=True,
                          labels={LABEL_SERVER_NET: service, LABEL_POOL: pool_id},
                          options=overlay_options(shared))
        with contextlib.suppress(docker.errors.NotFound):  # one left by a start that failed
            await self.docker("remove_container", relay, force=True)
        ports = [self.port] + ([self.ssh_container_port] if self.ssh_state_dir else [])  # the SSH gateway's way in
        proxy = proxy_spec(await self.docker("nodes"), self.outbound_proxy_networks) if self.outbound_proxy else None
        spec = relay_spec(service, ports, hub_host, hub_ports(env, hub_host), proxy)
        entrypoint = program_command(spec)
        made = await create_helper(
            self, image=self.image, entrypoint=entrypoint[:3], command=entrypoint[3:], user="65534:65534",
            name=relay, labels={LABEL_RELAY: service, LABEL_POOL: pool_id},
            environment={"NVIDIA_VISIBLE_DEVICES": "void"},
            host_config=self.client.create_host_config(
                network_mode=network, read_only=True, mem_limit=RELAY_MEMORY,
                restart_policy={"Name": "unless-stopped"}, **hardened_host_config(), **helper_bounds(self)),
            networking_config=self.client.create_networking_config(
                {network: self.client.create_endpoint_config(aliases=[HUB_ALIAS])}))
        await self.docker("connect_container_to_network", made["Id"], self.network_name)
        await self.docker("start", made["Id"])
        try:
            await wait_ready(self.docker, relay)
        except RelayNotReady as exc:
            self.log.error("The relay of %s is not ready: %s", service, exc)
            raise web.HTTPError(500, "The server's link to the hub did not start. Ask an administrator "
                                "(the hub's log says why).") from None
        env = through_relay(env, hub_host)
        if proxy:
            env.update(proxy_env(f"http://{HUB_ALIAS}:{PROXY_PORT}"))
        return env, network

    async def _relay_ip(self) -> str | None:
        """The relay's address on the servers' overlay (None: this server has no relay)."""
        try:
            info = await self.docker("inspect_container", relay_of(self.service_name))
        except docker.errors.NotFound:
            return None
        return (((info.get("NetworkSettings") or {}).get("Networks") or {}).get(self.network_name)
                or {}).get("IPAddress") or None

    async def _drop_relay(self) -> None:
        """Remove the relay now and the server's overlays once its task is gone (in the background):
        those there now, by id (a start after this one makes its own)."""
        if not self._isolated():
            return
        try:
            await self.docker("remove_container", relay_of(self.service_name), force=True)
        except docker.errors.NotFound:
            pass
        except docker.errors.APIError as exc:  # the reconciler removes it
            self.log.warning("Could not remove the relay of %s: %s", self.service_name, exc)
        try:
            own = await self.docker("networks", filters={"label": [f"{LABEL_SERVER_NET}={self.service_name}",
                                                                   f"{LABEL_POOL}={pool_identity(self.pool)}"]})
        except docker.errors.APIError as exc:  # the reconciler removes them
            self.log.warning("Could not list the overlays of %s: %s", self.service_name, exc)
            return
        ids = [n["Id"] for n in own]
        if ids:
            self._network_drop = asyncio.ensure_future(
                asyncio.gather(*(drop_network(self, network_id) for network_id in ids)))

    async def remove_object(self):
        await super().remove_object()
        await self._drop_relay()

    async def get_task(self):
        """The service's task.  One on a node that went quiet (down, unknown, disconnected) may
        still run there: it reads as it was, its lease kept and marked as a problem, for
        `node_down_grace` seconds; after that it counts as gone ("down")."""
        task = await SwarmSpawner.get_task(self)
        if task and task.get("NodeID"):
            node = task["NodeID"]
            states = await asyncio.to_thread(node_states, self.client)
            state = states.get(node, "ready")
            if state != "ready" and not DOWN_NODES.in_grace(node):
                return {**task, "Status": {**task.get("Status", {}), "State": "down"}}
            await self._note_quiet_node(state, DOWN_NODES.quiet_for(node))
        return task

    async def _note_quiet_node(self, state: str, quiet: float | None) -> None:
        """The lease's problem while its node is quiet (pool page, `gpu-pool status`); cleared after."""
        if self.lease_id is None:
            return
        problem = (f"node {self.gpu_host or '?'} is {state} (quiet for {quiet:.0f} s): its server is kept "
                   f"for up to {self.node_down_grace:g} s, then its lease ends" if quiet is not None else "")
        if problem == "" and not self._quiet_noted:
            return
        self._quiet_noted = bool(problem)
        try:
            await self._ledger(self.pool.set_problem, self.lease_id, problem)
        except PoolError as exc:
            self.log.warning("Could not note the quiet node of lease %s: %s", self.lease_id, exc)

    async def _use_guard(self) -> bool:
        """generic_resource_guard, where every manager can carry it (engines/swarm/generic_guard.py)."""
        if not self.generic_resource_guard:
            return False
        verdict = await asyncio.to_thread(GUARD.verdict, self.client)
        if not verdict.usable and not GPUSwarmSpawner._guard_warned:
            GPUSwarmSpawner._guard_warned = True
            self.log.warning("c.GPUSwarmSpawner.generic_resource_guard is on, but %s: servers start without "
                             "Swarm's GPU reservation (the ledger still lends each GPU once). Upgrade the "
                             "managers to Docker 23.0 or newer to use it.", verdict.detail)
        return verdict.usable

    async def start_object(self):
        """Wait until the task runs, checking every 0.2 s (SwarmSpawner backs off up to 11 s)."""
        rejected_since = None
        while True:
            task = await self.get_task()
            if not task:
                raise RuntimeError(f"Service {self.service_name} has no task")
            status = task.get("Status") or {}
            state = (status.get("State") or "").lower()
            if state == "running":
                return
            loop_now = asyncio.get_running_loop().time()
            if state != "rejected":
                rejected_since = None  # a new task: its own wait
            if state == "rejected" and self._guarded and (
                    rejected_since is None or loop_now - rejected_since < self.REJECTED_WAIT_SECONDS):
                # Swarm may reject the first task of a generic-resource service, then retries it.
                rejected_since = loop_now if rejected_since is None else rejected_since
            elif state not in LIVE_TASK_STATES:
                # Rejected, failed, or on a node that went down: say why, in Swarm's words.
                raise web.HTTPError(500, f"Your server's task did not start on {self.gpu_host or 'a node'}: "
                                    f"{state} ({status.get('Err') or status.get('Message') or 'no reason given'})")
            await asyncio.sleep(0.2)

    async def _task_running(self) -> bool:
        try:
            task = await self.get_task()
        except Exception:
            return True  # unknown is not gone: the hub's own check decides
        return bool(task) and (task.get("Status") or {}).get("State") in LIVE_TASK_STATES

    async def get_ip_and_port(self):
        if self._isolated():
            ip = await self._relay_ip()
            if ip:
                return ip, self.port
        # No relay: a server started with isolate_servers off (or before it), on the servers' overlay.
        task = await self.get_task()
        ip = task_ip(task, self.network_name) if task else None
        if not ip:
            raise RuntimeError(f"Service {self.service_name} has no address on {self.network_name}")
        return ip, self.port

    async def stop(self, now=False):
        # Asked first, the server exits before Swarm's slow task shutdown (engines/swarm/stopping.py).
        if not now:
            await ask_server_to_exit(self)
        await super().stop(now=now)

    async def run_post_stop_hook(self):
        # JupyterHub skips stop() for a server that poll found dead (a task that
        # exited, a node that went down): its service still exists.  Remove it,
        # so that nothing can run it again, before the lease is settled.
        try:
            if await self.get_object() is not None:
                await self.remove_object()
            else:
                await self._drop_relay()
        except Exception as exc:  # the lease then stays lent; the reconciler retries
            self.log.warning("Could not remove service %s: %s", self.service_name, exc)
        await super().run_post_stop_hook()

    async def lease_holders(self, lease_id: int) -> list[str]:
        return await asyncio.to_thread(lease_holders_in, self.client, lease_id, pool_identity(self.pool))

    # -------------------------------------------------------------- lifecycle

    async def _make_home_directory(self, image: str, uid: int, gid: int) -> None:
        """Create the user's directory under the shared homes root (once), owned by them."""
        await make_home_directory(self, self.home_root_volume_options, self.prefix, image, uid, gid)

    async def start_server(self, profile: Profile):
        uid, gid = self.container_identity()
        self._emit(50, "Preparing your home")
        await self._make_home_directory(profile.image, uid, gid)
        await prepare_home_volume(self, profile.image, uid, gid)
        if not self.gpu_uuids:
            await self._check_lockdown(profile.image)
        where = f" on {self.gpu_host}" if self.gpu_host else ""
        self._emit(60, f"Creating your service from {profile.image}{where}")
        result = await SwarmSpawner.start(self)
        self._emit(80, "Service started; waiting for JupyterLab")
        await wait_for_server(self, result, is_running=self._task_running)
        return result

