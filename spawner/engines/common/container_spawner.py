"""GPUContainerSpawner: what the two engines built on dockerspawner share.

Both `docker.GPUDockerSpawner` (a container per server, on one host) and
`swarm.GPUSwarmSpawner` (a service per server, on any Swarm node) inherit it
together with their own dockerspawner class (`DockerSpawner`,
`SwarmSpawner`), so neither carries the other's engine methods.  It holds
what is the same on both: the home volume's options and its hand-over
(`homes.py`), the server's lock-down checks and helper bounds
(`c.ContainerLimits`), the image chosen by the profile alone, the config
digest in the lease labels, an inspect that answers 500 read as "unknown",
never "gone", and adopting the lease a running server's labels carry.

Its options are configured as `c.GPUDockerSpawner.*` for both engines (the
section every deployment and these docs use): `section_names` adds that
section to every engine's own, at the place it had when the Swarm spawner
was a subclass of the Docker one, so the same configuration means the same.
"""

from __future__ import annotations

import docker.errors
from dockerspawner import DockerSpawner
from tornado import web
from traitlets import Float, Unicode, default

from ...inventory.machine import image_cuda_version
from ...lending.spawner import GPULendingSpawner
from ...pool.models import PoolError
from ...profiles import Profile
from ...ssh.spawner_access import SSHAccess
from .containers import ContainerLimits, config_digest, is_job_unit_name
from .labels import LABEL_CUDA, LABEL_LEASE, LABEL_POOL, pool_identity

# The configuration section of these options, whichever engine reads them.
CONFIG_SECTION = "GPUDockerSpawner"


class GPUContainerSpawner(SSHAccess, GPULendingSpawner, DockerSpawner):
    """The lending spawner on dockerspawner's common base (see the module docstring)."""

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

    @classmethod
    def section_names(cls) -> list[str]:
        """traitlets' sections of this class, with `GPUDockerSpawner` right after this base's
        own: where it sat in the Swarm spawner's order when that subclassed the Docker one."""
        names = super().section_names()
        if CONFIG_SECTION not in names:
            names.insert(names.index(GPUContainerSpawner.__name__) + 1, CONFIG_SECTION)
        return names

    # Servers are fresh at every start: the home is a volume, and an old
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
        self._container_limits: ContainerLimits | None = None
        # The labels of the server's container (or service) as the last inspect found them.
        self._object_labels: dict[str, str] = {}
        super().__init__(*args, **kwargs)
        self._check_security_config()
        from .reconciler import start_in_hub

        start_in_hub()

    @property
    def container_limits(self) -> ContainerLimits:
        """c.ContainerLimits: the pids and log bounds of the server and its helper containers."""
        if self._container_limits is None:
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

    def check_object_name(self) -> None:
        """Refuse a server whose container (service) name is a batch job's: DockerSpawner would
        remove a leftover unit of its name at start and stop it at stop, another user's job."""
        name = self._object_name_default()  # the name start() gives it
        if is_job_unit_name(name, self.prefix):
            raise web.HTTPError(
                409,
                f"Your server's container would be named {name}, the name of a batch job's container "
                f"on this hub (DockerSpawner.escape writes your user name into it); ask an administrator "
                f"to set DockerSpawner.name_template so that servers are never named {self.prefix}-job-<id>",
            )

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

    def _config_digest(self, uid: int, gid: int) -> str:
        """What this start's server is made for; a kept container with another digest is remade."""
        return config_digest(self.lease_id, self.gpu_uuids, self.image, self.cpu_limit,
                             self.mem_limit, uid, gid)

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

    async def get_object(self):
        """The container (a service, on Swarm), or None only when Docker says it does not exist (404).

        DockerSpawner reads an inspect that answers 500 as "gone"; then poll
        says a running server died and its GPUs are lent again.  A name that is a batch job's
        (check_object_name) has no server's container: its stop and poll never reach the job's."""
        if is_job_unit_name(self.object_name, self.prefix):
            self.object_id = ""
            return None
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
        labels = self._object_labels
        if status is None and self.lease_id is None and labels.get(LABEL_LEASE) \
                and labels.get(LABEL_POOL) == pool_identity(self.pool):
            try:
                await self.adopt_lease(int(labels[LABEL_LEASE]))
            except (ValueError, PoolError) as exc:
                self.log.warning("Could not adopt the lease of %s: %s", self.object_name, exc)
        return status
