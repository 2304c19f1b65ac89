"""Slowing down password and key guessing: per source address and per account, in bounded memory.

Each failure raises a counter for the address it came from and for the account it named.
Once a counter holds `free` failures, every further attempt from that address, or for that
account, waits `delay * 2**(n - free)` seconds (at most `max_delay`) before it is
checked.  A counter fades by one every `window` seconds without a failure.  At most
`capacity` counters are kept; the one longest without a failure goes first.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from dataclasses import dataclass


@dataclass
class _Count:
    failures: float
    last: float


class FailureThrottle:
    def __init__(self, free: int, delay: float, max_delay: float, window: float, capacity: int,
                 clock=time.monotonic):
        self.free = free
        self.delay = delay
        self.max_delay = max_delay
        self.window = window
        self.capacity = capacity
        self.clock = clock
        self._counts: OrderedDict[str, _Count] = OrderedDict()

    def __len__(self) -> int:
        return len(self._counts)

    def _failures(self, key: str, now: float) -> float:
        count = self._counts.get(key)
        if count is None:
            return 0.0
        faded = count.failures - (now - count.last) / self.window
        if faded <= 0:
            del self._counts[key]
            return 0.0
        return faded

    def wait_for(self, *keys: str) -> float:
        """Seconds the next attempt naming these keys (address, account) waits."""
        now = self.clock()
        failures = max((self._failures(k, now) for k in keys), default=0.0)
        n = int(failures)
        if n == 0 or n < self.free:
            return 0.0
        return min(self.max_delay, self.delay * 2 ** min(n - self.free, 32))

    def failed(self, *keys: str) -> None:
        now = self.clock()
        for key in keys:
            n = self._failures(key, now)
            self._counts[key] = _Count(n + 1, now)
            self._counts.move_to_end(key)
        while len(self._counts) > self.capacity:
            self._counts.popitem(last=False)
