"""The SQLite backend's histories: sessions, branches, messages, blobs and gateway turns."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable, Sequence
from dataclasses import replace

from store import codec
from store.assignments import Assign
from store.branches import BranchTable, ancestry, assemble, select_branch, turns_before
from store.digests import PackedHistory
from store.errors import NotFound
from store.histories import Histories, IngestResult, Lookup, StoredHistory
from store.sizes import added_bytes, bad_after_index, blob_texts, surely_fits, too_large
from store.sqlite.assignments import assignment, set_assignment
from store.sqlite.database import SQLiteDatabase
from store.sqlite.ledger import branch_counts
from store.sqlite.sessions import branch_length, branch_table, need_session, purge, session_id

# An ingest that may write this many new messages runs where a quick call does; one that
# may write more (a session's first request at the message limit: tens of milliseconds of
# inserts) on the worker thread.
QUICK_INGEST_MESSAGES = 256


def quick_ingest(history: PackedHistory) -> bool:
    """Whether storing ``history`` is bounded work: the messages not known stored are few."""
    return len(history.packed) - (history.known_stored or 0) <= QUICK_INGEST_MESSAGES


class SQLiteHistories(Histories):
    db: SQLiteDatabase
    ttl_s: float

    async def store_history(
        self,
        tenant: str,
        session: str,
        history: PackedHistory,
        cap: int,
        assign: Assign | None,
    ) -> IngestResult:
        def write(conn: sqlite3.Connection) -> IngestResult:
            result = self._ingest(conn, tenant, session, history, cap)
            if assign is None:
                return result
            return replace(result, assignment=set_assignment(conn, tenant, session, assign))

        return await self.db.run(write, write=True, quick=quick_ingest(history))

    async def find_history(
        self, tenant: str, session: str, history: PackedHistory, cap: int
    ) -> Lookup:
        def refuse_over_cap(
            conn: sqlite3.Connection, sid: int | None, stored: int, at: int
        ) -> None:
            """Refuse as ``_ingest`` would, storing the messages from index ``at``."""
            new = history.packed[at:]
            if surely_fits(stored, new, cap):
                return
            adding = added_bytes(new, fresh_blobs(conn, sid, new))
            if stored + adding > cap:
                raise too_large(tenant, session, stored, adding, cap)

        def read(conn: sqlite3.Connection) -> Lookup:
            asg = assignment(conn, tenant, session, time.time())
            row = conn.execute(
                "SELECT id, head, used, bytes FROM sessions WHERE tenant=? AND session=?",
                (tenant, session),
            ).fetchone()
            if row is None or row[2] < time.time() - self.ttl_s:
                refuse_over_cap(conn, None, 0, 0)
                return Lookup(None, 0, {}, {}, asg)
            sid, head = int(row[0]), int(row[1])
            branches = branch_table(conn, sid)
            target, from_, parent = select(conn, sid, head, branches, history.chains)
            refuse_over_cap(conn, sid, int(row[3]), from_)
            owner = target if target >= 0 else parent
            if owner < 0:
                return Lookup(None, from_, {}, {}, asg)
            limit = len(history.chains) if target >= 0 else from_
            turns = turns_before(gateway_turns(conn, sid, branches, owner), limit)
            found = assemble(session, owner, branches, [], turns, blob_reader(conn, sid))
            counts = branch_counts(conn, sid, target) if target >= 0 else {}
            return Lookup(target if target >= 0 else None, from_, found.gateway_turns, counts, asg)

        return await self.db.run(read, quick=True)

    def _ingest(
        self,
        conn: sqlite3.Connection,
        tenant: str,
        session: str,
        history: PackedHistory,
        cap: int,
    ) -> IngestResult:
        sid = session_id(conn, tenant, session, self.ttl_s, create=True)
        head, stored = conn.execute(
            "SELECT head, bytes FROM sessions WHERE id=?", (sid,)
        ).fetchone()
        branches = branch_table(conn, sid)
        chains, n = history.chains, len(history.chains)
        target, from_, parent = select(conn, sid, head, branches, chains)
        if from_ == n:
            # an identical re-send, or a shorter one (a late or retried earlier request)
            conn.execute("UPDATE sessions SET head=? WHERE id=?", (target, sid))
            return IngestResult(target, n, 0, False)
        new_branch = target < 0
        if new_branch:
            target = len(branches)
        new = history.packed[from_:]
        fresh = fresh_blobs(conn, sid, new)
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

    async def load_branch(
        self, tenant: str, session: str, branch: int | None, with_messages: bool
    ) -> StoredHistory:
        def read(conn: sqlite3.Connection) -> StoredHistory:
            sid = need_session(conn, tenant, session, self.ttl_s)
            (head,) = conn.execute("SELECT head FROM sessions WHERE id=?", (sid,)).fetchone()
            b = head if branch is None else branch
            branches = branch_table(conn, sid)
            if b not in branches:
                raise NotFound(f"session {session!r} has no branch {b}")
            bodies: list[bytes] = []
            if with_messages:
                for s, lo, hi in ancestry(branches, b):
                    bodies += [
                        bytes(r[0])
                        for r in conn.execute(
                            "SELECT body FROM messages WHERE sid=? AND branch=? AND pos>=?"
                            " AND pos<? ORDER BY pos",
                            (sid, s, lo, hi),
                        )
                    ]
            turns = gateway_turns(conn, sid, branches, b)
            return assemble(session, b, branches, bodies, turns, blob_reader(conn, sid))

        return await self.db.run(read, write=True)

    async def store_gateway_turns(
        self,
        tenant: str,
        session: str,
        branch: int,
        after_index: int,
        packed: Sequence[codec.PackedMessage],
    ) -> None:
        def write(conn: sqlite3.Connection) -> None:
            sid = need_session(conn, tenant, session, self.ttl_s)
            length = branch_length(conn, sid, session, branch)
            if after_index >= length:
                raise bad_after_index(after_index, branch, length)
            fresh = fresh_blobs(conn, sid, packed)
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

        await self.db.run(write, write=True, quick=True)

    async def live_sessions(self, tenant: str) -> list[str]:
        def listing(conn: sqlite3.Connection) -> list[str]:
            cutoff = time.time() - self.ttl_s
            for (sid,) in conn.execute(
                "SELECT id FROM sessions WHERE tenant=? AND used<?", (tenant, cutoff)
            ).fetchall():
                purge(conn, sid)
            rows = conn.execute(
                "SELECT session FROM sessions WHERE tenant=? ORDER BY used", (tenant,)
            )
            return [str(r[0]) for r in rows]

        return await self.db.run(listing, write=True)

    async def page_sessions(
        self, tenant: str, limit: int, after: tuple[float, str] | None
    ) -> list[tuple[str, float]]:
        def page(conn: sqlite3.Connection) -> list[tuple[str, float]]:
            where, args = "tenant=? AND used>=?", [tenant, time.time() - self.ttl_s]
            if after is not None:
                where += " AND (used < ? OR (used = ? AND session < ?))"
                args += [after[0], after[0], after[1]]
            rows = conn.execute(
                f"SELECT session, used FROM sessions WHERE {where} "
                "ORDER BY used DESC, session DESC LIMIT ?",
                [*args, limit],
            )
            return [(str(name), float(used)) for name, used in rows]

        return await self.db.run(page)

    async def drop_session(self, tenant: str, session: str) -> bool:
        def delete(conn: sqlite3.Connection) -> bool:
            conn.execute("DELETE FROM assignments WHERE tenant=? AND session=?", (tenant, session))
            sid = session_id(conn, tenant, session, self.ttl_s, create=False)
            if sid is None:
                return False
            purge(conn, sid)
            return True

        return await self.db.run(delete, write=True)

    async def stored_bytes(self, tenant: str, session: str) -> int:
        """Bytes of history the session holds (bodies, chain digests, blobs): for benchmarks."""
        (stored,) = await self.db.run(
            lambda c: c.execute(
                "SELECT COALESCE(SUM(bytes), 0) FROM sessions WHERE tenant=? AND session=?",
                (tenant, session),
            ).fetchone()
        )
        return int(stored)


def select(
    conn: sqlite3.Connection,
    sid: int,
    head: int,
    branches: BranchTable,
    chains: Sequence[bytes],
) -> tuple[int, int, int]:
    """``branches.select`` on the session's stored chained digests."""

    def chain_at(b: int, pos: int) -> bytes:
        row = conn.execute(
            "SELECT chain FROM messages WHERE sid=? AND branch=? AND pos=?", (sid, b, pos)
        ).fetchone()
        return bytes(row[0])

    return select_branch(branches, head, chains, chain_at)


def gateway_turns(
    conn: sqlite3.Connection, sid: int, branches: BranchTable, b: int
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


def fresh_blobs(
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


def blob_reader(conn: sqlite3.Connection, sid: int) -> Callable[[bytes], bytes | None]:
    def fetch_blob(ref: bytes) -> bytes | None:
        row = conn.execute("SELECT data FROM blobs WHERE sid=? AND digest=?", (sid, ref)).fetchone()
        return None if row is None else bytes(row[0])

    return fetch_blob
