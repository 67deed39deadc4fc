"""The gateway-side restore loop: the model's restore calls are answered here.

The reply streams through a ``ReplyFilter``; when the model asked to restore folded or
stubbed steps (a tool the gateway added, or a ``restore N`` line in text harnesses), the
gateway answers from the history, records the exchange as gateway turns (after the
request's last message, so every later render sees it before the model's reply) and asks
the model again. The harness never sees a restore.

The loop's own state (``Restoring``) is the one thing on the request path that grows
while the request runs: the gateway turns it adds, the replica that answered last, each
attempt's usage and the latest rendering's stats. It ends as a frozen ``Outcome`` for the
accounting.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gateway import metrics
from gateway.context_guard import ContextGuard
from gateway.dialects.openai_chat import decode_reply
from gateway.fold.renderer import RenderState, RenderStats
from gateway.fold.restore import parse_restore_spec, restore_outputs
from gateway.steps.ingest import GatewayTurns, Ingested, Stored, with_gateway_turns
from gateway.steps.render_call import Rendering
from gateway.steps.reply_filter import Decision, ReplyFilter
from gateway.transcript import Message, Text
from gateway.upstream import ChatStream
from router import ReplicaPool, reading_reply
from router.replica import Replica
from router.turn_end import ends_turn
from store import SessionStore

# A history with the gateway's turns in place, and the render state they make.
Placed = tuple[list[Message], RenderState]


def placed(messages: Sequence[Message], turns: GatewayTurns) -> Placed:
    """``messages`` with the gateway's ``turns`` in place (``ingest.with_gateway_turns``)."""
    history, restored = with_gateway_turns(messages, turns)
    return history, RenderState(restored=frozenset(restored))


class Restoring:
    """The restore loop's state: the history with the gateway's turns in place (those the
    store held, then those the loop adds), and what the accounting needs of the attempts."""

    def __init__(
        self,
        ingested: Ingested,
        placed: Placed,
        replica: Replica,
        stats: RenderStats,
        pressure: float,
    ) -> None:
        self.messages = ingested.transcript.messages
        self.turns = {after: list(t) for after, t in ingested.found.gateway_turns.items()}
        self.history, self.state = placed
        self.replica = replica
        self.usage: list[dict[str, Any]] = []
        self.restores = 0
        self.stats = stats
        self.pressure = pressure
        self.ended_turn = False  # the last reply ended the agent's turn (router.turn_end)

    def add_turns(self, after: int, messages: Sequence[Mapping[str, Any]]) -> None:
        """Gateway turns recorded after history message ``after``: in the history now."""
        self.turns.setdefault(after, []).extend(messages)
        self.history, self.state = self._placed()

    def _placed(self) -> Placed:
        return placed(self.messages, self.turns)

    def outcome(self) -> Outcome:
        return Outcome(self.replica, tuple(self.usage), self.restores, self.stats, self.pressure)


@dataclass(frozen=True, slots=True)
class Outcome:
    """What the loop saw, for the accounting: the replica that answered last, each
    attempt's usage, how many restores it answered, and the last rendering's stats and
    KV pressure."""

    replica: Replica
    usage: tuple[dict[str, Any], ...]
    restores: int
    stats: RenderStats
    pressure: float


# Render the request again (with the restored content) and open a new upstream stream.
AskAgain = Callable[[Restoring], Awaitable[tuple[Replica, ChatStream, Rendering]]]


@dataclass(frozen=True, slots=True)
class RestoreLoop:
    store: SessionStore
    pool: ReplicaPool
    guard: ContextGuard
    max_restores: int

    async def replies(
        self,
        ingested: Ingested,
        stored: Stored,
        restoring: Restoring,
        stream: ChatStream,
        ask_again: AskAgain,
    ) -> AsyncIterator[dict[str, Any]]:
        """The chunks for the client, restores answered in between; each reply's outcome
        goes to its replica's circuit breaker (``pool``) when the reply ends."""
        first = True
        while True:
            reply_filter = ReplyFilter(
                text_actions=ingested.text_actions,
                first_attempt=first,
                restore_tool=restoring.stats.restore_tool,
                text_restores=restoring.stats.text_restores,
            )
            # A reply that breaks off after its first chunk is a failure of its replica.
            with restoring.replica.track(), reading_reply(self.pool, restoring.replica):
                async for chunk in stream:
                    for out in reply_filter.feed(chunk):
                        yield out
            released, decision = reply_filter.finish()
            for out in released:
                yield out
            if decision.usage:
                restoring.usage.append(dict(decision.usage))
                self.guard.observe((ingested.tenant, ingested.session), decision.usage)
            if not decision.restores or restoring.restores >= self.max_restores:
                restoring.ended_turn = not decision.restores and ends_turn(
                    bool(ingested.transcript.tools), decision.other_calls, decision.finish_reason
                )
                break
            restoring.restores += 1
            await self.answer(ingested, stored, restoring, decision)
            if decision.other_calls:
                # The other calls went to the harness; the restored content, recorded, joins
                # the context of its next request.
                break
            restoring.replica, stream, rendering = await ask_again(restoring)
            restoring.stats, restoring.pressure = rendering.stats, rendering.pressure
            first = False
        for out in decision.tail:
            yield out

    async def answer(
        self, ingested: Ingested, stored: Stored, restoring: Restoring, decision: Decision
    ) -> None:
        """Answer a restore request from the history and record the exchange (the history
        is stored: the loop runs after the upstream accepted the request)."""
        asked = decode_reply(decision.asked)
        if ingested.text_actions:
            text = restored_text(ingested, restoring, decision.restores)
            answers = [Message("user", (Text(text),))]
        else:
            answers = [
                Message(
                    "tool",
                    (Text(restored_text(ingested, restoring, [spec])),),
                    tool_call_id=call["id"],
                )
                for call, spec in zip(decision.restore_calls, decision.restores, strict=True)
            ]
        metrics.RESTORES.labels(mode="text" if ingested.text_actions else "tool").inc()
        after = len(ingested.transcript.messages) - 1
        turns = [m.to_dict() for m in (asked, *answers)]
        await self.store.append_gateway_turns(
            ingested.tenant, ingested.session, stored.branch, after, turns
        )
        restoring.add_turns(after, turns)


def restored_text(ingested: Ingested, restoring: Restoring, specs: list[str]) -> str:
    history = ingested.transcript.with_messages(restoring.history)
    parts = []
    for spec in specs:
        try:
            first, last = parse_restore_spec(spec)
            for step, text in restore_outputs(history, restoring.state, first, last):
                parts.append(f"[restored step {step}]\n{text}")
        except ValueError as exc:
            parts.append(f"restore {spec} failed: {exc}")
    return "\n\n".join(parts)
