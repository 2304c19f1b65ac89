"""How a lease ends: who asked (the reason), and the release once nothing given it still runs.

The spawner hands an ended server's lease to `settle_lease` with its
engine's `lease_holders`.  The lease is released only when the engine
confirms that no object given it still runs; otherwise it stays lent, with
the reason recorded in the ledger for admins, and a watch in the background
keeps asking (a loaded node may report a task gone only after the grace): the
lease is released the moment the engine confirms, or the reconciler ends it
once it has removed what held it.  An unknown answer never frees a GPU.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

from ..metrics import pool_changed
from ..pool import PoolError

# How long a container Docker is still removing (auto-removal after a stop)
# may take to go before it counts as stuck.
SETTLE_GRACE_SECONDS = 10.0
# The engine is asked again after 50 ms, then less and less often (up to every 0.5 s): a
# container usually goes within a second or two of its stop, and each look costs the engine
# a few calls; its GPUs are lendable as soon as one look finds it gone.
SETTLE_FIRST_LOOK = 0.05
SETTLE_LONGEST_LOOK = 0.5
# After the grace, the background watch asks again this often (doubling up to a
# minute) for this long; the reconciler's passes cover whatever outlasts it.
SETTLE_RECHECK_SECONDS = 2.0
SETTLE_WATCH_SECONDS = 900.0

# The watches in flight (a reference each, so none is collected mid-wait).
_watches: set[asyncio.Task] = set()


@dataclass(frozen=True)
class HeldLease:
    """A lease whose server has ended but whose release waits for the engine's word."""

    id: int
    gpu_uuids: tuple[str, ...]
    host: str
    reason: str



async def settle_lease(held: HeldLease, lease_holders, ledger, pool, log, owner: str) -> bool:
    """Release `held` once `lease_holders(id)` is empty; else note why it stays lent.

    `ledger(fn, *args)` runs a ledger call off the event loop.  True when released."""
    deadline = time.monotonic() + SETTLE_GRACE_SECONDS
    pause = SETTLE_FIRST_LOOK
    while True:
        try:
            holders = await lease_holders(held.id)
        except Exception as exc:  # the engine could not say: the GPU may be in use
            holders, why = ["(unknown)"], f"the engine could not be asked ({exc})"
        else:
            why = f"{', '.join(holders)} would not stop"
        if not holders or time.monotonic() > deadline:
            break
        await asyncio.sleep(pause)
        pause = min(pause * 1.5, SETTLE_LONGEST_LOOK)
    if not holders:
        try:
            ended = await ledger(pool.release, held.id, held.reason)
        except PoolError as exc:
            # The reconciler ends it later (its container is gone by then).
            log.error("Could not release GPU lease %s of %s: %s", held.id, owner, exc)
            return False
        if ended:
            pool_changed()
            log.info("Released GPU lease %s of %s (%s): %s", held.id, owner, held.reason,
                     ", ".join(held.gpu_uuids))
        return True
    log.error("GPU lease %s of %s (%s) stays lent: %s. It is released once the engine confirms it "
              "gone (asked again in the background; the reconciler retries removing it).",
              held.id, owner, ", ".join(held.gpu_uuids), why)
    try:
        await ledger(pool.set_problem, held.id, why)
    except PoolError as exc:
        log.error("Could not record the problem of GPU lease %s: %s", held.id, exc)
    watch = asyncio.get_running_loop().create_task(_watch_until_gone(held, lease_holders, ledger, pool, log, owner))
    _watches.add(watch)
    watch.add_done_callback(_watches.discard)
    return False


async def _watch_until_gone(held: HeldLease, lease_holders, ledger, pool, log, owner: str) -> None:
    """Release `held` when the engine confirms nothing given it still runs (bounded in time)."""
    deadline = time.monotonic() + SETTLE_WATCH_SECONDS
    pause = SETTLE_RECHECK_SECONDS
    while time.monotonic() < deadline:
        await asyncio.sleep(pause)
        pause = min(pause * 2, 60.0)
        try:
            if await lease_holders(held.id):
                continue
        except Exception:  # still unknown: the GPU may be in use
            continue
        try:
            ended = await ledger(pool.release, held.id, held.reason)
        except PoolError as exc:
            log.error("Could not release GPU lease %s of %s: %s", held.id, owner, exc)
            continue
        if ended:
            pool_changed()
            log.info("Released GPU lease %s of %s (%s) once its holder was gone: %s", held.id, owner,
                     held.reason, ", ".join(held.gpu_uuids))
        return  # released here, or ended meanwhile by the reconciler
