"""Anthropic Messages request bodies -> the neutral transcript (``anthropic_messages``
describes the mapping and the hints it keeps for writing a body back).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from gateway.dialects.anthropic_context import CONTEXT_MANAGEMENT, parse_context_management
from gateway.dialects.convert import SOURCED_PARTS, check_source
from gateway.dialects.errors import DialectError
from gateway.dialects.fields import (
    ANTHROPIC,
    DIALECT_PARAM,
    answered_call,
    check_fields,
    check_request_body,
    expect_bool,
    expect_list,
    expect_object,
    expect_str,
    extra_fields,
    hints,
    integer,
    make_meta,
    number,
    require,
    strings,
    take_tools,
)
from gateway.transcript import Message, Opaque, Part, Text, Thinking, ToolCall, Transcript

_ASSISTANT_ONLY = frozenset({"thinking", "redacted_thinking", "tool_use"})
_TOOL_CHOICES = ("auto", "any", "tool", "none")


def _check_tool_choice(value: Any, path: str) -> None:
    """Anthropic's ``tool_choice``, which is converted to chat's (``convert``)."""
    choice = expect_object(value, path)
    kind = expect_str(require(choice, "type", path), f"{path}.type")
    if kind not in _TOOL_CHOICES:
        raise DialectError(
            f"unknown tool_choice type {kind!r}; expected one of {', '.join(_TOOL_CHOICES)}",
            param=f"{path}.type",
        )
    if kind == "tool":
        expect_str(require(choice, "name", path), f"{path}.name")
    if "disable_parallel_tool_use" in choice:
        expect_bool(choice["disable_parallel_tool_use"], f"{path}.disable_parallel_tool_use")


# The request fields the gateway reads or converts, and the sampling fields whose meaning
# it forwards: wrong types are refused before anything is stored. Ranges are Anthropic's,
# but temperature's is OpenAI's: the replicas sample as vLLM does, and a chat body's
# temperature converts to this dialect.
_FIELD_CHECKS = {
    "stream": expect_bool,
    "temperature": number(0, 2),
    "top_p": number(0, 1),
    "top_k": integer(0),
    "stop_sequences": strings,
    "metadata": expect_object,
    "tool_choice": _check_tool_choice,
    "thinking": expect_object,
    # Applied by the gateway (``gateway.fold.context_edits``); refused here when malformed.
    CONTEXT_MANAGEMENT: parse_context_management,
}


def decode_envelope(body: Any) -> tuple[Transcript, list[Any]]:
    """Every check and field of the body but its messages: a transcript holding only the
    top-level system prompt (with tools, params) and the raw message list, to decode one by
    one with ``decode_item``."""
    body = check_request_body(body)
    expect_str(require(body, "model", ""), "model")
    integer(1)(require(body, "max_tokens", ""), "max_tokens")
    check_fields(body, _FIELD_CHECKS)
    messages = expect_list(require(body, "messages", ""), "messages")
    if not messages:
        raise DialectError("must contain at least one message", param="messages")
    params = {k: v for k, v in body.items() if k not in ("messages", "system")}
    tools = take_tools(body, params)
    params[DIALECT_PARAM] = ANTHROPIC
    system = (_decode_system(body["system"]),) if "system" in body else ()
    return Transcript(messages=system, tools=tools, params=params), messages


def decode_item(raw: Any, index: int, issued: set[str]) -> tuple[Message, ...]:
    """``messages[index]`` of a request (one or more neutral messages), given the call ids
    the earlier ones issued.

    Depends on nothing else, so an unchanged message at the same index decodes the same.
    """
    return tuple(_decode_message(raw, f"messages[{index}]", issued, system_turn=index > 0))


def _decode_system(raw: Any, where: str = "system", *, turn: bool = False) -> Message:
    """The top-level system prompt, or (``turn``) a system turn inside ``messages``."""
    if isinstance(raw, str):
        return Message(
            role="system", parts=(Text(raw),), meta=make_meta(ANTHROPIC, turn=turn or None)
        )
    blocks = expect_list(raw, where)
    parts: list[Part] = []
    for j, block in enumerate(blocks):
        path = f"{where}[{j}]"
        if expect_object(block, path).get("type") != "text":
            raise DialectError("system blocks must be text blocks", param=f"{path}.type")
        parts.append(_decode_block(block, path, "user", set()))
    meta = make_meta(ANTHROPIC, content=_form_hint("list", parts), turn=turn or None)
    return Message(role="system", parts=tuple(parts), meta=meta)


def _decode_message(
    raw: Any, path: str, issued: set[str], system_turn: bool = False
) -> list[Message]:
    msg = expect_object(raw, path)
    role = expect_str(require(msg, "role", path), f"{path}.role")
    if role == "system" and system_turn:
        # Claude Code 2.1 sends a system turn after the first user message; a leading one
        # is still refused below, with the hint to use the top-level field.
        return [_decode_system(require(msg, "content", path), f"{path}.content", turn=True)]
    if role not in ("user", "assistant"):
        hint = "; put the system prompt in the top-level 'system' field" * (role == "system")
        raise DialectError(
            f"unknown role {role!r}; expected 'user' or 'assistant'{hint}", param=f"{path}.role"
        )
    content = require(msg, "content", path)
    fields = extra_fields(msg, frozenset({"role", "content"}))
    if isinstance(content, str):
        meta = make_meta(ANTHROPIC, message_fields=fields)
        return [Message(role=role, parts=(Text(content),), meta=meta)]
    blocks = expect_list(content, f"{path}.content")
    results: list[Message] = []
    parts: list[Part] = []
    order = ""
    for j, raw_block in enumerate(blocks):
        block_path = f"{path}.content[{j}]"
        block = expect_object(raw_block, block_path)
        if block.get("type") == "tool_result" and role == "user":
            results.append(_decode_tool_result(block, block_path, issued))
            order += "t"
        else:
            parts.append(_decode_block(block, block_path, role, issued))
            order += "u"
    if not results:
        meta = make_meta(ANTHROPIC, content=_form_hint("list", parts), message_fields=fields)
        return [Message(role=role, parts=tuple(parts), meta=meta)]
    group: list[Message] = list(results)
    if parts:
        group.append(Message(role="user", parts=tuple(parts)))
    first_hints = {
        **hints(group[0].meta, ANTHROPIC),
        "group": len(group),
        **({"order": order} if order != "t" * len(results) + "u" * len(parts) else {}),
        **({"message_fields": fields} if fields else {}),
    }
    group[0] = replace(group[0], meta={ANTHROPIC: first_hints})
    return group


def _decode_tool_result(block: Mapping[str, Any], path: str, issued: set[str]) -> Message:
    call_id = answered_call(block, "tool_use_id", path, issued, "assistant tool_use")
    is_error = expect_bool(block["is_error"], f"{path}.is_error") if "is_error" in block else False
    parts: list[Part] = []
    form = "absent"
    if "content" in block:
        content = block["content"]
        if isinstance(content, str):
            parts, form = [Text(content)], "str"
        else:
            blocks = expect_list(content, f"{path}.content")
            parts = [
                _decode_block(b, f"{path}.content[{j}]", "user", issued)
                for j, b in enumerate(blocks)
            ]
            form = "list"
    meta = make_meta(
        ANTHROPIC,
        content=_form_hint(form, parts),
        fields=extra_fields(block, frozenset({"type", "tool_use_id", "content", "is_error"})),
        has_is_error=True if "is_error" in block and not is_error else None,
    )
    return Message(
        role="tool", parts=tuple(parts), tool_call_id=call_id, is_error=is_error, meta=meta
    )


def _decode_block(raw: Any, path: str, role: str, issued: set[str]) -> Part:
    block = expect_object(raw, path)
    kind = expect_str(require(block, "type", path), f"{path}.type")
    if kind in _ASSISTANT_ONLY and role != "assistant":
        raise DialectError(
            f"{kind} blocks are only allowed in assistant messages", param=f"{path}.type"
        )
    if kind == "tool_result":
        raise DialectError(
            "tool_result blocks are only allowed in user messages", param=f"{path}.type"
        )

    def fields(*known: str) -> dict[str, Any]:
        return extra_fields(block, frozenset({"type", *known}))

    if kind == "text":
        text = expect_str(require(block, "text", path), f"{path}.text")
        return Text(text, make_meta(ANTHROPIC, fields=fields("text")))
    if kind == "thinking":
        text = expect_str(require(block, "thinking", path), f"{path}.thinking")
        signature = block.get("signature")
        if signature is not None:
            expect_str(signature, f"{path}.signature")
        meta = make_meta(ANTHROPIC, fields=fields("thinking", "signature"))
        return Thinking(text, signature, meta)
    if kind == "redacted_thinking":
        data = expect_str(require(block, "data", path), f"{path}.data")
        return Thinking("", None, make_meta(ANTHROPIC, redacted=data, fields=fields("data")))
    if kind == "tool_use":
        call_id = expect_str(require(block, "id", path), f"{path}.id")
        name = expect_str(require(block, "name", path), f"{path}.name")
        arguments = expect_object(require(block, "input", path), f"{path}.input")
        issued.add(call_id)
        meta = make_meta(ANTHROPIC, fields=fields("id", "name", "input"))
        return ToolCall(call_id, name, json.dumps(arguments, ensure_ascii=False), meta)
    if kind in SOURCED_PARTS:
        check_source(block, path)
    return Opaque(dict(block))


def _form_hint(form: str, parts: Sequence[Part]) -> str | None:
    """The content form to note, when it is not the one the parts' shape suggests.

    The shape ignores part hints, so that dropping a volatile marker (``volatile``) leaves
    the message's hints as they were.
    """
    natural = "str" if len(parts) == 1 and isinstance(parts[0], Text) else "list"
    return form if form != natural else None
