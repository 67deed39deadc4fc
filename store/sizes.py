"""What a write adds to a session's size, and the errors when it would not fit."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from store import codec
from store.errors import SessionTooLarge


def blob_texts(packed: Sequence[codec.PackedMessage]) -> dict[bytes, str]:
    """The distinct blobs of packed messages, by digest."""
    return {ref: text for p in packed for ref, text in p.blobs.items()}


def added_bytes(packed: Sequence[codec.PackedMessage], fresh: Mapping[bytes, bytes]) -> int:
    """What storing ``packed`` history messages adds to a session's size: each body and its
    digest, and each blob the session does not hold yet (``fresh``: digest -> stored form)."""
    return sum(len(p.body) + 16 for p in packed) + sum(len(d) + 16 for d in fresh.values())


def surely_fits(stored: int, packed: Sequence[codec.PackedMessage], cap: int) -> bool:
    """Whether storing ``packed`` keeps a session of ``stored`` bytes within ``cap`` however
    many of its blobs the session already holds: each blob counted as new and stored raw
    (``codec.encode_blob`` never takes more than the text and a format byte). Lets
    ``lookup`` skip the exact count (blob lookups, compression) far from the cap."""
    if not packed:
        return True
    most = sum(len(p.body) + 16 for p in packed) + sum(
        len(text.encode()) + 1 + 16 for text in blob_texts(packed).values()
    )
    return stored + most <= cap


def too_large(tenant: str, session: str, stored: int, adding: int, cap: int) -> SessionTooLarge:
    return SessionTooLarge(
        f"session {session!r} of tenant {tenant!r} would grow to {stored + adding} bytes "
        f"({stored} stored + {adding} new), over the {cap}-byte cap"
    )


def bad_after_index(after_index: int, branch: int, length: int) -> ValueError:
    return ValueError(f"after_index {after_index} is outside branch {branch} ({length} messages)")
