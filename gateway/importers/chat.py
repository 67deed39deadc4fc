"""OpenAI chat-shaped message lists (normalized files, mini-swe-agent, SWE-agent) -> messages.

This is the log-reading side only: no request params, no byte-exact write-back. Thinking
comes from ``reasoning_content`` and is placed before the text, as the model produced it.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from gateway.importers.base import TrajectoryFormatError, require
from gateway.transcript import ROLES, Message, Opaque, Part, Text, Thinking, ToolCall

# Roles some harnesses log that the model saw as another role.
_ROLE_ALIASES = {"developer": "system"}


def content_parts(content: Any, path: Path, where: str) -> list[Part]:
    """A chat ``content`` (string, ``None`` or a list of parts) as neutral parts.

    Empty strings give no part, so "no text" looks the same whatever the harness logged.
    """
    if content is None:
        return []
    if isinstance(content, str):
        return [Text(content)] if content else []
    require(isinstance(content, list), path, f"{where}: content must be a string or a list")
    parts: list[Part] = []
    for block in content:
        require(isinstance(block, Mapping), path, f"{where}: content parts must be objects")
        if block.get("type") == "text":
            if block.get("text"):
                parts.append(Text(block["text"]))
        else:
            parts.append(Opaque(dict(block)))
    return parts


def tool_call(raw: Any, path: Path, where: str) -> ToolCall:
    require(isinstance(raw, Mapping), path, f"{where}: a tool call must be an object")
    fn = raw.get("function")
    require(isinstance(fn, Mapping), path, f"{where}: tool call without a 'function' object")
    name, args = fn.get("name"), fn.get("arguments")
    require(isinstance(name, str), path, f"{where}: tool call without a function name")
    if isinstance(args, Mapping):
        # Some loggers keep the parsed object; the model sent JSON text.
        args = json.dumps(args, ensure_ascii=False)
    require(isinstance(args, str), path, f"{where}: tool call arguments must be JSON text")
    call_id = raw.get("id")
    require(isinstance(call_id, str) and bool(call_id), path, f"{where}: tool call without an id")
    return ToolCall(call_id, name, args)


def decode_chat_message(
    raw: Any,
    path: Path,
    where: str,
    tool_call_id: Callable[[Mapping[str, Any]], str | None] | None = None,
) -> Message:
    """One chat message. ``tool_call_id`` overrides how a tool message names its call."""
    require(isinstance(raw, Mapping), path, f"{where}: a message must be an object")
    role = _ROLE_ALIASES.get(raw.get("role"), raw.get("role"))
    if role not in ROLES:
        raise TrajectoryFormatError(
            path, f"{where}: unknown role {raw.get('role')!r}; expected one of {', '.join(ROLES)}"
        )
    parts: list[Part] = []
    reasoning = raw.get("reasoning_content")
    if reasoning:
        require(isinstance(reasoning, str), path, f"{where}: reasoning_content must be a string")
        parts.append(Thinking(reasoning))
    parts += content_parts(raw.get("content"), path, where)
    for call in raw.get("tool_calls") or ():
        parts.append(tool_call(call, path, where))
    call_id = None
    if role == "tool":
        call_id = tool_call_id(raw) if tool_call_id else raw.get("tool_call_id")
        require(bool(call_id), path, f"{where}: tool message without a tool_call_id")
    return Message(role=role, parts=tuple(parts), tool_call_id=call_id)


def decode_chat_messages(raw: Sequence[Any], path: Path, where: str = "") -> tuple[Message, ...]:
    require(isinstance(raw, list), path, f"{where}'messages' must be a list")
    return tuple(decode_chat_message(m, path, f"{where}message {i}") for i, m in enumerate(raw))
