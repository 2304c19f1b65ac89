"""Ledger calls made from an event loop: on the ledger's own threads, and bounded.

The ledger's calls block (SQL over a socket).  Run on the hub's loop, one
PostgreSQL that stops answering without a TCP reset would freeze every page
and API call of the hub until the kernel gives up, minutes later.  Here each
call runs on the ledger's small thread pool, `LEDGER_EXECUTOR`, not the loop's
default executor, which JupyterHub and the pool page use for other work (a long
fan-out there must not delay a lease, nor a stuck ledger call the page).  The
pool is bounded: a ledger that stops answering ties up these threads, never
more.  `ledger_call` stops waiting after `timeout` seconds with a
PoolUnavailable (HTTP 503); the thread itself ends when the database driver's
own timeouts fire.  The queue's waits (leasing/waiting.py) run here too.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from ..models import PoolUnavailable

LEDGER_THREADS = 8
LEDGER_EXECUTOR = ThreadPoolExecutor(max_workers=LEDGER_THREADS, thread_name_prefix="gpu-ledger")


async def ledger_call(fn: Callable[..., Any], *args, timeout: float, **kwargs) -> Any:
    """`fn(*args, **kwargs)` off the event loop; PoolUnavailable after `timeout` seconds."""
    loop = asyncio.get_running_loop()
    future = loop.run_in_executor(LEDGER_EXECUTOR, functools.partial(fn, *args, **kwargs))
    try:
        # Not asyncio.wait_for: on Python 3.11 it returns the result of a call that finishes as
        # its task is cancelled, so a stopping loop that reads the ledger (the jobs runner's
        # page snapshot, every 2 s) lost its cancel and ran on, and the service's stop waited.
        async with asyncio.timeout(timeout):
            return await future
    except TimeoutError:
        raise PoolUnavailable(
            f"The GPU ledger did not answer within {timeout:g} s; GPU servers cannot start or "
            "stop cleanly until it does. Try again in a minute, or ask an administrator."
        ) from None
