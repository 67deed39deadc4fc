"""``open_store``: the backend a store URL names, from the table of registered backends.

A backend is a package with a ``SessionStore`` subclass that opens itself from a URL
(``from_url(url, **options)``); registering it is one line in ``BACKENDS``. Imported only
when a URL names it, so a process pays for the backends it uses.
"""

from __future__ import annotations

import importlib
import os
from pathlib import Path
from typing import Any

from store.session_store import SessionStore

# URL scheme -> "module:class" of the backend.
BACKENDS: dict[str, str] = {
    **dict.fromkeys(("redis", "rediss", "unix"), "store.redis:RedisStore"),
    "sqlite": "store.sqlite:SQLiteStore",
}


def foldgate_home() -> Path:
    """Where foldgate keeps its files: ``$FOLDGATE_HOME``, else ``~/.foldgate``."""
    home = os.environ.get("FOLDGATE_HOME")
    return Path(home) if home else Path.home() / ".foldgate"


def default_sqlite_path() -> Path:
    """``store.db`` in ``foldgate_home()``."""
    return foldgate_home() / "store.db"


def open_store(url: str | None = None, **options: Any) -> SessionStore:
    """``redis://``/``rediss://``/``unix://`` -> Redis; ``sqlite:///path`` or None -> SQLite
    at ``default_sqlite_path()``.

    ``options`` go to the backend (``ttl_s``, ``max_session_bytes``, ``timeout_s``,
    ``digest_cache_bytes``, ``digest_cache_callbacks``, ...).
    """
    if url is None or url == "":
        url = f"sqlite://{default_sqlite_path()}"
    scheme, sep, _ = url.partition("://")
    if not sep:
        raise ValueError(
            f"store URL {url!r} has no scheme; use redis://host:port or sqlite:///path"
        )
    where = BACKENDS.get(scheme)
    if where is None:
        raise ValueError(
            f"unknown store URL scheme {scheme!r} in {url!r}; expected one of "
            + ", ".join(sorted(BACKENDS))
        )
    module, _, name = where.partition(":")
    backend: type[SessionStore] = getattr(importlib.import_module(module), name)
    return backend.from_url(url, **options)
