"""Session store: append-only histories, forks, counters, quotas and the router's assignments."""

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
    "default_sqlite_path",
    "open_store",
]
