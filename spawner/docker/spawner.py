"""GPUDockerSpawner: per-user JupyterLab containers that see exactly their leased GPUs.

The Docker engine of `lending.GPULendingSpawner`: it turns a lease into an
NVIDIA device request by UUID, locks the container down (non-root, no
capabilities, no-new-privileges, never the Docker socket), labels it with
its lease, and answers `lease_holders`: which of its containers given a lease
still run.  Homes are named volumes (`homes.py`).  Docker errors that say
nothing (an inspect that answers 500) are never read as "the container is
gone": an unknown answer keeps the server and its GPUs.
"""

from __future__ import annotations

import asyncio

import docker.errors
from dockerspawner import DockerSpawner
from tornado import web
from traitlets import Float, Unicode, default

from ..homes import prepare_home_volume
from ..inventory.machine import image_cuda_version
from ..containers import ContainerLimits, config_digest, gpu_host_config, hardened_host_config, lease_labels
from ..labels import HOLDING_STATES, LABEL_CONFIG, LABEL_CUDA, LABEL_LEASE, LABEL_POOL, pool_identity
from ..lending.spawner import GPULendingSpawner, shared_pool  # noqa: F401 (shared_pool: public API)
from ..pool.models import PoolError
from ..profiles import Profile
from ..readiness import wait_for_server
from ..ssh.spawner_access import SSHAccess
from .reconcile import reconcile


def _deep_merge(base: dict, override: dict) -> dict:
    merged = dict(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _deep_merge(merged[key], value)
        else:
            merged[key] = value
    return merged


class GPUDockerSpawner(SSHAccess, GPULendingSpawner, DockerSpawner):
    """A DockerSpawner that lends GPUs exclusively from a locked pool."""

    home_volume_name = Unicode(
        "gpuhub-home-{username}",
        config=True,
        help="Name template of the per-user named volume holding the home directory; it survives "
        "stop and cull.  `{username}` is the escaped user name.",
    )
    home_mount_point = Unicode(
        "/home/jovyan",
        config=True,
        help="Where the home volume is mounted in the container (the image's HOME).",
    )
    shm_size = Unicode(
        "2g",
        config=True,
        help="Size of /dev/shm in the container; data loaders with worker processes need more than "
        "Docker's 64 MB default.",
    )
    home_volume_prep_image = Unicode(
        "",
        config=True,
        help="Image used to give a home volume to the user's uid when it changes owner (a "
        "short-lived container with only CHOWN/DAC_OVERRIDE/FOWNER, no network).  Empty: the "
        "profile's image.",
    )
    home_prep_timeout = Float(
        600.0,
        config=True,
        help="""
        Seconds the hand-over of a home volume to a new owner may take.  It runs
        only when the owner changes, touches only files not yet owned by the new
        uid, and records the owner inside the volume only once it succeeded, so
        a hand-over cut short resumes where it stopped at the next start.
        """,
    )

    # Containers are fresh at every start: the home is a volume, and an old
    # container would still carry its old GPU pinning.
    @default("remove")
    def _default_remove(self):
        return True

    @default("use_internal_ip")
    def _default_use_internal_ip(self):
        return True

    @default("volumes")
    def _default_volumes(self):
        return {self.home_volume_name: {"bind": self.home_mount_point, "mode": "rw"}}

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._check_security_config()
        from ..reconciler import start_in_hub

        start_in_hub()

    # Each reconcile pass judges this host's containers (reconciler.start_in_hub runs it).
    reconcile_pass = staticmethod(reconcile)

    @property
    def container_limits(self) -> ContainerLimits:
        """c.ContainerLimits: the pids and log bounds of the server and its helper containers."""
        if getattr(self, "_container_limits", None) is None:
            self._container_limits = ContainerLimits(parent=self)
        return self._container_limits

    def home_volume_create_kwargs(self) -> dict:
        """Extra arguments of the home volume's creation (driver options): none on one host."""
        return {}

    def _check_security_config(self) -> None:
        """Refuse configurations that would hand a user the Docker daemon."""
        configured = [str(v) for v in list(self.volumes) + list(self.volumes.values())]
        if any("docker.sock" in v for v in configured):
            raise ValueError("GPUDockerSpawner.volumes must not mount the Docker socket")

    async def check_allowed(self, image):
        # DockerSpawner would let user_options["image"] pick an image; here the
        # profile alone decides (validation already rejects the key).
        if self.profile is None or image != self.profile.image:
            raise web.HTTPError(400, "The image comes from the profile and cannot be chosen")
        return image

    def get_env(self):
        env = super().get_env()
        env["HOME"] = self.home_mount_point
        return env

    # -------------------------------------------------------------- container

    def _config_digest(self, uid: int, gid: int) -> str:
        """What this start's container is made for; a kept container with another digest is remade."""
        return config_digest(self.lease_id, self.gpu_uuids, self.image, self.cpu_limit,
                             self.mem_limit, uid, gid)

    def _our_container_config(self) -> tuple[dict, dict]:
        uid, gid = self.container_identity()
        labels = lease_labels(self.user.name, self.name or "", self.gpu_uuids, self.gpu_host,
                              self.lease_id, pool_identity(self.pool), self._config_digest(uid, gid))
        create = {"user": f"{uid}:{gid}", "labels": labels}
        host = {**hardened_host_config(), "shm_size": self.shm_size, **gpu_host_config(self.gpu_uuids),
                **self.container_limits.host_config()}
        return create, host

    async def create_object(self):
        # Our settings win over configured extras: they are the security model.
        configured_create = self._eval_if_callable(self.extra_create_kwargs)
        if asyncio.iscoroutine(configured_create):
            configured_create = await configured_create
        configured_host = self._eval_if_callable(self.extra_host_config)
        if asyncio.iscoroutine(configured_host):
            configured_host = await configured_host
        ours_create, ours_host = self._our_container_config()
        saved = (self.extra_create_kwargs, self.extra_host_config)
        self.extra_create_kwargs = _deep_merge(dict(configured_create or {}), ours_create)
        self.extra_host_config = _deep_merge(dict(configured_host or {}), ours_host)
        try:
            return await super().create_object()
        finally:
            self.extra_create_kwargs, self.extra_host_config = saved

    async def check_image_fits(self, profile: Profile) -> None:
        """Refuse an image whose CUDA is newer than the host driver supports."""
        try:
            info = await self.docker("inspect_image", profile.image)
        except Exception:
            return  # a missing image fails later with Docker's own message
        labels = (info.get("Config") or {}).get("Labels") or {}
        needed = image_cuda_version(labels.get(LABEL_CUDA))
        if needed is None:
            return
        driver = self.pool.inventory.cuda_driver_version()
        if driver is not None and needed > driver:
            raise web.HTTPError(
                409,
                f"Image {profile.image} needs CUDA {needed[0]}.{needed[1]} but this host's driver "
                f"supports up to {driver[0]}.{driver[1]}; ask an administrator to update the driver "
                "or choose another profile.",
            )

    async def _remove_stale_container(self) -> None:
        """With remove=False DockerSpawner restarts an old container as it was:
        its labels (lease id), GPU pinning, image, limits and uid.  Remake it
        whenever any of those differ from this start's (a GPU server's lease
        always does), so the reconciler never finds a container of a lease
        that has ended."""
        obj = await self.get_object()
        if not obj:
            return
        uid, gid = self.container_identity()
        made_for = ((obj.get("Config") or {}).get("Labels") or {}).get(LABEL_CONFIG)
        if made_for != self._config_digest(uid, gid):
            self.log.info("Removing %s: it was made for another lease, image, limit or uid",
                          self.object_name)
            await self.docker("remove_container", obj["Id"], force=True)
            self.object_id = ""

    async def get_object(self):
        """The container (a service, on Swarm), or None only when Docker says it does not exist (404).

        DockerSpawner reads an inspect that answers 500 as "gone"; then poll
        says a running server died and its GPUs are lent again."""
        try:
            obj = await self.docker(f"inspect_{self.object_type}", self.object_name)
        except docker.errors.NotFound:
            self.object_id = ""
            return None
        self.object_id = obj[self.object_id_key]
        # A container's labels, or a Swarm service's.
        self._object_labels = ((obj.get("Config") or {}).get("Labels")
                               or (obj.get("Spec") or {}).get("Labels") or {})
        return obj

    async def poll(self):
        try:
            status = await super().poll()
        except Exception as exc:
            # Unknown is not dead: keep the server (and its GPUs) until Docker answers.
            self.log.warning("Could not inspect %s (%s); taking it as still running",
                             self.object_name, exc)
            return None
        labels = getattr(self, "_object_labels", {})
        if status is None and self.lease_id is None and labels.get(LABEL_LEASE) \
                and labels.get(LABEL_POOL) == pool_identity(self.pool):
            try:
                await self.adopt_lease(int(labels[LABEL_LEASE]))
            except (ValueError, PoolError) as exc:
                self.log.warning("Could not adopt the lease of %s: %s", self.object_name, exc)
        return status

    async def lease_holders(self, lease_id: int) -> list[str]:
        containers = await self.docker(
            "containers", all=True,
            filters={"label": [f"{LABEL_LEASE}={lease_id}", f"{LABEL_POOL}={pool_identity(self.pool)}"]})
        return [c["Names"][0].lstrip("/") if c.get("Names") else c["Id"][:12]
                for c in containers if c.get("State") in HOLDING_STATES]

    # ------------------------------------------------------------ lifecycle

    async def start_server(self, profile: Profile):
        if not self.remove:
            # With remove=True DockerSpawner replaces any leftover container itself.
            await self._remove_stale_container()
        uid, gid = self.container_identity()
        self._emit(50, "Preparing your home")
        await prepare_home_volume(self, profile.image, uid, gid)
        self._emit(60, f"Creating your container from {profile.image}")
        try:
            result = await DockerSpawner.start(self)
        except docker.errors.APIError as exc:
            if "device driver" in str(exc):
                # dockerd found no NVIDIA hook at start: say so, not Docker's riddle.
                raise web.HTTPError(
                    503,
                    "This host's Docker cannot give containers GPUs: the NVIDIA Container Toolkit "
                    "is missing or dockerd was started without it. Ask an administrator.",
                ) from None
            raise
        self._emit(80, "Container started; waiting for JupyterLab")
        await wait_for_server(self, result)
        return result
