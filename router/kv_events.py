"""vLLM's KV events, decoded, and what they say each replica holds of each session.

A replica started with ``--kv-events-config`` publishes, on a ZMQ PUB socket, multipart
messages ``(topic, sequence number (8 bytes big-endian), payload)``; the payload is a
``KVEventBatch`` in msgspec's msgpack encoding: an array ``[ts, events, data_parallel_rank]``
whose events are maps tagged ``"type"`` (``vllm.distributed.kv_events``, 0.32):
``BlockStored`` (``block_hashes``, ``parent_block_hash``, ``token_ids``, ``block_size``,
``extra_keys``: one entry per block, the first block's holding the untagged
``cache_salt``; ``session_id``), ``BlockRemoved`` (``block_hashes``) and
``AllBlocksCleared``. ``BlockStored`` also reports blocks a request reused from the prefix
cache (``BlockPool.emit_cached_block_events``), from block 0.

Keying. The gateway sends every upstream request a ``session_id`` of its own, an opaque
digest of (tenant, session) (``session_key``), which vLLM copies into the session's
``BlockStored`` events; removals name only hashes. So the index keeps, per replica, the
hashes it holds and, per session, the chain of block hashes its last request stored or
reused (in prefix order: an event with no parent starts the chain, one whose parent is in
it continues after that block). A session's resident prefix is the run of leading blocks
of its chain the replica still holds.

Why not compute the hashes: the gateway never sees token ids (the replica tokenizes the
rendered chat), and the hash depends on the replica's ``--prefix-caching-hash-algo`` and
``PYTHONHASHSEED`` (vllm-router's kv_aware needs ``sha256_cbor`` with a fixed seed; the
default is pickled SHA-256 from a fixed seed): keyed by the session and the hashes the
replica itself reports, the index works whatever the replica hashes with. Tenants stay apart
as the replicas keep them: every request of a tenant carries its ``cache_salt``, which vLLM
hashes into the first block (so the same tokens of two tenants are different blocks) and
reports in that block's ``extra_keys``; a chain counts only for a lookup with its salt.
"""

from __future__ import annotations

import hashlib
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import msgpack

# Chains remembered per replica (sessions; the least recently stored go first).
MAX_CHAINS = 100_000


@dataclass(frozen=True, slots=True)
class BlockStored:
    block_hashes: tuple[Hashable, ...]
    parent: Hashable | None
    block_size: int
    first_salt: str | None  # the untagged cache_salt of the first block, when it is block 0
    session_id: str | None


@dataclass(frozen=True, slots=True)
class BlockRemoved:
    block_hashes: tuple[Hashable, ...]


@dataclass(frozen=True, slots=True)
class AllBlocksCleared:
    pass


KvEvent = BlockStored | BlockRemoved | AllBlocksCleared


class KvEventError(ValueError):
    """A payload that is not a vLLM KV event batch."""


def session_key(tenant: str, session: str) -> str:
    """The ``session_id`` the gateway sends upstream for (tenant, session): opaque, the
    same in every gateway process, distinct across tenants (length-prefixed)."""
    name = tenant.encode()
    digest = hashlib.sha256(len(name).to_bytes(8, "big") + name + session.encode())
    return "fg-" + digest.hexdigest()[:32]


def _hashes(raw: Any) -> tuple[Hashable, ...]:
    if not isinstance(raw, list):
        raise KvEventError(f"block_hashes is not a list: {raw!r:.80}")
    return tuple(h if isinstance(h, bytes | int) else bytes(h) for h in raw)


def _first_salt(event: dict[str, Any]) -> str | None:
    keys = event.get("extra_keys")
    if event.get("parent_block_hash") is not None or not keys or not keys[0]:
        return None
    # Untagged in the event (``to_event_extra_keys``): LoRA name, media keys, then the salt.
    strings = [k for k in keys[0] if isinstance(k, str)]
    return strings[-1] if strings else None


def decode_batch(payload: bytes) -> tuple[float, list[KvEvent]]:
    """One published payload: its timestamp and events (unknown event types skipped: a
    newer vLLM may add some)."""
    try:
        batch = msgpack.unpackb(payload, raw=False, strict_map_key=False)
    except (ValueError, msgpack.UnpackException) as exc:
        raise KvEventError(f"not msgpack: {exc}") from exc
    if not isinstance(batch, list) or len(batch) < 2 or not isinstance(batch[1], list):
        raise KvEventError("not a KVEventBatch [ts, events, ...]")
    events: list[KvEvent] = []
    for raw in batch[1]:
        kind = raw.get("type") if isinstance(raw, dict) else None
        if kind == "BlockStored":
            events.append(
                BlockStored(
                    _hashes(raw.get("block_hashes")),
                    raw.get("parent_block_hash"),
                    int(raw.get("block_size") or 0),
                    _first_salt(raw),
                    raw.get("session_id"),
                )
            )
        elif kind == "BlockRemoved":
            events.append(BlockRemoved(_hashes(raw.get("block_hashes"))))
        elif kind == "AllBlocksCleared":
            events.append(AllBlocksCleared())
    return float(batch[0]), events


_UNKNOWN = "\x00unknown"  # no cache salt is this: a chain counted for nobody


@dataclass(slots=True)
class _Chain:
    salt: str | None
    hashes: list[Hashable]


class KvIndex:
    """What one replica holds, from its events: the block hashes, and each session's chain."""

    def __init__(self, max_chains: int = MAX_CHAINS) -> None:
        self.held: set[Hashable] = set()
        self.block_size = 0
        self._chains: dict[str, _Chain] = {}
        self._max_chains = max_chains
        self._parents: dict[Hashable, Hashable | None] = {}  # held blocks only
        self._root_salts: dict[Hashable, str | None] = {}  # held block 0s

    def apply(self, events: Iterable[KvEvent]) -> None:
        for event in events:
            if isinstance(event, BlockStored):
                self.held.update(event.block_hashes)
                self.block_size = event.block_size or self.block_size
                self._link(event)
                if event.session_id:
                    self._extend(event.session_id, event)
            elif isinstance(event, BlockRemoved):
                self.held.difference_update(event.block_hashes)
                for h in event.block_hashes:
                    self._parents.pop(h, None)
                    self._root_salts.pop(h, None)
            else:
                self.held.clear()
                self._parents.clear()
                self._root_salts.clear()

    def _link(self, event: BlockStored) -> None:
        """Each held block's parent (and block 0's salt), so that a chain whose first
        blocks another session stored (a shared system prompt) is known from block 0."""
        parent = event.parent
        if parent is None and event.block_hashes:
            self._root_salts[event.block_hashes[0]] = event.first_salt
        for h in event.block_hashes:
            self._parents[h] = parent
            parent = h

    def _walk(self, last: Hashable) -> _Chain | None:
        """The held chain ending at ``last``, from block 0; None where a link is unknown."""
        hashes: list[Hashable] = []
        block: Hashable | None = last
        while block is not None:
            if block not in self._parents or len(hashes) > len(self._parents):
                return None
            hashes.append(block)
            block = self._parents[block]
        root = hashes[-1]
        if root not in self._root_salts:
            return None
        return _Chain(self._root_salts[root], hashes[::-1])

    def _extend(self, session: str, event: BlockStored) -> None:
        chain = self._chains.pop(session, None)
        if event.parent is None:  # a chain starts at block 0, which carries its salt
            chain = _Chain(event.first_salt, list(event.block_hashes))
        elif chain is not None and event.parent in chain.hashes:
            kept = chain.hashes[: chain.hashes.index(event.parent) + 1]
            chain = _Chain(chain.salt, kept + list(event.block_hashes))
        else:  # it continues blocks another request stored (shared, or before this one)
            start = self._walk(event.parent)
            if start is None:  # its start was missed (subscribed late): unknown
                chain = _Chain(_UNKNOWN, [])
            else:
                chain = _Chain(start.salt, start.hashes + list(event.block_hashes))
        self._chains[session] = chain  # most recent last
        while len(self._chains) > self._max_chains:
            del self._chains[next(iter(self._chains))]

    def resident_tokens(self, session: str, cache_salt: str | None) -> int | None:
        """Tokens of the session's last prefix the replica still holds (its leading
        blocks), when that chain was salted with ``cache_salt`` (the session's tenant's);
        None when its events never named the session."""
        chain = self._chains.get(session)
        if chain is None:
            return None
        if chain.salt != (cache_salt or None):
            return 0
        return _leading(chain.hashes, self.held) * self.block_size


def _leading(chain: Sequence[Hashable], held: set[Hashable]) -> int:
    for i, h in enumerate(chain):
        if h not in held:
            return i
    return len(chain)
