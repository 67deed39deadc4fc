"""The SQLite backend's kept replies: one row per (tenant, id), with its expiry."""

from __future__ import annotations

import sqlite3
import time

from store.replies import KeptReplies
from store.sqlite.database import SQLiteDatabase


class SQLiteReplies(KeptReplies):
    db: SQLiteDatabase
    ttl_s: float

    async def keep_reply(self, tenant: str, reply_id: str, data: bytes) -> None:
        def put(conn: sqlite3.Connection) -> None:
            now = time.time()
            conn.execute("DELETE FROM replies WHERE expires<=?", (now,))
            conn.execute(
                "INSERT OR REPLACE INTO replies VALUES (?, ?, ?, ?)",
                (tenant, reply_id, data, now + self.ttl_s),
            )

        await self.db.run(put, write=True, quick=True)

    async def read_reply(self, tenant: str, reply_id: str) -> bytes | None:
        def read(conn: sqlite3.Connection) -> bytes | None:
            row = conn.execute(
                "SELECT data FROM replies WHERE tenant=? AND id=? AND expires>?",
                (tenant, reply_id, time.time()),
            ).fetchone()
            return None if row is None else bytes(row[0])

        return await self.db.run(read, quick=True)
