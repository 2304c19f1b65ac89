"""A real PostgreSQL server: Debian's `postgresql`, its own cluster, loopback only.

`start_postgres()` / `PostgresServer.stop()` serve the demo on Swarm (its
ledger), the benchmarks and the tests (tests/fixtures/postgres.py wraps them
in fixtures).

The cluster lives in a fresh temp directory, listens on 127.0.0.1 on a free
port (and a Unix socket inside that directory), and has one password-protected
role and database for the tests.  Durability is off by default (fsync,
synchronous_commit): tests kill clients, not the server, and it keeps the
suite fast.
"""

from __future__ import annotations

import glob
import os
import pwd
import secrets
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass, field

from devservices.apt import InstallError, apt_install
from devservices.ports import free_port

ROLE = "gpupool"
DATABASE = "gpupool"


class PostgresUnavailable(RuntimeError):
    """PostgreSQL could not be installed or started; str() says why."""


@dataclass
class PostgresServer:
    bindir: str
    datadir: str
    port: int
    password: str = field(repr=False)
    run_as: str | None  # OS user owning the cluster (initdb refuses root)
    basedir: str = ""

    @property
    def url(self) -> str:
        """SQLAlchemy URL of the test database (holds the password: never log it)."""
        return f"postgresql+psycopg://{ROLE}:{self.password}@127.0.0.1:{self.port}/{DATABASE}"

    def restart(self) -> None:
        """Restart the server (fast shutdown): every client connection breaks."""
        _run(self.run_as, [f"{self.bindir}/pg_ctl", "restart", "-w", "-m", "fast", "-D", self.datadir,
                           "-l", os.path.join(self.basedir, "log")], "pg_ctl restart")

    def stop(self) -> None:
        """Stop the server (fast shutdown) and delete its directory."""
        subprocess.run(
            _as_user(self.run_as, [f"{self.bindir}/pg_ctl", "stop", "-D", self.datadir, "-m", "immediate", "-w"]),
            capture_output=True,
            timeout=30,
        )
        shutil.rmtree(self.basedir or self.datadir, ignore_errors=True)


def _as_user(user: str | None, argv: list[str]) -> list[str]:
    return argv if user is None else ["runuser", "-u", user, "--", *argv]


def find_bindir() -> str | None:
    """Newest /usr/lib/postgresql/N/bin that has initdb, or None."""
    found = sorted(
        glob.glob("/usr/lib/postgresql/*/bin/initdb"),
        key=lambda p: int(p.split("/")[4]) if p.split("/")[4].isdigit() else 0,
    )
    return os.path.dirname(found[-1]) if found else None


def install_postgres() -> str:
    """The PostgreSQL bin directory, installing Debian's `postgresql` if it is missing."""
    bindir = find_bindir()
    if bindir:
        return bindir
    # No default 'main' cluster on port 5432: the tests run their own.
    conf = "/etc/postgresql-common/createcluster.conf"
    if os.geteuid() == 0 and not os.path.exists(conf):
        os.makedirs(os.path.dirname(conf), exist_ok=True)
        with open(conf, "w") as f:
            f.write("create_main_cluster = false\n")
    try:
        apt_install(["postgresql"], options=("-o", "Dpkg::Options::=--force-confold"))
    except InstallError as exc:
        raise PostgresUnavailable(str(exc).splitlines()[-1] if str(exc) else "apt-get failed") from None
    bindir = find_bindir()
    if not bindir:
        raise PostgresUnavailable("apt-get installed postgresql but no PostgreSQL binaries were found")
    return bindir


def start_postgres(durable: bool = False) -> PostgresServer:
    """Create and start a throw-away cluster; the caller must call .stop()."""
    bindir = install_postgres()
    run_as = None
    if os.geteuid() == 0:
        try:
            pwd.getpwnam("postgres")
            run_as = "postgres"
        except KeyError:
            raise PostgresUnavailable("running as root but there is no 'postgres' OS user for initdb") from None
    basedir = tempfile.mkdtemp(prefix="gpuhub-pg-")
    datadir = os.path.join(basedir, "data")
    os.chmod(basedir, 0o700)
    if run_as:
        shutil.chown(basedir, run_as, run_as)
    password = secrets.token_urlsafe(16)
    superpw = secrets.token_urlsafe(16)
    pwfile = os.path.join(basedir, "pw")
    with open(pwfile, "w") as f:
        f.write(superpw)
    if run_as:
        shutil.chown(pwfile, run_as, run_as)
    server = PostgresServer(bindir, datadir, free_port(), password, run_as, basedir)
    try:
        _run(
            run_as,
            [
                f"{bindir}/initdb", "-D", datadir, "-U", "postgres", f"--pwfile={pwfile}",
                "--auth-host=scram-sha-256", "--auth-local=trust", "-E", "UTF8", "--no-sync", "--no-instructions",
            ],
            "initdb",
        )
        os.unlink(pwfile)
        options = [
            "-c listen_addresses=127.0.0.1",
            f"-c port={server.port}",
            f"-c unix_socket_directories={basedir}",
            "-c max_connections=100",
            "-c shared_buffers=32MB",
        ]
        if not durable:
            options += ["-c fsync=off", "-c synchronous_commit=off", "-c full_page_writes=off"]
        _run(
            run_as,
            [f"{bindir}/pg_ctl", "start", "-w", "-t", "30", "-D", datadir, "-l", os.path.join(basedir, "log"),
             "-o", " ".join(options)],
            "pg_ctl start",
        )
        _create_role(server, basedir)
    except BaseException:
        server.stop()
        raise
    return server


def _run(run_as: str | None, argv: list[str], what: str) -> None:
    result = subprocess.run(_as_user(run_as, argv), capture_output=True, text=True, timeout=60)
    if result.returncode != 0:
        tail = (result.stderr or result.stdout).strip().splitlines()[-3:]
        raise PostgresUnavailable(f"{what} failed: {' | '.join(tail)}")


def _create_role(server: PostgresServer, socket_dir: str) -> None:
    import psycopg
    from psycopg import sql

    deadline = time.monotonic() + 10
    while True:
        try:
            conn = psycopg.connect(host=socket_dir, port=server.port, user="postgres", dbname="postgres",
                                   autocommit=True)
            break
        except psycopg.OperationalError:
            if time.monotonic() > deadline:
                raise PostgresUnavailable("PostgreSQL started but accepts no connections") from None
            time.sleep(0.1)
    with conn:
        conn.execute(sql.SQL("CREATE ROLE {} LOGIN PASSWORD {}").format(
            sql.Identifier(ROLE), sql.Literal(server.password)))
        conn.execute(sql.SQL("CREATE DATABASE {} OWNER {}").format(sql.Identifier(DATABASE), sql.Identifier(ROLE)))


def create_database(server: PostgresServer, name: str) -> str:
    """Create database `name` owned by the test role; returns its SQLAlchemy URL."""
    import psycopg
    from psycopg import sql

    with psycopg.connect(host=server.basedir, port=server.port, user="postgres", dbname="postgres",
                         autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {} OWNER {}").format(sql.Identifier(name), sql.Identifier(ROLE)))
    return f"postgresql+psycopg://{ROLE}:{server.password}@127.0.0.1:{server.port}/{name}"
