"""DockerJobEngine: a job's units are containers on the hub's own Docker engine (one host).

The jobs runner's engine (spawner/jobs/engine.py) for `gpu-docker`: each unit is a
container with the servers' lock-down (containers.py), exactly its leased GPUs as a device
request (runc and `void` without), the pids and log bounds of c.ContainerLimits, and no
network unless its spec names one.  Blocking Docker calls run on the engine's own threads.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace

from ...jobs.engine import CREATED, ENDED, RUNNING, UNKNOWN, UnitGone, UnitSpec, UnitState, wait_until_ended
from ...jobs.runner_settings import JobSettings
from .containers import ContainerLimits, gpu_host_config, hardened_host_config
from .docker_api import docker_api, no_read_timeout
from .firewall import BRIDGE_NAME_OPTION, job_bridge_name
from .homes import prepare_home_volume
from .labels import HOLDING_STATES, LABEL_JOB, LABEL_POOL

POLL_SECONDS = 0.5
DOCKER_THREADS = ThreadPoolExecutor(max_workers=8, thread_name_prefix="gpu-jobs-docker")


class HomeOwner:
    """What homes.prepare_home_volume asks of a spawner, for a job's user: the same rules."""

    def __init__(self, engine: DockerJobEngine, user: str, has_directory_identity: bool):
        s = engine.settings
        self.user = SimpleNamespace(name=user)
        self.client = engine.api
        self.docker = engine.docker
        self.home_volume_name = s.home_volume
        self.home_mount_point = s.home_mount_point
        self.home_volume_prep_image = s.home_volume_prep_image
        self.home_prep_timeout = s.home_prep_timeout
        self.container_limits = engine.container_limits
        self.fallback_uid, self.fallback_gid = s.fallback_uid, s.fallback_gid
        self._directory = has_directory_identity
        self._create_kwargs = engine.home_volume_create_kwargs(user)
        self._escape_name = s.home_name_escape

    def has_directory_identity(self) -> bool:
        return self._directory

    def home_volume_create_kwargs(self) -> dict:
        return self._create_kwargs

    def _render_templates(self, template: str) -> str:
        return render_user(template, self.user.name, self._escape_name)


def render_user(template: str, user: str, escape: str = "default") -> str:
    """`template` with {username} escaped as the servers' DockerSpawner does (`escape`:
    JobSettings.home_name_escape), so a job mounts the very volume the server does."""
    from dockerspawner import DockerSpawner

    escaped = DockerSpawner._legacy_escape(user) if escape == "legacy" else DockerSpawner._escape(user)
    return template.format(username=escaped, raw_username=user)


def phase_of(state: str) -> str:
    """A container's State (`docker ps` / inspect) as a unit phase."""
    if state == "created":
        return CREATED
    return RUNNING if state in HOLDING_STATES else ENDED


class DockerJobEngine:
    """See the module docstring; `api`: a docker.APIClient (made on first use if None)."""

    # A container's log is there the moment it ends (JobEngine.log_settle_seconds).
    log_settle_seconds = 0.0

    def __init__(self, settings: JobSettings, api=None):
        self.settings = settings
        self._api = api
        self.container_limits = ContainerLimits(**settings.container_limits)

    # ------------------------------------------------------------ plumbing

    @property
    def api(self):
        if self._api is None:
            self._api = docker_api()
        return self._api

    async def docker(self, method: str, *args, **kwargs):
        """A (blocking) Docker API call on the engine's own threads."""
        # self.api inside the thread too: making the client asks the daemon its version.
        return await asyncio.get_running_loop().run_in_executor(
            DOCKER_THREADS, lambda: getattr(self.api, method)(*args, **kwargs))

    def home_volume_create_kwargs(self, user: str) -> dict:
        return {}

    def create_args(self, spec: UnitSpec) -> tuple[dict, dict]:
        """(create_container keywords without host_config, create_host_config keywords): pure."""
        create = {
            "image": spec.image, "command": list(spec.command), "user": spec.user,
            "environment": dict(spec.env), "labels": dict(spec.labels), "working_dir": spec.working_dir,
            "name": spec.name, "network_disabled": spec.network is None,
        }
        host = {
            **hardened_host_config(),
            **gpu_host_config(spec.gpus),
            "binds": {volume: {"bind": target, "mode": "rw"} for volume, target in spec.volumes.items()},
            "shm_size": spec.shm_size,
            "network_mode": spec.network or "none",
            **self.container_limits.host_config(),
        }
        if spec.cpu_limit:
            host["nano_cpus"] = int(spec.cpu_limit * 1e9)
        if spec.mem_limit:
            host["mem_limit"] = spec.mem_limit
        return create, host

    # ------------------------------------------------------------ JobEngine

    async def create(self, spec: UnitSpec) -> None:
        if spec.host and self.settings.host and spec.host != self.settings.host:
            raise ValueError(f"This Docker engine runs units on {self.settings.host}, not {spec.host}")
        create, host = self.create_args(spec)
        create["host_config"] = self.api.create_host_config(**host)
        if spec.network and spec.aliases:
            create["networking_config"] = self.api.create_networking_config(
                {spec.network: self.api.create_endpoint_config(aliases=list(spec.aliases))})
        await self.docker("create_container", **create)
        try:
            await self.docker("start", spec.name)
        except BaseException:
            await self.remove(spec.name)
            raise

    async def inspect(self, name: str) -> UnitState | None:
        import docker.errors

        try:
            found = await self.docker("inspect_container", name)
        except docker.errors.NotFound:
            return None
        except Exception as exc:  # unknown is not gone
            return UnitState(name=name, id=name, phase=UNKNOWN, message=str(exc))
        state = found.get("State") or {}
        phase = phase_of(state.get("Status") or "")
        return UnitState(name=found.get("Name", name).lstrip("/"), id=found["Id"],
                         labels=(found.get("Config") or {}).get("Labels") or {}, phase=phase,
                         exit_code=state.get("ExitCode") if phase == ENDED else None,
                         message=state.get("Error") or None, node=self.settings.host)

    async def wait(self, name: str, timeout: float) -> UnitState | None:
        return await wait_until_ended(self.inspect, name, timeout, POLL_SECONDS)

    async def stop(self, name: str, grace: float) -> bool:
        import docker.errors

        for _ in range(3):
            try:
                state = (await self.docker("inspect_container", name))["State"]
                if not state.get("Running") and state.get("Status") not in ("restarting", "removing"):
                    return True
                await self.docker("stop", name, timeout=int(grace))
            except docker.errors.NotFound:
                return True
            except Exception:
                await asyncio.sleep(1.0)
        return False

    async def signal(self, name: str, signal: str = "SIGTERM") -> bool:
        """`docker kill --signal` of the container: its main process gets it, the container runs on."""
        try:
            await self.docker("kill", name, signal=signal)
        except Exception:  # gone, or not running: nothing to tell
            return False
        return True

    async def remove(self, name: str) -> bool:
        import docker.errors

        try:
            await self.docker("remove_container", name, force=True)
        except docker.errors.NotFound:
            pass
        except Exception:
            return False
        return True

    async def logs(self, name: str, tail: int) -> bytes:
        import docker.errors

        try:
            return await self.docker("logs", name, stdout=True, stderr=True, tail=tail)
        except docker.errors.NotFound:
            raise UnitGone(name) from None

    def open_follow(self, name: str, timeout: float):
        """A follow=True stream on a client of its own; the stream then waits for output
        without a timeout (a quiet job is not an error); close() on it ends it."""
        import docker.errors

        api = docker_api(timeout)
        try:
            source = api.logs(name, stream=True, follow=True)
            no_read_timeout(source)
        except docker.errors.NotFound:
            api.close()
            raise UnitGone(name) from None
        except BaseException:
            api.close()
            raise
        return api, source

    async def units(self, pool_id: str) -> list[UnitState]:
        found = await self.docker("containers", all=True, filters={"label": [LABEL_JOB, f"{LABEL_POOL}={pool_id}"]})
        return [UnitState(name=c["Names"][0].lstrip("/") if c.get("Names") else c["Id"][:12], id=c["Id"],
                          labels=c.get("Labels") or {}, phase=phase_of(c.get("State") or ""),
                          node=self.settings.host) for c in found]

    async def create_network(self, name: str, labels: Mapping[str, str], outbound: bool = False) -> None:
        import docker.errors

        try:
            await self.docker("inspect_network", name)
        except docker.errors.NotFound:
            # Its interface named by its kind: the host's rules (firewall.py) match every
            # cluster's bridge by that prefix, the internal ones reaching nothing on the host.
            await self.docker("create_network", name, driver="bridge", internal=not outbound,
                              labels=dict(labels), options={BRIDGE_NAME_OPTION: job_bridge_name(name, outbound)})

    async def remove_network(self, name: str) -> bool:
        import docker.errors

        try:
            await self.docker("remove_network", name)
        except docker.errors.NotFound:
            pass
        except Exception:
            return False
        return True

    async def networks(self, pool_id: str) -> dict[str, str]:
        found = await self.docker("networks", filters={"label": [LABEL_JOB, f"{LABEL_POOL}={pool_id}"]})
        return {n["Name"]: (n.get("Labels") or {}).get(LABEL_JOB, "") for n in found}

    async def lease_hosts(self, node_labels: Mapping[str, str], image: str = "") -> list[str] | None:
        return [self.settings.host] if self.settings.host else None

    async def home_dir(self, user: str) -> str | None:
        """The home volume's directory on this host (the local driver's), "" if the user has no
        home volume yet, None if it is not a directory here (another driver: NFS, a plugin)."""
        import docker.errors

        name = render_user(self.settings.home_volume, user, self.settings.home_name_escape)
        try:
            volume = await self.docker("inspect_volume", name)
        except docker.errors.NotFound:
            return ""
        mountpoint = volume.get("Mountpoint") or ""
        if volume.get("Driver") != "local" or volume.get("Options") or not os.path.isdir(mountpoint):
            return None
        return mountpoint

    async def prepare_home(self, user: str, image: str, uid: int, gid: int, directory_identity: bool) -> str:
        await prepare_home_volume(HomeOwner(self, user, directory_identity), image, uid, gid)
        return render_user(self.settings.home_volume, user, self.settings.home_name_escape)
