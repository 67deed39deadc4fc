"""Recorded trajectories as the HTTP requests their harness sent, step by step.

Request t of a session is ``offline.replay.requests_of`` (every message before the t-th
assistant reply, as the harness sent it) encoded in the harness's own dialect: Claude Code
sessions as Anthropic Messages to ``/v1/messages``, every other harness as OpenAI Chat
Completions to ``/v1/chat/completions``. Decode work matches the recording: ``max_tokens`` is
the recorded reply's token count and vLLM's ``ignore_eos`` makes the model produce all of
them. The next request carries the recorded reply, never the generated one, so every arm of
an experiment sends the same histories.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from gateway.dialects import anthropic_messages, openai_chat
from gateway.tokens import GENERATION_PROMPT, ChatTokenizer, default_tokenizer_spec, get_counter
from gateway.transcript import Message
from offline.importers import Trajectory, load_trajectories
from offline.replay import requests_of

Dialect = Literal["openai", "anthropic"]
PATHS: dict[Dialect, str] = {"openai": "/v1/chat/completions", "anthropic": "/v1/messages"}
# Harnesses that speak Anthropic Messages; every other recorded harness spoke OpenAI chat.
ANTHROPIC_HARNESSES = frozenset({"claude-code"})


def dialect_of(trajectory: Trajectory) -> Dialect:
    return "anthropic" if trajectory.harness in ANTHROPIC_HARNESSES else "openai"


@dataclass(frozen=True, slots=True)
class Step:
    """One request of a session: the body to send, the decode length it asks for, and the
    recorded seconds between the previous reply's end and this request (None: not logged)."""

    index: int
    body: dict[str, Any]
    reply_tokens: int
    think_s: float | None = None


@dataclass(frozen=True, slots=True)
class Session:
    trajectory: str
    dialect: Dialect
    steps: tuple[Step, ...]

    @property
    def path(self) -> str:
        return PATHS[self.dialect]


def reply_tokens(reply: Message, chat: ChatTokenizer) -> int:
    """Tokens the model generated for ``reply``: its ChatML turn without the turn header."""
    header = len(chat.text_ids(GENERATION_PROMPT))
    return max(1, chat.message_count(reply) - header)


def request_body(
    request: Any, dialect: Dialect, model: str, max_tokens: int, *, ignore_eos: bool = True
) -> dict[str, Any]:
    """The streaming request a harness sends for ``request`` (a transcript)."""
    if dialect == "anthropic":
        body = anthropic_messages.encode_request(request)
    else:
        body = openai_chat.encode_request(request)
        body["stream_options"] = {"include_usage": True}
    body.update(model=model, max_tokens=max_tokens, stream=True)
    if ignore_eos:
        body["ignore_eos"] = True  # vLLM's sampling field: decode exactly max_tokens
    return body


def replayable_sessions(
    paths: Sequence[str | Path],
    model: str,
    *,
    max_steps: int | None = None,
    max_tokens_cap: int | None = None,
    tokenizer: str = "",
) -> tuple[Session, ...]:
    """The sessions of every trajectory under ``paths`` that have a request to send, their
    decode lengths counted with ``tokenizer`` (the default one when empty)."""
    chat = ChatTokenizer(get_counter(tokenizer or default_tokenizer_spec()))
    sessions = (
        build_session(t, chat, model, max_steps=max_steps, max_tokens_cap=max_tokens_cap)
        for t in load_trajectories(*paths)
    )
    return tuple(s for s in sessions if s.steps)


def build_session(
    trajectory: Trajectory,
    chat: ChatTokenizer,
    model: str,
    *,
    max_steps: int | None = None,
    max_tokens_cap: int | None = None,
    dialect: Dialect | None = None,
) -> Session:
    """The session's requests; ``max_steps`` keeps the first steps only, ``max_tokens_cap``
    bounds the decode length (a stated deviation from the recording, for small machines)."""
    dialect = dialect or dialect_of(trajectory)
    replies = [m for m in trajectory.transcript.messages if m.role == "assistant"]
    steps = []
    requests = requests_of(trajectory.transcript, trajectory.compaction_indices)
    thinks = trajectory.think_times()
    for i, (request, reply, think) in enumerate(zip(requests, replies, thinks, strict=True)):
        if max_steps is not None and i >= max_steps:
            break
        if not request.messages or all(m.role == "system" for m in request.messages):
            continue  # a reply with nothing before it: no harness sent such a request
        tokens = reply_tokens(reply, chat)
        if max_tokens_cap is not None:
            tokens = min(tokens, max_tokens_cap)
        steps.append(Step(i, request_body(request, dialect, model, tokens), tokens, think))
    return Session(trajectory.id, dialect, tuple(steps))
