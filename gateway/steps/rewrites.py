"""Harness rewrites of a re-sent history, recognised before the store is asked where it lands.

Claude Code's microcompaction replaces old tool results with a fixed placeholder in the
history it re-sends (``store.branches.MICROCOMPACTED``). Taken as sent, the first cleared
result would fork the session at that message, store every later message again, and
render a context whose prefix the replica no longer holds. The placeholder carries no
content of its own, and the gateway holds the result it replaced: so the request's
placeholders are put back to the stored results (same position, same tool call), and the
request continues its branch. The history stays append-only and complete (restores read
the real bytes), and the strategy decides, as for any step, whether an old output stays
in the context or is folded away, pricing the re-prefill that costs.

Compactions that restart the history with a summary (Claude Code's "This session is being
continued...", Codex's summary prefix) keep the session (the harness names it the same
way: ``metadata.user_id``, ``prompt_cache_key``) and become a branch of it from the
prefix they share (the system prompt and tools, which the replica holds); provider
compaction items (Anthropic ``compaction`` blocks, Responses ``compaction`` items with
``encrypted_content``) are opaque parts, stored and re-sent byte for byte.
"""

from __future__ import annotations

from gateway.request_cache import Decoded
from gateway.tokens import estimate_tokens
from gateway.transcript import Message
from store import NotFound, SessionStore
from store.branches import microcompacted


async def with_cleared_results_restored(
    store: SessionStore, tenant: str, session: str, request: Decoded
) -> Decoded:
    """``request`` with the tool results its harness microcompacted put back from the
    session's head branch; unchanged when it holds no placeholder (no store read then)."""
    if not request.placeholders:
        return request
    try:
        head = await store.load(tenant, session)
    except NotFound:
        return request
    positions = microcompacted(request.stored, head.messages)
    if not positions:
        return request
    messages = list(request.transcript.messages)
    stored = list(request.stored)
    tokens = request.tokens
    for i in positions:
        original = Message.from_dict(head.messages[i])
        tokens += estimate_tokens(original) - estimate_tokens(messages[i])
        messages[i], stored[i] = original, dict(head.messages[i])
    return Decoded(
        request.transcript.with_messages(messages),
        stored,
        tokens,
        request.memo,
        request.placeholders - len(positions),
        request.session,
    )
