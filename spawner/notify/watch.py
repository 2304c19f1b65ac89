"""A watch of the gpu-pool service: one ledger round (budget_watch.run_once, booking_watch.run_once,
the browser rows' expiry) every `every` seconds, on the ledger's threads, bounded by
LEDGER_TIMEOUT; a failed round is logged and tried again at the next."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from ..pool.ledger.off_loop import ledger_call

LEDGER_TIMEOUT = 15.0
log = logging.getLogger("gpu-pool-notify")


class LedgerWatch:
    def __init__(self, pool, every: float, round_: Callable[..., int], what: str):
        """`round_(store)`: how many rows it wrote; `what`: what they are, for the log."""
        self.pool, self.every, self.round, self.what = pool, every, round_, what
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._loop())

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    async def _loop(self) -> None:
        while True:
            try:
                done = await ledger_call(self.round, self.pool._store, timeout=LEDGER_TIMEOUT)
                if done:
                    log.info("%d %s", done, self.what)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("A round of the %s watch failed; trying again in %s s", self.what, self.every)
            await asyncio.sleep(self.every)
