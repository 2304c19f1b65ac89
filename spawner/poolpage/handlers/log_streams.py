"""Following a job's log: bounded, capped, and ended when the reader goes.

`Followers` counts who follows what (per job, per user, in all) and refuses one more with a
message naming the limit.  `LogFollow` reads one log stream (the job engine's `open_follow`) on a thread of its own
into a bounded buffer: a reader that reads slowly makes the thread wait (Docker then waits),
never the buffer grow; `close()` (the reader went away, or stalled past its timeout) shuts
the Docker stream down, which ends the thread.  Docker is never waited on from the event loop:
the client and the stream are opened on a thread, within a timeout.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Protocol

from ..limits import PoolServiceLimits


class LogSource(Protocol):
    """What LogFollow reads: Docker's CancellableStream, or any iterator of bytes with close()."""

    def __iter__(self) -> Iterator[bytes]: ...

    def close(self) -> None: ...


class TooMany(Exception):
    """One follower more than a limit allows (HTTP 429); str() says which and what to do."""


class Followers:
    """This service's log followers, by job and by user."""

    def __init__(self, limits: PoolServiceLimits):
        self.limits = limits
        self.by_job: Counter = Counter()
        self.by_user: Counter = Counter()

    @property
    def total(self) -> int:
        return sum(self.by_job.values())

    def take(self, job_id: int, user: str) -> None:
        """Count one follower of `job_id` by `user`, or raise TooMany."""
        lim = self.limits
        if self.by_user[user] >= lim.log_followers_per_user:
            raise TooMany(f"You already follow {self.by_user[user]} job logs at once, the most one user may "
                          f"(PoolServiceLimits.log_followers_per_user = {lim.log_followers_per_user}); "
                          "close one, or read the log without follow=1")
        if self.by_job[job_id] >= lim.log_followers_per_job:
            raise TooMany(f"Job {job_id}'s log already has {self.by_job[job_id]} followers, the most one job may "
                          f"have (PoolServiceLimits.log_followers_per_job = {lim.log_followers_per_job}); "
                          "close one, or read the log without follow=1")
        if self.total >= lim.log_followers_total:
            raise TooMany(f"The service already follows {self.total} job logs, its limit "
                          f"(PoolServiceLimits.log_followers_total = {lim.log_followers_total}); "
                          "try again in a minute, or read the log without follow=1")
        self.by_job[job_id] += 1
        self.by_user[user] += 1

    def give_back(self, job_id: int, user: str) -> None:
        for counter, key in ((self.by_job, job_id), (self.by_user, user)):
            counter[key] -= 1
            if counter[key] <= 0:
                del counter[key]


_END = object()


class LogFollow:
    """One follower's stream: `await next_chunk()` until None (the log ended), then `close()`.

    `source` is a Docker CancellableStream (or any iterator with close()); `done` is called on
    the pump thread when it ends (tests and benchmarks watch it).
    """

    def __init__(self, source: LogSource, chunks: int, done: Callable[[], None] | None = None,
                 client=None):
        self.source = source
        self.client = client  # the Docker API client of the stream, closed when the pump ends
        self.buffer: asyncio.Queue = asyncio.Queue(maxsize=chunks)
        self.loop = asyncio.get_running_loop()
        self.closed = threading.Event()
        self.done = done
        self.thread = threading.Thread(target=self._pump, daemon=True, name="gpu-pool-log-follow")
        self.thread.start()

    def _put(self, item) -> bool:
        """Into the buffer, waiting while it is full; False once the follow is closed."""
        future = asyncio.run_coroutine_threadsafe(self.buffer.put(item), self.loop)
        while True:
            try:
                future.result(timeout=0.5)
                return True
            except concurrent.futures.TimeoutError:
                if self.closed.is_set():
                    future.cancel()
                    return False
            except (concurrent.futures.CancelledError, RuntimeError):  # the loop stopped
                return False

    def _pump(self) -> None:
        try:
            for chunk in self.source:
                if self.closed.is_set() or not self._put(chunk):
                    break
        except Exception:
            pass  # the stream was shut down, or Docker went away: the follow ends
        finally:
            self._close_source()
            if self.client is not None:
                with contextlib.suppress(Exception):
                    self.client.close()
            if not self.closed.is_set():
                self._put(_END)
            if self.done is not None:
                self.done()

    def _close_source(self) -> None:
        with contextlib.suppress(Exception):
            self.source.close()

    async def next_chunk(self) -> bytes | None:
        item = await self.buffer.get()
        return None if item is _END else item

    def close(self) -> None:
        """The reader is gone: shut the Docker stream down (the pump thread then ends)."""
        if self.closed.is_set():
            return
        self.closed.set()
        self._close_source()
        while not self.buffer.empty():  # a pump waiting for room gets it, sees `closed`, and ends
            self.buffer.get_nowait()
        self.buffer.put_nowait(_END)  # and the reader's next_chunk() says the follow is over


# A line longer than this (a progress bar without newlines) is passed on in pieces, each
# marked: a follower's partial lines cost at most this much per worker.
LINE_PIECE_BYTES = 16 * 1024


class WorkerLines:
    """One worker's log frames cut into whole lines, each marked `[worker i] ` (as the merged
    log that is not followed marks them); a frame may end mid-line, the rest waits for the next."""

    def __init__(self, index: int):
        self.mark = f"[worker {index}] ".encode()
        self.partial = b""

    def feed(self, chunk: bytes) -> bytes:
        *lines, self.partial = (self.partial + chunk).split(b"\n")
        while len(self.partial) > LINE_PIECE_BYTES:
            lines.append(self.partial[:LINE_PIECE_BYTES])
            self.partial = self.partial[LINE_PIECE_BYTES:]
        return b"".join(self.mark + line + b"\n" for line in lines)

    def rest(self) -> bytes:
        """What is left when the worker's log ends (its last line had no newline)."""
        rest, self.partial = self.partial, b""
        return self.mark + rest + b"\n" if rest else b""


class MergedFollow:
    """Every worker's follow (LogFollow) as one: whole lines, each marked with its worker, in
    the order they arrive; `next_chunk()` is None once every worker's log has ended."""

    def __init__(self, follows: list[tuple[int, LogFollow]]):
        self.follows = dict(follows)
        self.lines = {index: WorkerLines(index) for index in self.follows}
        self.waiting: dict[int, asyncio.Future] = {}
        self.closed = False

    async def next_chunk(self) -> bytes | None:
        while not self.closed:
            for index, follow in self.follows.items():
                if index not in self.waiting:
                    self.waiting[index] = asyncio.ensure_future(follow.next_chunk())
            if not self.waiting:
                return None
            await asyncio.wait(self.waiting.values(), return_when=asyncio.FIRST_COMPLETED)
            out = []
            for index, future in sorted(self.waiting.items()):
                if not future.done():
                    continue
                del self.waiting[index]
                chunk = future.result()
                if chunk is None:  # this worker's log ended
                    out.append(self.lines[index].rest())
                    del self.follows[index]
                else:
                    out.append(self.lines[index].feed(chunk))
            if joined := b"".join(out):
                return joined
        return None

    def close(self) -> None:
        """The reader is gone (or the stream ended): close every worker's follow."""
        self.closed = True
        for future in self.waiting.values():
            future.cancel()
        self.waiting.clear()
        for follow in self.follows.values():
            follow.close()
