"""The `gpu-pool` admin command, run as a real process against an SQLite ledger."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from spawner.cli import main
from spawner.inventory import SimulatedInventory
from spawner.pool import GPUPool

# The command-line tool as a subprocess, as an admin runs it: the docs/CLI tier, not `unit`.
pytestmark = pytest.mark.docs_cli

HOST = "node-1"


@pytest.fixture
def ledger(tmp_path):
    """A ledger with 4 GPUs: alice holds 2 (groups ml), bob held 1, GPU 3 drained."""
    url = f"sqlite:///{tmp_path / 'ledger.sqlite'}"
    pool = GPUPool(inventory=SimulatedInventory(count=4, host=HOST), db_url=url)
    alice = pool.try_acquire("alice", "big", 2, groups=["ml"])
    bob = pool.try_acquire("bob", "", 1, groups=["students"])
    pool.release(bob.id, "culled")
    pool.drain(SimulatedInventory.uuid_for(HOST, 3))
    pool.close()
    return {"url": url, "alice": alice, "bob": bob, "dir": tmp_path}


def run_cli(*args, env=None, cwd=None):
    """Run `python -m spawner.cli` like the installed gpu-pool script."""
    full_env = dict(os.environ)
    full_env.pop("GPUHUB_POOL_DB_URL", None)
    full_env.pop("GPU_POOL_DB_URL", None)
    full_env.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "spawner.cli", *args],
        capture_output=True, text=True, env=full_env, cwd=cwd, timeout=60,
    )


def test_status_table(ledger):
    r = run_cli("--db-url", ledger["url"], "status")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].split() == ["HOST", "INDEX", "UUID", "STATE", "USER", "SERVER", "LEASE", "SINCE"]
    rows = {int(l.split()[1]): l.split() for l in lines[1:5]}
    assert rows[0][3] == "lent" and rows[0][4] == "alice" and rows[0][5] == "big"
    assert rows[2][3] == "free" and rows[3][3] == "drained"
    assert "4 GPUs: 1 free, 2 lent, 1 drained" in r.stdout


def test_status_json(ledger):
    r = run_cli("--db-url", ledger["url"], "--json", "status")
    data = json.loads(r.stdout)
    states = [g["state"] for g in data["gpus"]]
    assert states == ["lent", "lent", "free", "drained"]
    assert data["gpus"][0]["lease"]["user"] == "alice"
    assert data["counts"] == {"free": 1, "lent": 2, "drained": 1, "queued": 0}
    # --json also works after the command
    assert json.loads(run_cli("status", "--json", "--db-url", ledger["url"]).stdout) == data


def test_leases_and_history_with_gpu_hours(ledger):
    r = run_cli("--db-url", ledger["url"], "--json", "leases")
    assert [l["user"] for l in json.loads(r.stdout)] == ["alice"]
    r = run_cli("--db-url", ledger["url"], "--json", "history", "--since", "2000-01-01")
    data = json.loads(r.stdout)
    assert [(l["user"], l["end_reason"]) for l in data["leases"]] == [("alice", None), ("bob", "culled")]
    assert set(data["usage"]["users"]) == {"alice", "bob"}
    assert set(data["usage"]["groups"]) == {"ml", "students"}
    r = run_cli("--db-url", ledger["url"], "history")
    assert r.returncode == 0
    assert "GPU-hours per user:" in r.stdout and "GPU-hours per group:" in r.stdout
    assert "culled" in r.stdout and "(active)" in r.stdout
    r = run_cli("--db-url", ledger["url"], "--json", "history", "--until", "2000-01-01")
    assert json.loads(r.stdout)["leases"] == []


def test_drain_undrain_release_change_the_ledger(ledger):
    url = ledger["url"]
    gpu2 = SimulatedInventory.uuid_for(HOST, 2)
    r = run_cli("--db-url", url, "drain", gpu2)
    assert r.returncode == 0 and "Drained GPU" in r.stdout
    pool = GPUPool(db_url=url)
    assert pool.try_acquire("carol", "", 1, host=HOST) is None
    assert run_cli("--db-url", url, "undrain", gpu2).returncode == 0
    audit = pool.audit()
    assert [a["action"] for a in audit] == ["undrain", "drain"]
    assert audit[0]["actor"].endswith("(gpu-pool command)") and audit[0]["uuid"] == gpu2
    lease_id = ledger["alice"].id
    r = run_cli("--db-url", url, "--json", "release", str(lease_id))
    assert r.returncode == 0 and json.loads(r.stdout)["released"] is True
    assert pool.lease(lease_id).end_reason == "admin"
    r = run_cli("--db-url", url, "release", str(lease_id))
    assert r.returncode == 0 and "had already ended" in r.stdout
    assert pool.try_acquire("carol", "", 3, host=HOST) is not None


@pytest.mark.parametrize(
    "args, code, message",
    [
        (["drain", "GPU-nope"], 2, "No GPU GPU-nope"),
        (["release", "4242"], 2, "No lease 4242"),
        (["release", "abc"], 2, "invalid int value"),
        # Ids past 64 bits name nothing (no OverflowError from the database driver).
        (["release", "9" * 23], 2, f"No lease {'9' * 23}"),
        (["unbook", "1" * 23], 2, f"No live booking {'1' * 23}"),
        (["unbook", "4242"], 2, "No live booking 4242"),
        (["history", "--since", "yesterday"], 2, "not an ISO date"),
        (["release", "1", "--reason", "bored"], 2, "invalid choice"),
        (["frobnicate"], 2, "invalid choice"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(ledger, args, code, message):
    r = run_cli("--db-url", ledger["url"], *args)
    assert r.returncode == code
    assert message in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr


def test_unreachable_database_exits_1_without_password():
    r = run_cli("--db-url", "postgresql+psycopg://hub:hunter2-secret@127.0.0.1:1/ledger", "status")
    assert r.returncode == 1
    assert "hunter2-secret" not in r.stderr + r.stdout
    assert "unavailable" in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_missing_sqlite_ledger_is_not_created(tmp_path):
    r = run_cli("status", cwd=tmp_path)
    assert r.returncode == 1 and "No GPU ledger at" in r.stderr
    assert not (tmp_path / "gpu-pool.sqlite").exists()
    assert "the hub makes it at its first start" in r.stderr and "--env-file" in r.stderr


def test_finds_the_hubs_ledger_by_the_hubs_settings(tmp_path):
    """One rule everywhere: the ledger the hub's settings name is the one gpu-pool reads, from
    GPUHUB_DATA_DIR, from GPUHUB_POOL_DB_URL, from the settings file (--env-file), or, with
    no settings at all, in the current directory as the hub would make it there."""
    from spawner.settings import load_settings

    data = tmp_path / "data"
    hub_env = {"GPUHUB_DATA_DIR": str(data), "GPUHUB_AUTHENTICATOR": "dummy", "GPUHUB_DUMMY_PASSWORD": "x"}
    settings = load_settings(hub_env)  # what jupyterhub_config.py gives c.GPUPool.db_url
    data.mkdir()
    pool = GPUPool(inventory=SimulatedInventory(count=2, host=HOST), db_url=settings.pool_db_url)
    pool.try_acquire("alice", "", 1)
    pool.close()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    clean = {k: "" for k in ("GPUHUB_DATA_DIR", "GPUHUB_POOL_DB_URL")}

    def users(r):
        assert r.returncode == 0, r.stderr
        return [l["user"] for l in json.loads(r.stdout)]

    assert users(run_cli("--json", "leases", env={**clean, "GPUHUB_DATA_DIR": str(data)}, cwd=elsewhere)) == ["alice"]
    assert users(run_cli("--json", "leases", env={**clean, "GPUHUB_POOL_DB_URL": settings.pool_db_url},
                         cwd=elsewhere)) == ["alice"]
    env_file = tmp_path / "gpuhub.env"
    env_file.write_text(f"# the hub's settings\nGPUHUB_DATA_DIR={data}\nGPUHUB_DIRECTORY_ADMIN_GROUPS='Hub Admins'\n")
    assert users(run_cli("--env-file", str(env_file), "--json", "leases", env=clean, cwd=elsewhere)) == ["alice"]
    assert users(run_cli("--json", "leases", env=clean, cwd=data)) == ["alice"]
    # Without them, the message says where it looked and how to read the settings.
    r = run_cli("leases", env=clean, cwd=elsewhere)
    assert r.returncode == 1 and f"{elsewhere}/gpu-pool.sqlite" in r.stderr and "--env-file" in r.stderr


def test_an_env_file_that_cannot_be_read_is_one_line(tmp_path):
    r = run_cli("--env-file", str(tmp_path / "absent.env"), "status")
    assert r.returncode == 2 and r.stderr.startswith("gpu-pool: --env-file: cannot read the settings file")


def test_reads_the_hub_config(ledger, tmp_path):
    hubdir = tmp_path / "hub"
    hubdir.mkdir()
    os.rename(ledger["dir"] / "ledger.sqlite", hubdir / "gpu.sqlite")
    for suffix in ("-wal", "-shm"):
        if (ledger["dir"] / f"ledger.sqlite{suffix}").exists():
            os.rename(ledger["dir"] / f"ledger.sqlite{suffix}", hubdir / f"gpu.sqlite{suffix}")
    config = hubdir / "jupyterhub_config.py"
    config.write_text(textwrap.dedent("""
        c = get_config()  # noqa
        c.GPUPool.db_url = "sqlite:///gpu.sqlite"   # relative: next to this file
        c.GPUPool.max_gpus_per_user = 2
    """))
    # Run from elsewhere: the relative path is taken from the config's directory.
    r = run_cli("--config", str(config), "--json", "leases", cwd=ledger["dir"])
    assert r.returncode == 0, r.stderr
    assert [l["user"] for l in json.loads(r.stdout)] == ["alice"]
    # The environment variable wins over the config file.
    r = run_cli("--config", str(config), "status", env={"GPUHUB_POOL_DB_URL": "sqlite:///elsewhere.sqlite"},
                cwd=ledger["dir"])
    assert r.returncode == 1 and "elsewhere.sqlite" in r.stderr


def test_the_old_ledger_variable_still_works_and_says_it_is_deprecated(ledger):
    # GPU_POOL_DB_URL was the name for gpu-pool and the culler, GPUHUB_POOL_DB_URL the hub's: one now.
    r = run_cli("--json", "leases", env={"GPUHUB_POOL_DB_URL": "", "GPU_POOL_DB_URL": ledger["url"]},
                cwd=ledger["dir"])
    assert r.returncode == 0, r.stderr
    assert [l["user"] for l in json.loads(r.stdout)] == ["alice"]
    assert "GPU_POOL_DB_URL is deprecated: set GPUHUB_POOL_DB_URL instead" in r.stderr


def test_broken_config_file_is_reported(tmp_path):
    config = tmp_path / "jupyterhub_config.py"
    config.write_text("c = get_config()\nc.GPUPool.db_url = \n")
    r = run_cli("--config", str(config), "status")
    assert r.returncode == 2 and "Cannot load" in r.stderr and "Traceback" not in r.stderr


def test_main_in_process_returns_exit_codes(ledger, capsys):
    assert main(["--db-url", ledger["url"], "leases"]) == 0
    assert "alice" in capsys.readouterr().out
    assert main(["--db-url", ledger["url"], "drain", "GPU-nope"]) == 2
    assert main([]) == 2
