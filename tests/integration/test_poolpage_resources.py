"""The gpu-pool service holds the same resources after hundreds of requests as before them:
threads, ledger connections (a real hub starts it; the ledger is a real PostgreSQL).

The service reads GPU utilisation as on a Swarm (GPUHUB_INVENTORY=swarm: the agents' readings
in the ledger), the setting under which every page view used to make a new ledger (its engine,
its schema write, and a watchdog thread that never ended).
"""

from __future__ import annotations

import os
from pathlib import Path

from sqlalchemy.engine import make_url

from ..fixtures.hub import Hub, wait_for
from .test_poolpage import page_api, wait_for_page

REQUESTS = 200

SWARM_READER = """
for _service in c.JupyterHub.services:
    if _service["name"] == "gpu-pool":
        _service["environment"]["GPUHUB_INVENTORY"] = "swarm"
"""


def children(pid: int) -> list[int]:
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                out.append(int(entry))
    return out


def service_pid(hub: Hub) -> int:
    """The gpu-pool service's process (the hub's child running spawner.poolpage)."""
    def find():
        for child in children(hub.process.pid):
            try:
                if b"spawner.poolpage" in Path(f"/proc/{child}/cmdline").read_bytes():
                    return child
            except OSError:
                pass
        return None
    return wait_for(find, what="the gpu-pool service's process", hub=hub)


def threads(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/task"))


def connections_to(pid: int, port: int) -> int:
    """TCP connections of process `pid` to `port` on this machine (its ledger connections)."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    count = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            remote_port = int(fields[2].rsplit(":", 1)[1], 16)
            if remote_port == port and fields[9] in inodes and fields[3] == "01":  # ESTABLISHED
                count += 1
    return count


def test_page_views_leave_no_threads_or_ledger_connections_behind(make_hub, postgres_database):
    hub = make_hub(SWARM_READER, env={"GPUHUB_POOL_DB_URL": postgres_database, "GPUHUB_JOBS": "false"})
    hub.create_user("pat")
    token = hub.user_token("pat")
    wait_for_page(hub, token)
    hub.start_server("pat", {"profile": "tf-gpu-1"})  # a lease: the page shows more
    pid = service_pid(hub)
    port = make_url(postgres_database).port
    paths = ["", "api/wait"]
    for i in range(20):  # warm up: the thread pools' threads, the engine's connection
        assert page_api(hub, "GET", paths[i % 2], token).status_code == 200
    before = threads(pid), connections_to(pid, port)

    for i in range(REQUESTS):
        r = page_api(hub, "GET", paths[i % 2], token)
        assert r.status_code == 200, r.text[:300]

    after = threads(pid), connections_to(pid, port)
    assert after[0] <= before[0] + 2, f"threads {before[0]} -> {after[0]} after {REQUESTS} requests"
    assert after[1] <= before[1] + 1, f"ledger connections {before[1]} -> {after[1]} after {REQUESTS} requests"


def test_every_thread_the_ledger_starts_ends_with_close(postgres_database):
    import threading

    from spawner.inventory import SimulatedInventory
    from spawner.pool import GPUPool

    before = set(threading.enumerate())
    pool = GPUPool(inventory=SimulatedInventory(count=2, host="node-1"), db_url=postgres_database)
    pool.release(pool.try_acquire("alice", "", 1).id)  # PostgreSQL calls: its watchdog runs
    started = [t for t in threading.enumerate() if t not in before]
    assert started, "no thread to check: the ledger started none"
    pool.close()
    assert [t.name for t in started if t.is_alive()] == []
    # Used again, it starts what it needs again, and ends it again.
    pool.release(pool.try_acquire("alice", "", 1).id)
    pool.close()
    assert [t.name for t in threading.enumerate() if t not in before and t.is_alive()] == []
