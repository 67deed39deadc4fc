"""Ingest: one store read before the upstream is asked, one write after it accepted.

Harnesses re-send the whole history every step. Before anything is stored, ``ingest``
reads (``store.lookup``) which branch the history lands on and what the request needs
besides its own messages: the gateway's turns (restore exchanges) that belong in it, the
branch's counters (the last prompt, for a cost-aware route) and the session's replica
assignment. Render and route need nothing else, so they run before anything is written.
The same read refuses a request that would take the session past its size cap (413), so
no upstream serves a request whose history cannot be kept.

``commit`` stores the history (append only, idempotent, forks kept) together with the
replica assignment the route chose, in one atomic write, once an upstream accepted the
request (its first chunk is in hand). A request that fails before that (upstream error,
no replica, context overflow given up, a crash, a client gone) leaves the store as it
was: the client will send those turns again.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gateway.fold.renderer import RenderState, RenderStats
from gateway.fold.spec import StrategySpec
from gateway.request_cache import Decoded, MessageMemo
from gateway.transcript import Message, Transcript
from store import Assign, IngestResult, Lookup, SessionStore

GatewayTurns = Mapping[int, Sequence[Mapping[str, Any]]]


def with_gateway_turns(
    messages: Sequence[Message], turns: GatewayTurns
) -> tuple[list[Message], list[int]]:
    """The harness's messages with the gateway's own turns (restore exchanges, stored by the
    index of the message they follow) put back in place, and the history indices of the
    gateway-made messages that carry restored content."""
    history: list[Message] = []
    restored: list[int] = []
    for position in range(len(messages) + 1):
        if position < len(messages):
            history.append(messages[position])
        for raw in turns.get(position, ()):
            message = Message.from_dict(raw)
            if message.role != "assistant":
                restored.append(len(history))
            history.append(message)
    return history, restored


@dataclass
class Prepared:
    """A decoded request with what the store holds for it, ready to render and forward."""

    tenant: str
    session: str
    strategy: StrategySpec
    fold: str  # ReFold's fold mode for this request ("auto", "on", "off")
    transcript: Transcript
    stored: list[dict[str, Any]]  # the transcript's messages as the store keeps them
    found: Lookup
    text_actions: bool
    stream: bool
    raw_tokens: int
    max_bytes: int | None = None  # the tenant's session size cap
    budget: int | None = None  # the tenant's token budget; None: the gateway's
    # The gateway's turns in the history (after-index -> raw messages), the history with
    # them in place, and the render state they make.
    turns: dict[int, list[Mapping[str, Any]]] = field(default_factory=dict)
    history: list[Message] = field(default_factory=list)
    state: RenderState = field(default_factory=RenderState)
    # Set by ``commit``: the branch the history was stored on.
    branch: int | None = None
    # The last rendering's renderer cache entry, kept for the session's next request once
    # the history is stored (``Render.keep``).
    render_cache: Any = None
    # What is derived from each message (store dicts, token estimates, upstream encoding),
    # reused across the session's requests when they reuse the message objects.
    memo: MessageMemo = field(default_factory=MessageMemo)
    # For the session's accounting: the last rendering's stats (what the strategy added and
    # removed) and the KV pressure it was priced at, the first rendering's token estimate
    # (the response header's figure), and the overflow ladder's retries.
    stats: RenderStats = field(default_factory=RenderStats)
    pressure: float = 0.0
    rendered_tokens: int = 0
    overflow_retries: int = 0
    # perf_counter() when the gateway began the request (before reading its body), for the
    # latency it adds before the upstream is asked.
    received: float | None = None

    def add_turns(self, after: int, messages: Sequence[Mapping[str, Any]]) -> None:
        """Gateway turns recorded after history message ``after``: in the history now."""
        self.turns.setdefault(after, []).extend(messages)
        self._place_turns()

    def _place_turns(self) -> None:
        self.history, restored = with_gateway_turns(self.transcript.messages, self.turns)
        self.state = RenderState(restored=frozenset(restored))


async def ingest(
    store: SessionStore,
    tenant: str,
    session: str,
    request: Decoded,
    *,
    max_bytes: int | None = None,
    **options: Any,
) -> Prepared:
    """The request with what the store holds for it (one read; nothing written).
    ``SessionTooLarge`` when storing it would take the session past its size cap (the
    store's, or the tenant's ``max_bytes``): refused before any upstream serves it.
    ``options``: the other ``Prepared`` fields (strategy, fold, stream, ...)."""
    found = await store.lookup(tenant, session, request.stored, max_bytes=max_bytes)
    prepared = Prepared(
        tenant=tenant,
        session=session,
        transcript=request.transcript,
        stored=request.stored,
        found=found,
        text_actions=not request.transcript.tools,
        raw_tokens=request.tokens,
        memo=request.memo,
        turns={after: list(turns) for after, turns in found.gateway_turns.items()},
        max_bytes=max_bytes,
        **options,
    )
    prepared._place_turns()
    return prepared


async def commit(store: SessionStore, prepared: Prepared, assign: Assign | None) -> IngestResult:
    """Store the request's history (and the route's assignment) once an upstream accepted it."""
    stored = await store.ingest(
        prepared.tenant,
        prepared.session,
        prepared.stored,
        max_bytes=prepared.max_bytes,
        assign=assign,
    )
    prepared.branch = stored.branch_id
    return stored
