"""``open_store``: pick the backend from a URL (Redis when given one, else embedded SQLite)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from store.base import SessionStore


def default_sqlite_path() -> Path:
    """``$FOLDGATE_HOME/store.db``, else ``~/.foldgate/store.db``."""
    home = os.environ.get("FOLDGATE_HOME")
    return (Path(home) if home else Path.home() / ".foldgate") / "store.db"


def open_store(url: str | None = None, **options: Any) -> SessionStore:
    """``redis://``/``rediss://``/``unix://`` -> Redis; ``sqlite:///path`` or None -> SQLite.

    ``options`` go to the backend (``ttl_s``, ``max_session_bytes``, ``timeout_s``, ...).
    """
    if url is None or url == "":
        from store.sqlite_store import SQLiteStore

        return SQLiteStore(default_sqlite_path(), **options)
    scheme, sep, rest = url.partition("://")
    if not sep:
        raise ValueError(
            f"store URL {url!r} has no scheme; use redis://host:port or sqlite:///path"
        )
    if scheme in ("redis", "rediss", "unix"):
        from store.redis_store import RedisStore

        return RedisStore(url, **options)
    if scheme == "sqlite":
        from store.sqlite_store import SQLiteStore

        if not rest:
            raise ValueError(f"store URL {url!r} names no database file")
        return SQLiteStore(rest, **options)
    raise ValueError(f"unknown store URL scheme {scheme!r} in {url!r}; expected redis or sqlite")
