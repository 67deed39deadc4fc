"""The SQLite backend's database: its schema, connections, and where each call runs.

WAL mode, and every write is one ``BEGIN IMMEDIATE`` transaction, so other processes on
the host see all of it or none.

Where a call runs: the request path's calls (a lookup, an ingest of a request's new
messages, counter increments, quota charges: tens to a few hundred microseconds of SQLite)
run on the event loop's own thread, on a connection that never waits for a lock (busy
timeout 0). Handing each to a worker thread cost more than the call (a thread handoff is
~40 us of CPU each way, and the worker's Python competes with the loop for the GIL). A call
that finds the database locked by another process goes to the worker thread, whose
connection waits up to ``timeout_s`` for the lock; so do the calls whose work grows with a
session (``load``, logs, listings and deletions, which purge), and the router's own assignment
reads and compare-and-sets (the request path reads the assignment with the lookup and
writes it with the ingest), whose races between gateways are resolved by waiting on one
another. Checkpoints, which write the WAL back and fsync, run on the worker thread too:
the loop's connection never checkpoints.

Calls keep their order: a call made while an earlier one is still on the worker (or
waiting behind one) waits for it on the loop, then runs where it would have. Quick calls
that came during a worker's call used to follow it into the worker's queue, and under load
that queue never emptied: with 32 sessions at once 87% of the quick calls ran there; with
16, ~0.6 ms of the worker's CPU per request (``bench/profile.py``).
"""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

from store.errors import StoreUnavailable

T = TypeVar("T")

# Writes on the event loop's connection between two checkpoints on the worker's (SQLite's
# own automatic checkpoint comes every 1,000 pages; a request writes a few).
CHECKPOINT_EVERY = 128

SCHEMA = """
CREATE TABLE IF NOT EXISTS sessions (
  id INTEGER PRIMARY KEY, tenant TEXT NOT NULL, session TEXT NOT NULL,
  head INTEGER NOT NULL DEFAULT 0, bytes INTEGER NOT NULL DEFAULT 0, used REAL NOT NULL,
  UNIQUE (tenant, session));
-- A page of a tenant's sessions by last use (``list_sessions``) reads only that page.
CREATE INDEX IF NOT EXISTS sessions_used ON sessions (tenant, used, session);
CREATE TABLE IF NOT EXISTS branches (
  sid INTEGER, branch INTEGER, parent INTEGER, fork INTEGER, length INTEGER,
  PRIMARY KEY (sid, branch)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS messages (
  sid INTEGER, branch INTEGER, pos INTEGER, chain BLOB, body BLOB,
  UNIQUE (sid, branch, pos));
CREATE TABLE IF NOT EXISTS blobs (
  sid INTEGER, digest BLOB, data BLOB, UNIQUE (sid, digest));
CREATE TABLE IF NOT EXISTS gateway_turns (
  sid INTEGER, branch INTEGER, seq INTEGER, after INTEGER, body BLOB,
  PRIMARY KEY (sid, branch, seq)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS request_log (
  sid INTEGER, branch INTEGER, seq INTEGER, data BLOB,
  PRIMARY KEY (sid, branch, seq)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS counts (
  sid INTEGER, branch INTEGER, name TEXT, value INTEGER,
  PRIMARY KEY (sid, branch, name)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS tenant_counts (
  tenant TEXT, name TEXT, value INTEGER, PRIMARY KEY (tenant, name)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS count_tokens (
  tenant TEXT, token TEXT, expires REAL, PRIMARY KEY (tenant, token)) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS count_tokens_expiry ON count_tokens (expires);
CREATE TABLE IF NOT EXISTS quota_counters (
  tenant TEXT, name TEXT, value INTEGER, expires REAL,
  PRIMARY KEY (tenant, name)) WITHOUT ROWID;
-- Leases (store.ledger): at most a limit of them per tenant and pool, each until its
-- deadline. (Databases of earlier versions counted requests in flight as the quota
-- counter "concurrent": nothing reads it now; it expires as any counter.)
CREATE TABLE IF NOT EXISTS leases (
  tenant TEXT, name TEXT, id TEXT, deadline REAL,
  PRIMARY KEY (tenant, name, id)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS assignments (
  tenant TEXT, session TEXT, replica TEXT, expires REAL,
  PRIMARY KEY (tenant, session)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS replies (
  tenant TEXT, id TEXT, data BLOB, expires REAL, PRIMARY KEY (tenant, id));
-- Render states, which databases of earlier versions kept per branch: nothing reads them
-- now, and purging a session would leave its rows behind.
DROP TABLE IF EXISTS states;
"""
# messages and blobs are large rows: rowid tables keep them out of the key b-tree
# (WITHOUT ROWID tables with rows near the page size waste most of each page)

# SQLITE_BUSY and SQLITE_LOCKED (with extended codes): another connection holds the lock.
LOCKED = {sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED} | {
    getattr(sqlite3, name)
    for name in dir(sqlite3)
    if name.startswith(("SQLITE_BUSY_", "SQLITE_LOCKED_"))
}


class SQLiteDatabase:
    """One database file: a worker thread's connection and the event loop thread's."""

    def __init__(self, path: str | Path, timeout_s: float) -> None:
        self.path = str(path)
        if self.path != ":memory:":
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        self.timeout_s = timeout_s
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="foldgate-sqlite")
        self._conn: sqlite3.Connection | None = None  # the worker thread's
        self._loop_conn: sqlite3.Connection | None = None  # the event loop thread's
        self._loop_thread: int | None = None
        self._last: asyncio.Future[None] | None = None  # see ``_ahead``
        self._loop_writes = 0

    async def run(
        self, fn: Callable[[sqlite3.Connection], T], *, write: bool = False, quick: bool = False
    ) -> T:
        """``fn`` in one transaction, after every call made before it. ``quick``: bounded
        work, which runs on the event loop's thread (see the module doc); else on the
        worker thread."""
        ahead = self._ahead()
        if quick and ahead is None:
            done, out = self._run_on_loop(fn, write)
            if done:
                return out
        # Behind the calls ahead: ``mine`` is done once this call and those are.
        mine = self._last = asyncio.get_running_loop().create_future()
        job: asyncio.Future[T] | None = None
        try:
            if ahead is not None:
                await asyncio.wait([ahead])  # (wait: ``ahead`` is not cancelled with us)
            if quick:
                done, out = self._run_on_loop(fn, write)
                if done:
                    return out
            job = asyncio.wrap_future(
                self._pool.submit(lambda: transaction(self._connect(), fn, write))
            )
            await asyncio.wait([job])  # a job already running finishes if we are cancelled
            return job.result()
        except sqlite3.OperationalError as e:
            raise StoreUnavailable(f"sqlite store {self.path} is unavailable: {e}") from e
        finally:
            _done_after(mine, [f for f in (ahead, job) if f is not None and not f.done()])

    async def close(self) -> None:
        def shut() -> None:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

        await asyncio.get_running_loop().run_in_executor(self._pool, shut)
        self._pool.shutdown(wait=True)
        if self._loop_conn is not None:
            self._loop_conn.close()
            self._loop_conn = None

    def _open(self) -> sqlite3.Connection:
        conn = sqlite3.connect(
            self.path, timeout=self.timeout_s, isolation_level=None, check_same_thread=False
        )
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=NORMAL")
        conn.executescript(SCHEMA)
        return conn

    def _connect(self) -> sqlite3.Connection:
        if self._conn is None:
            self._conn = self._open()
        return self._conn

    def _ahead(self) -> asyncio.Future[None] | None:
        """The latest call that went behind others or to the worker, while not done."""
        last = self._last
        return last if last is not None and not last.done() else None

    def _run_on_loop(self, fn: Callable[[sqlite3.Connection], T], write: bool) -> tuple[bool, T]:
        """(True, ``fn``'s result) run on the event loop's connection; (False, None) when
        it may not run there now: another thread's call, or the database locked."""
        conn = self._on_loop()
        if conn is None:
            return False, None  # type: ignore[return-value]
        try:
            out = transaction(conn, fn, write)
        except sqlite3.OperationalError as e:
            if getattr(e, "sqlite_errorcode", None) not in LOCKED:
                raise StoreUnavailable(f"sqlite store {self.path} is unavailable: {e}") from e
            return False, None  # type: ignore[return-value]
        if write:
            self._wrote_on_loop()
        return True, out

    def _on_loop(self) -> sqlite3.Connection | None:
        """The event loop thread's connection, when this is the thread it belongs to."""
        if self._loop_conn is None:
            conn = self._open()
            conn.execute("PRAGMA busy_timeout=0")  # a locked database: to the worker
            conn.execute("PRAGMA wal_autocheckpoint=0")  # the worker checkpoints
            self._loop_conn, self._loop_thread = conn, threading.get_ident()
        return self._loop_conn if self._loop_thread == threading.get_ident() else None

    def _wrote_on_loop(self) -> None:
        self._loop_writes += 1
        if self._loop_writes % CHECKPOINT_EVERY == 0:
            # Beside the calls, not behind them: a checkpoint changes no data, and a
            # passive one waits for no reader or writer. One that failed is retried by the
            # next one; SQLite's WAL stays valid.
            job = self._pool.submit(self._checkpoint)
            job.add_done_callback(lambda j: j.cancelled() or j.exception())

    def _checkpoint(self) -> None:
        self._connect().execute("PRAGMA wal_checkpoint(PASSIVE)")


def _done_after(mine: asyncio.Future[None], pending: list[asyncio.Future[Any]]) -> None:
    """Mark ``mine`` done once every ``pending`` future is (their errors are their callers')."""
    if not pending:
        mine.set_result(None)
        return
    gathered = asyncio.gather(*pending, return_exceptions=True)
    gathered.add_done_callback(lambda _: mine.set_result(None))


def transaction(conn: sqlite3.Connection, fn: Callable[[sqlite3.Connection], T], write: bool) -> T:
    conn.execute("BEGIN IMMEDIATE" if write else "BEGIN")
    try:
        out = fn(conn)
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
    return out
