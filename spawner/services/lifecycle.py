"""What every hub-managed service of this project shares with its hub: it ends with it, and
reads its settings from the hub's final config.

The hub starts services in their own session: a hub killed with SIGKILL
leaves them behind, holding a token the next hub no longer knows (and, for
the pool page, the port the next one needs).  They watch their parent and
stop themselves when it is gone; the restarted hub starts fresh ones.
Settings a service needs from the hub's configuration are written to a file
once every config file is loaded (`write_when_config_loaded`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

# How long a service may take from its stop (SIGINT, SIGTERM) to its exit: what is still
# running then (a Docker or ledger call waiting on its own timeout, up to a minute) is left.
EXIT_GRACE_SECONDS = 5.0


def exit_within(seconds: float, name: str, log: logging.Logger | logging.LoggerAdapter) -> None:
    """Called when the service stops: the process ends within `seconds` whatever still holds
    it.  Python waits at exit for every thread of an executor, and one in a Docker or ledger
    call that gets no answer (a daemon under load, a stalled database) holds the process until
    that call's own timeout, past the hub's patience.  The call's work is not lost: the next
    service takes the jobs up again and the ledger rolls back what was not committed."""
    def leave_now() -> None:
        held = [t.name for t in threading.enumerate()
                if t.is_alive() and not t.daemon and t is not threading.main_thread()]
        log.warning("The %s service leaves without waiting for %s (still busy %g s after its stop)",
                    name, ", ".join(held) or "its main thread", seconds)
        logging.shutdown()
        os._exit(0)

    timer = threading.Timer(seconds, leave_now)
    timer.daemon = True
    timer.name = f"{name}-exit"
    timer.start()


async def stop_when_the_hub_is_gone(name: str, log: logging.Logger | logging.LoggerAdapter,
                                    every: float = 1.0) -> None:
    """SIGTERM this process (its own clean shutdown) once its parent, the hub, has died."""
    parent = os.getppid()
    while os.getppid() == parent:
        await asyncio.sleep(every)
    log.warning("The hub (pid %s) is gone; stopping the %s service", parent, name)
    os.kill(os.getpid(), signal.SIGTERM)


def write_when_config_loaded(path: Path, render: Callable[[Any], str | None], private: bool = False) -> None:
    """In the hub: on the next turn of its event loop (every config file loaded, long before
    services start), write `render(hub)` to `path` atomically, so the settings a service reads
    come from the hub's final config (options set after hub_config count).  `render` returns
    None to write nothing; `private` makes the file readable by the hub's user only (it holds a
    secret).  Outside a running hub (a script loading the config): nothing."""
    try:
        loop = asyncio.get_running_loop()
        from jupyterhub.app import JupyterHub
    except (RuntimeError, ImportError):
        return
    if not JupyterHub.initialized():
        return

    def write() -> None:
        text = render(JupyterHub.instance())
        if text is None:
            return
        tmp = path.with_suffix(".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600 if private else 0o644)
        with os.fdopen(fd, "w") as f:
            f.write(text)
        if private:
            os.chmod(tmp, 0o600)  # an older file of the same name may have been wider
        tmp.replace(path)

    loop.call_soon(write)


def without_named(entries, name: str) -> list:
    """`entries` (services or roles in the hub's config) without the one called `name`."""
    return [e for e in list(entries or []) if e.get("name") != name]


async def cancel_and_wait(task: asyncio.Task) -> None:
    """Cancel a service's background loop and wait until it has stopped (its cancellation is
    the expected end, not an error)."""
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
