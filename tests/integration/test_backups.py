"""The admin docs' backup commands, run as written (docs/admins/backups.md) with the paths of a
staging root, under an admin's usual umask 022: every file they make is 0600, every directory
0700, and the copies are whole (the real sqlite3 and pg_dump, a real PostgreSQL)."""

from __future__ import annotations

import re
import sqlite3
import stat
import subprocess
from pathlib import Path

import pytest
from sqlalchemy.engine import make_url

from spawner.inventory import SimulatedInventory
from spawner.pool import GPUPool

REPO = Path(__file__).resolve().parents[2]
DOC = (REPO / "docs" / "admins" / "backups.md").read_text()


def block(containing: str) -> str:
    """The doc's ```sh block holding `containing`."""
    (found,) = [b for b in re.findall(r"```sh\n(.*?)```", DOC, flags=re.S) if containing in b]
    return found


def run(script: str) -> subprocess.CompletedProcess:
    proc = subprocess.run(["bash", "-euc", "umask 022\n" + script], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc


def modes(root: Path) -> dict[str, int]:
    return {str(p.relative_to(root)): stat.S_IMODE(p.stat().st_mode) for p in [root, *root.rglob("*")]}


@pytest.fixture
def hub_files(tmp_path):
    """A data directory and a settings directory as an install leaves them, with a lease."""
    data, etc = tmp_path / "data", tmp_path / "etc"
    data.mkdir(mode=0o700)
    etc.mkdir(mode=0o700)
    with sqlite3.connect(data / "jupyterhub.sqlite") as db:
        db.execute("create table users (name text)")
        db.execute("insert into users values ('alice')")
    pool = GPUPool(db_url=f"sqlite:///{data / 'gpu-pool.sqlite'}", inventory=SimulatedInventory(host="h"))
    pool.try_acquire("alice", "", 1)
    pool.close()
    for path, mode in ((data / "jupyterhub_cookie_secret", 0o600), (etc / "gpuhub.env", 0o600),
                       (etc / "directory-bind-password", 0o600), (etc / "directory-ca.pem", 0o644)):
        path.write_text("x\n")
        path.chmod(mode)
    return tmp_path


def test_the_documented_sqlite_backup_makes_0600_files(hub_files):
    root = hub_files
    script = (block("umask 077\n  mkdir")
              .replace("D=/var/lib/jupyterhub-gpu", f"D={root / 'data'}")
              .replace("E=/etc/jupyterhub-gpu", f"E={root / 'etc'}")
              .replace("B=/srv/backup/jupyterhub-gpu/", f"B={root / 'backup'}/"))
    run(script)
    (backup,) = (root / "backup").iterdir()
    found = modes(root / "backup")
    assert {m for p, m in found.items() if (root / "backup" / p).is_dir()} == {0o700}, found
    files = {p: m for p, m in found.items() if (root / "backup" / p).is_file()}
    assert set(files.values()) == {0o600}, files
    assert {Path(p).name for p in files} == {"jupyterhub.sqlite", "gpu-pool.sqlite", "jupyterhub_cookie_secret",
                                             "gpuhub.env", "directory-bind-password", "directory-ca.pem"}
    with sqlite3.connect(backup / "jupyterhub.sqlite") as db:
        assert db.execute("select name from users").fetchall() == [("alice",)]
    copy = GPUPool(db_url=f"sqlite:///{backup / 'gpu-pool.sqlite'}")
    assert [lease.user for lease in copy.leases()] == ["alice"]
    copy.close()


def test_the_documented_pg_dump_makes_a_0600_file(postgres_database, tmp_path):
    pool = GPUPool(db_url=postgres_database, inventory=SimulatedInventory(host="h"))
    pool.try_acquire("alice", "", 1)
    pool.close()
    url = make_url(postgres_database).set(drivername="postgresql").render_as_string(hide_password=False)
    backup = tmp_path / "backup"
    backup.mkdir(mode=0o700)
    run(f"B={backup}\n" + block("pg_dump").replace('"postgresql://gpuhub@db.example.com/gpuhub"', f"'{url}'"))
    dump = backup / "gpu-pool.dump"
    assert stat.S_IMODE(dump.stat().st_mode) == 0o600
    listed = subprocess.run(["pg_restore", "--list", str(dump)], capture_output=True, text=True, timeout=60)
    assert listed.returncode == 0 and "leases" in listed.stdout
