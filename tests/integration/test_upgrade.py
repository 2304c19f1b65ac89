"""A hub upgrade with servers kept running (GPUHUB_CLEANUP_SERVERS=false), as the README's
upgrade procedure does it: back the ledger up online while the hub runs, stop the hub, start
it again from the same data directory, and find every server and lease adopted and usable.

(This replaces the one-server test_hub_restart_without_cleanup_adopts_running_leases that
lived in test_gpu_spawner.py: two servers, one of them with two GPUs, and the backup.)
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import requests

from spawner.pool import GPUPool

from ..fixtures.hub import wait_for


def online_backup(source: Path, dest: Path) -> None:
    """SQLite's online backup API (what `sqlite3 DB ".backup DEST"` runs): a consistent copy
    while other connections read and write the database."""
    src, dst = sqlite3.connect(source), sqlite3.connect(dest)
    try:
        src.backup(dst)
    finally:
        dst.close()
        src.close()


def test_upgrade_keeps_two_gpu_servers_and_their_leases(make_hub, docker_client, tmp_path):
    hub = make_hub(env={"GPUHUB_CLEANUP_SERVERS": "false"})
    for user in ("olga", "piet"):
        hub.create_user(user)
    hub.start_server("olga", {"profile": "tf-gpu-1"})  # history: one ended lease
    hub.stop_server("olga", token=hub.user_token("olga"))
    before = {"olga": hub.start_server("olga", {"profile": "tf-gpu-1"}),
              "piet": hub.start_server("piet", {"profile": "tf-gpu-2"})}
    lease_ids = {user: server["state"]["gpu_lease_id"] for user, server in before.items()}

    # 1. Backups while the hub runs: the ledger and the hub's own database.
    backup = tmp_path / "backup"
    backup.mkdir()
    online_backup(hub.directory / "gpu-pool.sqlite", backup / "gpu-pool.sqlite")
    online_backup(hub.directory / "jupyterhub.sqlite", backup / "jupyterhub.sqlite")
    saved = GPUPool(db_url=f"sqlite:///{backup / 'gpu-pool.sqlite'}")
    try:
        assert {lease.user: lease.id for lease in saved.leases()} == lease_ids
        assert len(saved.leases(user="piet")[0].gpu_uuids) == 2
        ended = [lease for lease in saved.history(user="olga") if not lease.active]
        assert [lease.end_reason for lease in ended] == ["stopped"]
    finally:
        saved.close()
    with sqlite3.connect(backup / "jupyterhub.sqlite") as db:
        assert {"olga", "piet"} <= {name for (name,) in db.execute("SELECT name FROM users")}

    # 2. Stop the hub: the servers and their leases stay.
    hub.stop()
    assert {lease.id for lease in hub.ledger().leases()} == set(lease_ids.values())
    running = {c.name for c in hub.containers(docker_client, all=False)}
    assert running == {f"{hub.prefix}-olga", f"{hub.prefix}-piet"}

    # 3. Start it again from the same data directory: both adopted, leases unchanged.
    hub.start()
    for user, lease_id in lease_ids.items():
        after = hub.server_model(user)
        assert after and after["ready"], f"{user}: {after}"
        assert after["state"]["gpu_lease_id"] == lease_id
        assert after["state"]["gpu_uuids"] == before[user]["state"]["gpu_uuids"]
    # The start-up reconcile pass has run (the counter starts at 0 in the new hub process).
    wait_for(lambda: hub.metric("gpuhub_reconcile_passes") >= 1, timeout=60, what="the start-up reconcile pass",
             hub=hub)
    assert {lease.id for lease in hub.ledger().leases()} == set(lease_ids.values())

    # 4. Usable: each server answers through the (new) hub's proxy, and each user ends their own.
    for user, lease_id in lease_ids.items():
        token = hub.user_token(user)
        r = wait_for(lambda user=user, token=token: requests.get(
                         f"{hub.url}/user/{user}/api/status", timeout=10,
                         headers={"Authorization": f"token {token}"}).ok,
                     timeout=30, what=f"{user}'s server through the proxy", hub=hub)
        assert r
        hub.stop_server(user, token=token)
        assert hub.ledger().lease(lease_id).end_reason == "stopped"
    assert hub.ledger().leases() == []
    assert len(hub.ledger().history()) == 3
