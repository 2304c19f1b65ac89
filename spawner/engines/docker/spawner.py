"""GPUDockerSpawner: per-user JupyterLab containers that see exactly their leased GPUs.

The Docker engine, on `engines.common.container_spawner.GPUContainerSpawner` (what it
shares with the Swarm engine: homes, lock-down checks, labels, adoption) and
dockerspawner's `DockerSpawner`: it turns a lease into an NVIDIA device
request by UUID, locks the container down (non-root, no capabilities,
no-new-privileges, never the Docker socket), labels it with its lease, and
answers `lease_holders`: which of its containers given a lease still run.
Homes are named volumes (`homes.py`).
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

import docker.errors
from dockerspawner import DockerSpawner
from tornado import web

from ...profiles import Profile
from ..common.container_spawner import GPUContainerSpawner
from ..common.containers import gpu_host_config, hardened_host_config, lease_labels
from ..common.homes import prepare_home_volume
from ..common.labels import HOLDING_STATES, LABEL_CONFIG, LABEL_LEASE, LABEL_POOL, pool_identity
from ..common.readiness import wait_for_server
from ..common.reconcile_containers import reconcile


def _deep_merge(base: dict, override: dict) -> dict:
    merged = dict(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _deep_merge(merged[key], value)
        else:
            merged[key] = value
    return merged


class GPUDockerSpawner(GPUContainerSpawner, DockerSpawner):
    """A DockerSpawner that lends GPUs exclusively from a locked pool."""

    # Each reconcile pass judges this host's containers (reconciler.start_in_hub runs it).
    reconcile_pass = staticmethod(reconcile)

    if TYPE_CHECKING:  # DockerSpawner's options (it ships no types), swapped around create_object
        extra_create_kwargs: Any
        extra_host_config: Any

    # -------------------------------------------------------------- container

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
