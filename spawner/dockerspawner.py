"""GPUDockerSpawner: per-user JupyterLab containers that see exactly their leased GPUs.

Data flows one way: the inventory says what GPUs the host has, the pool lends
them (ledger in SQL), and this spawner asks the pool for a lease and hands the
leased GPUs, by UUID, to Docker as an NVIDIA device request.  The pool never
calls the spawner.

Every way a server ends passes through `clear_state()` (JupyterHub calls it
after a stop, after a failed start, and when poll finds the container gone),
so the lease is released there, with the reason recorded along the way.
"""

from __future__ import annotations

import asyncio
import math
import sys
import time
from typing import Any

import docker.errors
from dockerspawner import DockerSpawner
from tornado import web
from traitlets import CaselessStrEnum, Dict, Float, Int, List, Unicode, default

from .metrics import LEASE_WAIT_SECONDS, register_pool
from .pool import EndReason, GPUPool, Lease, PoolError
from .inventory import inventory_from_config, parse_cuda_version
from .profiles import DEFAULT_PROFILES, Profile, choose_profile, load_profiles
from .readiness import wait_for_server

# Labels on every container this spawner creates; the reconciler reads them.
LABEL_USER = "org.jupyter.gpuhub.user"
LABEL_SERVER = "org.jupyter.gpuhub.server"
LABEL_LEASE = "org.jupyter.gpuhub.lease-id"
LABEL_GPUS = "org.jupyter.gpuhub.gpus"
LABEL_HOST = "org.jupyter.gpuhub.host"
LABEL_CUDA = "org.jupyter.gpuhub.cuda-version"
LABEL_HOME_OWNER = "org.jupyter.gpuhub.home-owner"
# Which ledger lent the GPUs: a reconciler only judges containers of its own ledger.
LABEL_POOL = "org.jupyter.gpuhub.pool"


def pool_identity(pool: GPUPool) -> str:
    """A short, password-free identity of a ledger database."""
    import hashlib

    return hashlib.sha256(pool.safe_url.encode()).hexdigest()[:12]

# One pool per hub process, shared by every spawner instance.
_shared_pools: dict[int, GPUPool] = {}


def shared_pool(config) -> GPUPool:
    """The hub process's GPUPool for this configuration (made once)."""
    pool = _shared_pools.get(id(config))
    if pool is None:
        kind = config.GPUDockerSpawner.get(
            "inventory_kind", GPUDockerSpawner.class_traits()["inventory_kind"].default_value)
        inventory = inventory_from_config(kind, config=config)
        # No database access here: the pool records the inventory on first use,
        # and a CPU server must start even when the ledger is unreachable.
        pool = GPUPool(config=config, inventory=inventory)
        register_pool(pool.counts)
        _shared_pools[id(config)] = pool
    return pool


def _ordinal(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def _image_cuda_version(label: str | None) -> tuple[int, int] | None:
    """The CUDA version an image's label declares; None for CPU images ("none") or no label."""
    if not label or label.strip().lower() == "none":
        return None
    try:
        return parse_cuda_version(label)
    except ValueError:
        return None


def _deep_merge(base: dict, override: dict) -> dict:
    merged = dict(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _deep_merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def _stop_requester():
    """Who asked for the stop now in progress: the hub's request handler's
    current user (a User or a Service), or None (hub shutdown, poll).

    JupyterHub gives a spawner no such argument, but the stop runs inside the
    handler's coroutine chain, so its frame is on the stack.
    """
    try:
        from jupyterhub.handlers.base import BaseHandler
    except ImportError:  # pragma: no cover - the hub is always there
        return None
    frame = sys._getframe(1)
    for _ in range(80):
        if frame is None:
            break
        candidate = frame.f_locals.get("self")
        if isinstance(candidate, BaseHandler):
            return getattr(candidate, "_jupyterhub_user", None)
        frame = frame.f_back
    return None


class GPUDockerSpawner(DockerSpawner):
    """A DockerSpawner that lends GPUs exclusively from a locked pool."""

    profiles = List(
        Dict(),
        default_value=DEFAULT_PROFILES,
        config=True,
        help="""
        The spawn profiles users choose from.  Each is a dict with keys:
        `slug` (what REST clients send as `{"profile": slug}`), `display_name`,
        `description`, `image`, `gpus` (how many GPUs the profile leases; 0 for
        none), `cpu_limit`, `mem_limit`, and `groups` (JupyterHub groups allowed
        to use it; empty for everyone).  Users can choose nothing else: no image,
        environment, mount or GPU beyond what their profile grants.
        """,
    )
    default_profile = Unicode(
        "",
        config=True,
        help="Slug of the profile used when a spawn names none (REST without user_options). "
        "Empty: the first profile the user may use.",
    )
    inventory_kind = CaselessStrEnum(
        ["nvml", "static", "simulated"],
        default_value="nvml",
        config=True,
        help="""
        Where the host's GPUs come from: `nvml` (the NVIDIA driver, through
        nvidia-ml-py), `static` (a list in `StaticInventory.gpus_list`), or
        `simulated` (`SimulatedInventory.count` fake GPUs, for demos and tests on
        hosts without NVIDIA).
        """,
    )
    lease_wait_timeout = Float(
        300.0,
        config=True,
        help="""
        How long a spawn may wait in the GPU queue, in seconds, before it fails
        with a message saying all GPUs are lent.  `start_timeout` is extended by
        this much, so a queued spawn is not cut off by the hub.
        """,
    )
    container_start_timeout = Float(
        120.0,
        config=True,
        help="Seconds a container may take to be created and started, once its GPUs are leased. "
        "`start_timeout` defaults to `lease_wait_timeout + container_start_timeout`.",
    )
    fallback_uid = Int(
        1000,
        config=True,
        help="The uid containers run as when the user's auth_state has no `uid_number` "
        "(directory uidNumber).  Never 0: containers never run as root.",
    )
    fallback_gid = Int(
        100,
        config=True,
        help="The gid containers run as when the user's auth_state has no `gid_number`.",
    )
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
    cull_services = List(
        Unicode(),
        default_value=["idle-culler"],
        config=True,
        help="Names of the hub services (the idle culler) whose stop requests end a lease "
        "with reason `culled`; a stop by any other service or by an admin is `admin`, by the "
        "user themself `stopped`.",
    )
    home_volume_prep_image = Unicode(
        "",
        config=True,
        help="Image used once per home volume to give it to the user's uid (a short-lived container "
        "with only CAP_CHOWN, no network).  Empty: the profile's image.",
    )

    # Containers are fresh at every start: the home is a volume, and an old
    # container would still carry its old GPU pinning.
    @default("remove")
    def _default_remove(self):
        return True

    @default("start_timeout")
    def _default_start_timeout(self):
        return int(self.lease_wait_timeout + self.container_start_timeout)

    @default("use_internal_ip")
    def _default_use_internal_ip(self):
        return True

    @default("apply_user_options")
    def _default_apply_user_options(self):
        return lambda spawner, user_options: spawner._apply_profile(user_options)

    @default("options_form")
    def _default_options_form(self):
        return lambda spawner: spawner._render_options_form()

    @default("options_from_form")
    def _default_options_from_form(self):
        def options_from_form(formdata):
            # Form fields arrive as lists of strings; pass anything odd through
            # so validation reports it instead of silently dropping it.
            options = {}
            for key, values in formdata.items():
                if key == "_xsrf":
                    continue  # the form's own token, not a choice of the user's
                if isinstance(values, list) and len(values) == 1:
                    options[key] = values[0]
                else:
                    options[key] = values
            return options

        return options_from_form

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._profiles = load_profiles(self.profiles)
        self._check_security_config()
        self.profile: Profile | None = None
        self.lease_id: int | None = None
        self.gpu_uuids: list[str] = []
        self.gpu_host: str = ""
        self._end_reason: str | None = None
        self._auth_state: dict = {}
        self._progress_events: list[dict] = []
        self._progress_changed = asyncio.Event()
        from .reconcile import start_in_hub

        start_in_hub()

    # ------------------------------------------------------------------ pool

    @property
    def pool(self) -> GPUPool:
        return shared_pool(self.config)

    def _user_groups(self) -> list[str]:
        return sorted(g.name for g in getattr(self.user, "groups", []) or [])

    def _check_security_config(self) -> None:
        """Refuse configurations that would hand a user the Docker daemon."""
        configured = [str(v) for v in list(self.volumes) + list(self.volumes.values())]
        if any("docker.sock" in v for v in configured):
            raise ValueError("GPUDockerSpawner.volumes must not mount the Docker socket")

    # ------------------------------------------------------- profiles & form

    def _allowed_profiles(self) -> list[Profile]:
        groups = set(self._user_groups())
        return [p for p in self._profiles if p.allows(groups)]

    def _apply_profile(self, user_options: Any) -> None:
        profile = choose_profile(user_options, self._profiles, self._user_groups(), self.default_profile)
        if profile.gpus:
            try:
                # Quota and size checks up front: a refused request takes no
                # lease and creates no container.
                self.pool.check_request(self.user.name, profile.gpus, self._user_groups())
            except PoolError as exc:
                raise web.HTTPError(exc.status_code, str(exc)) from None
        self.profile = profile
        self.image = profile.image
        if profile.cpu_limit is not None:
            self.cpu_limit = profile.cpu_limit
        if profile.mem_limit is not None:
            self.mem_limit = profile.mem_limit

    def _render_options_form(self) -> str:
        from html import escape

        allowed = self._allowed_profiles()
        if not allowed:
            return "<p>No profile is available to you; ask an administrator for access.</p>"
        try:
            counts = self.pool.counts()
            free = counts.get("free", 0)
            total = free + counts.get("lent", 0)
        except PoolError:
            free, total = None, None
        default = self.default_profile or allowed[0].slug
        rows = []
        for profile in allowed:
            if profile.gpus == 0:
                availability = "no GPU"
            elif free is None:
                availability = f"{profile.gpus} GPU(s); availability unknown right now"
            else:
                availability = f"{profile.gpus} GPU(s); {free} of {total} free now"
            checked = " checked" if profile.slug == default else ""
            rows.append(
                f'<div class="radio"><label>'
                f'<input type="radio" name="profile" value="{escape(profile.slug)}"{checked}> '
                f"<strong>{escape(profile.display_name)}</strong> "
                f'<span class="gpu-availability">({escape(availability)})</span>'
                f'<br><small>{escape(profile.description)}</small></label></div>'
            )
        return "\n".join(rows)

    async def check_allowed(self, image):
        # DockerSpawner would let user_options["image"] pick an image; here the
        # profile alone decides (validation already rejects the key).
        if self.profile is None or image != self.profile.image:
            raise web.HTTPError(400, "The image comes from the profile and cannot be chosen")
        return image

    # ---------------------------------------------------------------- progress

    def _emit(self, progress: int, message: str) -> None:
        self._progress_events.append({"progress": progress, "message": message})
        self._progress_changed.set()

    async def progress(self):
        sent = 0
        while True:
            while sent < len(self._progress_events):
                yield self._progress_events[sent]
                sent += 1
            self._progress_changed.clear()
            try:
                await asyncio.wait_for(self._progress_changed.wait(), timeout=1.0)
            except asyncio.TimeoutError:
                pass

    def _on_wait(self, position: int, wanted: int, free: int) -> None:
        gpus = "GPU" if wanted == 1 else "GPUs"
        self._emit(
            20,
            f"Waiting for {wanted} {gpus}: {free} free now; you are {_ordinal(position)} in the queue.",
        )

    # ------------------------------------------------------------------ state

    def get_state(self):
        state = super().get_state()
        if self.lease_id is not None:
            state["gpu_lease_id"] = self.lease_id
            state["gpu_uuids"] = list(self.gpu_uuids)
            state["gpu_host"] = self.gpu_host
        if self.profile is not None:
            state["profile"] = self.profile.slug
        return state

    def load_state(self, state):
        super().load_state(state)
        self.lease_id = state.get("gpu_lease_id")
        self.gpu_uuids = list(state.get("gpu_uuids", []))
        self.gpu_host = state.get("gpu_host", "")
        slug = state.get("profile")
        self.profile = next((p for p in self._profiles if p.slug == slug), self.profile)

    def clear_state(self):
        # Every end of a server passes here, including the paths where
        # JupyterHub skips stop() (container already exited, crashed, removed).
        self._release_lease(self._end_reason or EndReason.DIED)
        super().clear_state()
        self._end_reason = None

    def _set_lease(self, lease: Lease) -> None:
        self.lease_id = lease.id
        self.gpu_uuids = list(lease.gpu_uuids)
        self.gpu_host = lease.host

    def _release_lease(self, reason: str) -> None:
        if self.lease_id is None:
            return
        lease_id = self.lease_id
        try:
            ended = self.pool.release(lease_id, reason)
        except PoolError as exc:
            # The reconciler ends it later (its container is gone by then).
            self.log.error("Could not release GPU lease %s of %s: %s", lease_id, self._log_name, exc)
        else:
            if ended:
                self.log.info("Released GPU lease %s of %s (%s): %s", lease_id, self._log_name,
                              reason, ", ".join(self.gpu_uuids))
        self.lease_id = None
        self.gpu_uuids = []
        self.gpu_host = ""

    # -------------------------------------------------------------- container

    def _container_identity(self) -> tuple[str, str]:
        """uid:gid from the directory (auth_state) when present, else the fallback."""
        uid = self._auth_state.get("uid_number")
        gid = self._auth_state.get("gid_number")
        if not isinstance(uid, int) or isinstance(uid, bool) or uid <= 0:
            uid = self.fallback_uid
        if not isinstance(gid, int) or isinstance(gid, bool) or gid < 0:
            gid = self.fallback_gid
        if uid == 0:
            raise web.HTTPError(500, "Refusing to run a notebook container as root (uid 0)")
        return str(uid), str(gid)

    async def run_auth_state_hook(self, auth_state):
        self._auth_state = dict(auth_state or {})
        return await super().run_auth_state_hook(auth_state)

    def get_env(self):
        env = super().get_env()
        cpu = self.profile.cpu_limit if self.profile else self.cpu_limit
        if cpu:
            threads = str(max(1, math.ceil(cpu)))
            env.update({
                "OMP_NUM_THREADS": threads,
                "MKL_NUM_THREADS": threads,
                "TF_NUM_INTRAOP_THREADS": threads,
                "TF_NUM_INTEROP_THREADS": str(min(2, int(threads))),
            })
        if not self.gpu_uuids:
            # Even where nvidia is Docker's default runtime, a CPU server gets no GPU.
            env["NVIDIA_VISIBLE_DEVICES"] = "void"
        else:
            env["NVIDIA_DRIVER_CAPABILITIES"] = "compute,utility"
        env["HOME"] = self.home_mount_point
        return env

    @default("volumes")
    def _default_volumes(self):
        return {self.home_volume_name: {"bind": self.home_mount_point, "mode": "rw"}}

    def _our_container_config(self) -> tuple[dict, dict]:
        uid, gid = self._container_identity()
        labels = {
            LABEL_USER: self.user.name,
            LABEL_SERVER: self.name or "",
            LABEL_GPUS: ",".join(self.gpu_uuids),
            LABEL_HOST: self.gpu_host,
            LABEL_LEASE: str(self.lease_id) if self.lease_id is not None else "",
            LABEL_POOL: pool_identity(self.pool),
        }
        create = {"user": f"{uid}:{gid}", "labels": labels}
        host = {
            "security_opt": ["no-new-privileges"],
            "cap_drop": ["ALL"],
            "cap_add": [],
            "privileged": False,
            "shm_size": self.shm_size,
        }
        if self.gpu_uuids:
            import docker.types

            host["device_requests"] = [
                docker.types.DeviceRequest(driver="nvidia", device_ids=list(self.gpu_uuids),
                                           capabilities=[["gpu"]])
            ]
        else:
            host["device_requests"] = []
            # Bypass a host-wide nvidia default runtime for CPU servers.
            host["runtime"] = "runc"
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

    async def _check_cuda(self, profile: Profile) -> None:
        """Refuse an image whose CUDA is newer than the host driver supports."""
        try:
            info = await self.docker("inspect_image", profile.image)
        except Exception:
            return  # a missing image fails later with Docker's own message
        labels = (info.get("Config") or {}).get("Labels") or {}
        needed = _image_cuda_version(labels.get(LABEL_CUDA))
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

    async def _prepare_home_volume(self, image: str) -> None:
        """Make the user's home volume theirs, once.

        Docker fills a new named volume from the image's home, owned by the
        image's user.  When the directory gives the user another uid, a
        short-lived container (no network, only CHOWN/DAC_OVERRIDE/FOWNER,
        no-new-privileges) copies the starter files and hands the volume to
        that uid.  The owner is recorded as a volume label so this runs once.
        """
        uid, gid = self._container_identity()
        owner = f"{uid}:{gid}"
        name = self._render_templates(self.home_volume_name)
        try:
            volume = await self.docker("inspect_volume", name)
        except Exception:
            volume = None
        default_owner = f"{self.fallback_uid}:{self.fallback_gid}"
        if volume is None:
            await self.docker("create_volume", name=name,
                              labels={LABEL_HOME_OWNER: owner, LABEL_USER: self.user.name})
            if owner == default_owner:
                return  # Docker's copy-up from the image already gives it to this uid
        else:
            recorded = (volume.get("Labels") or {}).get(LABEL_HOME_OWNER)
            if recorded == owner or (recorded is None and owner == default_owner):
                return
        script = (
            f"cp -an {self.home_mount_point}/. /mnt/home/ 2>/dev/null; "
            f"touch /mnt/home/.gpuhub-home && chown -R {owner} /mnt/home"
        )
        prep = await self.docker(
            "create_container",
            image=self.home_volume_prep_image or image,
            entrypoint=["/bin/sh", "-c"],
            command=[script],
            user="0:0",
            network_disabled=True,
            labels={LABEL_USER: self.user.name},
            host_config=self.client.create_host_config(
                binds={name: {"bind": "/mnt/home", "mode": "rw"}},
                cap_drop=["ALL"], cap_add=["CHOWN", "DAC_OVERRIDE", "FOWNER"],
                security_opt=["no-new-privileges"], network_mode="none",
            ),
        )
        try:
            await self.docker("start", prep["Id"])
            result = await self.docker("wait", prep["Id"], timeout=60)
            if result.get("StatusCode", 1) != 0:
                raise web.HTTPError(500, f"Could not prepare the home volume {name}")
        finally:
            await self.docker("remove_container", prep["Id"], force=True)

    async def _remove_stale_container(self) -> None:
        """With remove=False DockerSpawner restarts an old container as it was,
        GPU pinning included; never do that when the GPUs differ."""
        obj = await self.get_object()
        if not obj:
            return
        old_gpus = ((obj.get("Config") or {}).get("Labels") or {}).get(LABEL_GPUS, "")
        if old_gpus != ",".join(self.gpu_uuids):
            self.log.info("Removing %s: its GPUs (%s) differ from the new lease", self.object_name,
                          old_gpus or "none")
            await self.remove_object()
            self.object_id = ""

    # ------------------------------------------------------------ lifecycle

    async def start(self):
        profile = self.profile
        if profile is None:
            # apply_user_options always runs first in JupyterHub >= 5.3; be safe anyway.
            self._apply_profile(self.user_options or {})
            profile = self.profile
        self._progress_events = []
        self._end_reason = None
        self._emit(5, f"Starting {profile.display_name}")
        if profile.gpus:
            await self._check_cuda(profile)
            gpus = "GPU" if profile.gpus == 1 else "GPUs"
            self._emit(10, f"Requesting {profile.gpus} {gpus}")
            began = time.monotonic()
            try:
                lease = await self.pool.acquire(
                    self.user.name, self.name or "", profile.gpus, self._user_groups(),
                    timeout=self.lease_wait_timeout, on_wait=self._on_wait,
                )
            except PoolError as exc:
                self._emit(100, str(exc))
                raise web.HTTPError(exc.status_code, str(exc)) from None
            LEASE_WAIT_SECONDS.observe(time.monotonic() - began)
            self._set_lease(lease)
            self._emit(40, f"Leased {len(lease.gpu_uuids)} {gpus}: {', '.join(lease.gpu_uuids)}")
        try:
            if not self.remove:
                # With remove=True DockerSpawner replaces any leftover container itself.
                await self._remove_stale_container()
            await self._prepare_home_volume(profile.image)
            self._emit(60, f"Creating your container from {profile.image}")
            try:
                result = await super().start()
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
            await wait_for_server(self, result)  # the hub's first readiness check then succeeds
            return result
        except BaseException:
            self._end_reason = EndReason.FAILED_START
            self._release_lease(EndReason.FAILED_START)
            raise

    async def poll(self):
        status = await super().poll()
        if status is not None and self.lease_id is not None and self._end_reason is None:
            # The container exited, crashed, was OOM-killed or removed by hand.
            self._end_reason = EndReason.DIED
        return status

    def _stop_reason(self) -> str:
        requester = _stop_requester()
        if requester is None:
            return EndReason.STOPPED  # hub shutdown or an internal stop
        if getattr(requester, "kind", "user") == "service":
            if requester.name in self.cull_services:
                return EndReason.CULLED
            return EndReason.ADMIN
        if requester.name != self.user.name:
            return EndReason.ADMIN
        return EndReason.STOPPED

    async def stop(self, now=False):
        if self._end_reason is None:
            self._end_reason = self._stop_reason()
        reason = self._end_reason
        try:
            await super().stop(now=now)
        finally:
            # super().stop() ends in clear_state(), which releases; this covers
            # a stop that raised half-way (the container is going anyway).
            self._release_lease(reason)
