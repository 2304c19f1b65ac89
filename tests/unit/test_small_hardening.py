"""Small hardening found in one review (issue 22, item 10), without services: CSV cells a
spreadsheet would run, terminal escapes in `gpu-pool exec`'s output, argv kept out of logs."""

from __future__ import annotations

import csv
import io

import pytest

from devservices.waiting import async_until
from spawner.cli import exec_client as client
from spawner.poolpage import views


@pytest.mark.parametrize("name", ["=cmd|' /C calc'!A0", "+1", "-1", "@SUM(1)", "\t=1+1", "\r=1+1"])
def test_usage_csv_defuses_every_cell_a_spreadsheet_would_run(name):
    rows = list(csv.reader(io.StringIO(views.usage_csv({"users": {name: 1.0}, "groups": {name: 2.0}}), newline="")))
    assert [r[1] for r in rows[1:]] == ["'" + name] * 2, rows
    assert rows[1][0] == "user" and rows[2][0] == "group"


def test_usage_csv_leaves_plain_names_alone():
    rows = list(csv.reader(io.StringIO(views.usage_csv({"users": {"alice": 1.0, "a-b": 2.0}}), newline="")))
    assert [r[1] for r in rows[1:]] == ["alice", "a-b"]


HOSTILE_OUTPUT = ("ok\x1b[2J\x1b[H\x1b]0;owned title\x07\x1b]8;;http://x\x1b\\link\x1b]8;;\x1b\\"
                  "\x1b[31mred\x1b[0m\rover\x08\x9b31m\x1bPdcs\x1b\\\x1b(0tail\tTAB\n")


def test_exec_output_is_printed_without_terminal_escapes():
    data = {"target": "users pat", "timeout": 5, "results": [
        {"server": "pat\x1b[8m", "exit_code": 0, "timed_out": False, "error": "bad\x1b[5m",
         "output": HOSTILE_OUTPUT, "truncated": False}]}
    text = client.render(data)
    assert not any(ch in text for ch in "\x1b\x07\x08\r\x9b"), repr(text)
    assert "ok" in text and "link" in text and "red" in text and "over" in text and "tail\tTAB" in text
    assert "owned title" not in text and "[2J" not in text and "31m" not in text
    assert "== pat (exit 0: bad)" in text


class _SlowDocker:
    """A spawner's `docker` whose container creation waits until the test lets it finish."""

    def __init__(self, states=()):
        self.calls: list = []
        self.created = None
        self.states = list(states)

    async def docker(self, method, *args, **kwargs):
        import asyncio

        self.calls.append((method, args))
        if method == "create_container":
            self.created = asyncio.get_running_loop().create_future()
            return await asyncio.shield(self.created)
        if method == "inspect_container":
            return {"State": self.states.pop(0) if len(self.states) > 1 else self.states[0]}
        return None


class _SlowClient:
    """Docker's API client, whose container creation waits until the test lets it finish."""

    def __init__(self):
        import threading

        self.go, self.asked, self.removed = threading.Event(), threading.Event(), threading.Event()
        self.calls: list = []

    def create_container(self, **kwargs):
        self.asked.set()
        self.go.wait(10)
        self.calls.append("create_container")
        return {"Id": "helper-1"}

    def remove_container(self, container_id, force=False):
        self.calls.append(("remove_container", container_id))
        self.removed.set()


@pytest.mark.parametrize("cancels", [1, 2])
def test_a_helper_created_while_its_spawn_is_cancelled_is_removed_once_docker_made_it(cancels):
    import asyncio
    from types import SimpleNamespace

    from spawner.engines.common.homes import create_helper

    client = _SlowClient()

    async def scenario():
        spawn = asyncio.create_task(create_helper(SimpleNamespace(client=client), image="img", command=["true"]))
        await async_until(client.asked.is_set, what="Docker asked to create the helper")
        for _ in range(cancels):  # the hub shuts down while Docker creates the helper (twice: wait_for's too)
            spawn.cancel()
            await asyncio.sleep(0.01)  # not a wait: the cancel lands before the next one
        with pytest.raises(asyncio.CancelledError):
            await spawn

    asyncio.run(scenario())  # the loop is gone; Docker answers only now
    client.go.set()
    assert client.removed.wait(10)
    assert client.calls == ["create_container", ("remove_container", "helper-1")]


def test_a_helpers_exit_is_looked_at_without_holding_a_docker_thread():
    import asyncio

    from spawner.engines.common.homes import wait_for_exit

    spawner = _SlowDocker(states=[{"Status": "running"}, {"Status": "running"}, {"Status": "exited", "ExitCode": 3}])
    assert asyncio.run(wait_for_exit(spawner, "h", timeout=10, every=0.01)) == 3
    assert {c[0] for c in spawner.calls} == {"inspect_container"}  # never Docker's blocking `wait`
    stuck = _SlowDocker(states=[{"Status": "running"}])
    assert asyncio.run(wait_for_exit(stuck, "h", timeout=0.05, every=0.01)) is None
