"""SQLite backend: the embedded default for one host.

Same contract and model as the Redis backend (see ``store.base``). WAL mode, and every
write is one ``BEGIN IMMEDIATE`` transaction, so other processes on the host see all of it
or none. Expired sessions (unused for longer than the TTL) read as absent and are purged
lazily.

Where a call runs: the request path's calls (a lookup, an ingest of a request's new
messages, counter increments, quota charges: tens to a few hundred microseconds of SQLite)
run on the event loop's own thread, on a connection that never waits for a lock (busy
timeout 0). Handing each to a worker thread cost more than the call (a thread handoff is
~40 us of CPU each way, and the worker's Python competes with the loop for the GIL). A call
that finds the database locked by another process, or that comes while the worker thread
has calls queued (their order is kept), goes to the worker thread, whose connection waits
up to ``timeout_s`` for the lock; so do the calls whose work grows with a session
(``load``, logs, listings and deletions, which purge), and the router's own assignment
reads and compare-and-sets (the request path reads the assignment with the lookup and
writes it with the ingest), whose races between gateways are resolved by waiting on one
another. Checkpoints, which write the WAL
back and fsync, run on the worker thread too: the loop's connection never checkpoints.
"""

from __future__ import annotations

import asyncio
import sqlite3
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any, TypeVar

from store import codec
from store.base import (
    COUNT_TOKEN_TTL_S,
    DEFAULT_TIMEOUT_S,
    Assign,
    Charge,
    IngestResult,
    Lookup,
    Message,
    NotFound,
    Prepared,
    Refusal,
    SessionStore,
    StoredHistory,
    StoreUnavailable,
    added_bytes,
    ancestry,
    assemble,
    bad_after_index,
    blob_texts,
    check_assign,
    check_branch,
    check_counts,
    check_id,
    check_turns,
    over_limit,
    session_cap,
    surely_fits,
    too_large,
    turns_before,
    window_key,
)

T = TypeVar("T")

# Writes on the event loop's connection between two checkpoints on the worker's (SQLite's
# own automatic checkpoint comes every 1,000 pages; a request writes a few).
_CHECKPOINT_EVERY = 128

_SCHEMA = """
CREATE TABLE IF NOT EXISTS sessions (
  id INTEGER PRIMARY KEY, tenant TEXT NOT NULL, session TEXT NOT NULL,
  head INTEGER NOT NULL DEFAULT 0, bytes INTEGER NOT NULL DEFAULT 0, used REAL NOT NULL,
  UNIQUE (tenant, session));
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
_SESSION_TABLES = (
    "branches",
    "messages",
    "blobs",
    "gateway_turns",
    "request_log",
    "counts",
)


class SQLiteStore(SessionStore):
    def __init__(self, path: str | Path, *, timeout_s: float = DEFAULT_TIMEOUT_S, **kwargs: Any):
        super().__init__(**kwargs)
        self.path = str(path)
        if self.path != ":memory:":
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        self.timeout_s = timeout_s
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="foldgate-sqlite")
        self._conn: sqlite3.Connection | None = None  # the worker thread's
        self._loop_conn: sqlite3.Connection | None = None  # the event loop thread's
        self._loop_thread: int | None = None
        self._queued = 0  # calls handed to the worker thread and not finished
        self._loop_writes = 0

    # -- plumbing ----------------------------------------------------------------------
    def _open(self) -> sqlite3.Connection:
        conn = sqlite3.connect(
            self.path, timeout=self.timeout_s, isolation_level=None, check_same_thread=False
        )
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=NORMAL")
        conn.executescript(_SCHEMA)
        return conn

    def _connect(self) -> sqlite3.Connection:
        if self._conn is None:
            self._conn = self._open()
        return self._conn

    def _on_loop(self) -> sqlite3.Connection | None:
        """The event loop thread's connection, when a call may run on it now: the worker
        has nothing queued (calls keep their order) and this is the thread it belongs to."""
        if self._queued:
            return None
        if self._loop_conn is None:
            conn = self._open()
            conn.execute("PRAGMA busy_timeout=0")  # a locked database: to the worker
            conn.execute("PRAGMA wal_autocheckpoint=0")  # the worker checkpoints
            self._loop_conn, self._loop_thread = conn, threading.get_ident()
        return self._loop_conn if self._loop_thread == threading.get_ident() else None

    async def _run(
        self, fn: Callable[[sqlite3.Connection], T], *, write: bool = False, quick: bool = False
    ) -> T:
        """``fn`` in one transaction. ``quick``: bounded work, which may run on the event
        loop's thread (see the module doc); else on the worker thread."""
        conn = self._on_loop() if quick else None
        try:
            if conn is not None:
                try:
                    out = _transaction(conn, fn, write)
                except sqlite3.OperationalError as e:
                    if getattr(e, "sqlite_errorcode", None) not in _LOCKED:
                        raise
                else:
                    if write:
                        self._wrote_on_loop()
                    return out
            return await self._to_worker(lambda: _transaction(self._connect(), fn, write))
        except sqlite3.OperationalError as e:
            raise StoreUnavailable(f"sqlite store {self.path} is unavailable: {e}") from e

    async def _to_worker(self, job: Callable[[], T]) -> T:
        self._queued += 1
        try:
            return await asyncio.get_running_loop().run_in_executor(self._pool, job)
        finally:
            self._queued -= 1

    def _wrote_on_loop(self) -> None:
        self._loop_writes += 1
        if self._loop_writes % _CHECKPOINT_EVERY == 0:
            task = asyncio.ensure_future(self._to_worker(self._checkpoint))
            # A failed checkpoint is retried by the next one; SQLite's WAL stays valid.
            task.add_done_callback(lambda t: t.cancelled() or t.exception())

    def _checkpoint(self) -> None:
        self._connect().execute("PRAGMA wal_checkpoint(PASSIVE)")

    def _sid(self, conn: sqlite3.Connection, tenant: str, session: str, create: bool) -> int | None:
        """The session's row id, purging it first when it has expired; touches it."""
        now = time.time()
        row = conn.execute(
            "SELECT id, used FROM sessions WHERE tenant=? AND session=?", (tenant, session)
        ).fetchone()
        if row is not None and row[1] < now - self.ttl_s:
            _purge(conn, row[0])
            row = None
        if row is None:
            if not create:
                return None
            cur = conn.execute(
                "INSERT INTO sessions (tenant, session, used) VALUES (?, ?, ?)",
                (tenant, session, now),
            )
            return int(cur.lastrowid or 0)
        conn.execute("UPDATE sessions SET used=? WHERE id=?", (now, row[0]))
        return int(row[0])

    def _need_sid(self, conn: sqlite3.Connection, tenant: str, session: str) -> int:
        sid = self._sid(conn, tenant, session, create=False)
        if sid is None:
            raise NotFound(f"no session {session!r} for tenant {tenant!r}")
        return sid

    # -- history -----------------------------------------------------------------------
    async def ingest(
        self,
        tenant: str,
        session: str,
        messages: Sequence[Message],
        *,
        max_bytes: int | None = None,
        assign: Assign | None = None,
    ) -> IngestResult:
        check_id("tenant", tenant)
        check_id("session", session)
        check_assign(assign)
        prep = self._digests.prepare(tenant, session, messages)
        cap = session_cap(self.max_session_bytes, max_bytes)

        def write(conn: sqlite3.Connection) -> IngestResult:
            result = self._ingest(conn, tenant, session, prep, cap)
            if assign is None:
                return result
            return replace(result, assignment=_set_assignment(conn, tenant, session, assign))

        return await self._run(write, write=True, quick=True)

    async def lookup(
        self,
        tenant: str,
        session: str,
        messages: Sequence[Message],
        *,
        max_bytes: int | None = None,
    ) -> Lookup:
        check_id("tenant", tenant)
        check_id("session", session)
        prep = self._digests.prepare(tenant, session, messages)
        cap = session_cap(self.max_session_bytes, max_bytes)

        def refuse_over_cap(
            conn: sqlite3.Connection, sid: int | None, stored: int, at: int
        ) -> None:
            """Refuse as ``_ingest`` would, storing the messages from index ``at``."""
            new = prep.packed[at:]
            if surely_fits(stored, new, cap):
                return
            adding = added_bytes(new, _fresh_blobs(conn, sid, new))
            if stored + adding > cap:
                raise too_large(tenant, session, stored, adding, cap)

        def read(conn: sqlite3.Connection) -> Lookup:
            assignment = _assignment(conn, tenant, session, time.time())
            row = conn.execute(
                "SELECT id, head, used, bytes FROM sessions WHERE tenant=? AND session=?",
                (tenant, session),
            ).fetchone()
            if row is None or row[2] < time.time() - self.ttl_s:
                refuse_over_cap(conn, None, 0, 0)
                return Lookup(None, 0, {}, {}, assignment)
            sid, head = int(row[0]), int(row[1])
            branches = _branches(conn, sid)
            target, from_, parent = _select(conn, sid, head, branches, prep.chains)
            refuse_over_cap(conn, sid, int(row[3]), from_)
            n = len(prep.chains)
            owner = target if target >= 0 else parent
            if owner < 0:
                return Lookup(None, from_, {}, {}, assignment)
            limit = n if target >= 0 else from_
            turns = turns_before(_turns(conn, sid, branches, owner), limit)
            history = assemble(session, owner, branches, [], turns, _blob_reader(conn, sid))
            counts = {}
            if target >= 0:
                rows = conn.execute(
                    "SELECT name, value FROM counts WHERE sid=? AND branch=?", (sid, target)
                )
                counts = {str(name): int(value) for name, value in rows}
            return Lookup(
                target if target >= 0 else None,
                from_,
                history.gateway_turns,
                counts,
                assignment,
            )

        return await self._run(read, quick=True)

    def _ingest(
        self, conn: sqlite3.Connection, tenant: str, session: str, prep: Prepared, cap: int
    ) -> IngestResult:
        sid = self._sid(conn, tenant, session, create=True)
        head, stored = conn.execute(
            "SELECT head, bytes FROM sessions WHERE id=?", (sid,)
        ).fetchone()
        branches = _branches(conn, sid)
        chains, n = prep.chains, len(prep.chains)
        target, from_, parent = _select(conn, sid, head, branches, chains)
        if from_ == n:
            # an identical re-send, or a shorter one (a late or retried earlier request)
            conn.execute("UPDATE sessions SET head=? WHERE id=?", (target, sid))
            return IngestResult(target, n, 0, False)
        new_branch = target < 0
        if new_branch:
            target = len(branches)
        new = prep.packed[from_:]
        fresh = _fresh_blobs(conn, sid, new)
        adding = added_bytes(new, fresh)
        if stored + adding > cap:
            raise too_large(tenant, session, stored, adding, cap)
        if new_branch:
            conn.execute(
                "INSERT INTO branches VALUES (?, ?, ?, ?, ?)", (sid, target, parent, from_, n)
            )
        else:
            conn.execute("UPDATE branches SET length=? WHERE sid=? AND branch=?", (n, sid, target))
        conn.executemany(
            "INSERT INTO messages VALUES (?, ?, ?, ?, ?)",
            [(sid, target, from_ + i, chains[from_ + i], p.body) for i, p in enumerate(new)],
        )
        conn.executemany(
            "INSERT INTO blobs VALUES (?, ?, ?)", [(sid, r, d) for r, d in fresh.items()]
        )
        conn.execute(
            "UPDATE sessions SET head=?, bytes=? WHERE id=?", (target, stored + adding, sid)
        )
        return IngestResult(target, n, n - from_, new_branch)

    async def load(
        self, tenant: str, session: str, branch: int | None = None, *, messages: bool = True
    ) -> StoredHistory:
        check_id("tenant", tenant)
        check_id("session", session)
        if branch is not None:
            check_branch(branch)
        return await self._run(
            lambda c: self._load(c, tenant, session, branch, messages), write=True
        )

    def _load(
        self,
        conn: sqlite3.Connection,
        tenant: str,
        session: str,
        branch: int | None,
        with_messages: bool,
    ) -> StoredHistory:
        sid = self._need_sid(conn, tenant, session)
        (head,) = conn.execute("SELECT head FROM sessions WHERE id=?", (sid,)).fetchone()
        b = head if branch is None else branch
        branches = _branches(conn, sid)
        if b not in branches:
            raise NotFound(f"session {session!r} has no branch {b}")
        bodies: list[bytes] = []
        if with_messages:
            for s, lo, hi in ancestry(branches, b):
                bodies += [
                    bytes(r[0])
                    for r in conn.execute(
                        "SELECT body FROM messages WHERE sid=? AND branch=? AND pos>=? AND pos<?"
                        " ORDER BY pos",
                        (sid, s, lo, hi),
                    )
                ]
        turns = _turns(conn, sid, branches, b)
        return assemble(session, b, branches, bodies, turns, _blob_reader(conn, sid))

    def _branch_length(self, conn: sqlite3.Connection, sid: int, session: str, b: int) -> int:
        row = conn.execute(
            "SELECT length FROM branches WHERE sid=? AND branch=?", (sid, b)
        ).fetchone()
        if row is None:
            raise NotFound(f"session {session!r} has no branch {b}")
        return int(row[0])

    async def append_gateway_turns(
        self, tenant: str, session: str, branch: int, after_index: int, messages: Sequence[Message]
    ) -> None:
        check_id("tenant", tenant)
        check_id("session", session)
        check_branch(branch)
        check_turns(after_index, messages)
        packed = [codec.pack_message(m) for m in messages]

        def write(conn: sqlite3.Connection) -> None:
            sid = self._need_sid(conn, tenant, session)
            length = self._branch_length(conn, sid, session, branch)
            if after_index >= length:
                raise bad_after_index(after_index, branch, length)
            fresh = _fresh_blobs(conn, sid, packed)
            (stored,) = conn.execute("SELECT bytes FROM sessions WHERE id=?", (sid,)).fetchone()
            adding = sum(len(p.body) for p in packed) + sum(len(d) + 16 for d in fresh.values())
            if stored + adding > self.max_session_bytes:
                raise too_large(tenant, session, stored, adding, self.max_session_bytes)
            (seq,) = conn.execute(
                "SELECT COALESCE(MAX(seq) + 1, 0) FROM gateway_turns WHERE sid=? AND branch=?",
                (sid, branch),
            ).fetchone()
            conn.executemany(
                "INSERT INTO gateway_turns VALUES (?, ?, ?, ?, ?)",
                [(sid, branch, seq + i, after_index, p.body) for i, p in enumerate(packed)],
            )
            conn.executemany(
                "INSERT INTO blobs VALUES (?, ?, ?)", [(sid, r, d) for r, d in fresh.items()]
            )
            conn.execute("UPDATE sessions SET bytes=? WHERE id=?", (stored + adding, sid))

        await self._run(write, write=True, quick=True)

    # -- counters ----------------------------------------------------------------------
    async def add_counts(
        self,
        tenant: str,
        session: str,
        branch: int,
        counts: Mapping[str, int],
        *,
        token: str,
        latest: Mapping[str, int] | None = None,
        record: bytes | None = None,
    ) -> None:
        check_id("tenant", tenant)
        check_id("session", session)
        check_branch(branch)
        latest = latest or {}
        check_counts(counts, token, latest)

        def add(conn: sqlite3.Connection) -> None:
            now = time.time()
            conn.execute("DELETE FROM count_tokens WHERE expires<?", (now,))
            seen = conn.execute(
                "INSERT OR IGNORE INTO count_tokens VALUES (?, ?, ?)",
                (tenant, token, now + COUNT_TOKEN_TTL_S),
            )
            if seen.rowcount == 0:
                return  # a repeated call: counted already
            conn.executemany(
                "INSERT INTO tenant_counts VALUES (?, ?, ?) ON CONFLICT (tenant, name)"
                " DO UPDATE SET value = value + excluded.value",
                [(tenant, name, value) for name, value in counts.items()],
            )
            sid = self._sid(conn, tenant, session, create=False)
            if (
                sid is None
                or conn.execute(
                    "SELECT 1 FROM branches WHERE sid=? AND branch=?", (sid, branch)
                ).fetchone()
                is None
            ):
                return
            conn.executemany(
                "INSERT INTO counts VALUES (?, ?, ?, ?) ON CONFLICT (sid, branch, name)"
                " DO UPDATE SET value = value + excluded.value",
                [(sid, branch, name, value) for name, value in counts.items()],
            )
            conn.executemany(
                "INSERT OR REPLACE INTO counts VALUES (?, ?, ?, ?)",
                [(sid, branch, name, value) for name, value in latest.items()],
            )
            if record is not None:
                conn.execute(
                    "INSERT INTO request_log SELECT ?, ?, COALESCE(MAX(seq) + 1, 0), ?"
                    " FROM request_log WHERE sid=? AND branch=?",
                    (sid, branch, record, sid, branch),
                )

        await self._run(add, write=True, quick=True)

    async def get_log(self, tenant: str, session: str, branch: int) -> list[bytes]:
        check_id("tenant", tenant)
        check_id("session", session)
        check_branch(branch)

        def read(conn: sqlite3.Connection) -> list[bytes]:
            sid = self._need_sid(conn, tenant, session)
            self._branch_length(conn, sid, session, branch)
            rows = conn.execute(
                "SELECT data FROM request_log WHERE sid=? AND branch=? ORDER BY seq",
                (sid, branch),
            )
            return [bytes(r[0]) for r in rows]

        return await self._run(read, write=True)

    async def get_counts(self, tenant: str, session: str, branch: int) -> dict[str, int]:
        check_id("tenant", tenant)
        check_id("session", session)
        check_branch(branch)

        def read(conn: sqlite3.Connection) -> dict[str, int]:
            sid = self._need_sid(conn, tenant, session)
            self._branch_length(conn, sid, session, branch)
            rows = conn.execute(
                "SELECT name, value FROM counts WHERE sid=? AND branch=?", (sid, branch)
            )
            return {str(name): int(value) for name, value in rows}

        return await self._run(read, write=True, quick=True)

    async def get_tenant_counts(self, tenant: str) -> dict[str, int]:
        check_id("tenant", tenant)
        rows = await self._run(
            lambda c: c.execute(
                "SELECT name, value FROM tenant_counts WHERE tenant=?", (tenant,)
            ).fetchall()
        )
        return {str(name): int(value) for name, value in rows}

    async def charge(
        self,
        tenant: str,
        charges: Sequence[Charge],
        *,
        session: str | None = None,
        max_sessions: int | None = None,
    ) -> Refusal | None:
        check_id("tenant", tenant)
        if session is not None:
            check_id("session", session)

        def take(conn: sqlite3.Connection) -> Refusal | None:
            now = time.time()
            conn.execute("DELETE FROM quota_counters WHERE tenant=? AND expires<?", (tenant, now))
            if session is not None and max_sessions is not None:
                live = "tenant=? AND used>=?"
                cutoff = now - self.ttl_s
                known = conn.execute(
                    f"SELECT 1 FROM sessions WHERE {live} AND session=?", (tenant, cutoff, session)
                ).fetchone()
                if known is None:
                    (count,) = conn.execute(
                        f"SELECT COUNT(*) FROM sessions WHERE {live}", (tenant, cutoff)
                    ).fetchone()
                    if count >= max_sessions:
                        return Refusal("sessions", int(count), max_sessions)
            writes = []
            for c in charges:
                name, keep_s = window_key(c, now)
                row = conn.execute(
                    "SELECT value FROM quota_counters WHERE tenant=? AND name=?", (tenant, name)
                ).fetchone()
                current = 0 if row is None else int(row[0])
                if over_limit(current, c):
                    return Refusal(c.name, current, c.limit or 0)
                if c.amount:
                    writes.append((tenant, name, max(current + c.amount, 0), now + keep_s))
            conn.executemany("INSERT OR REPLACE INTO quota_counters VALUES (?, ?, ?, ?)", writes)
            return None

        return await self._run(take, write=True, quick=True)

    # -- router assignment -------------------------------------------------------------
    async def get_assignment(self, tenant: str, session: str) -> str | None:
        check_id("tenant", tenant)
        check_id("session", session)
        return await self._run(lambda c: _assignment(c, tenant, session, time.time()))

    async def set_assignment(
        self, tenant: str, session: str, replica: str, *, expected: str | None, ttl_s: float
    ) -> str:
        check_id("tenant", tenant)
        check_id("session", session)
        assign = Assign(replica, expected, ttl_s)
        check_assign(assign)
        return await self._run(lambda c: _set_assignment(c, tenant, session, assign), write=True)

    # -- kept replies ------------------------------------------------------------------
    async def put_reply(self, tenant: str, reply_id: str, data: bytes) -> None:
        check_id("tenant", tenant)
        check_id("reply", reply_id)

        def put(conn: sqlite3.Connection) -> None:
            now = time.time()
            conn.execute("DELETE FROM replies WHERE expires<=?", (now,))
            conn.execute(
                "INSERT OR REPLACE INTO replies VALUES (?, ?, ?, ?)",
                (tenant, reply_id, data, now + self.ttl_s),
            )

        await self._run(put, write=True, quick=True)

    async def get_reply(self, tenant: str, reply_id: str) -> bytes | None:
        check_id("tenant", tenant)
        check_id("reply", reply_id)

        def read(conn: sqlite3.Connection) -> bytes | None:
            row = conn.execute(
                "SELECT data FROM replies WHERE tenant=? AND id=? AND expires>?",
                (tenant, reply_id, time.time()),
            ).fetchone()
            return None if row is None else bytes(row[0])

        return await self._run(read, quick=True)

    # -- sessions ----------------------------------------------------------------------
    async def list_sessions(self, tenant: str) -> list[str]:
        check_id("tenant", tenant)

        def listing(conn: sqlite3.Connection) -> list[str]:
            cutoff = time.time() - self.ttl_s
            for (sid,) in conn.execute(
                "SELECT id FROM sessions WHERE tenant=? AND used<?", (tenant, cutoff)
            ).fetchall():
                _purge(conn, sid)
            rows = conn.execute(
                "SELECT session FROM sessions WHERE tenant=? ORDER BY used", (tenant,)
            )
            return [str(r[0]) for r in rows]

        return await self._run(listing, write=True)

    async def delete_session(self, tenant: str, session: str) -> bool:
        check_id("tenant", tenant)
        check_id("session", session)
        self._digests.forget(tenant, session)

        def delete(conn: sqlite3.Connection) -> bool:
            conn.execute("DELETE FROM assignments WHERE tenant=? AND session=?", (tenant, session))
            sid = self._sid(conn, tenant, session, create=False)
            if sid is None:
                return False
            _purge(conn, sid)
            return True

        return await self._run(delete, write=True)

    async def stored_bytes(self, tenant: str, session: str) -> int:
        """Bytes of history the session holds (bodies, chain digests, blobs): for benchmarks."""
        (stored,) = await self._run(
            lambda c: c.execute(
                "SELECT COALESCE(SUM(bytes), 0) FROM sessions WHERE tenant=? AND session=?",
                (tenant, session),
            ).fetchone()
        )
        return int(stored)

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


# SQLITE_BUSY and SQLITE_LOCKED (with extended codes): another connection holds the lock.
_LOCKED = {sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED} | {
    getattr(sqlite3, name)
    for name in dir(sqlite3)
    if name.startswith(("SQLITE_BUSY_", "SQLITE_LOCKED_"))
}


def _transaction(conn: sqlite3.Connection, fn: Callable[[sqlite3.Connection], T], write: bool) -> T:
    conn.execute("BEGIN IMMEDIATE" if write else "BEGIN")
    try:
        out = fn(conn)
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
    return out


def _purge(conn: sqlite3.Connection, sid: int) -> None:
    for table in _SESSION_TABLES:
        conn.execute(f"DELETE FROM {table} WHERE sid=?", (sid,))
    conn.execute("DELETE FROM sessions WHERE id=?", (sid,))


def _branches(conn: sqlite3.Connection, sid: int) -> dict[int, tuple[int, int, int]]:
    return {
        b: (p, f, n)
        for b, p, f, n in conn.execute(
            "SELECT branch, parent, fork, length FROM branches WHERE sid=?", (sid,)
        )
    }


def _select(
    conn: sqlite3.Connection,
    sid: int,
    head: int,
    branches: Mapping[int, tuple[int, int, int]],
    chains: Sequence[bytes],
) -> tuple[int, int, int]:
    """Where a sent history (its chained digests) lands: (branch, stored, parent).

    ``branch`` >= 0: the longest stored branch the history extends (ties: the head), or the
    branch it repeats or is a prefix of; its first ``stored`` messages are stored already
    (all of them: nothing to append). ``branch`` -1: a new branch forking from ``parent``
    (-1 for none: a new session) after ``stored`` shared messages.
    """

    def chain_at(b: int, pos: int) -> bytes:
        while pos < branches[b][1]:
            b = branches[b][0]
        row = conn.execute(
            "SELECT chain FROM messages WHERE sid=? AND branch=? AND pos=?", (sid, b, pos)
        ).fetchone()
        return bytes(row[0])

    n = len(chains)
    # the longest branch whose history is a prefix of the request (ties: the head)
    best, from_ = -1, 0
    for b, (_, _, length) in branches.items():
        better = length > from_ or (length == from_ and b == head)
        if length <= n and better and chain_at(b, length - 1) == chains[length - 1]:
            best, from_ = b, length
    if best >= 0:
        return best, from_, -1
    # diverged: fork from the branch sharing the longest common prefix
    parent = -1
    for b, (_, _, length) in branches.items():
        lo, hi = 0, min(length, n)
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if chain_at(b, mid - 1) == chains[mid - 1]:
                lo = mid
            else:
                hi = mid - 1
        if lo > from_ or (lo == from_ and lo > 0 and b == head):
            from_, parent = lo, b
    if from_ == n:
        return parent, n, -1  # a shorter re-send: stored already
    return -1, from_, parent


def _turns(
    conn: sqlite3.Connection, sid: int, branches: Mapping[int, tuple[int, int, int]], b: int
) -> list[tuple[int, bytes]]:
    """Branch ``b``'s gateway turns as (after_index, body), in record order; a fork sees an
    ancestor's turns that follow a message of the shared part."""
    turns: list[tuple[int, bytes]] = []
    for s, _, hi in ancestry(branches, b):
        turns += [
            (a, bytes(body))
            for a, body in conn.execute(
                "SELECT after, body FROM gateway_turns WHERE sid=? AND branch=? AND after<?"
                " ORDER BY seq",
                (sid, s, hi),
            )
        ]
    return turns


def _fresh_blobs(
    conn: sqlite3.Connection, sid: int | None, packed: Sequence[codec.PackedMessage]
) -> dict[bytes, bytes]:
    """The blobs of ``packed`` that session ``sid`` (None: a new one) does not hold yet,
    in their stored form."""
    return {
        ref: codec.encode_blob(text)
        for ref, text in blob_texts(packed).items()
        if sid is None
        or conn.execute("SELECT 1 FROM blobs WHERE sid=? AND digest=?", (sid, ref)).fetchone()
        is None
    }


def _blob_reader(conn: sqlite3.Connection, sid: int) -> Callable[[bytes], bytes | None]:
    def fetch_blob(ref: bytes) -> bytes | None:
        row = conn.execute("SELECT data FROM blobs WHERE sid=? AND digest=?", (sid, ref)).fetchone()
        return None if row is None else bytes(row[0])

    return fetch_blob


def _assignment(conn: sqlite3.Connection, tenant: str, session: str, now: float) -> str | None:
    row = conn.execute(
        "SELECT replica FROM assignments WHERE tenant=? AND session=? AND expires>?",
        (tenant, session, now),
    ).fetchone()
    return None if row is None else str(row[0])


def _set_assignment(conn: sqlite3.Connection, tenant: str, session: str, assign: Assign) -> str:
    now = time.time()
    current = _assignment(conn, tenant, session, now)
    if current is not None and current not in (assign.replica, assign.expected):
        return current
    conn.execute(
        "INSERT OR REPLACE INTO assignments VALUES (?, ?, ?, ?)",
        (tenant, session, assign.replica, now + assign.ttl_s),
    )
    return assign.replica
