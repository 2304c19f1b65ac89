"""The ledger's database: engine, connections, the write lock, transactions, retries.

Every SQLite/PostgreSQL difference lives here.  The rest of the pool hands a
function to `Store.write` or `Store.read` and runs statements through `rows`
and `run`, which on SQLite take a fast path of SQL compiled once from Core.
"""

from __future__ import annotations

import fcntl
import math
import os
import socket
import sqlite3
import threading
import time
from collections.abc import Callable
from contextlib import contextmanager, suppress
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import create_engine, event, func, select, text
from sqlalchemy import exc as sa_exc
from sqlalchemy.dialects import sqlite as sqlite_dialect
from sqlalchemy.engine import Engine, make_url
from sqlalchemy.pool import StaticPool

from ...inventory.machine import InventoryError
from ..models import PoolError, PoolUnavailable

# Key of the PostgreSQL advisory lock that serialises writes to the ledger
# (an arbitrary 63-bit constant: "gpupool" in ASCII).
PG_LOCK_KEY = 0x677075706F6F6C
INTEGRITY_RETRIES = 5

# The write lock, and the database's clock once it is held (lease times are ordered).
_PG_LOCK = select(func.pg_advisory_xact_lock(PG_LOCK_KEY), func.clock_timestamp())
# Same, and no wait for the commit's fsync: for writes whose loss in a
# server crash is harmless (a release, a queue heartbeat): the GPU would look
# lent until reconciled, never lent twice.
_PG_LOCK_LAX = select(
    func.pg_advisory_xact_lock(PG_LOCK_KEY), func.set_config("synchronous_commit", "off", True), func.clock_timestamp()
)
_PG_NOW = select(func.clock_timestamp())
_NOW_KEY = "gpu_pool_now"


# --- SQLite's fast path: Core statements compiled once ----------------------

_SQLITE = sqlite_dialect.dialect(paramstyle="named")


class _Compiled:
    """A Core statement as plain SQLite SQL, with its parameters' converters.

    Running it on the driver's connection costs a fifth of going through
    SQLAlchemy's execution machinery, which is most of a lease's cost.
    """

    __slots__ = ("sql", "convert", "is_insert")

    def __init__(self, stmt):
        compiled = stmt.compile(dialect=_SQLITE)
        self.sql = compiled.string
        self.is_insert = bool(compiled.isinsert)
        self.convert = tuple(
            (name, proc)
            for name, bp in compiled.binds.items()
            if (proc := bp.type.bind_processor(_SQLITE)) is not None
        )

    def params(self, values: dict) -> dict:
        if not self.convert:
            return values
        out = dict(values)
        for name, proc in self.convert:
            v = out.get(name)
            if v is not None:
                out[name] = proc(v)
        return out


_compiled: dict[int, tuple[Any, _Compiled]] = {}


def _compile(stmt) -> _Compiled:
    entry = _compiled.get(id(stmt))
    if entry is None or entry[0] is not stmt:
        entry = _compiled[id(stmt)] = (stmt, _Compiled(stmt))
    return entry[1]


def as_utc(value: str | datetime) -> datetime:
    """A NOT NULL datetime column read on either path (SQLite's fast path gives text)."""
    if isinstance(value, str):
        try:  # naive UTC text (UTCDateTime); parsing the zone is 15x cheaper than replace(tzinfo=)
            return datetime.fromisoformat(value + "+00:00")
        except ValueError:
            return datetime.fromisoformat(value).replace(tzinfo=UTC)
    return value


@contextmanager
def _nothing():
    yield


class _Reconnect:
    """Turns the first 'connection was invalidated' error into Retry.

    Cheaper than pinging the server before every transaction
    (pool_pre_ping costs a round trip each time).
    """

    class Retry(Exception):
        pass

    def __init__(self, already: bool):
        self.already = already

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if not self.already and isinstance(exc, sa_exc.DBAPIError) and exc.connection_invalidated:
            raise self.Retry() from exc
        return False


class _Watchdog:
    """Shuts down the connection of a PostgreSQL call that got no answer in time.

    A server that stops answering without closing the connection leaves the
    driver waiting in the kernel; no server-side timeout reaches it.  One
    thread per store checks the calls in flight and shuts down the socket of
    any past its deadline, so the call fails at once with a connection error.
    """

    def __init__(self):
        self._lock = threading.Lock()
        self._calls: dict[int, list] = {}  # id -> [deadline, socket fd, fired]
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()

    @contextmanager
    def watch(self, fd: int, seconds: float):
        entry = [time.monotonic() + seconds, fd, False]
        key = id(entry)
        with self._lock:
            self._calls[key] = entry
            if self._thread is None:
                self._stop.clear()
                self._thread = threading.Thread(target=self._run, args=(self._stop,), daemon=True,
                                                name="gpu-ledger-watchdog")
                self._thread.start()
        try:
            yield entry
        finally:
            with self._lock:
                self._calls.pop(key, None)

    def stop(self) -> None:
        """End the thread (the store closes); a later call starts a new one."""
        with self._lock:
            thread, self._thread = self._thread, None
            self._stop.set()
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=5)

    def _run(self, stop: threading.Event) -> None:
        while not stop.wait(0.25):
            now = time.monotonic()
            with self._lock:  # held while shutting down: the call cannot end (and its fd be reused) meanwhile
                for entry in self._calls.values():
                    if not entry[2] and entry[0] <= now:
                        entry[2] = True
                        try:
                            sock = socket.socket(fileno=entry[1])
                            try:
                                sock.shutdown(socket.SHUT_RDWR)
                            finally:
                                sock.detach()
                        except OSError:
                            pass


class Store:
    """Connections and transactions for one ledger database.

    `settings` is the GPUPool whose options (db_url, lock_timeout, ...) it
    reads; `on_create(store, engine)` runs once when the engine is made.
    """

    def __init__(self, settings, log, on_create: Callable[[Store, Engine], None]):
        self.settings = settings
        self.log = log
        self._on_create = on_create
        self._engine: Engine | None = None
        self._init_lock = threading.Lock()
        self._lock_path: str | None = None  # SQLite: the side file of _host_lock
        self._lock_fd: int | None = None
        self._thread_lock = threading.Lock()
        self.fast_sqlite = False  # set when the engine is SQLite (see _Compiled)
        self._watchdog = _Watchdog()
        # This machine's clock.  The ledger never records it (see now()): hub
        # processes on machines whose clocks disagree share one queue.
        self.clock: Callable[[], datetime] = lambda: datetime.now(UTC)

    # --- naming -------------------------------------------------------------

    @property
    def safe_url(self) -> str:
        """The database URL with its password hidden."""
        try:
            return make_url(self.settings.db_url).render_as_string(hide_password=True)
        except Exception:
            return "(unparsable URL)"

    @property
    def is_sqlite(self) -> bool:
        return make_url(self.settings.db_url).get_backend_name() == "sqlite"

    # --- the engine -----------------------------------------------------------

    def _make_engine(self) -> Engine:
        cfg = self.settings
        url = make_url(cfg.db_url)
        if url.get_backend_name() == "sqlite":
            return self._make_sqlite_engine(url)
        connect_args = {
            "connect_timeout": max(1, math.ceil(cfg.connect_timeout)),
            # lock_timeout bounds the wait for the advisory lock (and any row
            # lock); statement_timeout any statement the server is slow with.
            "options": (
                f"-c lock_timeout={int(cfg.lock_timeout * 1000)} "
                f"-c statement_timeout={int(cfg.statement_timeout * 1000)}"
            ),
            # A server gone silent: idle connections are probed, and data
            # left unacknowledged fails the connection (see also _Watchdog).
            "keepalives": 1,
            "keepalives_idle": cfg.tcp_keepalives_idle,
            "keepalives_interval": cfg.tcp_keepalives_interval,
            "keepalives_count": cfg.tcp_keepalives_count,
            "tcp_user_timeout": int(cfg.call_timeout * 1000),
        }
        return create_engine(url, connect_args=connect_args)

    def _make_sqlite_engine(self, url) -> Engine:
        memory = url.database in (None, "", ":memory:")
        self.fast_sqlite = True
        self._lock_path = None if memory else os.path.abspath(url.database) + ".lock"
        kwargs: dict[str, Any] = {
            # The busy timeout: how long BEGIN IMMEDIATE waits for the lock.
            "connect_args": {"timeout": self.settings.lock_timeout, "check_same_thread": False},
        }
        if memory:
            kwargs["poolclass"] = StaticPool
        engine = create_engine(url, **kwargs)

        @event.listens_for(engine, "connect")
        def _on_connect(dbapi_conn, _record):
            # Let SQLAlchemy's "begin" event issue BEGIN itself (pysqlite's
            # own transaction handling would defer the lock).
            dbapi_conn.isolation_level = None
            cur = dbapi_conn.cursor()
            if not memory:
                # WAL: readers never block the writer; NORMAL sync is
                # durable against process crashes (power loss may lose
                # the last commits, never corrupt the file).
                cur.execute("PRAGMA journal_mode=WAL")
                cur.execute("PRAGMA synchronous=NORMAL")
            cur.execute("PRAGMA foreign_keys=ON")
            cur.close()

        @event.listens_for(engine, "begin")
        def _on_begin(conn):
            # Writers take the write lock up front, so a transaction never
            # fails half-way on a lock upgrade.
            # (On the driver's connection: SQLAlchemy's execution
            # machinery would double the cost of a short transaction.)
            raw = conn.connection.driver_connection
            raw.execute("BEGIN IMMEDIATE" if conn.get_execution_options().get("gpu_pool_write") else "BEGIN")

        return engine

    def engine(self) -> Engine:
        """The engine, made (and the schema created) on first use."""
        if self._engine is not None:
            return self._engine
        with self._init_lock:
            if self._engine is None:
                with self.guard():
                    engine = self._make_engine()
                    try:
                        self._on_create(self, engine)
                        self._check_clock(engine)
                    except BaseException:
                        engine.dispose()  # the next call makes a new one: keep no connections
                        raise
                self._engine = engine
        return self._engine

    def _check_clock(self, engine: Engine) -> None:
        """Say so when this machine's clock is off the database's (which the ledger uses)."""
        if getattr(self.settings, "clock", None) is not None:
            return  # the ledger runs on the injected clock, not the database's
        mine = self.clock()
        theirs = self.transact(engine, self.now, write=False)
        off = (mine - theirs).total_seconds()
        if abs(off) > 2:
            self.log.warning(
                "This machine's clock is %.1f s %s the GPU ledger database's; the ledger keeps "
                "the database's time (lease times, queue heartbeats)", abs(off), "ahead of" if off > 0 else "behind",
            )

    def close(self) -> None:
        """Close the database connections and the lock file, and end the watchdog's thread."""
        self._watchdog.stop()
        if self._engine is not None:
            self._engine.dispose()
            self._engine = None
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    # --- errors ---------------------------------------------------------------

    def unavailable(self, error: Exception) -> PoolUnavailable:
        orig = getattr(error, "orig", None) or error
        message = str(orig).strip().splitlines()[0] if str(orig).strip() else type(orig).__name__
        password = None
        with suppress(Exception):
            password = make_url(self.settings.db_url).password
        if password:
            message = message.replace(str(password), "***")
        sqlstate = getattr(orig, "sqlstate", None) or getattr(orig, "pgcode", None)
        if "database is locked" in message or sqlstate == "55P03":
            return self.locked()
        return PoolUnavailable(f"The GPU ledger database {self.safe_url} is unavailable: {message}")

    def locked(self) -> PoolUnavailable:
        return PoolUnavailable(
            f"The GPU ledger stayed locked for more than {self.settings.lock_timeout:g} s "
            "(another process holds it); try again in a moment"
        )

    @contextmanager
    def guard(self):
        """Turn database failures into PoolUnavailable (IntegrityError passes: callers retry)."""
        try:
            yield
        except (PoolError, sa_exc.IntegrityError, sqlite3.IntegrityError):
            raise
        except sa_exc.DBAPIError as e:
            raise self.unavailable(e) from e
        except (sa_exc.SQLAlchemyError, sqlite3.Error) as e:  # sqlite3: our raw BEGIN
            raise self.unavailable(e) from e
        except InventoryError as e:
            raise PoolUnavailable(f"Cannot read this host's GPUs: {e}") from e

    # --- the write lock ---------------------------------------------------------

    @contextmanager
    def _host_lock(self):
        """For an SQLite file: a kernel lock on a side file, taken before BEGIN IMMEDIATE.

        SQLite's own busy handler sleeps 1, 2, 5, 10, 25... ms between tries,
        which puts tens of milliseconds into the tail latency when several hub
        processes write at once.  This lock hands over within a millisecond.
        Threads of one process queue on a thread lock first (flock does not
        exclude threads sharing a file description).
        """
        if self._lock_path is None:
            yield
            return
        timeout = self.settings.lock_timeout
        deadline = time.monotonic() + timeout
        if not self._thread_lock.acquire(timeout=timeout):
            raise self.locked()
        try:
            if self._lock_fd is None:
                try:
                    self._lock_fd = os.open(self._lock_path, os.O_RDWR | os.O_CREAT, 0o600)
                except OSError as e:
                    raise PoolUnavailable(f"The GPU ledger database {self.safe_url} is unavailable: {e}") from e
            delay = 0.0001
            while True:
                try:
                    fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() > deadline:
                        raise self.locked() from None
                    time.sleep(delay)
                    delay = min(delay * 2, 0.001)
            try:
                yield
            finally:
                fcntl.flock(self._lock_fd, fcntl.LOCK_UN)
        finally:
            self._thread_lock.release()

    # --- transactions -------------------------------------------------------------

    def transact(self, engine: Engine, fn: Callable, *args, write: bool, durable: bool = True, long: bool = False):
        """Run fn(conn, *args) in one transaction; writes hold the ledger's lock.

        durable=False lets PostgreSQL skip waiting for the commit's fsync; only
        for writes that are safe to lose in a server crash.  long=True: no
        statement or call time limit (a schema upgrade rolling up a long history).
        """
        reconnected = False
        for attempt in range(INTEGRITY_RETRIES):
            try:
                with self.guard(), _Reconnect(reconnected), (self._host_lock() if write else _nothing()), \
                        engine.connect() as conn:
                    if write:
                        conn.execution_options(gpu_pool_write=True)
                    with (_nothing() if long else self._bounded(conn)), conn.begin():
                        if long and engine.dialect.name == "postgresql":
                            conn.execute(text("SET LOCAL statement_timeout = 0"))
                        if write and engine.dialect.name == "postgresql":
                            locked_at = conn.execute(_PG_LOCK if durable else _PG_LOCK_LAX).one()[-1]
                            conn.info[_NOW_KEY] = locked_at.astimezone(UTC)
                        try:
                            return fn(conn, *args)
                        finally:
                            conn.info.pop(_NOW_KEY, None)
            except _Reconnect.Retry:
                # A pooled connection had died (server restart): the
                # transaction rolled back with it, so running it again on a
                # fresh connection is safe.  Once.
                reconnected = True
            except (sa_exc.IntegrityError, sqlite3.IntegrityError) as e:
                # Only something that bypassed the lock gets here (the unique
                # index caught it): re-read the ledger and decide again.
                self.log.warning("GPU ledger write conflicted (%s); retrying", type(getattr(e, "orig", e)).__name__)
                time.sleep(0.01 * (attempt + 1))
        raise PoolUnavailable("The GPU ledger kept changing under this request; try again")

    @contextmanager
    def _bounded(self, conn):
        """PostgreSQL: fail the transaction when the server leaves it unanswered past call_timeout."""
        if conn.dialect.name != "postgresql":
            yield
            return
        seconds = self.settings.call_timeout
        with self._watchdog.watch(conn.connection.driver_connection.pgconn.socket, seconds) as call:
            try:
                yield
            except Exception as e:
                if call[2]:
                    raise PoolUnavailable(
                        f"The GPU ledger database {self.safe_url} did not answer within {seconds:g} s "
                        "(GPUPool.call_timeout); try again in a moment"
                    ) from e
                raise

    def write(self, fn: Callable, *args, durable: bool = True):
        return self.transact(self.engine(), fn, *args, write=True, durable=durable)

    def read(self, fn: Callable, *args):
        return self.transact(self.engine(), fn, *args, write=False)

    def now(self, conn) -> datetime:
        """The database's clock: the time to record, and to judge heartbeats by.

        Hubs on several machines share a PostgreSQL ledger; their own clocks
        may disagree by seconds, the server's is one for all.  An SQLite
        ledger lives on one machine (see the lock file), whose clock SQLite's
        'now' reads, in milliseconds only; it is read here in microseconds,
        so that short leases keep their length.  `GPUPool.clock`, when set, replaces either.
        """
        injected = getattr(self.settings, "clock", None)  # GPUPool.clock: a virtual clock (tests, bench)
        if injected is not None:
            return injected()
        at = conn.info.get(_NOW_KEY)  # PostgreSQL: read with the write lock
        if at is not None:
            return at
        if conn.dialect.name == "postgresql":
            return conn.execute(_PG_NOW).scalar_one().astimezone(UTC)
        return datetime.now(UTC)

    # --- statements ------------------------------------------------------------------

    def _raw(self, conn):
        """The sqlite3 connection under `conn` when the fast path may run on it."""
        return conn.connection.driver_connection if self.fast_sqlite else None

    def rows(self, conn, stmt, params: dict | None = None) -> list:
        """Rows of a select (datetime columns: see as_utc)."""
        raw = self._raw(conn)
        if raw is not None:
            c = _compile(stmt)
            return raw.execute(c.sql, c.params(params or {})).fetchall()
        return conn.execute(stmt, params or {}).all()

    def run(self, conn, stmt, params: dict | list[dict]) -> int:
        """Execute a write; returns the new row id (INSERT) or the rows changed."""
        raw = self._raw(conn)
        if raw is not None:
            c = _compile(stmt)
            if isinstance(params, list):
                raw.executemany(c.sql, [c.params(p) for p in params])
                return len(params)
            cur = raw.execute(c.sql, c.params(params))
            return cur.lastrowid if c.is_insert else cur.rowcount
        result = conn.execute(stmt, params)
        if isinstance(params, dict) and stmt.is_insert:
            return result.inserted_primary_key[0]
        return result.rowcount
