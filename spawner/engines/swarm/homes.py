"""The shared homes root on Swarm: a user's directory made once, on the manager, owned by them.

Used by the spawner (a server's home) and the Swarm job engine (a job's): the
directory under the homes root (e.g. an NFS export) exists, owned by the user's
uid, before a volume of the `local` driver mounts it on whichever node the task lands.
"""

from __future__ import annotations

import docker.errors
from tornado import web

from ..common.homes import create_helper, helper_bounds, wait_for_exit

# (homes root volume, user directory) this process has made or found: a directory once made
# stays (it is the user's home), so later starts skip the helper container.
_made: set[tuple[str, str]] = set()


async def make_home_directory(owner, root_options: dict, prefix: str, image: str, uid: int, gid: int) -> None:
    """`owner`: the spawner (or a job's stand-in: user, client, docker, container_limits,
    home_volume_prep_image, _render_templates).  Nothing without `root_options`."""
    if not root_options:
        return
    root = f"{prefix}-homes-root"
    user_dir = owner._render_templates("{username}")
    if (root, user_dir) in _made:
        return
    try:
        await owner.docker("inspect_volume", root)
    except docker.errors.NotFound:
        await owner.docker("create_volume", name=root, driver="local",
                           driver_opts=dict(root_options))
    script = (f'd=/mnt/homes/{user_dir}; [ -d "$d" ] || {{ mkdir -p "$d.new" && chown {uid}:{gid} "$d.new" '
              f'&& mv "$d.new" "$d"; }}')
    prep = await create_helper(
        owner, image=owner.home_volume_prep_image or image, entrypoint=["/bin/sh", "-c"],
        command=[script], user="0:0", network_disabled=True,
        host_config=owner.client.create_host_config(
            binds={root: {"bind": "/mnt/homes", "mode": "rw"}}, network_mode="none",
            cap_drop=["ALL"], cap_add=["CHOWN"], security_opt=["no-new-privileges"],
            **helper_bounds(owner)))
    try:
        await owner.docker("start", prep["Id"])
        code = await wait_for_exit(owner, prep["Id"], 60)
        if code is None:
            raise web.HTTPError(503, f"Creating the home directory of {owner.user.name} took longer than "
                                "60 s; start again in a moment.")
        if code != 0:
            raise web.HTTPError(500, f"Could not create the home directory of {owner.user.name}")
        _made.add((root, user_dir))
    finally:
        await owner.docker("remove_container", prep["Id"], force=True)

