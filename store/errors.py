"""The errors the store raises on purpose, whichever backend and contract."""


class StoreError(Exception):
    """Base of every error the store raises on purpose."""


class StoreUnavailable(StoreError):
    """The backend cannot be reached or did not answer in time; nothing was written."""


class SessionTooLarge(StoreError):
    """The write would take the session past its size cap; nothing was written."""


class NotFound(StoreError):
    """The session or branch does not exist (or has expired)."""
