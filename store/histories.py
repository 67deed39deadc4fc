"""The histories contract: append-only session histories, their branches and gateway turns.

Model (every backend):
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
- Every call on a session refreshes its TTL. The size cap counts stored history bytes
  (message bodies, blobs, gateway turns), not counters or request logs.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from store import codec
from store.assignments import Assign, check_assign
from store.checks import check_branch, check_id, check_turns
from store.digests import DigestCache, Message, PackedHistory


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


@dataclass(frozen=True, slots=True)
class StoredHistory:
    branch_id: int
    messages: tuple[dict[str, Any], ...]
    gateway_turns: Mapping[int, tuple[dict[str, Any], ...]] = field(default_factory=dict)
    parent: int | None = None
    fork_index: int = 0


@dataclass(frozen=True, slots=True)
class SessionPage:
    """A page of a tenant's sessions (``Histories.session_page``)."""

    sessions: list[str]
    next: str | None
    """The cursor of the page after this one (``after``); None when this one is the last."""


class Histories(ABC):
    """Session histories. The public methods check their arguments and pack the sent
    messages (through ``digest_cache``), then call the backend's hooks (``store_history``,
    ``find_history``, ``load_branch``, ``store_gateway_turns``, ``live_sessions``,
    ``drop_session``)."""

    digest_cache: DigestCache
    max_session_bytes: int

    async def ingest(
        self,
        tenant: str,
        session: str,
        messages: Sequence[Message],
        *,
        max_bytes: int | None = None,
        assign: Assign | None = None,
        shared: bool = False,
    ) -> IngestResult:
        """Store the history a harness sent; see the module doc for which branch it lands on.

        ``max_bytes``: a size cap for this session below the store's (a tenant's limit).
        ``assign``: also set the session's replica assignment, in the same atomic write
        (not when the ingest fails); ``IngestResult.assignment`` is the one in force.
        ``shared``: the caller never edits ``messages``' dicts afterwards, so the digest
        cache keeps them instead of copies (``DigestCache.prepare``); the result is the same.
        """
        check_assign(assign)
        history = self.pack(tenant, session, messages, shared=shared)
        return await self.store_history(tenant, session, history, self._cap(max_bytes), assign)

    async def lookup(
        self,
        tenant: str,
        session: str,
        messages: Sequence[Message],
        *,
        max_bytes: int | None = None,
        shared: bool = False,
    ) -> Lookup:
        """What ``ingest(messages, max_bytes=max_bytes)`` would find, read without writing
        anything (and without refreshing the session's TTL): see ``Lookup``. A session that
        does not exist reads as empty. ``SessionTooLarge`` when that ingest would be refused
        as over the size cap, given what is stored now. ``shared``: as ``ingest``'s."""
        history = self.pack(tenant, session, messages, shared=shared)
        return await self.find_history(tenant, session, history, self._cap(max_bytes))

    def pack(
        self, tenant: str, session: str, messages: Sequence[Message], *, shared: bool = False
    ) -> PackedHistory:
        """The sent history packed with its chained digests (``DigestCache.prepare``): the
        CPU part of ``lookup`` and ``ingest``, which a caller may run ahead, in another
        thread, for a long history: they then find it packed."""
        check_id("tenant", tenant)
        check_id("session", session)
        return self.digest_cache.prepare(tenant, session, messages, shared=shared)

    async def load(
        self, tenant: str, session: str, branch: int | None = None, *, messages: bool = True
    ) -> StoredHistory:
        """A branch's full history (``None``: the session's head); ``NotFound`` if absent.

        ``messages=False`` reads only the gateway turns (``messages`` comes back empty): the
        gateway needs them on every request and already holds the harness's messages.
        """
        check_id("tenant", tenant)
        check_id("session", session)
        if branch is not None:
            check_branch(branch)
        return await self.load_branch(tenant, session, branch, messages)

    async def append_gateway_turns(
        self, tenant: str, session: str, branch: int, after_index: int, messages: Sequence[Message]
    ) -> None:
        """Record gateway-made turns after history message ``after_index`` of ``branch``."""
        check_id("tenant", tenant)
        check_id("session", session)
        check_branch(branch)
        check_turns(after_index, messages)
        packed = [codec.pack_message(m) for m in messages]
        await self.store_gateway_turns(tenant, session, branch, after_index, packed)

    async def list_sessions(self, tenant: str) -> list[str]:
        """The tenant's live sessions, least recently used first."""
        return await self.live_sessions(check_id("tenant", tenant))

    async def session_page(self, tenant: str, limit: int, after: str | None = None) -> SessionPage:
        """At most ``limit`` of the tenant's live sessions, most recently used first (then by
        name), from where the cursor ``after`` (a page's ``next``) left off. The cursor is a
        position in that order, not a session: reading a page's sessions uses them (they
        move to the front), and the next page still starts where this one ended. A session
        used between two pages moves to the front: a listing in progress misses it."""
        check_id("tenant", tenant)
        if not isinstance(limit, int) or isinstance(limit, bool) or limit < 1:
            raise ValueError(f"limit must be a positive int, got {limit!r}")
        position = None if after is None else _position(after)
        rows = await self.page_sessions(tenant, limit + 1, position)
        more = len(rows) > limit
        rows = rows[:limit]
        return SessionPage([name for name, _ in rows], _cursor(rows[-1]) if more else None)

    async def delete_session(self, tenant: str, session: str) -> bool:
        """Remove everything stored for a session; False if there was nothing."""
        check_id("tenant", tenant)
        check_id("session", session)
        self.digest_cache.forget(tenant, session)
        return await self.drop_session(tenant, session)

    def _cap(self, max_bytes: int | None) -> int:
        """The size cap of one ingest: the store's, or a smaller one the caller asks for."""
        return (
            self.max_session_bytes if max_bytes is None else min(self.max_session_bytes, max_bytes)
        )

    @abstractmethod
    async def store_history(
        self,
        tenant: str,
        session: str,
        history: PackedHistory,
        cap: int,
        assign: Assign | None,
    ) -> IngestResult:
        """``ingest`` with checked arguments, atomically; ``cap``: this ingest's size cap."""

    @abstractmethod
    async def find_history(
        self, tenant: str, session: str, history: PackedHistory, cap: int
    ) -> Lookup:
        """``lookup`` with checked arguments; ``cap``: the ingest's size cap."""

    @abstractmethod
    async def load_branch(
        self, tenant: str, session: str, branch: int | None, with_messages: bool
    ) -> StoredHistory:
        """``load`` with checked arguments."""

    @abstractmethod
    async def store_gateway_turns(
        self,
        tenant: str,
        session: str,
        branch: int,
        after_index: int,
        packed: Sequence[codec.PackedMessage],
    ) -> None:
        """``append_gateway_turns`` with checked arguments and the turns packed, atomically:
        ``NotFound`` without the branch, ``ValueError`` (``bad_after_index``) when
        ``after_index`` is not one of its messages, ``SessionTooLarge`` over the store's cap."""

    @abstractmethod
    async def live_sessions(self, tenant: str) -> list[str]:
        """``list_sessions`` with a checked tenant."""

    @abstractmethod
    async def page_sessions(
        self, tenant: str, limit: int, after: tuple[float, str] | None
    ) -> list[tuple[str, float]]:
        """``session_page``'s read: at most ``limit`` (name, last use) of the tenant's live
        sessions, the most recent first (ties by name, descending), after the position
        ``after`` (last use, name) when given."""

    @abstractmethod
    async def drop_session(self, tenant: str, session: str) -> bool:
        """``delete_session`` with checked arguments (the digest cache already forgot it)."""


def _cursor(row: tuple[str, float]) -> str:
    """A position in ``session_page``'s order: last use, then the name (which may hold any
    character; the number never holds a ``:``)."""
    name, used = row
    return f"{used!r}:{name}"


def _position(cursor: str) -> tuple[float, str]:
    used, _, name = cursor.partition(":") if isinstance(cursor, str) else ("", "", "")
    try:
        position = float(used)
    except ValueError:
        raise ValueError(f"not a session cursor: {str(cursor)[:80]!r}") from None
    return position, check_id("session", name)
