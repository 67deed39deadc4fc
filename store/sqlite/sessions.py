"""The SQLite backend's session rows: finding (and expiring) a session, its branch table.

Expired sessions (unused for longer than the TTL) read as absent and are purged lazily.
"""

from __future__ import annotations

import sqlite3
import time

from store.branches import BranchTable
from store.errors import NotFound

# Every table keyed by a session's row id (``sid``).
SESSION_TABLES = ("branches", "messages", "blobs", "gateway_turns", "request_log", "counts")


def session_id(
    conn: sqlite3.Connection, tenant: str, session: str, ttl_s: float, *, create: bool
) -> int | None:
    """The session's row id, purging it first when it has expired; touches it."""
    now = time.time()
    row = conn.execute(
        "SELECT id, used FROM sessions WHERE tenant=? AND session=?", (tenant, session)
    ).fetchone()
    if row is not None and row[1] < now - ttl_s:
        purge(conn, row[0])
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


def need_session(conn: sqlite3.Connection, tenant: str, session: str, ttl_s: float) -> int:
    """``session_id`` of a session that must exist: ``NotFound`` otherwise."""
    sid = session_id(conn, tenant, session, ttl_s, create=False)
    if sid is None:
        raise NotFound(f"no session {session!r} for tenant {tenant!r}")
    return sid


def purge(conn: sqlite3.Connection, sid: int) -> None:
    for table in SESSION_TABLES:
        conn.execute(f"DELETE FROM {table} WHERE sid=?", (sid,))
    conn.execute("DELETE FROM sessions WHERE id=?", (sid,))


def branch_table(conn: sqlite3.Connection, sid: int) -> BranchTable:
    return {
        b: (p, f, n)
        for b, p, f, n in conn.execute(
            "SELECT branch, parent, fork, length FROM branches WHERE sid=?", (sid,)
        )
    }


def branch_length(conn: sqlite3.Connection, sid: int, session: str, branch: int) -> int:
    """How many messages ``branch`` holds: ``NotFound`` without it."""
    row = conn.execute(
        "SELECT length FROM branches WHERE sid=? AND branch=?", (sid, branch)
    ).fetchone()
    if row is None:
        raise NotFound(f"session {session!r} has no branch {branch}")
    return int(row[0])
