"""OpenAI Chat Completions request bodies <-> the neutral transcript.

``encode_request(decode_request(body)) == body`` for every body this module accepts: what
the neutral model does not hold is kept under ``meta["openai"]`` (see ``fields``):

- message ``content`` written as a string, a part list, ``null`` or left out (only noted
  when it differs from the default: one plain text part -> string);
- ``role: developer`` (decoded as ``system``), unknown message / part / tool-call fields;
- which field (``reasoning_content`` or ``reasoning``) carried an assistant's thinking.

Legacy function calling (``role: function``, a non-null ``function_call``) is rejected with
a DialectError: no current harness sends it, and it has no tool-call id to pair results by.

A transcript decoded from Anthropic Messages encodes to a valid chat body: system first,
tool results as ``role: tool`` messages, tool schemas and parameters converted, thinking
in ``reasoning`` (the field vLLM reads), images as ``image_url`` parts.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from typing import Any

from gateway.dialects.base import Chunks, Dialect, Exchange
from gateway.dialects.chunks import ChunkAccumulator, format_sse
from gateway.dialects.convert import (
    SOURCED_PARTS,
    check_source,
    params_to_openai,
    part_to_openai,
    to_openai_tools,
)
from gateway.dialects.errors import ERROR_KINDS, DialectError, ErrorKind, mid_stream_error
from gateway.dialects.fields import (
    ANTHROPIC,
    DIALECT_PARAM,
    OPENAI,
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
    string_or_strings,
    take_tools,
)
from gateway.transcript import Message, Opaque, Part, Role, Text, Thinking, ToolCall, Transcript

_ROLES: Mapping[str, Role] = {
    "system": "system",
    "developer": "system",
    "user": "user",
    "assistant": "assistant",
    "tool": "tool",
}
_THINKING_FIELDS = ("reasoning_content", "reasoning")
# vLLM reads (and its /tokenize keeps) ``reasoning``; used for thinking from other dialects.
_DEFAULT_THINKING_FIELD = "reasoning"
_ABSENT = object()
# The request fields the gateway reads or converts, and the sampling fields whose meaning
# it forwards: wrong types are refused here, before anything is stored (``"false"`` is not
# false, ``"8"`` not 8). Ranges are OpenAI's.
_FIELD_CHECKS = {
    "stream": expect_bool,
    "stream_options": expect_object,
    "max_tokens": integer(1),
    "max_completion_tokens": integer(1),
    "n": integer(1, 1),  # one choice: the gateway keeps, restores and accounts choice 0
    "temperature": number(0, 2),
    "top_p": number(0, 1),
    "presence_penalty": number(-2, 2),
    "frequency_penalty": number(-2, 2),
    "seed": integer(-(2**63), 2**63 - 1),
    "logprobs": expect_bool,
    "top_logprobs": integer(0, 20),
    "parallel_tool_calls": expect_bool,
    "stop": string_or_strings,
    "user": expect_str,
    "prompt_cache_key": expect_str,
    "metadata": expect_object,
}

ContentPart = Text | Opaque

# The error type OpenAI-shaped bodies (chat and Responses) name each kind with: the kinds'
# own names (Anthropic's), as this gateway has always answered. OpenAI clients act on the
# status and ``code``; a type to spell OpenAI's way is one entry here, for both dialects.
OPENAI_ERROR_TYPES: Mapping[ErrorKind, str] = {kind: kind for kind in ERROR_KINDS}


def decode_request(body: Any) -> Transcript:
    """Parse a Chat Completions request body; raises DialectError naming the bad field."""
    return OPENAI_CHAT.decode(body)


def decode_envelope(body: Any) -> tuple[Transcript, list[Any]]:
    """Every check and field of the body but its messages: a transcript with no messages
    (tools, params) and the raw message list, to decode one by one with ``decode_item``."""
    body = check_request_body(body)
    expect_str(require(body, "model", ""), "model")
    check_fields(body, _FIELD_CHECKS)
    messages = expect_list(require(body, "messages", ""), "messages")
    if not messages:
        raise DialectError("must contain at least one message", param="messages")
    params = {k: v for k, v in body.items() if k != "messages"}
    tools = take_tools(body, params)
    params[DIALECT_PARAM] = OPENAI
    return Transcript(messages=(), tools=tools, params=params), messages


def decode_item(raw: Any, index: int, issued: set[str]) -> tuple[Message, ...]:
    """``messages[index]`` of a request, given the call ids the earlier ones issued.

    Depends on nothing else, so an unchanged message at the same index decodes the same.
    """
    return (decode_message(raw, f"messages[{index}]", issued),)


def decode_message(raw: Any, path: str = "message", issued: set[str] | None = None) -> Message:
    """One chat message. With ``issued`` (the call ids seen so far) tool results are checked
    against it and the assistant's new call ids are added to it."""
    msg = expect_object(raw, path)
    role_name = expect_str(require(msg, "role", path), f"{path}.role")
    if role_name == "function" or msg.get("function_call") is not None:
        raise DialectError(
            "legacy function calling is not supported; use tools, tool_calls and role 'tool'",
            param=f"{path}.role" if role_name == "function" else f"{path}.function_call",
        )
    if role_name not in _ROLES:
        raise DialectError(
            f"unknown role {role_name!r}; expected one of {', '.join(_ROLES)}",
            param=f"{path}.role",
        )
    role = _ROLES[role_name]
    known = {"role", "content"}
    parts: list[Part] = []
    tool_calls_hint = None
    if role == "assistant":
        for name in _THINKING_FIELDS:
            if isinstance(msg.get(name), str):
                parts.append(Thinking(msg[name], meta=make_meta(OPENAI, field=name)))
                known.add(name)
                break
    content, form = _decode_content(msg, role, path)
    parts.extend(content)
    if "tool_calls" in msg:
        known.add("tool_calls")
        tool_calls_hint, calls = _decode_tool_calls(msg["tool_calls"], role, f"{path}.tool_calls")
        parts.extend(calls)
        if issued is not None:
            issued.update(c.id for c in calls)
    call_id = None
    if role == "tool":
        known.add("tool_call_id")
        call_id = answered_call(msg, "tool_call_id", path, issued, "assistant tool call")
    meta = make_meta(
        OPENAI,
        role="developer" if role_name == "developer" else None,
        content=form if form != _default_form(role, content) else None,
        tool_calls=tool_calls_hint,
        fields=extra_fields(msg, frozenset(known)),
    )
    return Message(role=role, parts=tuple(parts), tool_call_id=call_id, meta=meta)


def decode_reply(message: Mapping[str, Any]) -> Message:
    """The assistant message of a (non-streaming) chat completion, as a neutral Message."""
    decoded = decode_message(dict(message), "choices[0].message")
    if decoded.role != "assistant":
        raise DialectError("a reply must be an assistant message", param="choices[0].message.role")
    return decoded


def _decode_content(msg: Mapping[str, Any], role: Role, path: str) -> tuple[list[ContentPart], str]:
    if "content" not in msg or msg["content"] is None:
        if role != "assistant":
            raise DialectError(f"a {role} message needs content", param=f"{path}.content")
        return [], "absent" if "content" not in msg else "null"
    content = msg["content"]
    if isinstance(content, str):
        return [Text(content)], "str"
    if isinstance(content, list):
        return [_decode_part(p, f"{path}.content[{j}]") for j, p in enumerate(content)], "list"
    raise DialectError(
        "content must be a string, an array of parts or null", param=f"{path}.content"
    )


def _decode_part(raw: Any, path: str) -> ContentPart:
    part = expect_object(raw, path)
    kind = expect_str(require(part, "type", path), f"{path}.type")
    if kind in SOURCED_PARTS:  # an Anthropic part, converted upstream
        check_source(part, path)
    if kind != "text":
        return Opaque(dict(part))
    text = expect_str(require(part, "text", path), f"{path}.text")
    return Text(text, make_meta(OPENAI, fields=extra_fields(part, frozenset({"type", "text"}))))


def _decode_tool_calls(raw: Any, role: Role, path: str) -> tuple[str | None, list[ToolCall]]:
    if role != "assistant":
        raise DialectError("only assistant messages carry tool_calls", param=path)
    if raw is None:
        return "null", []
    listed = expect_list(raw, path)
    return ("empty" if not listed else None), [
        _decode_tool_call(c, f"{path}[{i}]") for i, c in enumerate(listed)
    ]


def _decode_tool_call(raw: Any, path: str) -> ToolCall:
    call = expect_object(raw, path)
    call_id = expect_str(require(call, "id", path), f"{path}.id")
    if "type" in call and call["type"] != "function":
        raise DialectError(
            f"unsupported tool call type {call['type']!r}; expected 'function'",
            param=f"{path}.type",
        )
    fn = expect_object(require(call, "function", path), f"{path}.function")
    name = expect_str(require(fn, "name", f"{path}.function"), f"{path}.function.name")
    args = expect_str(require(fn, "arguments", f"{path}.function"), f"{path}.function.arguments")
    meta = make_meta(
        OPENAI,
        untyped=True if "type" not in call else None,
        fields=extra_fields(call, frozenset({"id", "type", "function"})),
        function_fields=extra_fields(fn, frozenset({"name", "arguments"})),
    )
    return ToolCall(call_id, name, args, meta)


def encode_request(
    t: Transcript, encode: Callable[[Message], dict[str, Any]] | None = None
) -> dict[str, Any]:
    """A Chat Completions body; parameters and tools from another dialect are converted.

    ``encode``: a stand-in for ``encode_message`` giving the same dicts (a memo of it).
    """
    params = dict(t.params)
    if params.pop(DIALECT_PARAM, OPENAI) == ANTHROPIC:
        params = params_to_openai(params)
    encode = encode or encode_message
    body: dict[str, Any] = {**params, "messages": [encode(m) for m in t.messages]}
    if t.tools:
        body["tools"] = to_openai_tools(t.tools)
    return body


def encode_messages(messages: Iterable[Message]) -> list[dict[str, Any]]:
    """Neutral messages as chat messages (what the gateway sends a vLLM upstream).

    Thinking and tool calls on non-assistant messages have no chat form and are left out.
    """
    return [encode_message(m) for m in messages]


def encode_message(m: Message) -> dict[str, Any]:
    h = hints(m.meta, OPENAI)
    role = "developer" if m.role == "system" and h.get("role") == "developer" else m.role
    out: dict[str, Any] = {**h.get("fields", {}), "role": role}
    if m.role == "assistant":
        out.update(_encode_thinking([p for p in m.parts if isinstance(p, Thinking)]))
    content_parts = [p for p in m.parts if isinstance(p, Text | Opaque)]
    content = _encode_content(m.role, content_parts, h.get("content"))
    if m.is_error:  # chat has no error flag on tool results (only other dialects set it)
        content = _mark_error(content)
    if content is not _ABSENT:
        out["content"] = content
    if m.role == "assistant":
        calls = m.tool_calls
        if calls:
            out["tool_calls"] = [_encode_tool_call(c) for c in calls]
        elif h.get("tool_calls") in ("null", "empty"):
            out["tool_calls"] = None if h["tool_calls"] == "null" else []
    if m.role == "tool":
        out["tool_call_id"] = m.tool_call_id
    return out


def _encode_thinking(parts: Sequence[Thinking]) -> dict[str, str]:
    if len(parts) == 1 and "field" in hints(parts[0].meta, OPENAI):
        return {hints(parts[0].meta, OPENAI)["field"]: parts[0].text}
    texts = [p.text for p in parts if p.text]
    return {_DEFAULT_THINKING_FIELD: "\n\n".join(texts)} if texts else {}


def _is_plain(part: ContentPart) -> bool:
    return isinstance(part, Text) and not hints(part.meta, OPENAI)


def _default_form(role: Role, parts: Sequence[ContentPart]) -> str:
    """The content form the parts' shape suggests; decoding notes only other forms.

    The shape ignores part hints, so that dropping a volatile marker (``volatile``) leaves
    the message's hints as they were.
    """
    if not parts:
        return "null" if role == "assistant" else "str"
    return "str" if len(parts) == 1 and isinstance(parts[0], Text) else "list"


def _encode_content(role: Role, parts: Sequence[ContentPart], form: str | None) -> Any:
    # A hint only applies while it still fits the parts (a renderer may have changed them).
    fits = {
        "absent": not parts,
        "null": not parts,
        "str": not parts or (len(parts) == 1 and _is_plain(parts[0])),
        "list": True,
    }
    if not fits.get(form or "", False):
        form = _default_form(role, parts)
        form = form if fits[form] else "list"
    if form == "absent":
        return _ABSENT
    if form == "null":
        return None
    if form == "str":
        return "".join(p.text for p in parts if isinstance(p, Text))  # one part or none
    return [_encode_part(p) for p in parts]


def _encode_part(part: ContentPart) -> dict[str, Any]:
    if isinstance(part, Opaque):
        return part_to_openai(part.data)
    return {**hints(part.meta, OPENAI).get("fields", {}), "type": "text", "text": part.text}


def _mark_error(content: Any) -> Any:
    if isinstance(content, list):
        return [{"type": "text", "text": "Error:"}, *content]
    return f"Error: {content}" if content else "Error"


def _encode_tool_call(call: ToolCall) -> dict[str, Any]:
    h = hints(call.meta, OPENAI)
    out: dict[str, Any] = {**h.get("fields", {}), "id": call.id}
    if not h.get("untyped"):
        out["type"] = "function"
    out["function"] = {
        **h.get("function_fields", {}),
        "name": call.name,
        "arguments": call.arguments,
    }
    return out


class OpenAIChat(Dialect):
    """OpenAI Chat Completions (``POST /v1/chat/completions``): the upstream's own chunks
    pass through as they are."""

    name = OPENAI
    items_field = "messages"
    path = "/v1/chat/completions"

    def decode_envelope(self, body: Any) -> tuple[Transcript, list[Any]]:
        return decode_envelope(body)

    def decode_item(self, raw: Any, index: int, issued: set[str]) -> tuple[Message, ...]:
        return decode_item(raw, index, issued)

    async def stream(self, chunks: Chunks, exchange: Exchange) -> AsyncIterator[bytes]:
        try:
            async for chunk in chunks:
                yield format_sse(None, chunk)
        except Exception as exc:  # the status line is sent: the stream must still end well
            err = mid_stream_error(exc)
            yield format_sse(None, self.error_body(err))
            return
        yield format_sse(None, "[DONE]")

    async def response(self, chunks: Chunks, exchange: Exchange) -> dict[str, Any]:
        acc = ChunkAccumulator()
        async for chunk in chunks:
            acc.feed(chunk)
        return acc.completion()

    def error_body(self, err: DialectError) -> dict[str, Any]:
        return openai_error_body(err)


def openai_error_body(err: DialectError) -> dict[str, Any]:
    """OpenAI's error shape: ``{"error": {"message", "type", "param", "code"}}``."""
    return {
        "error": {
            "message": str(err),
            "type": OPENAI_ERROR_TYPES[err.kind],
            "param": err.param,
            "code": err.code,
        }
    }


OPENAI_CHAT = OpenAIChat()
