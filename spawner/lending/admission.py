"""Admission of starts: how many servers one hub starts at once, queued GPU spawns not counted.

JupyterHub's `concurrent_spawn_limit` counts every pending spawn, spawns
waiting in the GPU queue too, so a few GPU users waiting would turn every CPU
user away with 429.  The spawner takes that limit over and counts only starts
that are not waiting for GPUs (a queued spawn costs nothing while it waits).
"""

from __future__ import annotations

from tornado import web

# Starts in progress in this hub process that are not waiting in the GPU
# queue: what `concurrent_start_limit` counts.
_starting: set[int] = set()
# JupyterHub's concurrent_spawn_limit, once `take_over_spawn_limit` moved it here.
_hub_spawn_limit = 0


def take_over_spawn_limit(app) -> None:
    """Apply JupyterHub's `concurrent_spawn_limit` to starts only, not to queued GPU spawns.

    JupyterHub counts every pending spawn, queued ones included, so a few
    GPU users waiting for GPUs would turn every CPU user away with 429.  The
    hub's handlers read the limit from the web application's settings; it is
    set to 0 there and applied by `GPULendingSpawner._admit_start` instead.
    """
    global _hub_spawn_limit
    settings = app.tornado_application.settings
    _hub_spawn_limit = settings.get("concurrent_spawn_limit") or 0
    settings["concurrent_spawn_limit"] = 0


def admit(key: int, configured: int) -> None:
    """Count start `key`, or refuse it with 429 when the limit is reached.

    `configured` is `concurrent_start_limit`: -1 for JupyterHub's own, 0 for none."""
    limit = configured if configured >= 0 else _hub_spawn_limit
    if limit and len(_starting) >= limit:
        raise web.HTTPError(
            429, f"{len(_starting)} servers are starting right now, the most this hub starts at "
            "once; try again in a minute.")
    _starting.add(key)


def leave(key: int) -> None:
    """Start `key` ended, or began to wait in the GPU queue."""
    _starting.discard(key)


def resume(key: int) -> None:
    """Start `key` left the GPU queue (with a lease or an error) and counts again until it ends."""
    _starting.add(key)
