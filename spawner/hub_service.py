"""What every hub-managed service of this project does to end with its hub.

The hub starts services in their own session: a hub killed with SIGKILL
leaves them behind, holding a token the next hub no longer knows (and, for
the pool page, the port the next one needs).  They watch their parent and
stop themselves when it is gone; the restarted hub starts fresh ones.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal


async def stop_when_the_hub_is_gone(name: str, log: logging.Logger | logging.LoggerAdapter,
                                    every: float = 1.0) -> None:
    """SIGTERM this process (its own clean shutdown) once its parent, the hub, has died."""
    parent = os.getppid()
    while os.getppid() == parent:
        await asyncio.sleep(every)
    log.warning("The hub (pid %s) is gone; stopping the %s service", parent, name)
    os.kill(os.getpid(), signal.SIGTERM)
