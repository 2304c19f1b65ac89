"""What the hub tells the gpu-pool service about job containers.

The hub's config knows the profiles, the Docker network, the home volumes and
the identity fallbacks; the service, a separate process, gets them as the
`JobSettings` section of its settings file (poolpage/service_config.py, written
by the hub from its final config) and builds containers exactly as the spawner would.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

from ..profiles import Profile, load_profiles


def spawner_default(name: str):
    """The servers' spawner's default for option `name` (the jobs mirror it)."""
    from ..engines.common.container_spawner import GPUContainerSpawner

    return GPUContainerSpawner.class_traits()[name].default_value


def reconciler_default(name: str):
    from ..engines.common.reconciler import Reconciler

    return Reconciler.class_traits()[name].default_value


@dataclass(frozen=True)
class JobSettings:
    profiles: list = field(default_factory=list)  # raw profile dicts, as configured
    # The hub's engine: "docker" (containers on the hub's own host) or "swarm" (services on any node).
    engine: str = "docker"
    host: str = ""  # the inventory's host: jobs lease GPUs of this Docker host only
    network: str = "gpuhub"
    prefix: str = "gpuhub"
    # The next ones mirror the servers' options; the hub always writes them, and a default here
    # is the servers' own trait default (written once, there: spawner_default).
    home_volume: str = field(default_factory=lambda: spawner_default("home_volume_name"))
    # How {username} is escaped in home_volume, as the servers' DockerSpawner.escape does it:
    # "default" (DockerSpawner's own) or "legacy" (its c.DockerSpawner.escape = "legacy").
    home_name_escape: str = "default"
    home_mount_point: str = field(default_factory=lambda: spawner_default("home_mount_point"))
    home_volume_prep_image: str = field(default_factory=lambda: spawner_default("home_volume_prep_image"))
    home_prep_timeout: float = field(default_factory=lambda: spawner_default("home_prep_timeout"))
    fallback_uid: int = field(default_factory=lambda: spawner_default("fallback_uid"))
    fallback_gid: int = field(default_factory=lambda: spawner_default("fallback_gid"))
    shm_size: str = field(default_factory=lambda: spawner_default("shm_size"))
    # Swarm: c.GPUSwarmSpawner's home volume options (shared storage), homes root and CPU constraints.
    home_volume_driver_options: dict = field(default_factory=dict)
    home_root_volume_options: dict = field(default_factory=dict)
    cpu_constraints: list = field(default_factory=list)
    # c.GPUSwarmSpawner.node_down_grace: how long a cluster waits for a worker's quiet node.
    # The hub hands over the Swarm engine's value (settings/pool_jobs.py); on one host no node
    # goes quiet, so nothing is waited for.
    node_down_grace: float = math.inf
    # c.GPUSwarmSpawner.outbound_proxy(_networks): a Swarm job with `job_network` goes out through
    # a proxy of its own, as a server does through its relay (engines/swarm/relay.py).  The hub
    # hands over the Swarm engine's values (settings/pool_jobs.py); None: that engine's default.
    outbound_proxy: bool | None = None
    outbound_proxy_networks: list = field(default_factory=list)
    max_seconds: int = 86400
    log_max_bytes: int = 1024 * 1024
    queue_timeout: float = 86400.0
    # The hub's c.Reconciler.interval and .min_lease_age when set: jobs are reconciled like servers.
    reconcile_interval: float = field(default_factory=lambda: reconciler_default("interval"))
    reconcile_min_age: float = field(default_factory=lambda: reconciler_default("min_lease_age"))
    # Where containers reach the service (the hub's bridge address); "" = 127.0.0.1 only.
    bridge_ip: str = ""
    # The hub's c.GPUPool options (quotas, queue rules), so jobs queue by the same rules.
    pool: dict = field(default_factory=dict)
    # The hub's c.JobLimits options (limits.py): how many jobs a user runs and queues, their CPUs.
    limits: dict = field(default_factory=dict)
    # The hub's c.ScheduleLimits options (schedules.py): schedules per user, their interval and run.
    schedule_limits: dict = field(default_factory=dict)
    # The hub's c.ContainerLimits (pids and log bounds), as ContainerLimits.settings() gives them.
    container_limits: dict = field(default_factory=dict)

    def profile_objects(self) -> list[Profile]:
        return load_profiles(self.profiles)

    def as_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_config(cls, config) -> JobSettings | None:
        """From the service's settings (a traitlets Config); None when the hub runs no jobs."""
        if "JobSettings" not in config:
            return None
        return cls(**dict(config.JobSettings))
