"""SQLite backend: the embedded default for one host, one module per contract.

Same contracts and model as every backend (``store.session_store``); where each call runs
and how it stays atomic: ``store.sqlite.database``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Self

from store.session_store import DEFAULT_TIMEOUT_S, SessionStore
from store.sqlite.assignments import SQLiteAssignments
from store.sqlite.database import SQLiteDatabase
from store.sqlite.histories import SQLiteHistories
from store.sqlite.ledger import SQLiteLedger
from store.sqlite.replies import SQLiteReplies


class SQLiteStore(SQLiteHistories, SQLiteLedger, SQLiteAssignments, SQLiteReplies, SessionStore):
    """Every contract on one SQLite database file (``db``)."""

    def __init__(self, path: str | Path, *, timeout_s: float = DEFAULT_TIMEOUT_S, **kwargs: Any):
        super().__init__(**kwargs)
        self.db = SQLiteDatabase(path, timeout_s)

    @classmethod
    def from_url(cls, url: str, **options: Any) -> Self:
        """``sqlite:///path/to/file.db``."""
        path = url.partition("://")[2]
        if not path:
            raise ValueError(f"store URL {url!r} names no database file")
        return cls(path, **options)

    @property
    def path(self) -> str:
        return self.db.path

    async def close(self) -> None:
        await self.db.close()


__all__ = ["SQLiteStore"]
