"""What GPUPool's facade (gpupool.py) supplies to each of its parts, declared once.

The parts (leasing, admin_actions, fair_use, pool_queries, gpu_readings) are mixins of
`GPUPool`; these are the facade's members they all use, for the type checker only.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .store import Store


class PoolPart:
    """A part of GPUPool: the facade gives it the ledger's store, the log and the ways to read
    and write (a transaction, retried) and to wake the waiters."""

    _store: Store
    log: logging.Logger
    _write: Callable[..., Any]
    _read: Callable[..., Any]
    _notify: Callable[[], None]
