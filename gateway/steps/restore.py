"""The gateway-side restore loop: the model's restore calls are answered here.

The reply streams through a ``ReplyFilter``; when the model asked to restore folded or
stubbed steps (a tool the gateway added, or a ``restore N`` line in text harnesses), the
gateway answers from the history, records the exchange as gateway turns (after the
request's last message, so every later render sees it before the model's reply) and asks
the model again. The harness never sees a restore. The loop ends with the reply's tail and
what the accounting needs (``Outcome``).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from gateway import metrics
from gateway.context_guard import ContextGuard
from gateway.dialects.openai_chat import decode_reply
from gateway.fold.restore import parse_restore_spec, restore_outputs
from gateway.replies import Decision, ReplyFilter
from gateway.steps.ingest import Prepared
from gateway.transcript import Message, Text
from gateway.upstream import ChatStream
from router import ReplicaPool, reading_reply
from router.replica import Replica
from store import SessionStore

# Render the request again (with the restored content) and open a new upstream stream.
AskAgain = Callable[[Prepared], Awaitable[tuple[Replica, ChatStream]]]


@dataclass
class Outcome:
    """What the loop saw, for the accounting: the replica that answered last, each
    attempt's usage, and how many restores it answered."""

    replica: Replica
    usage: list[dict[str, Any]] = field(default_factory=list)
    restores: int = 0


async def replies(
    prepared: Prepared,
    outcome: Outcome,
    stream: ChatStream,
    *,
    store: SessionStore,
    pool: ReplicaPool,
    guard: ContextGuard,
    ask_again: AskAgain,
    max_restores: int,
) -> AsyncIterator[dict[str, Any]]:
    """The chunks for the client, restores answered in between; each reply's outcome goes
    to its replica's circuit breaker (``pool``) when the reply ends."""
    first = True
    while True:
        reply_filter = ReplyFilter(text_actions=prepared.text_actions, first_attempt=first)
        # A reply that breaks off after its first chunk is a failure of its replica.
        with outcome.replica.track(), reading_reply(pool, outcome.replica):
            async for chunk in stream:
                for out in reply_filter.feed(chunk):
                    yield out
        released, decision = reply_filter.finish()
        for out in released:
            yield out
        if decision.usage:
            outcome.usage.append(dict(decision.usage))
            guard.observe((prepared.tenant, prepared.session), decision.usage)
        if not decision.restores or outcome.restores >= max_restores:
            break
        outcome.restores += 1
        await answer(store, prepared, decision)
        if decision.other_calls:
            # The other calls went to the harness; the restored content, recorded, joins
            # the context of its next request.
            break
        outcome.replica, stream = await ask_again(prepared)
        first = False
    for out in decision.tail:
        yield out


async def answer(store: SessionStore, prepared: Prepared, decision: Decision) -> None:
    """Answer a restore request from the history and record the exchange (the history is
    stored: the loop runs after the upstream accepted the request)."""
    assert prepared.branch is not None, "restores are answered after the history is stored"
    asked = decode_reply(decision.asked)
    if prepared.text_actions:
        answers = [Message("user", (Text(restored_text(prepared, decision.restores)),))]
    else:
        answers = [
            Message("tool", (Text(restored_text(prepared, [spec])),), tool_call_id=call["id"])
            for call, spec in zip(decision.restore_calls, decision.restores, strict=True)
        ]
    metrics.RESTORES.labels(mode="text" if prepared.text_actions else "tool").inc()
    after = len(prepared.transcript.messages) - 1
    turns = [m.to_dict() for m in (asked, *answers)]
    await store.append_gateway_turns(
        prepared.tenant, prepared.session, prepared.branch, after, turns
    )
    prepared.add_turns(after, turns)


def restored_text(prepared: Prepared, specs: list[str]) -> str:
    history = prepared.transcript.with_messages(prepared.history)
    parts = []
    for spec in specs:
        try:
            first, last = parse_restore_spec(spec)
            for step, text in restore_outputs(history, prepared.state, first, last):
                parts.append(f"[restored step {step}]\n{text}")
        except ValueError as exc:
            parts.append(f"restore {spec} failed: {exc}")
    return "\n\n".join(parts)
