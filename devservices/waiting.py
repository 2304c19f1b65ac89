"""The one wait of the tests and the harness: poll something observable until it holds, with a deadline.

`until(predicate, timeout, what=...)` polls `predicate()` until it returns something truthy
(returned); `async_until` does the same on an event loop, for a condition another task brings
about.  When the deadline passes, the AssertionError says what was waited for (`what`, else the
predicate's own source line), for how long, and what `explain()` adds (a hub's log tail, the
state of the units being waited on), so a failure explains itself.  No test sleeps a fixed
time where such an event exists.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Callable
from typing import Any


def describe(predicate: Callable[[], Any]) -> str:
    """The predicate as its source says it (a lambda's line), else its name."""
    try:
        source = inspect.getsource(predicate).strip()
    except (OSError, TypeError):
        source = ""
    if source:
        line = " ".join(source.split())
        return line if len(line) <= 200 else line[:197] + "..."
    return getattr(predicate, "__qualname__", repr(predicate))


def timed_out(predicate: Callable[[], Any], timeout: float, what: str | None,
              explain: Callable[[], str] | None) -> AssertionError:
    message = f"timed out after {timeout:g} s waiting for {what or describe(predicate)}"
    if explain is not None:
        try:
            message += "\n" + explain()
        except Exception as exc:  # the explanation must not hide the timeout
            message += f"\n(explain() failed: {exc!r})"
    return AssertionError(message)


def until(predicate: Callable[[], Any], timeout: float = 30.0, what: str | None = None, interval: float = 0.1,
          explain: Callable[[], str] | None = None) -> Any:
    """Poll `predicate` until it returns something truthy (returned); AssertionError after `timeout` s."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise timed_out(predicate, timeout, what, explain)
        time.sleep(interval)


async def async_until(predicate: Callable[[], Any], timeout: float = 15.0, what: str | None = None,
                      interval: float = 0.01, explain: Callable[[], str] | None = None) -> Any:
    """`until` on the running event loop: the other tasks run between polls.  `predicate` may
    be a coroutine function (its result is awaited)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        value = predicate()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return value
        if loop.time() >= deadline:
            raise timed_out(predicate, timeout, what, explain)
        await asyncio.sleep(interval)
