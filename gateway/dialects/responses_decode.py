"""OpenAI Responses request bodies -> the neutral transcript (``openai_responses``).

``instructions`` becomes a leading system message; ``input`` (a string, or items) becomes
the conversation. The items a model produced in one turn (``reasoning``, ``message`` with
role assistant, ``function_call``) arrive side by side and become ONE assistant message, as
a chat model produced them: a reasoning item stays with the call or text that follows it
through every renderer. ``function_call_output`` becomes a tool message and must answer a
call made before it. A reasoning item is carried whole (summary, content, encrypted
content) in the thinking part's hints; its text goes upstream as the chat ``reasoning``
field. A ``compaction`` item (the provider's compaction of earlier turns, its
``encrypted_content`` readable by that provider only) is carried whole as an opaque part of
the model's turn, and goes upstream as a placeholder. Tools: function tools are converted
to chat tools; hosted and other tools
(``web_search``, ``namespace``, ``custom`` ...) cannot run on a vLLM replica and are left
out of the upstream request (Codex always offers ``web_search``). Parameters are converted
(``max_output_tokens`` -> ``max_tokens``, ``text.format`` -> ``response_format``); fields
with no chat meaning (``store``, ``include``, ``reasoning``, ...) stay here, and unknown
ones (``stop``, ``top_k``) pass through to vLLM.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from gateway.dialects.errors import DialectError
from gateway.dialects.fields import (
    DIALECT_PARAM,
    OPENAI,
    RESPONSES,
    answered_call,
    check_fields,
    check_request_body,
    expect_bool,
    expect_list,
    expect_object,
    expect_str,
    extra_fields,
    integer,
    make_meta,
    number,
    require,
)
from gateway.transcript import Message, Opaque, Part, Role, Text, Thinking, ToolCall, Transcript

# Request fields the translation consumes or that mean nothing to a chat upstream.
_CONSUMED = frozenset(
    {
        "input", "instructions", "tools", "tool_choice", "max_output_tokens", "text",
        "previous_response_id", "store", "include", "reasoning", "truncation", "metadata",
        "prompt_cache_key", "prompt_cache_retention", "client_metadata", "service_tier",
        "background", "safety_identifier", "stream_options", "max_tool_calls", "conversation",
    }
)  # fmt: skip
_ROLES: Mapping[str, Role] = {
    "user": "user",
    "assistant": "assistant",
    "system": "system",
    "developer": "system",
}
# Items a model produces in one turn; side by side they form one assistant message.
_TURN_ITEMS = frozenset({"reasoning", "function_call", "custom_tool_call", "compaction"})
_TEXT_PARTS = frozenset({"input_text", "output_text"})
# The request fields the gateway reads or converts, and the sampling fields whose meaning
# it forwards: wrong types are refused before anything is stored. Ranges are OpenAI's.
_FIELD_CHECKS = {
    "stream": expect_bool,
    "store": expect_bool,
    "parallel_tool_calls": expect_bool,
    "background": expect_bool,
    "max_output_tokens": integer(1),
    "temperature": number(0, 2),
    "top_p": number(0, 1),
    "top_logprobs": integer(0, 20),
    "max_tool_calls": integer(1),
    "user": expect_str,
    "safety_identifier": expect_str,
    "prompt_cache_key": expect_str,
    "metadata": expect_object,
}


def _convert_tools(body: Mapping[str, Any]) -> tuple[dict[str, Any], ...]:
    """Function tools as chat tools; tools only a hosted service runs are left out."""
    if "tools" not in body or body["tools"] is None:
        return ()
    tools: list[dict[str, Any]] = []
    for i, raw in enumerate(expect_list(body["tools"], "tools")):
        tool = expect_object(raw, f"tools[{i}]")
        if expect_str(require(tool, "type", f"tools[{i}]"), f"tools[{i}].type") != "function":
            continue
        name = expect_str(require(tool, "name", f"tools[{i}]"), f"tools[{i}].name")
        fn: dict[str, Any] = {"name": name}
        if isinstance(tool.get("description"), str):
            fn["description"] = tool["description"]
        fn["parameters"] = tool.get("parameters") or {"type": "object", "properties": {}}
        if isinstance(tool.get("strict"), bool):
            fn["strict"] = tool["strict"]
        tools.append({"type": "function", "function": fn})
    return tuple(tools)


def _convert_tool_choice(choice: Any) -> Any:
    if choice in ("auto", "none", "required"):
        return choice
    if isinstance(choice, dict) and choice.get("type") == "function":
        name = expect_str(require(choice, "name", "tool_choice"), "tool_choice.name")
        return {"type": "function", "function": {"name": name}}
    if isinstance(choice, dict) and choice.get("type") == "allowed_tools":
        return "required" if choice.get("mode") == "required" else "auto"
    raise DialectError(
        "only 'auto', 'none', 'required' or a function tool can be chosen; hosted tools do "
        "not run on this gateway's replicas",
        param="tool_choice",
    )


def _convert_text_format(text: Any) -> dict[str, Any] | None:
    fmt = expect_object(text, "text").get("format")
    if fmt is None:
        return None
    fmt = expect_object(fmt, "text.format")
    kind = expect_str(require(fmt, "type", "text.format"), "text.format.type")
    if kind == "text":
        return None
    if kind == "json_object":
        return {"type": "json_object"}
    if kind == "json_schema":
        schema = {k: fmt[k] for k in ("name", "schema", "strict", "description") if k in fmt}
        return {"type": "json_schema", "json_schema": schema}
    raise DialectError(f"unknown format type {kind!r}", param="text.format.type")


def _params(body: Mapping[str, Any]) -> dict[str, Any]:
    """The request's parameters as Chat Completions fields."""
    check_fields(body, _FIELD_CHECKS)
    if body.get("background"):
        raise DialectError("background responses are not supported", param="background")
    params = {k: v for k, v in body.items() if k not in _CONSUMED}
    if body.get("max_output_tokens") is not None:
        params["max_tokens"] = body["max_output_tokens"]
    if body.get("tool_choice") is not None:
        params["tool_choice"] = _convert_tool_choice(body["tool_choice"])
    if body.get("text") is not None:
        response_format = _convert_text_format(body["text"])
        if response_format is not None:
            params["response_format"] = response_format
    params[DIALECT_PARAM] = OPENAI  # the params are chat fields now
    return params


def group_items(items: Sequence[Any]) -> list[dict[str, Any]]:
    """Input items as decoding units: the items of one model turn together, every other
    item alone. ``at`` is the first item's index in ``input``."""
    groups: list[dict[str, Any]] = []
    for index, item in enumerate(items):
        turn = _is_turn_item(item)
        if turn and groups and groups[-1]["turn"]:
            groups[-1]["items"].append(item)
        else:
            groups.append({"at": index, "turn": turn, "items": [item]})
    return groups


def _is_turn_item(item: Any) -> bool:
    if not isinstance(item, dict):
        return False
    kind = item.get("type", "message")
    if not isinstance(kind, str):
        return False  # refused with its path when decoded
    return kind in _TURN_ITEMS or (kind == "message" and item.get("role") == "assistant")


def _content_part(raw: Any, path: str) -> Part:
    part = expect_object(raw, path)
    kind = expect_str(require(part, "type", path), f"{path}.type")
    if kind in _TEXT_PARTS:
        text = expect_str(require(part, "text", path), f"{path}.text")
        return Text(
            text, make_meta(RESPONSES, fields=extra_fields(part, frozenset({"type", "text"})))
        )
    if kind == "refusal":
        return Text(expect_str(require(part, "refusal", path), f"{path}.refusal"))
    if kind == "input_image" and isinstance(part.get("image_url"), str):
        image = {
            "url": part["image_url"],
            **({"detail": part["detail"]} if "detail" in part else {}),
        }
        return Opaque({"type": "image_url", "image_url": image})
    raise DialectError(
        f"unsupported content part type {kind!r}; expected input_text, output_text, refusal "
        "or input_image with an image_url",
        param=f"{path}.type",
    )


def _content(raw: Any, path: str) -> list[Part]:
    if isinstance(raw, str):
        return [Text(raw)]
    return [_content_part(p, f"{path}[{j}]") for j, p in enumerate(expect_list(raw, path))]


def _message(item: dict[str, Any], path: str) -> Message:
    role_name = expect_str(require(item, "role", path), f"{path}.role")
    if role_name not in _ROLES:
        raise DialectError(
            f"unknown role {role_name!r}; expected one of {', '.join(_ROLES)}", param=f"{path}.role"
        )
    parts = _content(require(item, "content", path), f"{path}.content")
    fields = extra_fields(item, frozenset({"type", "role", "content"}))
    meta = make_meta(RESPONSES, role=role_name if role_name == "developer" else None, fields=fields)
    return Message(_ROLES[role_name], tuple(parts), meta=meta)


def _turn_parts(item: dict[str, Any], path: str, issued: set[str]) -> list[Part]:
    """The parts one model-turn item adds to its assistant message."""
    kind = item.get("type", "message")
    if kind == "message":
        parts = _content(require(item, "content", path), f"{path}.content")
        fields = extra_fields(item, frozenset({"type", "role", "content"}))
        if fields and parts:  # the item's own fields (id, status) ride on its first part
            first = parts[0]
            if isinstance(first, Text):
                parts[0] = Text(first.text, {**first.meta, **make_meta(RESPONSES, item=fields)})
        return parts
    if kind == "reasoning":
        # The model's own reasoning text when the item has it, else its summary.
        content, summary = (_reasoning_texts(item, key, path) for key in ("content", "summary"))
        text = "\n\n".join(content or summary)
        return [Thinking(text, None, {RESPONSES: {"item": dict(item)}})]
    if kind == "compaction":
        # The model's compaction of earlier turns (``encrypted_content``): carried whole.
        return [Opaque(dict(item))]
    call_id = expect_str(require(item, "call_id", path), f"{path}.call_id")
    name = expect_str(require(item, "name", path), f"{path}.name")
    key = "arguments" if kind == "function_call" else "input"
    arguments = expect_str(require(item, key, path), f"{path}.{key}")
    issued.add(call_id)
    fields = extra_fields(item, frozenset({"type", "call_id", "name", key}))
    custom = True if kind == "custom_tool_call" else None
    return [ToolCall(call_id, name, arguments, make_meta(RESPONSES, fields=fields, custom=custom))]


def _reasoning_texts(item: dict[str, Any], key: str, path: str) -> list[str]:
    texts = []
    for j, raw in enumerate(expect_list(item.get(key) or [], f"{path}.{key}")):
        where = f"{path}.{key}[{j}]"
        texts.append(expect_str(require(expect_object(raw, where), "text", where), f"{where}.text"))
    return texts


def _tool_output(item: dict[str, Any], path: str, issued: set[str]) -> Message:
    call_id = answered_call(item, "call_id", path, issued, "function_call")
    parts = _content(require(item, "output", path), f"{path}.output")
    fields = extra_fields(item, frozenset({"call_id", "output"}))
    return Message(
        "tool", tuple(parts), tool_call_id=call_id, meta=make_meta(RESPONSES, fields=fields)
    )


def decode_envelope(body: Any) -> tuple[Transcript, list[Any]]:
    """Every check and field of the body but its input items: a transcript of the
    ``instructions`` (with tools, params) and the items grouped into decoding units
    (``group_items``), to decode one by one with ``decode_item``."""
    body = check_request_body(body)
    expect_str(require(body, "model", ""), "model")
    raw_input = require(body, "input", "")
    items = (
        [{"role": "user", "content": raw_input}]
        if isinstance(raw_input, str)
        else (expect_list(raw_input, "input"))
    )
    if not items:
        raise DialectError("must contain at least one item", param="input")
    if body.get("previous_response_id") is not None:
        expect_str(body["previous_response_id"], "previous_response_id")
    lead: tuple[Message, ...] = ()
    instructions = body.get("instructions")
    if instructions is not None and expect_str(instructions, "instructions"):
        meta = {RESPONSES: {"instructions": True}}
        lead = (Message("system", (Text(instructions),), meta=meta),)
    transcript = Transcript(lead, tools=_convert_tools(body), params=_params(body))
    return transcript, group_items(items)


def decode_item(raw: Any, index: int, issued: set[str]) -> tuple[Message, ...]:
    """One decoding unit of ``group_items`` (a model turn's items, or one other item) as
    neutral messages, given the call ids the earlier ones issued."""
    at, items = raw["at"], raw["items"]
    if raw["turn"]:
        parts = [
            part
            for offset, item in enumerate(items)
            for part in _turn_parts(item, f"input[{at + offset}]", issued)
        ]
        return (Message("assistant", tuple(parts)),)
    path = f"input[{at}]"
    item = expect_object(items[0], path)
    kind = expect_str(item.get("type", "message"), f"{path}.type")
    if kind == "message":
        return (_message(item, path),)
    if kind in ("function_call_output", "custom_tool_call_output"):
        return (_tool_output(item, path, issued),)
    raise DialectError(
        f"unsupported item type {kind!r}; expected message, reasoning, function_call, "
        "function_call_output, custom_tool_call or custom_tool_call_output",
        param=f"{path}.type",
    )
