"""Session store: append-only histories, forks, render state and the router's assignments."""

from store.base import (
    Charge,
    IngestResult,
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
    "Charge",
    "IngestResult",
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
