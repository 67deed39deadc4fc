"""Session store: append-only histories, forks, render state and the router's assignments."""

from store.base import (
    Assign,
    Charge,
    IngestResult,
    Lookup,
    NotFound,
    Refusal,
    SessionStore,
    SessionTooLarge,
    StoredHistory,
    StoreError,
    StoreUnavailable,
    VersionConflict,
)
from store.factory import default_sqlite_path, open_store

__all__ = [
    "Assign",
    "Charge",
    "IngestResult",
    "Lookup",
    "NotFound",
    "Refusal",
    "SessionStore",
    "SessionTooLarge",
    "StoreError",
    "StoreUnavailable",
    "StoredHistory",
    "VersionConflict",
    "default_sqlite_path",
    "open_store",
]
