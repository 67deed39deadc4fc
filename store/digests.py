"""Per-process memory of each session's last request, so a re-sent history is not re-packed.

Harnesses re-send the whole history every step; comparing dicts for equality is far
cheaper than re-encoding and re-hashing them, so only the new suffix is packed. The cache
never decides correctness: the backend still checks the chained digests.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gateway.lru import LRU
from store import codec

# What the digest cache may remember of sessions' last requests.
DEFAULT_DIGEST_CACHE_BYTES = 64 * 1024 * 1024
# Python's own cost of one remembered message beyond its text and packed bytes (the
# private dict copy, the PackedMessage, the chained digest): counted so that histories of
# many short messages are bounded too. Measured with tracemalloc: ~670-700 B per one-line
# message (bench/memory.py's ``short`` shape).
ENTRY_OVERHEAD = 680

Message = Mapping[str, Any]
# ``gateway.lru.LRU``'s ``on_evict`` / ``on_size``, e.g. ``gateway.metrics.cache_callbacks``.
CacheCallbacks = Mapping[str, Callable[[int], None]]


@dataclass(slots=True)
class PackedHistory:
    """A sent history's messages, packed, with the chained digest at every position."""

    packed: list[codec.PackedMessage]
    chains: list[bytes]
    # Leading messages this process knows are stored (a hint only); None: unknown.
    known_stored: int | None


@dataclass(slots=True)
class _Seen:
    messages: list[Message]
    packed: list[codec.PackedMessage]
    chains: list[bytes]
    sizes: list[int]  # running total of what messages[:i + 1] hold, in bytes
    stored: int | None  # leading messages known stored (``DigestCache.stored``)


def _held_bytes(packed: codec.PackedMessage) -> int:
    """What remembering one message keeps alive: its packed body, the text of its blobs
    (shared with the private copy of the message) and the per-message overhead."""
    return len(packed.body) + sum(len(text) for text in packed.blobs.values()) + ENTRY_OVERHEAD


class DigestCache:
    """Each session's last packed history, bounded by bytes (``gateway.lru.LRU``).

    The least recently used sessions are dropped once the remembered messages hold more
    than ``max_bytes`` (a bound by session count let a few long sessions take gigabytes);
    ``bytes`` is what it holds now. ``callbacks`` are the LRU's (``on_evict``, ``on_size``:
    ``CacheCallbacks``), for metrics.
    """

    def __init__(
        self, max_bytes: int = DEFAULT_DIGEST_CACHE_BYTES, **callbacks: Callable[[int], None]
    ) -> None:
        if max_bytes < 0:
            raise ValueError(f"digest cache bound must be >= 0 bytes, got {max_bytes}")
        self._seen: LRU[_Seen] = LRU(max_bytes, **callbacks)

    @property
    def max_bytes(self) -> int:
        return self._seen.max_size

    @property
    def bytes(self) -> int:
        return self._seen.size

    def __contains__(self, key: tuple[str, str]) -> bool:
        """Whether (tenant, session)'s last history is remembered."""
        return key in self._seen

    def prepare(
        self, tenant: str, session: str, messages: Sequence[Message], *, shared: bool = False
    ) -> PackedHistory:
        """Pack a sent history, reusing what the session's last one shares with it.

        ``shared``: the caller never edits these dicts (the gateway's, reused request after
        request): they are remembered as they are, not copied, and a message the last
        history held is known by identity, without a walk through its fields."""
        if isinstance(messages, str | bytes) or not isinstance(messages, Sequence):
            raise TypeError("ingest expects a sequence of message dicts")
        if not messages:
            raise ValueError("cannot ingest an empty history: a request has at least one message")
        key = (tenant, session)
        seen = self._seen.pop(key)
        same = codec.same_prefix(messages, seen.messages) if seen is not None else 0
        if seen is not None and same == len(seen.messages) == len(messages):
            kept = seen  # a re-send of what was prepared last (ingest after lookup)
        else:
            kept = _extend(seen, same, messages, shared)
        self._seen.put(key, kept, kept.sizes[-1])
        return PackedHistory(kept.packed, kept.chains, kept.stored)

    def stored(self, tenant: str, session: str, history: PackedHistory, count: int) -> None:
        """The first ``count`` messages of ``history`` are stored. Remembered when they are
        also the start of what the session last prepared (another request of the session
        may have been prepared since): their chained digests tell in one comparison."""
        seen = self._seen.peek((tenant, session))
        if seen is None:
            return
        if count == 0 or (
            count <= len(seen.chains) and seen.chains[count - 1] == history.chains[count - 1]
        ):
            seen.stored = count

    def forget(self, tenant: str, session: str) -> None:
        self._seen.pop((tenant, session))


def _extend(seen: _Seen | None, same: int, messages: Sequence[Message], shared: bool) -> _Seen:
    """What to remember of ``messages``: the first ``same`` as ``seen`` had them, the rest
    packed now (and copied, unless ``shared``)."""
    packed = seen.packed[:same] if seen else []
    chains = seen.chains[:same] if seen else []
    sizes = seen.sizes[:same] if seen else []
    prev = chains[-1] if chains else b""
    held = sizes[-1] if sizes else 0
    for message in messages[same:]:
        p = codec.pack_message(message)
        prev = codec.chain(prev, p.digest)
        held += _held_bytes(p)
        packed.append(p)
        chains.append(prev)
        sizes.append(held)
    # keep private copies: a caller editing its dicts in place must not edit our memory
    # (strings are immutable: the copies share them)
    copies = list(messages[same:]) if shared else [copy.deepcopy(m) for m in messages[same:]]
    known = None if seen is None or seen.stored is None else min(same, seen.stored)
    return _Seen((seen.messages[:same] if seen else []) + copies, packed, chains, sizes, known)
