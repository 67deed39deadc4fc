"""The SQLite backend's ledger: counters, request logs, counting tokens, quota counters,
leases (deadlines by this host's clock, which every process sharing the file shares)."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Mapping, Sequence

from store.ledger import (
    COUNT_TOKEN_TTL_S,
    Charge,
    HeldLease,
    LeaseClaim,
    Ledger,
    Refusal,
    over_limit,
    window_key,
)
from store.sqlite.database import SQLiteDatabase
from store.sqlite.sessions import branch_length, need_session, session_id


class SQLiteLedger(Ledger):
    db: SQLiteDatabase
    ttl_s: float

    async def record_counts(
        self,
        tenant: str,
        session: str,
        branch: int,
        counts: Mapping[str, int],
        token: str,
        latest: Mapping[str, int],
        record: bytes | None,
    ) -> None:
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
            sid = session_id(conn, tenant, session, self.ttl_s, create=False)
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

        await self.db.run(add, write=True, quick=True)

    async def read_log(self, tenant: str, session: str, branch: int) -> list[bytes]:
        def read(conn: sqlite3.Connection) -> list[bytes]:
            sid = need_session(conn, tenant, session, self.ttl_s)
            branch_length(conn, sid, session, branch)
            rows = conn.execute(
                "SELECT data FROM request_log WHERE sid=? AND branch=? ORDER BY seq",
                (sid, branch),
            )
            return [bytes(r[0]) for r in rows]

        return await self.db.run(read, write=True)

    async def read_counts(self, tenant: str, session: str, branch: int) -> dict[str, int]:
        def read(conn: sqlite3.Connection) -> dict[str, int]:
            sid = need_session(conn, tenant, session, self.ttl_s)
            branch_length(conn, sid, session, branch)
            return branch_counts(conn, sid, branch)

        return await self.db.run(read, write=True, quick=True)

    async def read_tenant_counts(self, tenant: str) -> dict[str, int]:
        rows = await self.db.run(
            lambda c: c.execute(
                "SELECT name, value FROM tenant_counts WHERE tenant=?", (tenant,)
            ).fetchall()
        )
        return {str(name): int(value) for name, value in rows}

    async def take_charges(
        self,
        tenant: str,
        charges: Sequence[Charge],
        session: str | None,
        max_sessions: int | None,
        lease: LeaseClaim | None,
    ) -> Refusal | None:
        def take(conn: sqlite3.Connection) -> Refusal | None:
            now = time.time()
            conn.execute("DELETE FROM quota_counters WHERE tenant=? AND expires<?", (tenant, now))
            if session is not None and max_sessions is not None:
                refused = self._too_many_sessions(conn, tenant, session, max_sessions, now)
                if refused is not None:
                    return refused
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
            if lease is not None:
                refused = self._pool_full(conn, tenant, lease, now)
                if refused is not None:
                    return refused
                conn.execute(
                    "INSERT OR REPLACE INTO leases VALUES (?, ?, ?, ?)",
                    (tenant, lease.name, lease.lease_id, now + lease.period_s),
                )
            conn.executemany("INSERT OR REPLACE INTO quota_counters VALUES (?, ?, ?, ?)", writes)
            return None

        return await self.db.run(take, write=True, quick=True)

    @staticmethod
    def _pool_full(
        conn: sqlite3.Connection, tenant: str, lease: LeaseClaim, now: float
    ) -> Refusal | None:
        """The refusal when the lease's pool holds ``lease.limit`` live leases (not this one)."""
        pool = (tenant, lease.name)
        conn.execute("DELETE FROM leases WHERE tenant=? AND name=? AND deadline<=?", (*pool, now))
        held = conn.execute(
            "SELECT 1 FROM leases WHERE tenant=? AND name=? AND id=?", (*pool, lease.lease_id)
        ).fetchone()
        count, earliest = conn.execute(
            "SELECT COUNT(*), MIN(deadline) FROM leases WHERE tenant=? AND name=?", pool
        ).fetchone()
        if held is not None or count < lease.limit:
            return None
        return Refusal(lease.name, int(count), lease.limit, max(0.0, earliest - now))

    async def extend_leases(self, leases: Sequence[HeldLease], period_s: float) -> list[HeldLease]:
        def extend(conn: sqlite3.Connection) -> list[HeldLease]:
            now = time.time()
            lost = []
            for held in leases:
                renewed = conn.execute(
                    "UPDATE leases SET deadline=? WHERE tenant=? AND name=? AND id=?"
                    " AND deadline>?",
                    (now + period_s, held.tenant, held.name, held.lease_id, now),
                )
                if renewed.rowcount == 0:
                    lost.append(held)
            return lost

        return await self.db.run(extend, write=True, quick=True)

    async def drop_lease(self, lease: HeldLease) -> None:
        await self.db.run(
            lambda conn: conn.execute(
                "DELETE FROM leases WHERE tenant=? AND name=? AND id=?",
                (lease.tenant, lease.name, lease.lease_id),
            ),
            write=True,
            quick=True,
        )

    def _too_many_sessions(
        self, conn: sqlite3.Connection, tenant: str, session: str, max_sessions: int, now: float
    ) -> Refusal | None:
        """The refusal when ``session`` is not live and the tenant has ``max_sessions``."""
        live = "tenant=? AND used>=?"
        cutoff = now - self.ttl_s
        known = conn.execute(
            f"SELECT 1 FROM sessions WHERE {live} AND session=?", (tenant, cutoff, session)
        ).fetchone()
        if known is not None:
            return None
        (count,) = conn.execute(
            f"SELECT COUNT(*) FROM sessions WHERE {live}", (tenant, cutoff)
        ).fetchone()
        return Refusal("sessions", int(count), max_sessions) if count >= max_sessions else None


def branch_counts(conn: sqlite3.Connection, sid: int, branch: int) -> dict[str, int]:
    rows = conn.execute("SELECT name, value FROM counts WHERE sid=? AND branch=?", (sid, branch))
    return {str(name): int(value) for name, value in rows}
