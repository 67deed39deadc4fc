"""Logged OpenAI chat messages (normalized files, mini-swe-agent, SWE-agent) -> messages.

Decoding is the OpenAI chat dialect's own (``gateway.dialects.openai_chat``); this module
only keeps the fields a model saw (harnesses log bookkeeping such as raw API responses
beside each message, which must not travel on as pass-through fields) and turns the
dialect's errors into errors naming the file and line.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from gateway.dialects.errors import DialectError
from gateway.dialects.openai_chat import decode_message
from gateway.transcript import Message, Transcript
from offline.importers.base import (
    MessageTime,
    Trajectory,
    TrajectoryFormatError,
    require,
    stem,
)

_CHAT_FIELDS = ("role", "content", "reasoning_content", "tool_calls", "tool_call_id")


def chat_fields(raw: Any) -> Any:
    """The message with only the fields the model saw (anything else is returned as is)."""
    if not isinstance(raw, Mapping):
        return raw
    out = {k: raw[k] for k in _CHAT_FIELDS if k in raw}
    if out.get("tool_calls"):
        # Streaming leftovers (``index``) are not part of a call.
        out["tool_calls"] = [
            {k: v for k, v in c.items() if k != "index"} if isinstance(c, Mapping) else c
            for c in out["tool_calls"]
        ]
    elif "tool_calls" in out:
        del out["tool_calls"]  # null or [] on a plain message: no calls
    return out


def decode_chat_messages(
    raw: Sequence[Any], path: Path, line: int | None = None, where: str = "messages"
) -> tuple[Message, ...]:
    """Decode a logged message list; each tool result must answer an earlier call."""
    require(isinstance(raw, list), path, f"{where!r} must be a list", line)
    issued: set[str] = set()
    out = []
    for i, m in enumerate(raw):
        try:
            out.append(decode_message(chat_fields(m), f"{where}[{i}]", issued))
        except DialectError as exc:
            raise TrajectoryFormatError(path, str(exc), line) from exc
    return tuple(out)


def chat_trajectory(
    harness: str,
    path: Path,
    messages: Sequence[Message],
    meta: Mapping[str, Any],
    times: Sequence[MessageTime | None] = (),
) -> list[Trajectory]:
    """One run of a chat-logging harness: tool-calling when it has tool messages.
    ``times`` (one per message, or empty) only where some message has one."""
    native = any(m.role == "tool" for m in messages)
    return [
        Trajectory(
            id=f"{harness}__{stem(path)}",
            harness=harness,
            fmt="native_tool_calls" if native else "text_actions",
            transcript=Transcript(tuple(messages)),
            source_path=path,
            meta=dict(meta),
            times=tuple(times) if any(t is not None for t in times) else (),
        )
    ]
