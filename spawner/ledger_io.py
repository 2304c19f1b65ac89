"""Ledger calls made from the hub's event loop: in their own threads, and bounded.

The ledger's calls block (SQL over a socket).  Run on the hub's loop, one
PostgreSQL that stops answering without a TCP reset would freeze every page
and API call of the hub until the kernel gives up, minutes later.  Here each
call runs on the ledger's small thread pool (pool/executor.py) (so stuck calls cannot starve the
loop's default executor, which JupyterHub uses too), and the caller stops
waiting after `timeout` seconds with a PoolUnavailable (HTTP 503).  The
thread itself ends when the database driver's own timeouts fire.
"""

from __future__ import annotations

import asyncio
import functools
from typing import Any, Callable

from .pool import PoolUnavailable
from .pool.executor import LEDGER_EXECUTOR as _EXECUTOR


async def ledger_call(fn: Callable[..., Any], *args, timeout: float, **kwargs) -> Any:
    """`fn(*args, **kwargs)` off the event loop; PoolUnavailable after `timeout` seconds."""
    loop = asyncio.get_running_loop()
    future = loop.run_in_executor(_EXECUTOR, functools.partial(fn, *args, **kwargs))
    try:
        return await asyncio.wait_for(future, timeout)
    except asyncio.TimeoutError:
        raise PoolUnavailable(
            f"The GPU ledger did not answer within {timeout:g} s; GPU servers cannot start or "
            "stop cleanly until it does. Try again in a minute, or ask an administrator."
        ) from None
