"""The per-node GPU agent's loop and the readings' staleness rule (SQLite ledger, simulated GPUs).

The agent as a real process against PostgreSQL, read back by SwarmInventory
and the culler's reader, runs in tests/integration/test_gpu_agent.py.
"""

from __future__ import annotations

import json
import logging
import signal
import threading
from datetime import timedelta

import pytest
from traitlets import TraitError

from devservices.waiting import until
from spawner.cli.agent import Agent
from spawner.culling.culler import CullerUtilization, GPUIdleCuller
from spawner.inventory import SimulatedInventory
from spawner.inventory.swarm import SwarmInventory
from spawner.pool import GPUPool, InvalidRequest
from spawner.settings import load_settings
from tests.unit.test_swarm import Manager, node


@pytest.fixture
def pool(tmp_path):
    p = GPUPool(db_url=f"sqlite:///{tmp_path / 'ledger.sqlite'}")
    yield p
    p.close()


@pytest.fixture
def node_a(tmp_path):
    path = tmp_path / "utilization.json"
    inv = SimulatedInventory(count=2, utilization_file=str(path), cuda_version="12.2")
    inv.host = "node-a"
    return inv, path


def swarm(pool, nodes=None, **kwargs):
    inv = SwarmInventory(client=Manager(nodes or []), **kwargs)
    inv.use_readings(pool.gpu_readings)
    return inv


def age(pool, seconds):
    """Move every reading `seconds` into the past (as if the agent had stopped then)."""
    from sqlalchemy import update

    from spawner.pool import readings_table

    def move(conn):
        for r in conn.execute(readings_table.select()).all():
            conn.execute(update(readings_table)
                         .where((readings_table.c.host == r.host) & (readings_table.c.uuid == r.uuid))
                         .values(at=r.at - timedelta(seconds=seconds)))
    pool._write(move)


def test_one_pass_records_each_gpus_utilization_and_the_drivers_cuda_version(pool, node_a):
    inv, path = node_a
    gpu0, gpu1 = (g.uuid for g in inv.gpus())
    path.write_text(json.dumps({gpu0: 87, gpu1: 3}))
    assert Agent(pool, inv, interval=1).run_once() is True
    readings = pool.gpu_readings(60)
    assert {k: r.utilization for k, r in readings.items()} == {("node-a", gpu0): 87.0, ("node-a", gpu1): 3.0}
    assert {r.cuda_version for r in readings.values()} == {"12.2"}
    # The next pass replaces the readings: one row per GPU, the newest.
    path.write_text(json.dumps({gpu0: 0, gpu1: 50}))
    Agent(pool, inv, interval=1).run_once()
    assert {k[1]: r.utilization for k, r in pool.gpu_readings(60).items()} == {gpu0: 0.0, gpu1: 50.0}


def test_memory_in_use_travels_from_the_node_to_the_hubs_readers(pool, node_a):
    inv, path = node_a
    gpu0, gpu1 = (g.uuid for g in inv.gpus())
    path.write_text(json.dumps({gpu0: {"utilization": 37, "memory_used_mib": 1200}, gpu1: 5}))
    Agent(pool, inv, interval=1).run_once()
    readings = pool.gpu_readings(60)
    assert {k[1]: (r.utilization, r.memory_used_mib) for k, r in readings.items()} == {
        gpu0: (37.0, 1200), gpu1: (5.0, None)}
    # SwarmInventory and the pool page's reader see what the agent wrote.
    inv_swarm = swarm(pool)
    assert inv_swarm.memory_used_mib(gpu0, host="node-a") == 1200
    assert inv_swarm.memory_used_mib(gpu1, host="node-a") is None
    reader = CullerUtilization("swarm", 0, "", logging.getLogger("test"), readings=pool.gpu_readings)
    assert reader.reading("node-a", gpu0) == (37.0, 1200)
    assert reader.reading("node-b", gpu0) == (None, None)  # no reading from that node: unknown
    age(pool, 3600)
    assert inv_swarm.memory_used_mib(gpu0, host="node-a") is None  # stale: unknown


def test_a_reading_may_be_a_percent_or_utilization_and_memory(pool):
    pool.record_readings("node-a", {"GPU-1": {"utilization": 10, "memory_used_mib": 2048}, "GPU-2": 3,
                                    "GPU-3": {"utilization": None, "memory_used_mib": None}})
    got = {k[1]: (r.utilization, r.memory_used_mib) for k, r in pool.gpu_readings(60).items()}
    assert got == {"GPU-1": (10.0, 2048), "GPU-2": (3.0, None), "GPU-3": (None, None)}
    for bad in ({"GPU-1": {"utilization": 10, "memory_used_mib": -1}},
                {"GPU-1": {"utilization": 10, "memory_used_mib": "1 GiB"}},
                {"GPU-1": {"utilization": 10, "memory_used_mib": 2 ** 40}},
                {"GPU-1": {"utilization": 101}}, {"GPU-1": {"temperature": 80}}):
        with pytest.raises(InvalidRequest):
            pool.record_readings("node-a", bad)
    assert {k[1]: r.memory_used_mib for k, r in pool.gpu_readings(60).items()}["GPU-1"] == 2048  # unchanged


def test_an_unreadable_gpu_is_recorded_as_unknown_not_as_idle(pool, node_a):
    inv, path = node_a
    path.write_text("{not json")  # the simulated inventory reads None, like an NVML error
    Agent(pool, inv, interval=1).run_once()
    assert {r.utilization for r in pool.gpu_readings(60).values()} == {None}


def test_an_unreachable_ledger_is_logged_without_the_password_and_retried(node_a, caplog):
    inv, _ = node_a
    down = GPUPool(db_url="postgresql+psycopg://agent:pw-not-in-logs@127.0.0.1:1/ledger", connect_timeout=1)
    agent = Agent(down, inv, interval=0.05)
    caplog.set_level(logging.DEBUG, logger="gpu-pool.agent")
    assert agent.run_once() is False
    assert agent.run_once() is False  # no exception, ever: the loop goes on
    text = caplog.text
    assert "unreachable" in text and "pw-not-in-logs" not in text
    assert sum(r.levelno == logging.WARNING for r in caplog.records) == 1  # an outage is warned about once


def test_the_loop_runs_until_stopped_and_sigterm_stops_it(pool, node_a):
    inv, _ = node_a
    agent = Agent(pool, inv, interval=0.02)
    handlers = {}
    agent.stop_on_signals(install=lambda sig, fn: handlers.__setitem__(sig, fn))
    assert set(handlers) == {signal.SIGTERM, signal.SIGINT}
    thread = threading.Thread(target=agent.run)
    thread.start()
    try:
        until(lambda: pool.gpu_readings(60), timeout=10, interval=0.01, what="the agent's first reading")
    finally:
        handlers[signal.SIGTERM](signal.SIGTERM, None)
        thread.join(timeout=10)
    assert not thread.is_alive()


def test_bad_readings_are_refused_and_change_nothing(pool):
    pool.record_readings("node-a", {"GPU-1": 10}, "12.4")
    for bad in ({"GPU-1": 101}, {"GPU-1": -1}, {"GPU-1": float("nan")}, {"GPU-1": True}, {"GPU-1": "10"},
                {"": 10}, {"G" * 129: 10}, "GPU-1", {f"GPU-{i}": 1 for i in range(1025)}):
        with pytest.raises(InvalidRequest):
            pool.record_readings("node-a", bad)
    for host in ("", 7, "a\nb"):
        with pytest.raises(InvalidRequest):
            pool.record_readings(host, {"GPU-1": 5})
    with pytest.raises(InvalidRequest):
        pool.record_readings("node-a", {"GPU-1": 5}, "twelve")
    with pytest.raises(InvalidRequest):
        pool.gpu_readings(0)
    [reading] = pool.gpu_readings(60).values()
    assert (reading.utilization, reading.cuda_version) == (10.0, "12.4")


def test_swarm_inventory_reads_live_readings_and_treats_stale_ones_as_unknown(pool, node_a):
    inv, path = node_a
    gpu0 = inv.gpus()[0].uuid
    path.write_text(json.dumps({gpu0: 42}))
    Agent(pool, inv, interval=1).run_once()
    swarm_inv = swarm(pool, reading_max_age=30)
    assert swarm_inv.utilization(gpu0, host="node-a") == 42.0
    assert swarm_inv.utilization(gpu0) == 42.0
    assert swarm_inv.utilization(gpu0, host="node-b") is None  # (host, uuid) is the key
    age(pool, 31)
    assert swarm_inv.utilization(gpu0, host="node-a") is None
    assert swarm(pool, reading_max_age=60).utilization(gpu0, host="node-a") == 42.0


def test_swarm_inventory_without_readings_or_ledger_knows_no_utilization(node_a):
    inv, _ = node_a
    assert SwarmInventory(client=Manager([])).utilization(inv.gpus()[0].uuid) is None
    down = GPUPool(db_url="postgresql+psycopg://agent:pw@127.0.0.1:1/ledger", connect_timeout=1)
    assert swarm(down).utilization(inv.gpus()[0].uuid) is None
    with pytest.raises(TraitError):
        SwarmInventory(reading_max_age=0)


def test_the_pool_hands_its_readings_to_a_swarm_inventory(tmp_path, node_a):
    inv, _ = node_a
    swarm_inv = SwarmInventory(client=Manager([node("node-a", [g.uuid for g in inv.gpus()])]))
    p = GPUPool(db_url=f"sqlite:///{tmp_path / 'l.sqlite'}", inventory=swarm_inv)
    Agent(p, inv, interval=1).run_once()
    assert swarm_inv.utilization(inv.gpus()[1].uuid, host="node-a") == 0.0
    p.close()


def test_cuda_version_comes_from_the_label_else_from_the_agent(pool, node_a):
    inv, _ = node_a
    nodes = [node("node-a", [g.uuid for g in inv.gpus()]), node("node-b", ["GPU-b0"], labels={"gpu.cuda": "12.4"})]
    swarm_inv = swarm(pool, nodes)
    assert swarm_inv.cuda_driver_version() == (12, 4)  # node-a unknown yet
    Agent(pool, inv, interval=1).run_once()  # node-a's driver: 12.2
    assert swarm_inv.cuda_driver_version() == (12, 2)
    assert swarm_inv.cuda_driver_version("node-b") == (12, 4)
    age(pool, 3600)
    assert swarm_inv.cuda_driver_version("node-a") is None


def test_the_culler_reads_swarm_utilization_from_the_ledger(pool, node_a, monkeypatch):
    inv, path = node_a
    gpu0 = inv.gpus()[0].uuid
    path.write_text(json.dumps({gpu0: 77}))
    Agent(pool, inv, interval=1).run_once()
    monkeypatch.setenv("GPUHUB_POOL_DB_URL", pool.db_url)
    reader = CullerUtilization("swarm", 0, "", None, reading_max_age=5)
    assert reader("node-a", gpu0) == 77.0
    assert reader("node-b", gpu0) is None
    age(pool, 6)
    assert reader("node-a", gpu0) is None


def test_the_culler_turns_the_gpu_rule_on_with_swarm_and_gets_the_ledger_url():
    from traitlets.config import Config

    from spawner.settings.culler import configure_culler, render_hand_over
    from spawner.settings.services import set_hub_services

    app = GPUIdleCuller()
    app.parse_command_line(["--inventory=swarm", "--reading-max-age=45"])
    assert app.cull_arbiter_hook.gpu_rule_enabled
    assert app.cull_arbiter_hook.utilization.reading_max_age == 45
    url = "postgresql+psycopg://u:secret@db/gpupool"
    s = load_settings({"GPUHUB_DATA_DIR": "/nonexistent", "GPUHUB_SPAWNER": "swarm", "GPUHUB_POOL_DB_URL": url,
                       "GPUHUB_HUB_CONNECT_IP": "10.0.1.2"})
    assert s.gpu_idle_percent is None  # unset: the culler's own default, on with swarm
    c = Config()
    configure_culler(c, s)
    set_hub_services(c, s)
    [service] = [s for s in c.JupyterHub.services if s["name"] == "idle-culler"]
    assert service["environment"] == {"GPUHUB_POOL_DB_URL": url}
    hand_over = render_hand_over(c)
    assert json.loads(hand_over) == {"GPUIdleCuller": {"inventory": "swarm"}}
    assert GPUIdleCuller(config=Config(json.loads(hand_over))).gpu_idle_percent == 5.0
    assert not any("secret" in arg for arg in service["command"]) and "secret" not in hand_over


def test_a_version_5_ledger_gains_the_readings_table_in_place(tmp_path):
    import sqlalchemy as sa

    from spawner.pool import SCHEMA_VERSION

    url = f"sqlite:///{tmp_path / 'old.sqlite'}"
    GPUPool(db_url=url).gpus()
    engine = sa.create_engine(url)
    with engine.begin() as conn:
        conn.execute(sa.text("DROP TABLE gpu_pool_readings"))
        conn.execute(sa.text("UPDATE gpu_pool_meta SET value='5' WHERE key='schema_version'"))
    p = GPUPool(db_url=url)
    p.record_readings("node-a", {"GPU-1": 1.5})
    assert len(p.gpu_readings(60)) == 1
    with engine.begin() as conn:
        assert conn.execute(sa.text("SELECT value FROM gpu_pool_meta")).scalar() == str(SCHEMA_VERSION)
    p.close()
    engine.dispose()


def test_a_version_8_ledger_gains_the_readings_memory_column_in_place(tmp_path):
    import sqlalchemy as sa

    from spawner.pool import SCHEMA_VERSION

    url = f"sqlite:///{tmp_path / 'old.sqlite'}"
    old = GPUPool(db_url=url)
    old.record_readings("node-a", {"GPU-1": 7})
    old.close()
    engine = sa.create_engine(url)
    with engine.begin() as conn:
        conn.execute(sa.text("ALTER TABLE gpu_pool_readings DROP COLUMN memory_used_mib"))
        conn.execute(sa.text("UPDATE gpu_pool_meta SET value='8' WHERE key='schema_version'"))
    p = GPUPool(db_url=url)
    [kept] = p.gpu_readings(3600).values()
    assert (kept.utilization, kept.memory_used_mib) == (7.0, None)  # the old reading: memory unknown
    p.record_readings("node-a", {"GPU-1": {"utilization": 8, "memory_used_mib": 512}})
    [new] = p.gpu_readings(60).values()
    assert new.memory_used_mib == 512
    with engine.begin() as conn:
        assert conn.execute(sa.text("SELECT value FROM gpu_pool_meta")).scalar() == str(SCHEMA_VERSION) == "14"
    p.close()
    engine.dispose()


def test_the_agent_command_refuses_bad_options_in_one_line(tmp_path, capsys):
    from spawner.cli import main

    url = f"sqlite:///{tmp_path / 'l.sqlite'}"
    assert main(["agent", "--db-url", url, "--interval", "0", "--inventory", "simulated"]) == 2
    assert main(["agent", "--db-url-file", str(tmp_path / "missing"), "--inventory", "simulated"]) == 1
    assert main(["agent", "--db-url", url, "--inventory", "simulated", "--simulated-gpus", "-1"]) == 2
    assert main(["agent", "--db-url", url, "--inventory", "cloud"]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 4 and all(line.startswith("gpu-pool: ") for line in lines), lines
    assert "--interval must be > 0" in lines[0] and "Cannot read the ledger URL" in lines[1]


def test_the_pool_page_shows_swarm_utilization_from_the_agents(pool, node_a):
    from spawner.poolpage.handlers.wait import Settings
    from spawner.poolpage.service_config import PoolPageSettings

    inv, path = node_a
    gpu0 = inv.gpus()[0].uuid
    path.write_text(json.dumps({gpu0: 64}))
    Agent(pool, inv, interval=1).run_once()
    reader = Settings(PoolPageSettings(inventory="swarm"), pool.db_url).utilization_reader()
    assert reader("node-a", gpu0) == 64.0
    age(pool, 61)  # past SwarmInventory's default reading_max_age
    assert reader("node-a", gpu0) is None
