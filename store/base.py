"""The session store contract: one async interface, two backends (Redis, SQLite).

Model (both backends):
- A session holds branches. A branch is (parent branch, fork index, own messages): its
  history is the parent's first ``fork_index`` messages followed by its own. The first
  branch of a session is 0 and has no parent. Branches only ever grow.
- ``ingest`` takes the whole history a harness sent. The branch it extends is the longest
  stored branch whose history is a prefix of what was sent (ties: the session's head, the
  branch most recently ingested into). Equal length means an identical re-send: nothing is
  appended. A history that is a prefix of a stored branch (a late or retried earlier
  request) is stored already: nothing is appended and that branch is returned. Otherwise a
  new branch forks from the branch sharing the longest common prefix. Prefixes are
  compared by chained 128-bit digests, so one check is O(1) however long the history.
- ``step_count`` is the number of messages of the sent history: it is the first
  ``step_count`` messages of the returned branch (normally all of them).
- ``lookup`` is ``ingest``'s read half: without writing anything it says which branch the
  sent history would land on, how much of it is stored, and returns what a request needs
  besides (that history's gateway turns, the branch's counters, the session's replica
  assignment), so a gateway can render and route a request before anything is stored
  and store it only once the upstream accepted it (one read, one write). It refuses a
  history that ``ingest`` would refuse as too large now (``SessionTooLarge``), so an
  over-cap request is refused before any upstream serves it; ``ingest`` still checks
  atomically (the session may grow in between).
- ``ingest`` may set the session's replica assignment in the same atomic write
  (``assign``: the compare-and-set of ``set_assignment``).
- Gateway-made turns (restore exchanges) are kept beside the harness history, keyed by the
  index of the history message they follow, so ingest digests keep matching what the
  harness re-sends. A fork inherits its parent's gateway turns that follow a message
  inside the shared prefix (``after_index < fork_index``).
- Counters: named integers per branch and per tenant, changed only by atomic increments
  (``add_counts``), so concurrent requests never lose one another's counts. A call carries
  a token of its own (the request id): repeating it (a retry after a lost reply) adds
  nothing, while two different calls with equal counts both add. The same call may append
  one record to the branch's request log (``get_log``), under the same token.
- Quota charges (``charge``): per-tenant counters in fixed time windows (or gauges, such as
  requests in flight), checked against their limits and added all together or not at all,
  so every gateway process sharing the store enforces one limit.
- Every call on a session refreshes its TTL. The size cap counts stored history bytes
  (message bodies, blobs, gateway turns), not counters or request logs.
"""

from __future__ import annotations

import copy
from abc import ABC, abstractmethod
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from store import codec

DEFAULT_TTL_S = 7 * 24 * 3600.0
DEFAULT_MAX_SESSION_BYTES = 64 * 1024 * 1024
DEFAULT_TIMEOUT_S = 2.0
# What the digest cache may remember of sessions' last requests (``DigestCache``).
DEFAULT_DIGEST_CACHE_BYTES = 64 * 1024 * 1024
MAX_ID_LEN = 512
# How long a counting token is remembered: a retry arrives within seconds, never an hour.
COUNT_TOKEN_TTL_S = 3600.0
# A gauge (a charge without a window, e.g. requests in flight) expires this long after its
# last change, so slots a crashed gateway process held are freed in the end.
GAUGE_TTL_S = 900.0

Message = Mapping[str, Any]


class StoreError(Exception):
    """Base of every error the store raises on purpose."""


class StoreUnavailable(StoreError):
    """The backend cannot be reached or did not answer in time; nothing was written."""


class SessionTooLarge(StoreError):
    """The write would take the session past its size cap; nothing was written."""


class NotFound(StoreError):
    """The session or branch does not exist (or has expired)."""


@dataclass(frozen=True, slots=True)
class Assign:
    """Set the session's replica assignment with an ingest, as ``set_assignment`` would:
    to ``replica`` if it currently is ``expected`` (or absent), for ``ttl_s``."""

    replica: str
    expected: str | None
    ttl_s: float


@dataclass(frozen=True, slots=True)
class IngestResult:
    branch_id: int
    step_count: int
    appended: int
    new_branch: bool
    assignment: str | None = None
    """With ``assign``: the assignment in force afterwards (``set_assignment``'s result)."""

    @property
    def first_new(self) -> int:
        """Index of the first message this call stored (== step_count when none)."""
        return self.step_count - self.appended


@dataclass(frozen=True, slots=True)
class Charge:
    """Add ``amount`` to the tenant's counter ``name`` unless that passes ``limit``.

    ``window_s``: the counter restarts every ``window_s`` seconds (fixed windows aligned to
    the epoch); None: a gauge that is raised and lowered (``amount`` may be negative).
    ``limit`` None only counts. A charge of 0 with a limit checks the counter is below it.
    """

    name: str
    amount: int
    limit: int | None = None
    window_s: float | None = None


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why ``charge`` added nothing: the counter (or ``"sessions"``) and its value."""

    name: str
    current: int
    limit: int


def window_key(charge: Charge, now: float) -> tuple[str, float]:
    """The stored counter name of a charge at time ``now`` and how long to keep it."""
    if charge.window_s is None:
        return charge.name, GAUGE_TTL_S
    if charge.window_s <= 0:
        raise ValueError(f"charge window must be positive, got {charge.window_s}")
    return f"{charge.name}@{int(now // charge.window_s)}", 2 * charge.window_s


def over_limit(current: int, charge: Charge) -> bool:
    return charge.limit is not None and current + max(charge.amount, 1) > charge.limit


def check_counts(counts: Mapping[str, int], token: str, latest: Mapping[str, int]) -> None:
    for name, value in (*counts.items(), *latest.items()):
        check_id("counter name", name)
        if ":" in name or "@" in name:
            raise ValueError(f"counter name {name!r} must not contain ':' or '@'")
        if not isinstance(value, int) or isinstance(value, bool):
            raise ValueError(f"counter {name!r} must be an int, got {value!r}")
    check_id("count token", token)


@dataclass(frozen=True, slots=True)
class Lookup:
    """What ``lookup`` found for a sent history, before it is stored.

    ``branch``: the stored branch the history extends or repeats (None: it would start a
    new session or fork a new branch); ``stored``: how many leading messages of it are
    stored already; ``gateway_turns``: the gateway turns that follow its messages, by
    after-index (those a fork would inherit, for a new branch); ``counts``: ``branch``'s
    counters (empty without one); ``assignment``: the session's replica, or None.
    """

    branch: int | None
    stored: int
    gateway_turns: Mapping[int, tuple[dict[str, Any], ...]]
    counts: Mapping[str, int]
    assignment: str | None


def turns_before(turns: Sequence[tuple[int, bytes]], limit: int) -> list[tuple[int, bytes]]:
    """The (after_index, body) turns that follow a message before index ``limit``."""
    return [(after, body) for after, body in turns if after < limit]


def check_assign(assign: Assign | None) -> None:
    if assign is not None:
        check_id("replica", assign.replica)
        if assign.ttl_s <= 0:
            raise ValueError(f"assignment ttl_s must be positive, got {assign.ttl_s}")


@dataclass(frozen=True, slots=True)
class StoredHistory:
    branch_id: int
    messages: tuple[dict[str, Any], ...]
    gateway_turns: Mapping[int, tuple[dict[str, Any], ...]] = field(default_factory=dict)
    parent: int | None = None
    fork_index: int = 0


def check_id(kind: str, value: object) -> str:
    if not isinstance(value, str) or not value:
        raise ValueError(f"{kind} must be a non-empty string, got {value!r}")
    if len(value) > MAX_ID_LEN:
        raise ValueError(f"{kind} is {len(value)} characters long; the limit is {MAX_ID_LEN}")
    if "\x00" in value:
        raise ValueError(f"{kind} must not contain NUL characters")
    return value


def check_branch(branch: object) -> int:
    if not isinstance(branch, int) or isinstance(branch, bool) or branch < 0:
        raise ValueError(f"branch id must be a non-negative int, got {branch!r}")
    return branch


def check_turns(after_index: object, messages: Sequence[Message]) -> None:
    if not isinstance(after_index, int) or isinstance(after_index, bool) or after_index < 0:
        raise ValueError(f"after_index must be a non-negative int, got {after_index!r}")
    if not messages:
        raise ValueError("append_gateway_turns needs at least one message")


def bad_after_index(after_index: int, branch: int, length: int) -> ValueError:
    return ValueError(f"after_index {after_index} is outside branch {branch} ({length} messages)")


def ancestry(
    branches: Mapping[int, tuple[int, int, int]], branch: int
) -> list[tuple[int, int, int]]:
    """Where a branch's history lives: (branch, first index, end) from the root down.

    ``branches`` maps id -> (parent or -1, fork index, length). An ancestor's part ends at
    its child's fork index, and may be empty when the child forked inside the ancestor's
    own inherited prefix.
    """
    segments: list[tuple[int, int, int]] = []
    cur, end = branch, branches[branch][2]
    while cur >= 0:
        parent, fork, _ = branches[cur]
        start = min(fork, end)
        segments.append((cur, start, end))
        cur, end = parent, start
    segments.reverse()
    return segments


def assemble(
    session: str,
    branch: int,
    branches: Mapping[int, tuple[int, int, int]],
    bodies: Sequence[bytes],
    turns: Sequence[tuple[int, bytes]],
    fetch_blob: Callable[[bytes], bytes | None],
) -> StoredHistory:
    """Decode a loaded branch; ``turns`` are (after_index, packed message) in record order."""
    texts: dict[bytes, str] = {}

    def blob(ref: bytes) -> str:
        if ref not in texts:
            data = fetch_blob(ref)
            if data is None:
                raise NotFound(f"session {session!r} lost blob {ref.hex()}")
            texts[ref] = codec.decode_blob(data)
        return texts[ref]

    gateway: dict[int, list[dict[str, Any]]] = {}
    for after, body in turns:
        gateway.setdefault(after, []).append(codec.unpack_message(body, blob))
    parent, fork, _ = branches[branch]
    return StoredHistory(
        branch_id=branch,
        messages=tuple(codec.unpack_message(body, blob) for body in bodies),
        gateway_turns={k: tuple(v) for k, v in sorted(gateway.items())},
        parent=parent if parent >= 0 else None,
        fork_index=fork,
    )


def session_cap(store_cap: int, max_bytes: int | None) -> int:
    """The size cap of one ingest: the store's, or a smaller one the caller asks for."""
    return store_cap if max_bytes is None else min(store_cap, max_bytes)


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


@dataclass(slots=True)
class Prepared:
    """A request's messages, packed, with the chained digest at every position."""

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


# Python's own cost of one remembered message beyond its text and packed bytes (the
# private dict copy, the PackedMessage, the chained digest): counted so that histories of
# many short messages are bounded too.
_ENTRY_OVERHEAD = 512


def _held_bytes(packed: codec.PackedMessage) -> int:
    """What remembering one message keeps alive: its packed body, the text of its blobs
    (shared with the private copy of the message) and the per-message overhead."""
    return len(packed.body) + sum(len(text) for text in packed.blobs.values()) + _ENTRY_OVERHEAD


class DigestCache:
    """Per-process memory of each session's last ingested request, bounded by bytes.

    Harnesses re-send the whole history every step; comparing dicts for equality is far
    cheaper than re-encoding and re-hashing them, so only the new suffix is packed. The
    cache never decides correctness: the backend still checks the chained digests.

    The least recently used sessions are dropped once the remembered messages hold more
    than ``max_bytes`` (a bound by session count let a few long sessions take gigabytes);
    ``bytes`` is what it holds now, and ``evicted`` (if set) is called once per dropped
    session, for a metric.
    """

    def __init__(self, max_bytes: int = DEFAULT_DIGEST_CACHE_BYTES) -> None:
        if max_bytes < 0:
            raise ValueError(f"digest cache bound must be >= 0 bytes, got {max_bytes}")
        self.max_bytes = max_bytes
        self.bytes = 0
        self.evicted: Callable[[], None] | None = None
        self._seen: OrderedDict[tuple[str, str], _Seen] = OrderedDict()

    def prepare(self, tenant: str, session: str, messages: Sequence[Message]) -> Prepared:
        if isinstance(messages, str | bytes) or not isinstance(messages, Sequence):
            raise TypeError("ingest expects a sequence of message dicts")
        if not messages:
            raise ValueError("cannot ingest an empty history: a request has at least one message")
        key = (tenant, session)
        seen = self._seen.pop(key, None)
        same = 0
        if seen is not None:
            self.bytes -= seen.sizes[-1]
            for new, old in zip(messages, seen.messages, strict=False):
                if new != old:
                    break
                same += 1
        if seen is not None and same == len(seen.messages) == len(messages):
            kept = seen  # a re-send of what was prepared last (ingest after lookup)
        else:
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
            # keep private copies: a caller editing its dicts in place must not edit our
            # memory (strings are immutable: the copies share them)
            copies = [copy.deepcopy(m) for m in messages[same:]]
            known = None if seen is None or seen.stored is None else min(same, seen.stored)
            kept = _Seen(
                (seen.messages[:same] if seen else []) + copies, packed, chains, sizes, known
            )
        self._remember(key, kept)
        return Prepared(kept.packed, kept.chains, kept.stored)

    def _remember(self, key: tuple[str, str], seen: _Seen) -> None:
        size = seen.sizes[-1]
        if size <= self.max_bytes:
            self._seen[key] = seen
            self.bytes += size
        while self.bytes > self.max_bytes:
            _, dropped = self._seen.popitem(last=False)
            self.bytes -= dropped.sizes[-1]
            if self.evicted is not None:
                self.evicted()

    def stored(self, tenant: str, session: str, prepared: Prepared, count: int) -> None:
        """The first ``count`` messages of ``prepared`` are stored. Remembered when they are
        also the start of what the session last prepared (another request of the session
        may have been prepared since): their chained digests tell in one comparison."""
        seen = self._seen.get((tenant, session))
        if seen is None:
            return
        if count == 0 or (
            count <= len(seen.chains) and seen.chains[count - 1] == prepared.chains[count - 1]
        ):
            seen.stored = count

    def forget(self, tenant: str, session: str) -> None:
        seen = self._seen.pop((tenant, session), None)
        if seen is not None:
            self.bytes -= seen.sizes[-1]


class SessionStore(ABC):
    """Append-only session histories, their counters and request logs, quota counters and
    the router's assignment map."""

    def __init__(
        self,
        *,
        ttl_s: float = DEFAULT_TTL_S,
        max_session_bytes: int = DEFAULT_MAX_SESSION_BYTES,
        digest_cache_bytes: int = DEFAULT_DIGEST_CACHE_BYTES,
    ) -> None:
        if ttl_s <= 0:
            raise ValueError(f"ttl_s must be positive, got {ttl_s}")
        if max_session_bytes <= 0:
            raise ValueError(f"max_session_bytes must be positive, got {max_session_bytes}")
        self.ttl_s = ttl_s
        self.max_session_bytes = max_session_bytes
        self._digests = DigestCache(digest_cache_bytes)

    @property
    def digest_cache(self) -> DigestCache:
        """The per-process memory of each session's last request (its bound, its size)."""
        return self._digests

    @abstractmethod
    async def ingest(
        self,
        tenant: str,
        session: str,
        messages: Sequence[Message],
        *,
        max_bytes: int | None = None,
        assign: Assign | None = None,
    ) -> IngestResult:
        """Store the history a harness sent; see the module doc for which branch it lands on.

        ``max_bytes``: a size cap for this session below the store's (a tenant's limit).
        ``assign``: also set the session's replica assignment, in the same atomic write
        (not when the ingest fails); ``IngestResult.assignment`` is the one in force.
        """

    @abstractmethod
    async def lookup(
        self,
        tenant: str,
        session: str,
        messages: Sequence[Message],
        *,
        max_bytes: int | None = None,
    ) -> Lookup:
        """What ``ingest(messages, max_bytes=max_bytes)`` would find, read without writing
        anything (and without refreshing the session's TTL): see ``Lookup``. A session that
        does not exist reads as empty. ``SessionTooLarge`` when that ingest would be refused
        as over the size cap, given what is stored now."""

    @abstractmethod
    async def load(
        self, tenant: str, session: str, branch: int | None = None, *, messages: bool = True
    ) -> StoredHistory:
        """A branch's full history (``None``: the session's head); ``NotFound`` if absent.

        ``messages=False`` reads only the gateway turns (``messages`` comes back empty): the
        gateway needs them on every request and already holds the harness's messages.
        """

    @abstractmethod
    async def append_gateway_turns(
        self, tenant: str, session: str, branch: int, after_index: int, messages: Sequence[Message]
    ) -> None:
        """Record gateway-made turns after history message ``after_index`` of ``branch``."""

    @abstractmethod
    async def add_counts(
        self,
        tenant: str,
        session: str,
        branch: int,
        counts: Mapping[str, int],
        *,
        token: str,
        latest: Mapping[str, int] | None = None,
        record: bytes | None = None,
    ) -> None:
        """Add ``counts`` to the branch's counters and to the tenant's, by atomic increments.

        ``token`` names this call (a request id): a repeated call with the same token adds
        nothing. ``latest``: branch values that are set, not added (what the last request
        saw, e.g. its prompt size); the tenant's counters do not take them. ``record``:
        appended to the branch's request log. A branch that no longer exists (session
        deleted or expired) gets nothing; the tenant's counters are added all the same.
        """

    @abstractmethod
    async def get_log(self, tenant: str, session: str, branch: int) -> list[bytes]:
        """The branch's request log (``add_counts`` records) in order; ``NotFound`` if absent."""

    @abstractmethod
    async def get_counts(self, tenant: str, session: str, branch: int) -> dict[str, int]:
        """The branch's counters (empty when never counted); ``NotFound`` if absent."""

    @abstractmethod
    async def get_tenant_counts(self, tenant: str) -> dict[str, int]:
        """The tenant's counters, summed over all its sessions ever counted."""

    @abstractmethod
    async def charge(
        self,
        tenant: str,
        charges: Sequence[Charge],
        *,
        session: str | None = None,
        max_sessions: int | None = None,
    ) -> Refusal | None:
        """Add every charge, or none when one would pass its limit (that one is returned).

        With ``session`` and ``max_sessions``: also refused (as ``"sessions"``) when the
        session is not live yet and the tenant already has ``max_sessions`` live sessions.
        """

    @abstractmethod
    async def get_assignment(self, tenant: str, session: str) -> str | None:
        """The replica the session is assigned to, or None."""

    @abstractmethod
    async def set_assignment(
        self, tenant: str, session: str, replica: str, *, expected: str | None, ttl_s: float
    ) -> str:
        """Set the assignment to ``replica`` if it currently is ``expected`` and refresh its TTL.

        An absent (expired) assignment is free to take whatever ``expected`` says, since no
        one holds it. Returns the assignment in force afterwards: ``replica``, or the value a
        concurrent writer set.
        """

    @abstractmethod
    async def put_reply(self, tenant: str, reply_id: str, data: bytes) -> None:
        """Keep a finished reply's record under its id, for the store's TTL (the Responses
        API's stored responses, which later requests continue from)."""

    @abstractmethod
    async def get_reply(self, tenant: str, reply_id: str) -> bytes | None:
        """The record ``put_reply`` kept, or None (never kept, expired, other tenant)."""

    @abstractmethod
    async def list_sessions(self, tenant: str) -> list[str]:
        """The tenant's live sessions, least recently used first."""

    @abstractmethod
    async def delete_session(self, tenant: str, session: str) -> bool:
        """Remove everything stored for a session; False if there was nothing."""

    @abstractmethod
    async def close(self) -> None:
        """Release connections; the store must not be used afterwards."""
