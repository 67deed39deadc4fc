"""Ingest: one store read before the upstream is asked, one write after it accepted.

Harnesses re-send the whole history every step. Before anything is stored, ``lookup``
reads (``store.lookup``) which branch the history lands on and what the request needs
besides its own messages: the gateway's turns (restore exchanges) that belong in it, the
branch's counters (the last prompt, for a cost-aware route) and the session's replica
assignment. Render and route need nothing else, so they run before anything is written.
The same read refuses a request that would take the session past its size cap (413), so
no upstream serves a request whose history cannot be kept.

``store_history`` writes the history (append only, idempotent, forks kept) together with
the replica assignment the route chose, in one atomic write, once an upstream accepted the
request (its first chunk is in hand); again, appending nothing, when another replica
takes over a non-streaming reply that broke. A request that fails before that (upstream
error, no replica, context overflow given up, a crash, a client gone) leaves the store as
it was: the client will send those turns again.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gateway.identity import Caller
from gateway.offload import Offload, is_large
from gateway.request_cache import Decoded, MessageMemo
from gateway.transcript import Message, Transcript
from store import Assign, Lookup, SessionStore

GatewayTurns = Mapping[int, Sequence[Mapping[str, Any]]]


def with_gateway_turns(
    messages: Sequence[Message], turns: GatewayTurns
) -> tuple[list[Message], list[int]]:
    """The harness's messages with the gateway's own turns (restore exchanges, stored by the
    index of the message they follow) put back in place, and the history indices of the
    gateway-made messages that carry restored content."""
    history: list[Message] = []
    restored: list[int] = []
    done = 0  # messages placed; the turns are few, the messages many: copied in slices
    for position in sorted(p for p in turns if 0 <= p <= len(messages)):
        history += messages[done : position + 1]
        done = position + 1
        for raw in turns[position]:
            message = Message.from_dict(raw)
            if message.role != "assistant":
                restored.append(len(history))
            history.append(message)
    history += messages[done:]
    return history, restored


@dataclass(frozen=True, slots=True)
class Ingested:
    """A decoded request, who sent it, its session, and what the store holds for it."""

    caller: Caller
    session: str
    decoded: Decoded
    found: Lookup
    stream: bool

    @property
    def tenant(self) -> str:
        return self.caller.tenant

    @property
    def transcript(self) -> Transcript:
        return self.decoded.transcript

    @property
    def raw_tokens(self) -> int:
        """The gateway's token estimate of what the harness sent."""
        return self.decoded.tokens

    @property
    def memo(self) -> MessageMemo:
        return self.decoded.memo

    @property
    def text_actions(self) -> bool:
        """Restores come as ``restore N`` lines: the request offers no tools."""
        return not self.decoded.transcript.tools


@dataclass(frozen=True, slots=True)
class Stored:
    """Where the history was stored, and the session's assignment afterwards."""

    branch: int
    assignment: str | None


async def lookup(
    store: SessionStore,
    caller: Caller,
    session: str,
    request: Decoded,
    *,
    stream: bool,
    offload: Offload | None = None,
) -> Ingested:
    """The request with what the store holds for it (one read; nothing written).
    ``SessionTooLarge`` when storing it would take the session past its size cap (the
    store's, or the tenant's): refused before any upstream serves it. A long history is
    packed in ``offload``'s worker thread first (``gateway.offload``): the read finds it
    packed."""
    if offload is not None and is_large(len(request.stored), request.tokens):
        await offload.run(
            True, None, store.pack, caller.tenant, session, request.stored, shared=True
        )
    # ``shared``: the decode cache's store dicts, never edited, reused request after request.
    found = await store.lookup(
        caller.tenant, session, request.stored, max_bytes=caller.max_bytes, shared=True
    )
    return Ingested(caller, session, request, found, stream)


async def store_history(store: SessionStore, ingested: Ingested, assign: Assign | None) -> Stored:
    """Store the request's history (and the route's assignment) once an upstream accepted it."""
    stored = await store.ingest(
        ingested.tenant,
        ingested.session,
        ingested.decoded.stored,
        max_bytes=ingested.caller.max_bytes,
        assign=assign,
        shared=True,
    )
    assignment = stored.assignment if stored.assignment is not None else ingested.found.assignment
    return Stored(stored.branch_id, assignment)
