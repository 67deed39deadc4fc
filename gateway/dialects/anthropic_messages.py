"""Anthropic Messages (``POST /v1/messages``): the dialect, and request bodies <-> the neutral
transcript (decoding in ``anthropic_decode``, encoding here; replies in
``anthropic_replies``).

Mapping: the top-level ``system`` becomes a leading ``system`` message; ``tool_use`` blocks
become ToolCalls (``arguments`` = the JSON text of ``input``); the ``tool_result`` blocks of
a user message become ``tool`` messages placed first, followed by one ``user`` message with
the message's other blocks; ``thinking`` / ``redacted_thinking`` become Thinking parts;
images, documents and unknown block types stay Opaque.

``encode_request(decode_request(body)) == body`` for every body this module accepts; the
hints it needs live under ``meta["anthropic"]``:

- ``content``: "str" / "list" / "absent", only when it differs from the default (one plain
  text part -> string);
- ``fields`` (unknown block fields: ``cache_control``, ``citations``, ...) and
  ``message_fields`` (unknown message fields);
- on the first message of a split user message: ``group`` (how many neutral messages it
  became) and ``order`` (the original interleaving of tool results ``t`` and other blocks
  ``u``, when it was not all results first);
- ``redacted``: the ``data`` of a redacted_thinking block; ``has_is_error``: an explicit
  ``is_error: false``.

Re-serialising ``input`` needs no hint: ``json.loads(json.dumps(x)) == x`` for any parsed
JSON value. A transcript from another dialect encodes to a valid body: leading system
messages join the top-level ``system``, later ones become user turns, consecutive tool
results and the user message after them share one user message, empty text parts and
unsigned thinking (which Anthropic refuses) are left out, tools and parameters converted.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from typing import Any

from gateway.dialects.anthropic_context import CONTEXT_MANAGEMENT, context_management_body
from gateway.dialects.anthropic_decode import decode_envelope, decode_item
from gateway.dialects.anthropic_replies import AnthropicStreamTranslator, to_anthropic_response
from gateway.dialects.base import Chunks, Dialect, Exchange
from gateway.dialects.chunks import ChunkAccumulator, format_sse
from gateway.dialects.convert import (
    params_to_anthropic,
    part_to_anthropic,
    to_anthropic_tools,
    tool_input,
)
from gateway.dialects.errors import ERROR_KINDS, DialectError, ErrorKind, mid_stream_error
from gateway.dialects.fields import ANTHROPIC, DIALECT_PARAM, OPENAI, DialectName, hints
from gateway.transcript import Message, Opaque, Part, Text, ToolCall, Transcript

_ABSENT = object()
# Anthropic's error type for each kind: the kinds are named as Anthropic names its types.
ANTHROPIC_ERROR_TYPES: Mapping[ErrorKind, str] = {kind: kind for kind in ERROR_KINDS}


def decode_request(body: Any) -> Transcript:
    """Parse a Messages request body; raises DialectError naming the bad field."""
    return ANTHROPIC_MESSAGES.decode(body)


def _is_plain(part: Part) -> bool:
    return isinstance(part, Text) and not hints(part.meta, ANTHROPIC)


def encode_request(t: Transcript) -> dict[str, Any]:
    """A Messages body; parameters and tools from another dialect are converted."""
    params = dict(t.params)
    source: DialectName = params.pop(DIALECT_PARAM, ANTHROPIC)
    if source == OPENAI:
        params = params_to_anthropic(params)
    lead = 0
    while lead < len(t.messages) and t.messages[lead].role == "system":
        lead += 1
    if lead == len(t.messages):
        raise DialectError(
            "Anthropic Messages needs a message after the system prompt", param="messages"
        )
    body: dict[str, Any] = dict(params)
    if lead:
        body["system"] = _encode_system(t.messages[:lead], source)
    body["messages"] = encode_messages(t.messages[lead:], source=source)
    if t.tools:
        body["tools"] = to_anthropic_tools(t.tools)
    return body


def _encode_system(messages: Sequence[Message], source: DialectName) -> Any:
    if len(messages) == 1:
        m = messages[0]
        return _encode_content(m.parts, hints(m.meta, ANTHROPIC).get("content"), source)
    return [b for m in messages for b in _encode_blocks(m.parts, source)]


def encode_messages(
    messages: Sequence[Message], *, source: DialectName = ANTHROPIC
) -> list[dict[str, Any]]:
    """Neutral messages (no leading system prompt) as Messages API messages.

    ``source`` is the dialect the messages were decoded from; for another one, parts that
    Anthropic refuses (empty text, unsigned thinking) are left out. Tool results are grouped
    into user messages as they were sent (``group`` hint), else with the user message that
    follows them; a system message here stays a system turn if it was one in an Anthropic
    request (Claude Code sends them), else becomes a user turn.
    """
    out: list[dict[str, Any]] = []
    i = 0
    while i < len(messages):
        m = messages[i]
        if m.role != "tool":
            h = hints(m.meta, ANTHROPIC)
            role = "user" if m.role == "system" and not h.get("turn") else m.role
            content = _encode_content(m.parts, h.get("content"), source)
            out.append({**h.get("message_fields", {}), "role": role, "content": content})
            i += 1
            continue
        h = hints(m.meta, ANTHROPIC)
        size = h.get("group")
        end = i
        while (
            end < len(messages)
            and messages[end].role == "tool"
            and (size is None or end - i < size)
        ):
            end += 1
        user = None
        if (
            end < len(messages)
            and messages[end].role == "user"
            and (size is None or end - i < size)
        ):
            user = messages[end]
        out.append(_encode_group(messages[i:end], user, h, source))
        i = end + (user is not None)
    return out


def _encode_group(
    results: Sequence[Message], user: Message | None, h: Mapping[str, Any], source: DialectName
) -> dict[str, Any]:
    encoded = [_encode_tool_result(m, source) for m in results]
    others = _encode_blocks(user.parts, source) if user is not None else []
    order = h.get("order")
    if order and order.count("t") == len(encoded) and order.count("u") == len(others):
        queues = {"t": iter(encoded), "u": iter(others)}
        blocks = [next(queues[c]) for c in order]
    else:
        blocks = [*encoded, *others]
    return {**h.get("message_fields", {}), "role": "user", "content": blocks}


def _encode_tool_result(m: Message, source: DialectName) -> dict[str, Any]:
    h = hints(m.meta, ANTHROPIC)
    block: dict[str, Any] = {
        **h.get("fields", {}),
        "type": "tool_result",
        "tool_use_id": m.tool_call_id,
    }
    content = _encode_content(m.parts, h.get("content"), source)
    if content is not _ABSENT:
        block["content"] = content
    if m.is_error or h.get("has_is_error"):
        block["is_error"] = m.is_error
    return block


def _encode_content(parts: Sequence[Part], form: str | None, source: DialectName) -> Any:
    # A hint only applies while it still fits the parts (a renderer may have changed them).
    if form == "absent" and not parts:
        return _ABSENT
    only = parts[0] if len(parts) == 1 else None
    # One plain text part is a string; from another dialect only when non-empty, since
    # Anthropic refuses empty text.
    if (
        form != "list"
        and isinstance(only, Text)
        and _is_plain(only)
        and (only.text or source == ANTHROPIC)
    ):
        return only.text
    return _encode_blocks(parts, source)


def _encode_blocks(parts: Iterable[Part], source: DialectName) -> list[dict[str, Any]]:
    native = source == ANTHROPIC
    blocks: list[dict[str, Any]] = []
    for part in parts:
        if isinstance(part, Opaque):
            blocks.append(part_to_anthropic(part.data))
            continue
        h = hints(part.meta, ANTHROPIC)
        fields = h.get("fields", {})
        if isinstance(part, Text):
            if native or part.text:
                blocks.append({**fields, "type": "text", "text": part.text})
        elif isinstance(part, ToolCall):
            blocks.append(
                {
                    **fields,
                    "type": "tool_use",
                    "id": part.id,
                    "name": part.name,
                    "input": tool_input(part.arguments),
                }
            )
        elif "redacted" in h:
            blocks.append({**fields, "type": "redacted_thinking", "data": h["redacted"]})
        elif native or part.signature is not None:
            block = {**fields, "type": "thinking", "thinking": part.text}
            if part.signature is not None:
                block["signature"] = part.signature
            blocks.append(block)
    return blocks


class AnthropicMessages(Dialect):
    """Anthropic Messages (``POST /v1/messages``): chunks become Messages events."""

    name = ANTHROPIC
    items_field = "messages"
    path = "/v1/messages"

    def decode_envelope(self, body: Any) -> tuple[Transcript, list[Any]]:
        return decode_envelope(body)

    def decode_item(self, raw: Any, index: int, issued: set[str]) -> tuple[Message, ...]:
        return decode_item(raw, index, issued)

    async def stream(self, chunks: Chunks, exchange: Exchange) -> AsyncIterator[bytes]:
        translator = AnthropicStreamTranslator()
        try:
            async for chunk in chunks:
                for event, data in translator.feed(chunk):
                    yield format_sse(event, data)
        except Exception as exc:  # the status line is sent: the stream must still end well
            err = mid_stream_error(exc)
            yield format_sse("error", self.error_body(err))
            return
        for event, data in translator.finish():
            if event == "message_delta" and exchange.context_edits is not None:
                # Anthropic reports the applied edits on the final message_delta.
                data = {**data, CONTEXT_MANAGEMENT: context_management_body(exchange.context_edits)}
            yield format_sse(event, data)

    async def response(self, chunks: Chunks, exchange: Exchange) -> dict[str, Any]:
        acc = ChunkAccumulator()
        async for chunk in chunks:
            acc.feed(chunk)
        body = to_anthropic_response(acc.completion())
        if exchange.context_edits is not None:
            body[CONTEXT_MANAGEMENT] = context_management_body(exchange.context_edits)
        return body

    def error_body(self, err: DialectError) -> dict[str, Any]:
        return anthropic_error_body(err)


def anthropic_error_body(err: DialectError) -> dict[str, Any]:
    """Anthropic's error shape: ``{"type": "error", "error": {"type", "message"}}``."""
    return {
        "type": "error",
        "error": {"type": ANTHROPIC_ERROR_TYPES[err.kind], "message": str(err)},
    }


ANTHROPIC_MESSAGES = AnthropicMessages()
