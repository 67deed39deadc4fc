"""Session store: append-only histories, forks, counters, quotas, the router's assignments
and kept replies, behind one small contract per concern and a backend per URL scheme."""

from store.assignments import Assign, Assignments
from store.errors import NotFound, SessionTooLarge, StoreError, StoreUnavailable
from store.histories import Histories, IngestResult, Lookup, SessionPage, StoredHistory
from store.ledger import Charge, HeldLease, LeaseClaim, Ledger, Refusal
from store.registry import default_sqlite_path, foldgate_home, open_store
from store.replies import KeptReplies
from store.session_store import SessionStore

__all__ = [
    "Assign",
    "Assignments",
    "Charge",
    "HeldLease",
    "Histories",
    "IngestResult",
    "KeptReplies",
    "LeaseClaim",
    "Ledger",
    "Lookup",
    "NotFound",
    "Refusal",
    "SessionPage",
    "SessionStore",
    "SessionTooLarge",
    "StoreError",
    "StoreUnavailable",
    "StoredHistory",
    "default_sqlite_path",
    "foldgate_home",
    "open_store",
]
