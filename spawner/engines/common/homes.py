"""Home volumes: a user's named volume, owned by their directory uid, and kept that way.

Docker fills a new named volume from the image's home, owned by the image's
user (uid 1000).  When the directory gives the user another uid, a
short-lived container (no network, only CHOWN/DAC_OVERRIDE/FOWNER,
no-new-privileges) copies the starter files in and hands the volume over.
Who owns the home is recorded by a marker file *inside* the volume, written
only after the hand-over succeeded: a hand-over that failed, timed out or was
cancelled is simply resumed at the next start, and it touches only files not
yet owned by the new uid, so a repeated one is cheap.  The marker travels
with the data (shared storage included); Docker's volume labels cannot, and
cannot change.  A home that belongs to a directory uid is never handed to
the fallback uid: that spawn is refused with a message to log in again.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import tarfile
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Protocol

import docker.errors
from tornado import web

from .containers import ContainerLimits
from .labels import LABEL_HOME_OWNER, LABEL_USER


class HomeOwner(Protocol):
    """What `prepare_home_volume` asks of its caller: a server's spawner (every engine) or a
    job's stand-in (jobs/runner.py), so both follow the same rules."""

    user: Any  # .name
    home_volume_name: str
    home_mount_point: str
    home_volume_prep_image: str
    home_prep_timeout: float
    fallback_uid: int
    fallback_gid: int

    @property
    def container_limits(self) -> ContainerLimits:
        """The pids and log bounds of its helper containers (c.ContainerLimits)."""
        ...

    def _render_templates(self, template: str) -> str: ...
    async def docker(self, method: str, *args, **kwargs) -> Any: ...
    def has_directory_identity(self) -> bool: ...
    def home_volume_create_kwargs(self) -> dict:
        """Extra `create_volume` arguments: an engine may put homes on shared storage (Swarm)."""
        ...

MARKER = ".gpuhub-owner"
MOUNT = "/mnt/home"

# Creating helpers (create_helper): threads of their own, so that one that outlives its
# caller (cancelled) still finishes, and removes what it made.
_HELPER_THREADS = ThreadPoolExecutor(max_workers=4, thread_name_prefix="gpuhub-helpers")

# volume name -> owner ("uid:gid") already checked by this hub process.
_known_owner: dict[str, str] = {}


def helper_bounds(spawner: HomeOwner) -> dict:
    """The pids and log bounds of a helper container of `spawner` (its c.ContainerLimits)."""
    return spawner.container_limits.host_config(helper=True)


class _Claim:
    """Who removes a helper whose creation its caller stopped waiting for: the creating
    thread, or the caller; decided under a lock, so exactly one of them does."""

    def __init__(self):
        self._lock = threading.Lock()
        self._made: dict | None = None
        self._abandoned = False

    def take(self, made: dict) -> bool:
        """In the creating thread: False when the caller has gone (the thread removes it)."""
        with self._lock:
            self._made = made
            return not self._abandoned

    def abandon(self) -> dict | None:
        """In the cancelled caller: the helper if it was made meanwhile (the caller removes it)."""
        with self._lock:
            self._abandoned = True
            return self._made


async def create_helper(spawner, **kwargs) -> dict:
    """Docker's create_container for a helper container, never left behind in `Created`.

    Should the caller be cancelled while Docker creates it (the hub shutting down during a
    spawn, which may cancel a task more than once), the helper is removed once made, by
    the creating thread or by a thread of its own: both run to their end even when the
    event loop stops, as the hub's process exits only once they have."""
    claim = _Claim()
    client = spawner.client

    def create() -> dict:
        made = client.create_container(**kwargs)
        if not claim.take(made):
            with contextlib.suppress(Exception):
                client.remove_container(made["Id"], force=True)
        return made

    creating = asyncio.get_running_loop().run_in_executor(_HELPER_THREADS, create)
    try:
        return await creating
    except asyncio.CancelledError:
        made = claim.abandon()
        if made is not None:  # made, but the answer had not reached this task yet
            threading.Thread(target=_remove_quietly, args=(client, made["Id"]), name="gpuhub-helper-removal").start()
        raise


def _remove_quietly(client, container_id: str) -> None:
    with contextlib.suppress(Exception):
        client.remove_container(container_id, force=True)


async def wait_for_exit(spawner, container_id: str, timeout: float, every: float = 0.25) -> int | None:
    """A started helper's exit code, or None once `timeout` seconds have passed.

    Looked at every `every` seconds rather than with Docker's blocking `wait`: that would
    hold one of the spawner's Docker threads (DockerSpawner has one, for every user) for
    as long as the helper runs, and a cancelled caller (the hub shutting down) could not
    remove the helper until it ended."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        state = (await spawner.docker("inspect_container", container_id)).get("State") or {}
        if state.get("Status") not in ("created", "running", "restarting", "paused"):
            return int(state.get("ExitCode", 1))
        if loop.time() >= deadline:
            return None
        await asyncio.sleep(every)


async def _recorded_owner(spawner, name: str, image: str) -> str | None:
    """The owner the volume's marker records, read through a container that never starts."""
    reader = await create_helper(
        spawner, image=image, command=["true"], network_disabled=True,
        labels={LABEL_USER: spawner.user.name},
        host_config=spawner.client.create_host_config(
            binds={name: {"bind": MOUNT, "mode": "ro"}}, network_mode="none", cap_drop=["ALL"],
            **helper_bounds(spawner)),
    )
    try:
        stream, _ = await spawner.docker("get_archive", reader["Id"], f"{MOUNT}/{MARKER}")
        with tarfile.open(fileobj=io.BytesIO(b"".join(stream))) as tar:
            member = tar.extractfile(MARKER)
            return member.read().decode().strip() if member else None
    except docker.errors.NotFound:
        return None
    finally:
        await spawner.docker("remove_container", reader["Id"], force=True)


async def prepare_home_volume(spawner: HomeOwner, image: str, uid: int, gid: int) -> None:
    """Make the user's home volume theirs (see the module docstring); raise HTTPError if refused."""
    owner = f"{uid}:{gid}"
    name = spawner._render_templates(spawner.home_volume_name)
    try:
        volume = await spawner.docker("inspect_volume", name)
    except docker.errors.NotFound:
        volume = None
    fallback = f"{spawner.fallback_uid}:{spawner.fallback_gid}"
    if volume is None:
        _known_owner.pop(name, None)
        # The label says whom the volume was made for (labels never change).
        volume = {"Labels": {LABEL_USER: spawner.user.name, LABEL_HOME_OWNER: owner}}
        # An engine may put homes on shared storage (Swarm: the local driver's NFS options).
        extra = spawner.home_volume_create_kwargs()
        await spawner.docker("create_volume", name=name, labels=volume["Labels"], **extra)
        if owner == fallback:
            # Docker's copy-up from the image gives a new volume to the image's
            # user, which the fallback identity is: nothing to hand over.
            _known_owner[name] = owner
            return
        recorded = None
    elif _known_owner.get(name) == owner:
        return
    else:
        recorded = await _recorded_owner(spawner, name, spawner.home_volume_prep_image or image)
    # Without a marker no hand-over ever finished; the label is the owner the
    # volume was made for, true only for copy-up homes (the fallback identity).
    label = (volume or {}).get("Labels", {}) or {}
    claimed = recorded or label.get(LABEL_HOME_OWNER)
    verified = recorded or (claimed if claimed == fallback else None)
    if verified == owner:
        _known_owner[name] = owner
        return
    if owner == fallback and not spawner.has_directory_identity() and claimed not in (None, fallback):
        raise web.HTTPError(
            409,
            f"Your home belongs to your directory account (uid {claimed.split(':')[0]}), but the hub "
            "has no directory identity for you right now. Log out and log in again, then start "
            "your server.")
    await _hand_over(spawner, name, image, owner)
    _known_owner[name] = owner


async def _hand_over(spawner, name: str, image: str, owner: str) -> None:
    uid, gid = owner.split(":")
    home = spawner.home_mount_point
    # Copy starter files without overwriting, give the new owner only what is
    # not theirs yet, and record the owner last: only a finished hand-over counts.
    script = (
        f"cp -an {home}/. {MOUNT}/ 2>/dev/null; "
        f"find {MOUNT} \\( ! -user {uid} -o ! -group {gid} \\) -exec chown -h {owner} {{}} + && "
        f"printf '%s\\n' {owner} > {MOUNT}/{MARKER}.new && chown {owner} {MOUNT}/{MARKER}.new && "
        f"mv -f {MOUNT}/{MARKER}.new {MOUNT}/{MARKER}"
    )
    prep = await create_helper(
        spawner,
        image=spawner.home_volume_prep_image or image,
        entrypoint=["/bin/sh", "-c"],
        command=[script],
        user="0:0",
        network_disabled=True,
        labels={LABEL_USER: spawner.user.name},
        host_config=spawner.client.create_host_config(
            binds={name: {"bind": MOUNT, "mode": "rw"}},
            cap_drop=["ALL"], cap_add=["CHOWN", "DAC_OVERRIDE", "FOWNER"],
            security_opt=["no-new-privileges"], network_mode="none", **helper_bounds(spawner),
        ),
    )
    try:
        await spawner.docker("start", prep["Id"])
        code = await wait_for_exit(spawner, prep["Id"], spawner.home_prep_timeout)
        if code is None:
            raise web.HTTPError(
                503, f"Handing your home volume {name} to your account took longer than "
                f"{spawner.home_prep_timeout:g} s; start again to resume it.")
        if code != 0:
            raise web.HTTPError(500, f"Could not give the home volume {name} to your account")
    finally:
        await spawner.docker("remove_container", prep["Id"], force=True)
