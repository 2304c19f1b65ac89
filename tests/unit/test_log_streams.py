"""Log followers of the gpu-pool service, without Docker: the buffer stays bounded behind a
reader that stalls, closing ends the stream's thread, and the caps say what they are."""

from __future__ import annotations

import asyncio
import threading

import pytest

from devservices.waiting import async_until as until
from spawner.poolpage.handlers.log_streams import Followers, LogFollow, TooMany
from spawner.poolpage.limits import PoolServiceLimits


class EndlessLog:
    """A Docker log stream of a job that prints without end (close() ends it, as Docker's does)."""

    def __init__(self):
        self.read = 0
        self.closed = threading.Event()

    def __iter__(self):
        return self

    def __next__(self):
        if self.closed.is_set():
            raise StopIteration
        self.read += 1
        return b"x" * 1024

    def close(self):
        self.closed.set()


def test_a_stalled_reader_holds_a_bounded_buffer_and_closing_ends_the_thread():
    source = EndlessLog()

    async def main():
        follow = LogFollow(source, chunks=4)
        # Nobody reads: the pump fills the buffer and waits with the next frame in hand.
        await until(lambda: follow.buffer.full() and source.read == 5)
        assert follow.thread.is_alive() and source.read == 5
        assert await follow.next_chunk() == b"x" * 1024  # taking one makes room for one
        await until(lambda: source.read == 6 and follow.buffer.full())
        follow.close()  # the reader left
        assert await follow.next_chunk() is None
        await until(lambda: not follow.thread.is_alive())
        return follow

    asyncio.run(main())
    assert source.closed.is_set() and source.read <= 7


def test_a_log_that_ends_ends_the_follow():
    async def main():
        follow = LogFollow(iter([b"a", b"b"]), chunks=1)
        got = [await follow.next_chunk() for _ in range(3)]
        await until(lambda: not follow.thread.is_alive())
        return got

    assert asyncio.run(main()) == [b"a", b"b", None]


def test_followers_are_capped_per_user_per_job_and_in_all():
    followers = Followers(PoolServiceLimits(log_followers_per_user=2, log_followers_per_job=3,
                                            log_followers_total=4))
    followers.take(1, "pat")
    followers.take(1, "pat")
    with pytest.raises(TooMany, match=r"You already follow 2 job logs.*log_followers_per_user = 2"):
        followers.take(2, "pat")
    followers.take(1, "ada")
    with pytest.raises(TooMany, match=r"Job 1.s log already has 3 followers.*log_followers_per_job = 3"):
        followers.take(1, "bob")
    followers.take(2, "bob")
    with pytest.raises(TooMany, match=r"already follows 4 job logs, its limit.*log_followers_total = 4"):
        followers.take(3, "cat")
    followers.give_back(1, "pat")
    followers.take(2, "pat")  # a place freed is a place again
    for job, user in [(1, "pat"), (2, "pat"), (1, "ada"), (2, "bob")]:
        followers.give_back(job, user)
    assert followers.total == 0 and not followers.by_user


def test_a_follower_of_a_queued_job_reads_the_ledger_only_when_the_runner_moves_it():
    from types import SimpleNamespace

    from spawner.jobs.runner import JobRunner
    from spawner.pool.ledger.job_records import QUEUED, RUNNING, STARTING
    from spawner.poolpage.handlers.jobs import JobLogsAPI

    states = iter([STARTING, RUNNING])
    reads = []

    async def main():
        runner = SimpleNamespace(_moves={})
        runner.moved = JobRunner.moved.__get__(runner)
        runner.tell = JobRunner._tell.__get__(runner)

        def get(job_id):
            reads.append(job_id)
            return SimpleNamespace(id=job_id, state=next(states))

        async def call(fn, *args):
            return fn(*args)

        runner.ledger = SimpleNamespace(get=get)
        handler = SimpleNamespace(runner=runner, _gone=asyncio.Event(), call=call)
        waiting = asyncio.ensure_future(JobLogsAPI.until_it_runs(handler, SimpleNamespace(id=7, state=QUEUED)))
        await until(lambda: 7 in runner._moves)  # it waits on the runner's news, having read nothing
        assert reads == []
        runner.tell(7)  # leased: STARTING
        await until(lambda: reads == [7] and 7 in runner._moves)
        runner.tell(7)  # started: RUNNING
        return await waiting

    assert asyncio.run(main()).state == RUNNING
    assert reads == [7, 7]


class Frames:
    """A Docker log stream that yields these frames, waiting for `go` before each, then ends."""

    def __init__(self, frames, go=None):
        self.frames = list(frames)
        self.go = go
        self.closed = threading.Event()

    def __iter__(self):
        for frame in self.frames:
            if self.go is not None:
                self.go.wait(10)
            if self.closed.is_set():
                return
            yield frame

    def close(self):
        self.closed.set()


def test_a_clusters_follow_marks_whole_lines_with_their_worker_and_ends_when_every_worker_has():
    from spawner.poolpage.handlers.log_streams import MergedFollow

    # Frames end mid-line; the last line of worker 1 has no newline at all.
    chief = Frames([b"TensorFlow 2", b".18 on CPU\nepoch 1/1", b": 3.2 s\n"])
    other = Frames([b"TensorFlow 2.18 on CPU\n", b"test accuracy 0.9; worker 1 leaves the model"])

    async def main():
        merged = MergedFollow([(0, LogFollow(chief, chunks=4)), (1, LogFollow(other, chunks=4))])
        out = b""
        while (chunk := await merged.next_chunk()) is not None:
            assert chunk.endswith(b"\n") and chunk.startswith(b"[worker ")  # whole lines only
            out += chunk
        merged.close()
        return out.decode()

    out = asyncio.run(main())
    lines = out.splitlines()
    assert sorted(lines) == sorted([
        "[worker 0] TensorFlow 2.18 on CPU", "[worker 0] epoch 1/1: 3.2 s",
        "[worker 1] TensorFlow 2.18 on CPU", "[worker 1] test accuracy 0.9; worker 1 leaves the model"])
    # Each worker's lines keep their order.
    assert [l for l in lines if l.startswith("[worker 0]")] == ["[worker 0] TensorFlow 2.18 on CPU",
                                                               "[worker 0] epoch 1/1: 3.2 s"]


def test_closing_a_clusters_follow_ends_every_workers_stream_and_a_line_without_end_comes_in_pieces():
    from spawner.poolpage.handlers.log_streams import LINE_PIECE_BYTES, MergedFollow

    endless = [EndlessLog(), EndlessLog()]  # 1 KiB frames without a newline, without end

    async def main():
        follows = [LogFollow(s, chunks=2) for s in endless]
        merged = MergedFollow(list(enumerate(follows)))
        first = await merged.next_chunk()  # a piece: the partial line never grows past its bound
        merged.close()
        assert await merged.next_chunk() is None
        await until(lambda: not any(f.thread.is_alive() for f in follows))
        return first

    first = asyncio.run(main())
    pieces = first.split(b"\n")[:-1]
    assert pieces and all(p.startswith(b"[worker ") and len(p) <= LINE_PIECE_BYTES + 11 for p in pieces)
    assert all(s.closed.is_set() for s in endless)
