"""SwarmJobEngine: a job's units are Swarm services, each pinned to its leased node.

The jobs runner's engine (spawner/jobs/engine.py) for `gpu-swarm`, built as the
spawner builds a server's service: restart policy none (a job that exits stays
exited), a placement constraint on the node whose GPUs the ledger lent, exactly
those uuids in `NVIDIA_VISIBLE_DEVICES` (`void` without GPUs; the GPU nodes run
`nvidia` as their default runtime), non-root, no capabilities, pids and log bounds,
the user's home as a volume of the `local` driver with the hub's shared-storage
options, and a unit without a network an internal overlay of its own (Swarm cannot
attach a task to no network: it would join its node's bridge, with a route out).  Every job
overlay is internal (a route out would reach the metadata address and the nodes' ports through
docker_gwbridge); with `job_network` (a one-container job's own overlay, not the servers', or a
cluster's) its units go out through a proxy container of that overlay's (engines/swarm/relay.py).
A unit's exit code is its task's, its output the service's logs; stopping scales it to 0
replicas (its log stays until it is removed); so does the SIGTERM of a reclaim's notice
(`signal`), with the spec's stop grace (a borrowed job's: GPUPool.reclaim_grace).  A task on a node that
is down may still run: it reads UNKNOWN, and holds its GPUs, until the node confirms.
Homes are prepared on the manager (the Docker engine's rules, on shared storage).
A unit runs only on a node whose tasks get no-new-privileges: the spec asks for it where
the manager's API can say so, and the nodes the lock-down probe refused (engines/swarm/lockdown.py,
the servers' own check) are left out of the lease and of the placement.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Mapping
from dataclasses import replace

from ...jobs.engine import ENDED, RUNNING, UNKNOWN, JobRefused, UnitGone, UnitSpec, UnitState, wait_until_ended
from ..common.containers import hardened_host_config
from ..common.job_containers import DockerJobEngine, HomeOwner, render_user
from ..common.labels import LABEL_JOB, LABEL_POOL, LABEL_USER
from .homes import make_home_directory
from .lockdown import SPEC_API, refused_nodes, version_tuple
from .relay import (
    JOB_PROXY_ALIAS,
    LABEL_JOB_PROXY,
    PROXY_PORT,
    RELAY_MAX_CONNECTIONS,
    RELAY_MEMORY,
    overlay_options,
    program_command,
    proxy_env,
    proxy_of,
    proxy_spec,
    wait_ready,
)
from .tasks import LIVE_TASK_STATES, task_labels

log = logging.getLogger("gpu-pool-page")
POLL_SECONDS = 0.25
# A job's submission, lease and start each ask which nodes the lock-down check refuses (two
# manager calls, the probe's verdicts kept in lockdown.py): an answer this young is reused.
REFUSED_FRESH_SECONDS = 5.0
# The manager's API version (whether a spec may carry no-new-privileges) is read this often.
API_VERSION_SECONDS = 600.0
# How long stop() and remove() wait for Swarm to report a unit's task ended (beyond its stop grace).
CONFIRM_SECONDS = 20.0
# A unit's stop grace period (SIGTERM, then SIGKILL after it) unless its spec says otherwise
# (a borrowed job's: GPUPool.reclaim_grace, its notice when reclaimed).
STOP_GRACE_SECONDS = 5.0
# A followed log ends this long after Swarm reports its unit ended (its last lines arrive first).
FOLLOW_CHECK_SECONDS = 0.5
FOLLOW_DRAIN_SECONDS = 1.0
# Task states after which a container may still run on its node: "orphaned" is Swarm giving
# up on a node that stayed down, not the node saying its container ended.
MAY_STILL_RUN = LIVE_TASK_STATES | {"orphaned", "remove"}


# The label of a unit's own internal overlay (a unit without a network), naming the unit.
LABEL_ISOLATED = "org.jupyter.gpuhub.isolated-unit"


# The label of a job's own overlay that goes out through a proxy (`job_network`, engines/swarm/relay.py).
LABEL_PROXIED = "org.jupyter.gpuhub.proxied-network"


def isolated_network(unit: str) -> str:
    return f"{unit}-isolated"


def _replicas(service: dict) -> int | None:
    return ((service.get("Spec") or {}).get("Mode") or {}).get("Replicated", {}).get("Replicas")


def _stop_grace(service: dict) -> float:
    """Seconds the service's tasks get between SIGTERM and SIGKILL (its spec's, else Docker's 10)."""
    spec = ((service.get("Spec") or {}).get("TaskTemplate") or {}).get("ContainerSpec") or {}
    grace = spec.get("StopGracePeriod")
    return grace / 1e9 if isinstance(grace, int) else 10.0


def newest_task(tasks: list[dict]) -> dict | None:
    return max(tasks, key=lambda t: ((t.get("Version") or {}).get("Index", 0)), default=None)


def unit_state(service_name: str, service_id: str, labels: Mapping, task: dict | None,
               states: dict[str, str], hostnames: dict[str, str]) -> UnitState:
    """A unit's state from its newest task and the nodes' states: pure."""
    if task is None:  # Swarm has not made its task yet: it may any moment
        return UnitState(service_name, service_id, labels, RUNNING, message="no task yet")
    status = task.get("Status") or {}
    state = status.get("State") or ""
    node_id = task.get("NodeID") or ""
    node = hostnames.get(node_id, node_id[:12])
    if state in MAY_STILL_RUN and node_id and states.get(node_id) not in (None, "ready"):
        return UnitState(service_name, service_id, labels, UNKNOWN, node=node,
                         message=f"node {node} is {states.get(node_id)}: its task may still run")
    if state in MAY_STILL_RUN:
        return UnitState(service_name, service_id, labels, RUNNING, node=node)
    code = (status.get("ContainerStatus") or {}).get("ExitCode")
    if state == "complete" and code is None:
        code = 0
    return UnitState(service_name, service_id, labels, ENDED, exit_code=code if state != "rejected" else None,
                     message=f"{state}: {status.get('Err') or status.get('Message') or 'no reason given'}",
                     node=node)


class _Follow:
    """A log stream whose close() (by the follower, or once the unit ended) is seen by both."""

    def __init__(self, source):
        self.source = source
        self.closed = threading.Event()

    def __iter__(self):
        return iter(self.source)

    def close(self) -> None:
        self.closed.set()
        with contextlib.suppress(Exception):
            self.source.close()


class SwarmJobEngine(DockerJobEngine):
    """See the module docstring; `api`: a docker.APIClient of a Swarm manager."""

    # A task's last output reaches the manager's service logs a moment after the task ends.
    log_settle_seconds = 3.0

    def __init__(self, settings, api=None):
        super().__init__(settings, api)
        self._refused_seen: dict[str, tuple[float, dict[str, tuple[str, str]]]] = {}  # image -> (when, nodes)
        self._api_version: tuple[float, tuple[int, ...]] | None = None

    # ------------------------------------------------------------ specs

    def _volume_options(self, user: str) -> dict:
        return {k: render_user(v, user, self.settings.home_name_escape)
                for k, v in self.settings.home_volume_driver_options.items()}

    async def home_dir(self, user: str) -> str | None:
        """None: a job's home is a volume on the node it runs on (the container checks its notebook)."""
        return None

    def home_volume_create_kwargs(self, user: str) -> dict:
        options = self._volume_options(user)
        return {"driver": "local", "driver_opts": options} if options else {}

    def service_args(self, spec: UnitSpec, refused: Mapping[str, str] | None = None,
                     spec_nnp: bool = False) -> dict:
        """create_service keywords for the unit: pure (docker.types only).  `refused`: node id ->
        hostname of the nodes it must not run on; `spec_nnp`: the manager's API carries
        no-new-privileges in the spec (1.44+)."""
        from docker.types import (
            ContainerSpec,
            DriverConfig,
            EndpointSpec,
            Mount,
            NetworkAttachmentConfig,
            Placement,
            Resources,
            RestartPolicy,
            ServiceMode,
            TaskTemplate,
        )
        from docker.utils import parse_bytes

        user = spec.labels.get(LABEL_USER, "")
        options = self._volume_options(user) if user else {}
        mounts = [Mount(target=target, source=volume, type="volume",
                        driver_config=DriverConfig("local", options=options) if options else None,
                        labels={LABEL_USER: user} if user else None)
                  for volume, target in spec.volumes.items()]
        mounts.append(Mount(target="/dev/shm", source=None, type="tmpfs", tmpfs_size=parse_bytes(spec.shm_size)))
        env = {**spec.env, "NVIDIA_VISIBLE_DEVICES": ",".join(spec.gpus) if spec.gpus else "void"}
        container = ContainerSpec(
            image=spec.image, args=list(spec.command), env=env, user=spec.user, labels=dict(spec.labels),
            workdir=spec.working_dir, mounts=mounts, cap_add=None, cap_drop=["ALL"],
            stop_grace_period=int((spec.stop_grace if spec.stop_grace is not None else STOP_GRACE_SECONDS) * 1e9))
        if spec_nnp:
            container["Privileges"] = {"NoNewPrivileges": True}
        limits = self.container_limits
        resources = Resources(mem_limit=parse_bytes(spec.mem_limit) if isinstance(spec.mem_limit, str)
                              else spec.mem_limit,
                              cpu_limit=int(spec.cpu_limit * 1e9) if spec.cpu_limit else None)
        resources.setdefault("Limits", {})["Pids"] = limits.pids_limit
        constraints = [f"node.hostname=={spec.host}"] if spec.host else list(self.settings.cpu_constraints)
        constraints += [f"node.id!={node}" for node in sorted(refused or {})]
        networks = [NetworkAttachmentConfig(spec.network or isolated_network(spec.name),
                                            aliases=list(spec.aliases) or None)]
        task = TaskTemplate(
            container_spec=container, resources=resources, restart_policy=RestartPolicy(condition="none"),
            placement=Placement(constraints=constraints or None), networks=networks,
            log_driver=DriverConfig(limits.log_driver, options=limits.log_options()))
        return {"task_template": task, "name": spec.name, "labels": dict(spec.labels),
                "mode": ServiceMode("replicated", replicas=1), "endpoint_spec": EndpointSpec(mode="dnsrr")}

    # ------------------------------------------------------------ reading Swarm

    def _nodes(self) -> tuple[dict[str, str], dict[str, str]]:
        nodes = self.api.nodes()
        return ({n["ID"]: (n.get("Status") or {}).get("State", "unknown") for n in nodes},
                {n["ID"]: (n.get("Description") or {}).get("Hostname", "") for n in nodes})

    def _read(self, name: str) -> UnitState | None:
        import docker.errors

        try:
            service = self.api.inspect_service(name)
        except docker.errors.NotFound:
            return None
        if service["Spec"]["Name"] != name and service["ID"] != name:
            return None
        tasks = self.api.tasks(filters={"service": service["ID"]})
        states, hostnames = self._nodes()
        task = newest_task(tasks)
        if task is None and _replicas(service) == 0:  # told to stop (signal), and its task already gone
            return UnitState(service["Spec"]["Name"], service["ID"], service["Spec"].get("Labels") or {}, ENDED,
                             message="stopped: scaled to 0 replicas, its task removed")
        return unit_state(service["Spec"]["Name"], service["ID"], service["Spec"].get("Labels") or {},
                          task, states, hostnames)

    def _units(self, pool_id: str) -> list[UnitState]:
        services = self.api.services(filters={"label": [LABEL_JOB, f"{LABEL_POOL}={pool_id}"]})
        tasks = [t for t in self.api.tasks() if task_labels(t).get(LABEL_POOL) == pool_id
                 and LABEL_JOB in task_labels(t)]
        states, hostnames = self._nodes()
        by_service: dict[str, list[dict]] = {}
        for t in tasks:
            by_service.setdefault(t.get("ServiceID", ""), []).append(t)
        units = [unit_state(s["Spec"]["Name"], s["ID"], s["Spec"].get("Labels") or {},
                            newest_task(by_service.pop(s["ID"], [])), states, hostnames) for s in services]
        # Tasks of services already removed that may still run (their node was down): units
        # too, so that their leases stay until the node confirms them gone.
        for service_id, left in by_service.items():
            task = newest_task(left)
            if task is None:
                continue
            state = unit_state(f"removed service {service_id[:12]}", service_id, task_labels(task), task,
                               states, hostnames)
            if state.holding:
                units.append(state)
        return units

    def _confirm_ended(self, service_id: str, timeout: float) -> bool:
        """Until no task of the service may still run (True), or `timeout` s (False)."""
        deadline = time.monotonic() + timeout
        while True:
            states, _ = self._nodes()
            tasks = [t for t in self.api.tasks() if t.get("ServiceID") == service_id]
            live = [t for t in tasks if (t.get("Status") or {}).get("State") in MAY_STILL_RUN]
            if not live:
                return True
            if time.monotonic() > deadline or any(states.get(t.get("NodeID")) not in (None, "ready") for t in live):
                return False
            time.sleep(POLL_SECONDS)

    def _stop(self, name: str, grace: float) -> bool:
        import docker.errors

        try:
            service = self.api.inspect_service(name)
            state = self._read(name)
            if state is not None and state.phase == ENDED:
                # Already ended: scaling down would have Swarm remove its container, and its log.
                return True
            self._scale_down(service)
        except docker.errors.NotFound:
            return True
        # Swarm kills the task after its spec's stop grace (a borrowed job's is its notice).
        return self._confirm_ended(service["ID"], max(grace, _stop_grace(service)) + CONFIRM_SECONDS)

    def _scale_down(self, service: dict) -> None:
        """0 replicas: Swarm sends the task SIGTERM now, and SIGKILL after its stop grace period."""
        from docker.types import ServiceMode

        if _replicas(service) != 0:
            self.api.update_service(service["ID"], service["Version"]["Index"],
                                    mode=ServiceMode("replicated", replicas=0), fetch_current_spec=True)

    def _tell(self, name: str) -> bool:
        import docker.errors

        try:
            service = self.api.inspect_service(name)
            state = self._read(name)
            if state is None or state.phase == ENDED:
                return False
            self._scale_down(service)
        except docker.errors.NotFound:
            return False
        return True

    def _remove(self, name: str) -> bool:
        import docker.errors

        try:
            service = self.api.inspect_service(name)
            service_id, unit = service["ID"], service["Spec"]["Name"]
        except docker.errors.NotFound:
            service_id = unit = name  # a removed service's tasks (units() names them by the service id)
        with contextlib.suppress(docker.errors.NotFound):
            self.api.remove_service(service_id)
        if not self._confirm_ended(service_id, CONFIRM_SECONDS):
            return False
        with contextlib.suppress(docker.errors.NotFound):  # its proxy (`job_network`), if any
            self.api.remove_container(proxy_of(isolated_network(unit)), force=True)
        with contextlib.suppress(docker.errors.APIError):  # none (it had a network), or already gone
            self.api.remove_network(isolated_network(unit))
        return True

    def _logs(self, name: str, tail: int) -> bytes:
        import docker.errors

        state = self._read(name)
        if state is None:
            raise UnitGone(name)
        if state.phase == UNKNOWN:
            # Its node is down: Swarm's log broker waits for that node's share, and docker-py
            # reads a log stream without a timeout, so asking would block this thread (and the
            # end of a cluster with a quiet node, which reads its workers' logs) until the node
            # answers.  Its log is not to be had now.
            return b""
        try:
            return b"".join(self.api.service_logs(name, stdout=True, stderr=True, tail=tail, is_tty=False))
        except docker.errors.NotFound:
            raise UnitGone(name) from None

    # ------------------------------------------------------------ JobEngine

    async def _refused(self, image: str) -> dict[str, tuple[str, str]]:
        """node id -> (hostname, why) of the nodes no unit may run on (the servers' lock-down check)."""
        now = time.monotonic()
        seen = self._refused_seen.get(image)
        if seen is not None and now - seen[0] < REFUSED_FRESH_SECONDS:
            return seen[1]
        try:
            refused = await refused_nodes(self.api, image, self.settings.prefix, log)
        except Exception as exc:  # the manager did not answer: nothing is placed unchecked
            raise JobRefused(f"The Swarm manager did not answer, so no node could be checked for the job "
                             f"({exc}); try again in a minute.") from None
        if len(self._refused_seen) > 64:  # one entry per profile image: bounded all the same
            self._refused_seen.clear()
        self._refused_seen[image] = (time.monotonic(), refused)
        return refused

    async def _spec_carries_nnp(self) -> bool:
        """Whether the manager's API takes no-new-privileges in a service spec (1.44+)."""
        now = time.monotonic()
        if self._api_version is None or now - self._api_version[0] > API_VERSION_SECONDS:
            self._api_version = (now, version_tuple((await self.docker("version")).get("ApiVersion")))
        return self._api_version[1] >= SPEC_API

    async def create(self, spec: UnitSpec) -> None:
        refused = await self._refused(spec.image)
        why = next((why for host, why in refused.values() if host == spec.host), None)
        if spec.host and why is not None:
            raise JobRefused(f"GPU node {spec.host} would run the job without no-new-privileges ({why}). "
                             "Ask an administrator: `gpu-pool doctor` on the Swarm manager names the fix.")
        spec_nnp = await self._spec_carries_nnp()
        if spec.network is not None and spec.network == self.settings.network:
            # `job_network` for one container: not the servers' overlay (a route out through its
            # node's docker_gwbridge: the metadata address, the nodes' ports), but an internal
            # overlay of its own with a proxy out, as a server has (engines/swarm/relay.py).
            await self.create_network(isolated_network(spec.name), {**spec.labels, LABEL_ISOLATED: spec.name},
                                      outbound=True)
            spec = replace(spec, network=isolated_network(spec.name))
        if spec.network is None:
            # Swarm cannot attach a task to no network (it would join its node's default bridge,
            # with a route out): a unit without one gets an internal overlay of its own.
            await self.create_network(isolated_network(spec.name), {**spec.labels, LABEL_ISOLATED: spec.name})
        elif await self._proxied(spec.network):
            await self._start_proxy(spec.network, spec.image, spec.labels.get(LABEL_POOL, ""))
            spec = replace(spec, env={**spec.env, **proxy_env(f"http://{JOB_PROXY_ALIAS}:{PROXY_PORT}")})
        await self.docker("create_service", **self.service_args(
            spec, {node: host for node, (host, _) in refused.items()}, spec_nnp))

    async def inspect(self, name: str) -> UnitState | None:
        try:
            return await self._on_thread(self._read, name)
        except Exception as exc:  # the manager did not answer: unknown is not gone
            return UnitState(name=name, id=name, phase=UNKNOWN, message=str(exc))

    async def wait(self, name: str, timeout: float) -> UnitState | None:
        return await wait_until_ended(self.inspect, name, timeout, POLL_SECONDS)

    async def stop(self, name: str, grace: float) -> bool:
        return await self._on_thread(self._stop, name, grace)

    async def signal(self, name: str, signal: str = "SIGTERM") -> bool:
        """A service cannot be signalled from the manager (no `docker service kill`; its task's node
        would have to be reached), but its stop sends SIGTERM: the unit is scaled to 0 now, and its
        task has the spec's stop grace (a borrowed job's: GPUPool.reclaim_grace) to end before
        Swarm kills it.  Only SIGTERM; False when there was nothing to tell."""
        if signal != "SIGTERM":
            return False
        try:
            return await self._on_thread(self._tell, name)
        except Exception:
            return False

    async def remove(self, name: str) -> bool:
        try:
            return await self._on_thread(self._remove, name)
        except Exception:
            return False

    async def logs(self, name: str, tail: int) -> bytes:
        return await self._on_thread(self._logs, name, tail)

    def open_follow(self, name: str, timeout: float):
        """The service's logs, follow=True, as a stream that close() ends (docker-py's own
        CancellableStream over the response, as its container logs have)."""
        import docker.errors

        from ..common.docker_api import docker_api, follow_service_logs

        api = docker_api(timeout)
        try:
            source = follow_service_logs(api, name)
            # Swarm's follow does not end when the task does (nor when its service goes):
            # end it once Swarm says the unit ended, after a moment for its last output.
            source = _Follow(source)
            threading.Thread(target=self._close_when_ended, args=(name, source, timeout), daemon=True,
                             name="gpu-jobs-follow-end").start()
        except docker.errors.NotFound:
            api.close()
            raise UnitGone(name) from None
        except BaseException:
            api.close()
            raise
        return api, source

    def _close_when_ended(self, name: str, source, timeout: float) -> None:
        from ..common.docker_api import docker_api

        api = docker_api(timeout)
        reader = SwarmJobEngine(self.settings, api)
        try:
            while True:
                try:
                    state = reader._read(name)
                except Exception:
                    state = UnitState(name, name, phase=UNKNOWN)
                if state is None or state.phase == ENDED:
                    break
                if source.closed.wait(FOLLOW_CHECK_SECONDS):
                    return  # the follower went away first
            source.closed.wait(FOLLOW_DRAIN_SECONDS)
            source.close()
        finally:
            api.close()

    async def units(self, pool_id: str) -> list[UnitState]:
        return await self._on_thread(self._units, pool_id)

    async def create_network(self, name: str, labels: Mapping[str, str], outbound: bool = False) -> None:
        """Internal always: a task on an overlay with a route out could reach the cloud metadata
        address and every node's ports through its node's docker_gwbridge.  `outbound`: its units
        go out through a proxy of the overlay's own (create), when c.GPUSwarmSpawner.outbound_proxy
        is on; off, they reach nothing outside."""
        import docker.errors

        try:
            await self.docker("inspect_network", name)
        except docker.errors.NotFound:
            # Encrypted as the servers' overlay is (its nodes then carry IPsec between them).
            servers = {}
            if self.settings.network:
                with contextlib.suppress(docker.errors.NotFound):
                    servers = await self.docker("inspect_network", self.settings.network)
            proxied = outbound and self.outbound_proxy and bool(self.settings.network)
            await self.docker("create_network", name, driver="overlay", attachable=True, internal=True,
                              labels={**labels, **({LABEL_PROXIED: "true"} if proxied else {})},
                              options=overlay_options(servers))

    @property
    def outbound_proxy(self) -> bool:
        """c.GPUSwarmSpawner.outbound_proxy as the hub handed it over, else its own default."""
        if self.settings.outbound_proxy is not None:
            return self.settings.outbound_proxy
        from .spawner import GPUSwarmSpawner

        return GPUSwarmSpawner.class_traits()["outbound_proxy"].default_value

    async def _proxied(self, network: str) -> bool:
        import docker.errors

        try:
            info = await self.docker("inspect_network", network)
        except docker.errors.NotFound:
            return False
        return (info.get("Labels") or {}).get(LABEL_PROXIED) == "true"

    async def _start_proxy(self, network: str, image: str, pool_id: str) -> None:
        """The proxy of the job's own overlay `network` (once, whichever unit comes first): a relay
        (engines/swarm/relay.py) with the proxy only, on the manager, on `network` as JOB_PROXY_ALIAS and
        on the servers' overlay for its route out; `image`'s python3 as nobody, locked down."""
        import docker.errors

        name = proxy_of(network)
        try:
            await self.docker("inspect_container", name)
        except docker.errors.NotFound:
            await self._make_proxy(network, name, image, pool_id)
        # Every unit waits for it: one that made no proxy (another unit did) would otherwise
        # start while it does not listen yet, and its first connection out be refused.
        await wait_ready(self.docker, name)

    async def _make_proxy(self, network: str, name: str, image: str, pool_id: str) -> None:
        import docker.errors

        program = {"forwards": [], "allow": [], "max_connections": RELAY_MAX_CONNECTIONS,
                   "proxy": proxy_spec(await self.docker("nodes"), self.settings.outbound_proxy_networks)}
        command = program_command(program)
        try:
            made = await self.docker(
                "create_container", image, entrypoint=command[:3], command=command[3:], user="65534:65534",
                name=name, labels={LABEL_JOB_PROXY: network, LABEL_POOL: pool_id},
                environment={"NVIDIA_VISIBLE_DEVICES": "void"},
                host_config=self.api.create_host_config(
                    network_mode=network, read_only=True, mem_limit=RELAY_MEMORY,
                    restart_policy={"Name": "unless-stopped"}, **hardened_host_config(),
                    **self.container_limits.host_config(helper=True)),
                networking_config=self.api.create_networking_config(
                    {network: self.api.create_endpoint_config(aliases=[JOB_PROXY_ALIAS])}))
        except docker.errors.APIError as exc:
            if exc.status_code == 409:  # another unit of the cluster made it just now
                return
            raise
        await self.docker("connect_container_to_network", made["Id"], self.settings.network)
        await self.docker("start", made["Id"])

    async def remove_network(self, name: str) -> bool:
        import docker.errors

        with contextlib.suppress(docker.errors.NotFound):
            await self.docker("remove_container", proxy_of(name), force=True)
        return await super().remove_network(name)

    async def lease_hosts(self, node_labels: Mapping[str, str], image: str = "") -> list[str] | None:
        """The nodes carrying every label of `node_labels` (None: any node), less those whose
        tasks would run without no-new-privileges (checked with `image`, as for servers)."""
        wanted = dict(node_labels)
        nodes = await self.docker("nodes")
        hosts = [n["Description"]["Hostname"] for n in nodes
                 if all(((n.get("Spec") or {}).get("Labels") or {}).get(k) == v for k, v in wanted.items())]
        if wanted and not hosts:
            raise JobRefused(f"No GPU node carries the labels {wanted} that this profile asks for. "
                             "Ask an administrator.")
        refused = {host: why for host, why in (await self._refused(image)).values()} if image else {}
        if not refused:
            return hosts if wanted else None
        allowed = [h for h in hosts if h not in refused]
        if not allowed:
            why = "; ".join(f"{h}: {refused[h]}" for h in hosts if h in refused)
            raise JobRefused(f"No GPU node this profile may use runs jobs with no-new-privileges ({why}). "
                             "Ask an administrator: `gpu-pool doctor` on the Swarm manager names the fix.")
        return allowed

    async def prepare_home(self, user: str, image: str, uid: int, gid: int, directory_identity: bool) -> str:
        """The user's directory under the shared homes root, then the home volume (on the manager)."""
        owner = HomeOwner(self, user, directory_identity)
        await make_home_directory(owner, self.settings.home_root_volume_options, self.settings.prefix, image, uid, gid)
        return await super().prepare_home(user, image, uid, gid, directory_identity)

    async def _on_thread(self, fn, *args):
        from ..common.job_containers import DOCKER_THREADS

        return await asyncio.get_running_loop().run_in_executor(DOCKER_THREADS, lambda: fn(*args))
