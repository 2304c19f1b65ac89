"""The per-node GPU agent as a real process on a real PostgreSQL ledger.

`gpu-pool agent` runs as a subprocess with the simulated inventory (its
utilization file is the only stand-in: there is no GPU here) and writes its
readings to PostgreSQL; the hub's SwarmInventory and the idle culler (its
GPU-idle rule, with `--inventory=swarm`) read them back, and treat them as
unknown once the agent has stopped and they went stale.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from datetime import timedelta

from devservices.waiting import until
from spawner.culling import GPUIdleCuller
from spawner.inventory import SimulatedInventory
from spawner.inventory.swarm import SwarmInventory
from spawner.pool import GPUPool
from tests.fixtures.postgres import create_database

NODE = "gpu-node-a"
MAX_AGE = 2.0


def start_agent(tmp_path, url: str, utilization_file) -> subprocess.Popen:
    secret = tmp_path / "ledger-url"  # as a Docker secret hands it over
    secret.write_text(url + "\n")
    secret.chmod(0o600)
    log = (tmp_path / "agent.log").open("w")
    agent = subprocess.Popen(
        [sys.executable, "-m", "spawner.cli", "agent", "--db-url-file", str(secret), "--inventory", "simulated",
         "--host", NODE, "--simulated-gpus", "2", "--utilization-file", str(utilization_file), "--interval", "0.3"],
        stdout=log, stderr=subprocess.STDOUT, text=True, env=dict(os.environ))
    agent.log_path = tmp_path / "agent.log"  # type: ignore[attr-defined]
    return agent


def wait_for(what, predicate, timeout=30.0):
    return until(predicate, timeout, what)


def stop(agent: subprocess.Popen) -> tuple[int, str]:
    if agent.poll() is None:
        agent.send_signal(signal.SIGTERM)
    try:
        agent.wait(timeout=20)
    except subprocess.TimeoutExpired:
        agent.kill()
        agent.wait()
        raise AssertionError(f"the agent ignored SIGTERM:\n{agent.log_path.read_text()}") from None
    return agent.returncode, agent.log_path.read_text()


def gpu_server(uuids):
    return {"name": "", "url": "/user/alice/",
            "state": {"gpu_lease_id": 1, "gpu_uuids": list(uuids), "gpu_host": NODE}}


def test_agent_readings_reach_swarm_inventory_and_the_culler_then_go_stale(
        tmp_path, postgres_database, monkeypatch):
    uuids = [SimulatedInventory.uuid_for(NODE, i) for i in range(2)]
    util = tmp_path / "utilization.json"
    util.write_text(json.dumps({uuids[0]: 90, uuids[1]: 70}))
    pool = GPUPool(db_url=postgres_database)
    swarm = SwarmInventory(reading_max_age=MAX_AGE)
    swarm.use_readings(pool.gpu_readings)
    monkeypatch.setenv("GPUHUB_POOL_DB_URL", postgres_database)
    culler = GPUIdleCuller()
    culler.parse_command_line(["--inventory=swarm", "--gpu-idle-percent=5", "--gpu-idle-seconds=0",
                               f"--reading-max-age={MAX_AGE:g}"])
    policy = culler.cull_arbiter_hook

    agent = start_agent(tmp_path, postgres_database, util)
    try:
        wait_for("the agent's first readings", lambda: swarm.utilization(uuids[0], host=NODE) == 90.0)
        assert swarm.utilization(uuids[1], host=NODE) == 70.0
        assert {r.cuda_version for r in pool.gpu_readings(60).values()} == {"12.4"}
        # Busy GPUs: the GPU-idle rule keeps the server (it is active, so no timeout either).
        assert policy.decide(timedelta(seconds=1), gpu_server(uuids)).cull is False

        # The GPUs go idle: the next readings say so, and the rule culls.
        util.write_text(json.dumps({uuids[0]: 0, uuids[1]: 1}))
        wait_for("the idle readings", lambda: swarm.utilization(uuids[0], host=NODE) == 0.0)
        verdict = policy.decide(timedelta(seconds=1), gpu_server(uuids))
        assert verdict.cull is True and "under 5%" in verdict.reason
    finally:
        code, out = stop(agent)
    assert code == 0, out
    assert "Stopped" in out

    # The agent is gone: its last readings age past MAX_AGE and read as unknown, which never culls.
    wait_for("the readings to go stale", lambda: swarm.utilization(uuids[0], host=NODE) is None,
             timeout=MAX_AGE + 15)
    assert policy.decide(timedelta(seconds=1), gpu_server(uuids)).cull is False
    assert pool.gpu_readings(3600)  # still in the ledger, only too old to count
    pool.close()


def test_agent_survives_an_unreachable_ledger_and_reports_once_it_is_there(
        tmp_path, postgres_server, monkeypatch):
    # A database that does not exist yet: every write fails until it is created.
    name = f"agent_late_{os.getpid()}_{int(time.time() * 1000) % 10**9}"
    url = postgres_server.url.rsplit("/", 1)[0] + "/" + name
    util = tmp_path / "utilization.json"
    util.write_text(json.dumps({}))
    agent = start_agent(tmp_path, url, util)
    try:
        # It failed to report (and says so once); the readings below prove it kept retrying.
        wait_for("the failed report", lambda: "The GPU ledger is unreachable" in agent.log_path.read_text()
                 or agent.poll() is not None)
        assert agent.poll() is None, "the agent exited on an unreachable ledger"
        assert create_database(postgres_server, name) == url
        pool = GPUPool(db_url=url)
        readings = wait_for("readings once the ledger exists", lambda: pool.gpu_readings(60))
        assert {k[0] for k in readings} == {NODE} and len(readings) == 2
        pool.close()
    finally:
        code, out = stop(agent)
    assert code == 0, out
    assert "unreachable" in out
    assert out.count("WARNING") == 1, out  # one warning for the outage, not one per try
    assert "Reporting 2 GPU(s)" in out
    assert postgres_server.password not in out
