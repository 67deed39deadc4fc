"""The SQLite backend's assignments: one row per session, with its expiry."""

from __future__ import annotations

import sqlite3
import time

from store.assignments import Assign, Assignments
from store.sqlite.database import SQLiteDatabase


class SQLiteAssignments(Assignments):
    db: SQLiteDatabase

    async def read_assignment(self, tenant: str, session: str) -> str | None:
        return await self.db.run(lambda c: assignment(c, tenant, session, time.time()))

    async def write_assignment(self, tenant: str, session: str, assign: Assign) -> str:
        return await self.db.run(lambda c: set_assignment(c, tenant, session, assign), write=True)


def assignment(conn: sqlite3.Connection, tenant: str, session: str, now: float) -> str | None:
    """The session's live assignment, in a transaction the caller holds."""
    row = conn.execute(
        "SELECT replica FROM assignments WHERE tenant=? AND session=? AND expires>?",
        (tenant, session, now),
    ).fetchone()
    return None if row is None else str(row[0])


def set_assignment(conn: sqlite3.Connection, tenant: str, session: str, assign: Assign) -> str:
    """The compare-and-set of ``set_assignment``, in a write transaction the caller holds."""
    now = time.time()
    current = assignment(conn, tenant, session, now)
    if current is not None and current not in (assign.replica, assign.expected):
        return current
    conn.execute(
        "INSERT OR REPLACE INTO assignments VALUES (?, ?, ?, ?)",
        (tenant, session, assign.replica, now + assign.ttl_s),
    )
    return assign.replica
