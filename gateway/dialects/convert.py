"""Cross-dialect conversion of what is not a message: tool schemas, tool_choice, request
parameters and the part types only one provider understands (images, documents, audio).

Used by the encoders when a transcript decoded from one dialect is written in the other
(the usual case: an Anthropic client in front of a vLLM upstream that speaks OpenAI chat).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

from gateway.dialects.fields import (
    ANTHROPIC,
    OPENAI,
    DialectName,
    expect_object,
    expect_str,
    require,
)

_EMPTY_SCHEMA: Mapping[str, Any] = {"type": "object", "properties": {}}

# Part types that exist in only one provider's API; anything else passes through as is.
OPENAI_ONLY_PARTS = frozenset({"image_url", "input_audio", "file", "refusal"})
ANTHROPIC_ONLY_PARTS = frozenset(
    {
        "image",
        "document",
        "search_result",
        "container_upload",
        "server_tool_use",
        "web_search_tool_result",
        "web_fetch_tool_result",
        "code_execution_tool_result",
        "mcp_tool_use",
        "mcp_tool_result",
        # a provider's compaction of earlier context (stored and re-sent to Anthropic as is)
        "compaction",
    }
)

# Request fields with no counterpart in the other API: dropped when converting.
_ANTHROPIC_ONLY_PARAMS = frozenset(
    {"thinking", "service_tier", "container", "mcp_servers", "context_management", "metadata"}
)
# Anthropic refuses unknown fields, so OpenAI -> Anthropic keeps only these.
_ANTHROPIC_PARAMS = frozenset(
    {"model", "max_tokens", "temperature", "top_p", "top_k", "stream", "tools"}
)


def tool_dialect(tool: Mapping[str, Any]) -> DialectName:
    """Which dialect a tool schema is written in, by its shape.

    OpenAI wraps the schema: ``{"type": "function", "function": {...}}`` (or ``custom``);
    Anthropic tools are flat (``{name, description, input_schema}`` or a server tool type).
    """
    kind = tool.get("type")
    if kind in ("function", "custom") and isinstance(tool.get(kind), Mapping):
        return OPENAI
    return ANTHROPIC


def to_openai_tools(tools: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Tool schemas in OpenAI chat form; Anthropic server tools (no schema) are dropped."""
    out: list[dict[str, Any]] = []
    for tool in tools:
        if tool_dialect(tool) == OPENAI:
            out.append(dict(tool))
        elif "input_schema" in tool or "type" not in tool or tool.get("type") == "custom":
            fn: dict[str, Any] = {"name": tool.get("name", "")}
            if "description" in tool:
                fn["description"] = tool["description"]
            fn["parameters"] = tool.get("input_schema") or dict(_EMPTY_SCHEMA)
            if "strict" in tool:
                fn["strict"] = tool["strict"]
            out.append({"type": "function", "function": fn})
    return out


def to_anthropic_tools(tools: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Tool schemas in Anthropic form; OpenAI ``custom`` (free-text) tools are dropped."""
    out: list[dict[str, Any]] = []
    for tool in tools:
        if tool_dialect(tool) == ANTHROPIC:
            out.append(dict(tool))
        elif tool.get("type") == "function":
            fn = tool["function"]
            converted: dict[str, Any] = {"name": fn.get("name", "")}
            if "description" in fn:
                converted["description"] = fn["description"]
            converted["input_schema"] = fn.get("parameters") or dict(_EMPTY_SCHEMA)
            out.append(converted)
    return out


def _tool_choice_to_openai(choice: Any) -> Any:
    if not isinstance(choice, Mapping):
        return choice
    kind = choice.get("type")
    if kind == "tool":
        return {"type": "function", "function": {"name": choice.get("name", "")}}
    return {"auto": "auto", "any": "required", "none": "none"}.get(kind, "auto")


def _tool_choice_to_anthropic(choice: Any) -> dict[str, Any]:
    if isinstance(choice, Mapping):
        name = (choice.get("function") or {}).get("name", "")
        return {"type": "tool", "name": name}
    return {"type": {"required": "any", "none": "none"}.get(choice, "auto")}


def params_to_openai(params: Mapping[str, Any]) -> dict[str, Any]:
    """Anthropic Messages request fields as OpenAI chat fields (vLLM accepts top_k)."""
    out = {k: v for k, v in params.items() if k not in _ANTHROPIC_ONLY_PARAMS}
    if "stop_sequences" in out:
        out["stop"] = out.pop("stop_sequences")
    if "tool_choice" in out:
        choice = out.pop("tool_choice")
        if isinstance(choice, Mapping) and choice.get("disable_parallel_tool_use"):
            out["parallel_tool_calls"] = False
        out["tool_choice"] = _tool_choice_to_openai(choice)
    user_id = (params.get("metadata") or {}).get("user_id")
    if isinstance(user_id, str):
        out["user"] = user_id
    if out.get("stream"):
        # Anthropic streams end with usage; OpenAI streams only carry it when asked.
        out["stream_options"] = {"include_usage": True}
    return out


def params_to_anthropic(params: Mapping[str, Any]) -> dict[str, Any]:
    """OpenAI chat request fields as Anthropic Messages fields; fields it lacks are dropped."""
    out = {k: v for k, v in params.items() if k in _ANTHROPIC_PARAMS}
    if "max_tokens" not in out and "max_completion_tokens" in params:
        out["max_tokens"] = params["max_completion_tokens"]
    stop = params.get("stop")
    if stop is not None:
        out["stop_sequences"] = [stop] if isinstance(stop, str) else list(stop)
    if "tool_choice" in params or params.get("parallel_tool_calls") is False:
        choice = _tool_choice_to_anthropic(params.get("tool_choice", "auto"))
        if params.get("parallel_tool_calls") is False:
            choice["disable_parallel_tool_use"] = True
        out["tool_choice"] = choice
    if isinstance(params.get("user"), str):
        out["metadata"] = {"user_id": params["user"]}
    return out


def _placeholder(kind: str, dialect: DialectName) -> dict[str, Any]:
    return {"type": "text", "text": f"[{kind} content omitted: not supported by {dialect}]"}


# Anthropic's part types whose ``source`` ``part_to_openai`` reads.
SOURCED_PARTS = frozenset({"image", "document"})


def check_source(part: Mapping[str, Any], path: str) -> None:
    """A request's image or document part (``SOURCED_PARTS``), whichever dialect sent it:
    its ``source`` as ``part_to_openai`` reads it, an object of string fields."""
    source = expect_object(require(part, "source", path), f"{path}.source")
    for key in ("type", "media_type", "data", "url"):
        if key in source:
            expect_str(source[key], f"{path}.source.{key}")


def part_to_openai(data: Mapping[str, Any]) -> dict[str, Any]:
    """An opaque content part in OpenAI form: Anthropic images become ``image_url``."""
    kind = data.get("type")
    if kind not in ANTHROPIC_ONLY_PARTS:
        return dict(data)
    source = data.get("source") or {}
    if kind == "image" and source.get("type") == "base64":
        url = f"data:{source.get('media_type', 'image/png')};base64,{source.get('data', '')}"
        return {"type": "image_url", "image_url": {"url": url}}
    if kind == "image" and source.get("type") == "url":
        return {"type": "image_url", "image_url": {"url": source.get("url", "")}}
    if kind == "document" and source.get("type") == "text":
        return {"type": "text", "text": source.get("data", "")}
    if kind == "compaction" and isinstance(data.get("content"), str):
        # Anthropic's compaction block holds its summary as text a chat model can read; a
        # Responses compaction item's ``encrypted_content`` is readable by its provider only.
        return {"type": "text", "text": data["content"]}
    return _placeholder(str(kind), OPENAI)


def part_to_anthropic(data: Mapping[str, Any]) -> dict[str, Any]:
    """An opaque content part in Anthropic form: ``image_url`` becomes an image block."""
    kind = data.get("type")
    if kind not in OPENAI_ONLY_PARTS:
        return dict(data)
    if kind == "refusal":
        return {"type": "text", "text": str(data.get("refusal", ""))}
    if kind == "image_url":
        url = str((data.get("image_url") or {}).get("url", ""))
        head, sep, payload = url.partition(";base64,")
        if sep and head.startswith("data:"):
            source = {"type": "base64", "media_type": head[5:], "data": payload}
        else:
            source = {"type": "url", "url": url}
        return {"type": "image", "source": source}
    return _placeholder(str(kind), ANTHROPIC)


def tool_input(arguments: str) -> dict[str, Any]:
    """``tool_use.input`` must be an object; arguments that are not one are kept as text."""
    try:
        value = json.loads(arguments)
    except (ValueError, RecursionError):  # a string of 100,000 "[" is valid JSON text
        value = None
    return value if isinstance(value, dict) else {"_raw_arguments": arguments}
