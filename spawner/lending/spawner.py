"""What every GPU spawner shares, whatever engine runs the server.

`GPULendingSpawner` holds profiles and the spawn form, the lease around a
start (queue, progress, state for the admin panel and REST), the hand-over
of an ended server's lease to `ending`, and the identity and
environment rules (start admission: `admission`).  An engine (`docker.GPUDockerSpawner`,
`swarm.GPUSwarmSpawner`) subclasses it together with its JupyterHub spawner and supplies
`start_server`, `lease_holders(lease_id)` (which of its objects that were given the lease
still run) and `reconcile_pass`.  The lease invariant lives here: a lease ends only once the
engine confirms that nothing it was given to can still run.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import time
from typing import Any

from jupyterhub.spawner import Spawner
from tornado import web
from traitlets import CaselessStrEnum, Dict, Float, Int, List, Unicode, default, validate

from ..engines.common.containers import runtime_env
from ..identity import container_identity
from ..inventory.kinds import inventory_from_config
from ..metrics import LEASE_WAIT_SECONDS, pool_changed, register_pool
from ..notify.directory import record_address
from ..pool import EndReason, GPUPool, Lease, PoolError, QuotaExceeded, ordinal
from ..pool.leasing.reclaim import borrowed_notice
from ..pool.ledger.off_loop import ledger_call
from ..profiles import DEFAULT_PROFILES, Profile, choose_profile, load_profiles, options_form_html
from . import admission
from .ending import HeldLease, settle_lease

# One pool per hub process, shared by every spawner instance.
_shared_pools: dict[int, GPUPool] = {}


def configured_inventory(config, kind: str | None = None):
    """The inventory a hub with this configuration lends from (kind: the spawner's inventory_kind)."""
    if kind is None:
        kind = config.GPULendingSpawner.get("inventory_kind", None) or config.GPUDockerSpawner.get(
            "inventory_kind", GPULendingSpawner.class_traits()["inventory_kind"].default_value)
    return inventory_from_config(kind, config=config)


def shared_pool(config, kind: str | None = None) -> GPUPool:
    """The hub process's GPUPool for this configuration (made once)."""
    pool = _shared_pools.get(id(config))
    if pool is None:
        inventory = configured_inventory(config, kind)
        # No database access here: the pool records the inventory on first use,
        # and a CPU server must start even when the ledger is unreachable.
        pool = GPUPool(config=config, inventory=inventory)
        register_pool(pool.counts)
        _shared_pools[id(config)] = pool
    return pool


class GPULendingSpawner(Spawner):
    """Profiles, GPU leases and their ends, for any engine (see the module docstring)."""

    profiles = List(
        Dict(),
        default_value=DEFAULT_PROFILES,
        config=True,
        help="""
        The spawn profiles users choose from.  Each is a dict with keys:
        `slug` (what REST clients send as `{"profile": slug}`), `display_name`,
        `description`, `image`, `gpus` (how many GPUs the profile leases; 0 for
        none), `cpu_limit`, `mem_limit`, and `groups` (JupyterHub groups allowed
        to use it; empty for everyone).  For batch jobs also `job_max_seconds`
        (the longest timeout a job may ask; default GPUHUB_JOB_MAX_SECONDS) and
        `job_network` (true: a one-container job joins the hub's Docker network,
        as a server; a cluster's own network, which only its workers share, gets
        a route out; on Swarm both get an internal overlay of their own and HTTPS
        out through a proxy, as servers; default false: no network, a cluster's
        network internal).  For culling, `idle_timeout` (seconds of
        inactivity before its servers are culled, instead of the hub's GPU or CPU
        timeout) and `max_age` (seconds after which its servers are stopped
        whatever their activity).  `borrow` (default false): true lets a server of
        this profile take idle GPUs beyond its user's share (`GPUPool.max_gpus_per_user`,
        `group_gpu_limits`) while nobody within their share waits; its lease is then
        borrowed, within `GPUPool.max_borrowed_gpus_per_user`, and when a request within
        its share needs the GPUs the server is stopped after `GPUPool.reclaim_grace`
        seconds' notice in JupyterLab (its lease ends `reclaimed`).  Users can choose nothing else: no image,
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
        ["nvml", "static", "simulated", "swarm"],
        default_value="nvml",
        config=True,
        help="""
        Where the host's GPUs come from: `nvml` (the NVIDIA driver, through
        nvidia-ml-py), `static` (a list in `StaticInventory.gpus_list`),
        `simulated` (`SimulatedInventory.count` fake GPUs, for demos and tests on
        hosts without NVIDIA), or `swarm` (every Swarm node's GPUs, from the
        manager: `SwarmInventory`; the default of `gpu-swarm`).
        """,
    )
    lease_wait_timeout = Float(
        300.0,
        config=True,
        help="""
        How long a spawn may wait in the GPU queue, in seconds, before it fails
        with a message saying all GPUs are lent (HTTP 429: a busy pool is an
        answer, not a hub failure, so it never counts toward JupyterHub's
        `consecutive_failure_limit`).  `start_timeout` is extended by this much,
        so a queued spawn is not cut off by the hub.
        """,
    )
    container_start_timeout = Float(
        120.0,
        config=True,
        help="Seconds a container may take to be created and started, once its GPUs are leased. "
        "`start_timeout` defaults to `lease_wait_timeout + container_start_timeout`.",
    )
    ledger_timeout = Float(
        10.0,
        config=True,
        help="""
        Seconds the hub waits for one GPU ledger call (a release, a quota
        check, the spawn form's counts) before it answers 503.  Ledger calls
        never run on the hub's event loop, so a database that stops answering
        slows GPU spawns only, never the hub's pages and API.
        """,
    )
    concurrent_start_limit = Int(
        -1,
        config=True,
        help="""
        How many servers this hub may be starting at once, not counting spawns
        that wait in the GPU queue (they cost nothing while they wait); a start
        beyond it gets HTTP 429 "try again in a minute".  0: no limit.  -1: take
        JupyterHub's own `concurrent_spawn_limit` (100 by default), which the
        hub then stops applying itself, because it counts queued GPU spawns too
        and would turn CPU users away while GPU users wait.
        """,
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
        help="The gid containers run as when the user's auth_state has no `gid_number`.  Never 0 "
        "(root's group).",
    )
    end_intent_max_age = Float(
        120.0,
        config=True,
        help="Seconds an end intent stays valid: the idle culler (`culled`) and the pool page's "
        "admin end (`admin`) record one in the ledger just before they ask the hub to stop a "
        "server; a stop that finds none this fresh is the user's own (`stopped`).  A stop from "
        "the hub's own admin panel or REST API by someone else is also `stopped`: JupyterHub "
        "tells a spawner nothing of who asked.",
    )

    @validate("fallback_uid", "fallback_gid")
    def _never_root(self, proposal):
        if proposal.value <= 0:
            raise ValueError(f"{proposal.trait.name} must be > 0 (containers never run as root), "
                             f"not {proposal.value}")
        return proposal.value

    @default("start_timeout")
    def _default_start_timeout(self):
        return int(self.lease_wait_timeout + self.container_start_timeout)

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
        self.profile: Profile | None = None
        self.lease_id: int | None = None
        self.gpu_uuids: list[str] = []
        self.gpu_host: str = ""
        self.gpu_borrowed = False  # the lease is borrowed beyond the user's share (reclaimed with notice)
        self._end_reason: str | None = None
        self._auth_state: dict = {}
        self._progress_events: list[dict] = []
        self._progress_changed = asyncio.Event()
        # Leases of ended servers whose release waits for the engine's word.
        self._unsettled: list[HeldLease] = []
        self._settling: set[int] = set()  # ...and those being settled right now
        self._background: set[asyncio.Task] = set()

    @property
    def server_label(self) -> str:
        """`user` or `user:name`, as the hub's own log lines name a server (JupyterHub's own
        log name for it is private; this one is built from the public `user` and `name`)."""
        return f"{self.user.name}:{self.name}" if self.name else self.user.name

    # ------------------------------------------------------------------ pool

    @property
    def pool(self) -> GPUPool:
        return shared_pool(self.config, self.inventory_kind)

    async def _ledger(self, fn, *args, **kwargs):
        """A ledger call off the hub's event loop, bounded by `ledger_timeout`."""
        return await ledger_call(fn, *args, timeout=self.ledger_timeout, **kwargs)

    def _user_groups(self) -> list[str]:
        return sorted(g.name for g in getattr(self.user, "groups", []) or [])

    # ------------------------------------------------------- profiles & form

    def _allowed_profiles(self) -> list[Profile]:
        groups = set(self._user_groups())
        return [p for p in self._profiles if p.allows(groups)]

    async def _apply_profile(self, user_options: Any) -> None:
        profile = choose_profile(user_options, self._profiles, self._user_groups(), self.default_profile)
        if profile.gpus:
            try:
                # Quota and size checks up front (a borrowing profile's: the borrowing limits
                # beyond the user's share): a refused request takes no lease and creates no container.
                await self._ledger(self.pool.check_request, self.user.name, profile.gpus, self._user_groups(),
                                   borrow=profile.borrow)
            except QuotaExceeded as exc:
                raise web.HTTPError(exc.status_code, self._beyond_share(profile, str(exc))) from None
            except PoolError as exc:
                raise web.HTTPError(exc.status_code, str(exc)) from None
        self.profile = profile
        self.apply_profile_limits(profile)

    def _beyond_share(self, profile: Profile, message: str) -> str:
        """A quota refusal, with the borrowing rule when another profile of the user's may borrow."""
        if profile.borrow or not any(p.borrow and p.gpus for p in self._allowed_profiles()):
            return message
        return (f"{message}. Profile {profile.slug!r} does not borrow idle GPUs beyond your share "
                "(its `borrow` is off); a profile marked 'may borrow' does.")

    def apply_profile_limits(self, profile: Profile) -> None:
        """Set the engine's image and limits from the profile (engines may extend)."""
        self.image = profile.image
        if profile.cpu_limit is not None:
            self.cpu_limit = profile.cpu_limit
        if profile.mem_limit is not None:
            self.mem_limit = profile.mem_limit

    async def _render_options_form(self) -> str:
        try:
            counts = await self._ledger(self.pool.counts)
        except PoolError:
            counts = None
        return options_form_html(self._allowed_profiles(), self.default_profile, counts)

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
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(1.0):  # not wait_for: it could lose a cancel (pool/ledger/off_loop.py)
                    await self._progress_changed.wait()

    def _on_wait(self, position: int, wanted: int, free: int, why: str = "") -> None:
        gpus = "GPU" if wanted == 1 else "GPUs"
        # `why` (the pool's, naming nobody) says why the request is where it is.
        place = f"you are {why}" if why else f"you are {ordinal(position)} in the queue"
        self._emit(20, f"Waiting for {wanted} {gpus}: {free} free now; {place}.")

    # ------------------------------------------------------------------ state

    def get_state(self):
        state = super().get_state()
        if self.lease_id is not None:
            state["gpu_lease_id"] = self.lease_id
            state["gpu_uuids"] = list(self.gpu_uuids)
            state["gpu_host"] = self.gpu_host
            if self.gpu_borrowed:
                state["gpu_borrowed"] = True
        if self.profile is not None:
            state["profile"] = self.profile.slug
        return state

    def load_state(self, state):
        super().load_state(state)
        self.lease_id = state.get("gpu_lease_id")
        self.gpu_uuids = list(state.get("gpu_uuids", []))
        self.gpu_host = state.get("gpu_host", "")
        self.gpu_borrowed = bool(state.get("gpu_borrowed"))
        slug = state.get("profile")
        self.profile = next((p for p in self._profiles if p.slug == slug), self.profile)

    def _set_lease(self, lease: Lease) -> None:
        self.lease_id = lease.id
        self.gpu_uuids = list(lease.gpu_uuids)
        self.gpu_host = lease.host
        self.gpu_borrowed = lease.borrowed

    async def adopt_lease(self, lease_id: int) -> bool:
        """Take over the lease this server's running container carries, when the state lacks it.

        A hub killed mid-spawn saved this server's state before its lease
        existed; the container it started carries the lease in its labels.
        Adopted (only an active lease of this very user and server), the lease
        is tracked while the hub checks the server, and ends on the usual stop
        paths instead of by a reconcile pass judging a server still in use."""
        if self.lease_id is not None:
            return False
        lease = await self._ledger(self.pool.lease, lease_id)
        if lease is None or not lease.active or lease.user != self.user.name \
                or lease.server_name != (self.name or ""):
            return False
        self._set_lease(lease)
        self.log.info("Adopted GPU lease %s (%s) of %s from its container", lease.id,
                      ",".join(lease.gpu_uuids), self.server_label)
        return True

    # ------------------------------------------------------- ending a lease
    #
    # JupyterHub ends a server in User.stop(): poll, stop() only if poll says
    # it runs, then (on every path, also when stop() raised) the awaited
    # post-stop hook, then clear_state().  Engines call clear_state() inside
    # stop() too, and JupyterHub calls it before each new spawn.  clear_state
    # is synchronous and cannot ask the engine anything, so it never releases:
    # it hands the lease to `_unsettled`, and the post-stop hook settles it.

    def _stash_lease(self) -> None:
        if self.lease_id is not None:
            self._unsettled.append(HeldLease(self.lease_id, tuple(self.gpu_uuids), self.gpu_host,
                                             str(self._end_reason or EndReason.DIED)))
        self.lease_id = None
        self.gpu_uuids = []
        self.gpu_host = ""
        self.gpu_borrowed = False

    def clear_state(self):
        self._stash_lease()
        super().clear_state()
        self._end_reason = None
        if self._unsettled and not self._stop_pending:
            # Not inside User.stop (whose post-stop hook settles): settle now.
            self._settle_in_background()

    async def run_post_stop_hook(self):
        self._stash_lease()
        await self._settle_all()
        result = super().run_post_stop_hook()
        if inspect.isawaitable(result):
            await result

    def _settle_in_background(self) -> None:
        try:
            task = asyncio.get_running_loop().create_task(self._settle_all())
        except RuntimeError:
            return  # no loop (a script): the reconciler settles it
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _settle_all(self) -> None:
        while self._unsettled:
            held = self._unsettled.pop(0)
            self._settling.add(held.id)
            try:
                await self._settle(held)
            finally:
                self._settling.discard(held.id)

    def leases_in_hand(self) -> set[int]:
        """The leases this server holds, or has ended and is still settling.

        The reconciler leaves them alone: a stop in progress ends its own lease
        (with its own reason) once the engine confirms the container gone."""
        held = {h.id for h in self._unsettled} | self._settling
        if self.lease_id is not None and (self.active or self.ready):
            held.add(self.lease_id)
        return held

    async def lease_holders(self, lease_id: int) -> list[str]:
        """Names of the engine's objects given this lease that may still run.

        Engines implement it; raise when the engine cannot tell (unreachable,
        erroring): an unknown answer never frees a GPU."""
        raise NotImplementedError

    async def _settle(self, held: HeldLease) -> None:
        """Release `held` once the engine confirms nothing given it still runs; else keep it lent."""
        await settle_lease(held, self.lease_holders, self._ledger, self.pool, self.log, self.server_label)

    # ------------------------------------------------------ end reasons

    async def _stop_reason(self) -> str:
        """Why this stop ends the lease: the intent the asker recorded in the ledger just before
        asking (the idle culler: `culled`; the pool page's admin end: `admin`), else the user's own.

        JupyterHub hands a spawner no requester; the askers that are this project's own say so."""
        if self.lease_id is None:
            return EndReason.STOPPED
        try:
            intent = await self._ledger(self.pool.end_intent, self.lease_id, self.end_intent_max_age)
        except PoolError as exc:
            self.log.warning("Could not read who ended GPU lease %s (%s): recorded as stopped", self.lease_id, exc)
            return EndReason.STOPPED
        return EndReason(intent[0]) if intent else EndReason.STOPPED

    async def poll(self):
        status = await super().poll()
        if status is not None and self.lease_id is not None and self._end_reason is None:
            # The server exited, crashed, was OOM-killed or removed by hand.
            self._end_reason = EndReason.DIED
        return status

    async def stop(self, now=False):
        if self._end_reason is None:
            self._end_reason = await self._stop_reason()
        # The lease is settled by the post-stop hook, after this returned or raised.
        await super().stop(now=now)

    # ------------------------------------------------------------- identity

    def container_identity(self) -> tuple[int, int]:
        """uid, gid from the directory (auth_state) when it has them, else the fallback."""
        return container_identity(self._auth_state, self.fallback_uid, self.fallback_gid)

    def has_directory_identity(self) -> bool:
        return self._auth_state.get("uid_number") is not None

    async def run_auth_state_hook(self, auth_state):
        self._auth_state = dict(auth_state or {})
        if "user_attributes" in self._auth_state:
            # The directory's mail attribute, for the notification mails (spawner/notify/): kept
            # at each spawn, so a changed or removed address is followed.
            try:
                await self._ledger(record_address, self.pool, self.user.name, self._auth_state)
            except PoolError as exc:
                self.log.warning("Could not record %s's mail address for notifications: %s", self.user.name, exc)
        return await super().run_auth_state_hook(auth_state)

    def get_env(self):
        env = super().get_env()
        cpu = self.profile.cpu_limit if self.profile else self.cpu_limit
        env.update(runtime_env(cpu, self.gpu_uuids))
        return env

    # ------------------------------------------------------------- starting

    async def lease_for_start(self, profile: Profile) -> None:
        """Take the profile's GPUs from the pool (queueing, with progress), or raise HTTPError."""
        gpus = "GPU" if profile.gpus == 1 else "GPUs"
        self._emit(10, f"Requesting {profile.gpus} {gpus}")
        began = time.monotonic()
        admission.leave(id(self))  # a queued spawn costs nothing: not counted while it waits
        try:
            lease = await self.pool.acquire(
                self.user.name, self.name or "", profile.gpus, self._user_groups(),
                timeout=self.lease_wait_timeout, on_wait=self._on_wait, host=self.lease_hosts(profile),
                borrow=profile.borrow,
            )
        except PoolError as exc:
            self._emit(100, str(exc))
            raise web.HTTPError(exc.status_code, str(exc)) from None
        finally:
            admission.resume(id(self))
        LEASE_WAIT_SECONDS.observe(time.monotonic() - began)
        pool_changed()
        self._set_lease(lease)
        self._emit(40, f"Leased {len(lease.gpu_uuids)} {gpus}: {', '.join(lease.gpu_uuids)}")
        if lease.borrowed:  # beyond the user's share: asked back when a request within its share waits
            self._emit(41, borrowed_notice(self.pool.reclaim_grace))
            self.log.info("GPU lease %d of %s is borrowed beyond their share", lease.id, self.server_label)
        if lease.notice:  # one of its GPUs is booked by someone else later (the culler stops it then)
            self._emit(41, lease.notice)
            self.log.info("GPU lease %d of %s: %s", lease.id, self.user.name, lease.notice)

    async def start(self):
        """Admission, the lease, then the engine's `start_server()`."""
        profile = self.profile
        if profile is None:
            # apply_user_options always runs first in JupyterHub >= 5.3; be safe anyway.
            await self._apply_profile(self.user_options or {})
            profile = self.profile
            assert profile is not None  # _apply_profile sets it or raises
        self._progress_events = []
        self._end_reason = None
        self.container_identity()  # refuses a root identity before any lease
        self.check_object_name()  # ...and a server named like another's unit
        admission.admit(id(self), self.concurrent_start_limit)  # or 429
        try:
            self._emit(5, f"Starting {profile.display_name}")
            if profile.gpus:
                await self.check_image_fits(profile)
                await self.lease_for_start(profile)
            try:
                return await self.start_server(profile)
            except BaseException as exc:
                self._end_reason = EndReason.FAILED_START
                if not isinstance(exc, Exception):
                    # Cancelled: JupyterHub will not call stop(); settle here.
                    self._stash_lease()
                    self._settle_in_background()
                # Otherwise JupyterHub stops the failed server, and the lease
                # is settled (released once its container is gone) on the way.
                raise
        finally:
            admission.leave(id(self))

    @staticmethod
    def reconcile_pass(pool: GPUPool, client, host: str, tracked: set[int], log, min_age: float,
                       starting: set[tuple[str, str]], /):
        """One reconcile pass of this engine: the ledger's leases against what the engine runs.

        `tracked`: the leases the hub's servers hold; `starting`: (user, server name) of the
        spawns in progress, whose leases are theirs even before they record them.

        Returns a `reconciler.ReconcileReport`; runs in a thread (blocking calls are fine)."""
        raise NotImplementedError("an engine defines its reconcile pass")

    def lease_hosts(self, profile: Profile) -> list[str] | None:
        """The hosts a lease for `profile` may come from; None: the pool's default (engines may narrow)."""
        return None

    def check_object_name(self) -> None:
        """Engines refuse, before any lease or engine call, a server whose unit would take the
        name of another unit of the hub's (a batch job's container)."""

    async def check_image_fits(self, profile: Profile) -> None:
        """Engines refuse, before any lease, an image this host cannot run (CUDA too new)."""

    async def start_server(self, profile: Profile):
        """Engines create and start the server for `profile` (GPUs already leased)."""
        raise NotImplementedError
