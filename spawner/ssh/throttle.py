"""Slowing down password and key guessing: per source address and per account, in bounded memory.

Each failure raises a counter for the address it came from and for the account it named.
Once a counter holds `free` failures, every further attempt from that address, or for that
account, waits `delay * 2**(n - free)` seconds (at most `max_delay`) before it is
checked.  A counter fades by one every `window` seconds without a failure, and a failure
counts until it has wholly faded: three failures a moment ago are three, not 2.999 rounded
down to two.  At most `capacity` counters are kept; the one longest without a failure goes
first.

The keys are the callers' (gateway.py): the source address (an IPv6 one by its /64) and the
account by the authenticator's own normalised name, so neither a new address in the same
/64 nor another spelling of the same name starts a fresh count.
"""

from __future__ import annotations

import ipaddress
import math
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
        # A failure counts until it has faded out entirely (a hair of float error aside).
        n = math.ceil(failures - 1e-9)
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


def source_key(address: str) -> str:
    """The throttle's and the connection limits' name of a source address: an IPv4 address
    as itself (an IPv4-mapped IPv6 one too), an IPv6 address by its /64 (one host, or one
    customer of a provider, holds a whole /64 and can pick a fresh address from it for every
    connection)."""
    try:
        ip = ipaddress.ip_address(address.split("%", 1)[0])
    except ValueError:
        return address
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        return str(ipaddress.IPv6Network((ip, 64), strict=False))
    return str(ip)
