"""OpenAI chat-shaped message lists (normalized files, mini-swe-agent, SWE-agent) -> messages.

This is the log-reading side only: no request params, no byte-exact write-back. Thinking
comes from ``reasoning_content`` and is placed before the text, as the model produced it.
``line`` is the JSONL line the messages came from, for error messages.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from gateway.importers.base import require
from gateway.transcript import ROLES, Message, Opaque, Part, Text, Thinking, ToolCall

# Roles some harnesses log that the model saw as another role.
_ROLE_ALIASES = {"developer": "system"}


def content_parts(content: Any, path: Path, where: str, line: int | None = None) -> list[Part]:
    """A chat ``content`` (string, ``None`` or a list of parts) as neutral parts.

    Empty strings give no part, so "no text" looks the same whatever the harness logged.
    """
    if content is None:
        return []
    if isinstance(content, str):
        return [Text(content)] if content else []
    require(isinstance(content, list), path, f"{where}: content must be a string or a list", line)
    parts: list[Part] = []
    for block in content:
        require(isinstance(block, Mapping), path, f"{where}: content parts must be objects", line)
        if block.get("type") != "text":
            parts.append(Opaque(dict(block)))
        elif block.get("text"):
            parts.append(Text(block["text"]))
    return parts


def tool_call(raw: Any, path: Path, where: str, line: int | None = None) -> ToolCall:
    def check(ok: bool, problem: str) -> None:
        require(ok, path, f"{where}: {problem}", line)

    check(isinstance(raw, Mapping), "a tool call must be an object")
    fn = raw.get("function")
    check(isinstance(fn, Mapping), "tool call without a 'function' object")
    name, args = fn.get("name"), fn.get("arguments")
    check(isinstance(name, str) and bool(name), "tool call without a function name")
    if isinstance(args, Mapping):
        # Some loggers keep the parsed object; the model sent JSON text.
        args = json.dumps(args, ensure_ascii=False)
    check(isinstance(args, str), "tool call arguments must be JSON text")
    call_id = raw.get("id")
    check(isinstance(call_id, str) and bool(call_id), "tool call without an id")
    return ToolCall(call_id, name, args)


def decode_chat_message(
    raw: Any,
    path: Path,
    where: str,
    line: int | None = None,
    tool_call_id: Callable[[Mapping[str, Any]], str | None] | None = None,
) -> Message:
    """One chat message. ``tool_call_id`` overrides how a tool message names its call."""
    require(isinstance(raw, Mapping), path, f"{where}: a message must be an object", line)
    role = _ROLE_ALIASES.get(raw.get("role"), raw.get("role"))
    known = ", ".join(ROLES)
    require(
        role in ROLES, path, f"{where}: unknown role {raw.get('role')!r}; expected {known}", line
    )
    parts: list[Part] = []
    reasoning = raw.get("reasoning_content")
    if reasoning:
        require(isinstance(reasoning, str), path, f"{where}: reasoning_content must be text", line)
        parts.append(Thinking(reasoning))
    parts += content_parts(raw.get("content"), path, where, line)
    parts += [tool_call(c, path, where, line) for c in raw.get("tool_calls") or ()]
    call_id = None
    if role == "tool":
        call_id = tool_call_id(raw) if tool_call_id else raw.get("tool_call_id")
        require(bool(call_id), path, f"{where}: tool message without a tool_call_id", line)
    return Message(role=role, parts=tuple(parts), tool_call_id=call_id)


def decode_chat_messages(
    raw: Sequence[Any], path: Path, line: int | None = None
) -> tuple[Message, ...]:
    require(isinstance(raw, list), path, "'messages' must be a list", line)
    return tuple(decode_chat_message(m, path, f"message {i}", line) for i, m in enumerate(raw))
