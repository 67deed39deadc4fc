"""Anthropic Messages replies: vLLM's OpenAI chat completions as Messages responses,
streamed or not.

- ``to_anthropic_response``: a non-streaming chat completion -> a Messages response.
- ``AnthropicStreamTranslator``: fed parsed chunks, yields Anthropic SSE events as
  ``(event_name, data)`` tuples (``chunks.format_sse`` writes one frame).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gateway.dialects.chunks import (
    ChunkAccumulator,
    call_delta,
    first_choice,
    thinking_text,
    upstream_error,
)
from gateway.dialects.convert import tool_input
from gateway.dialects.openai_chat import decode_reply
from gateway.transcript import Message

Event = tuple[str, dict[str, Any]]

STOP_REASONS: Mapping[str, str] = {
    "stop": "end_turn",
    "length": "max_tokens",
    "tool_calls": "tool_use",
    "function_call": "tool_use",
    "content_filter": "refusal",
}


def anthropic_usage(usage: Mapping[str, Any] | None) -> dict[str, int]:
    """OpenAI usage as Anthropic usage: ``input_tokens`` there excludes cache reads."""
    usage = usage or {}
    prompt = int(usage.get("prompt_tokens") or 0)
    cached = int((usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0)
    return {
        "input_tokens": prompt - cached,
        "output_tokens": int(usage.get("completion_tokens") or 0),
        "cache_read_input_tokens": cached,
        "cache_creation_input_tokens": 0,
    }


def stop_reason(finish_reason: str | None, matched_stop: Any = None) -> tuple[str | None, Any]:
    """``(stop_reason, stop_sequence)`` for an OpenAI finish_reason.

    vLLM reports the stop string that ended generation in the choice's ``stop_reason``; a
    string there means a stop sequence, which Anthropic reports as such.
    """
    if finish_reason == "stop" and isinstance(matched_stop, str):
        return "stop_sequence", matched_stop
    if finish_reason is None:
        return None, None
    return STOP_REASONS.get(finish_reason, "end_turn"), None


def _first_choice(response: Mapping[str, Any]) -> Mapping[str, Any]:
    choices = response.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], Mapping):
        raise upstream_error("upstream response has no choices")
    return choices[0]


def to_anthropic_response(response: Mapping[str, Any]) -> dict[str, Any]:
    """A non-streaming chat completion as an Anthropic Messages response."""
    choice = _first_choice(response)
    message = choice.get("message")
    if not isinstance(message, Mapping):
        raise upstream_error("upstream choice has no message")
    content: list[dict[str, Any]] = []
    thinking = thinking_text(message)
    if thinking:
        # vLLM does not sign thinking; an empty signature keeps the block well-formed.
        content.append({"type": "thinking", "thinking": thinking, "signature": ""})
    if message.get("content"):
        content.append({"type": "text", "text": message["content"]})
    for call in message.get("tool_calls") or ():
        fn = call.get("function") or {}
        content.append(
            {
                "type": "tool_use",
                "id": call.get("id", ""),
                "name": fn.get("name", ""),
                "input": tool_input(fn.get("arguments") or "{}"),
            }
        )
    reason, sequence = stop_reason(choice.get("finish_reason"), choice.get("stop_reason"))
    return {
        "id": response.get("id", ""),
        "type": "message",
        "role": "assistant",
        "model": response.get("model", ""),
        "content": content,
        "stop_reason": reason,
        "stop_sequence": sequence,
        "usage": anthropic_usage(response.get("usage")),
    }


class AnthropicStreamTranslator:
    """Turns a vLLM chat completion stream into an Anthropic Messages event stream.

    Call ``feed`` with each parsed chunk and ``finish`` once the upstream sent ``[DONE]``
    (usage arrives after the finish_reason, so ``message_delta`` waits for the end).
    Tool calls must arrive one after another, as vLLM and OpenAI send them.
    """

    def __init__(self, model: str | None = None, message_id: str | None = None) -> None:
        self.accumulator = ChunkAccumulator()
        self._model = model
        self._message_id = message_id
        self._started = False
        self._done = False
        self._open: str | None = None  # "text", "thinking" or "call:<index>"
        self._next_index = 0
        self._calls_begun: set[int] = set()

    def feed(self, chunk: Mapping[str, Any]) -> list[Event]:
        if self._done:
            raise upstream_error("chunk after the end of the stream")
        self.accumulator.feed(chunk)
        events = self._start(chunk)
        for choice, delta in first_choice(chunk):
            thinking = thinking_text(delta)
            if thinking:
                delta_event = {"type": "thinking_delta", "thinking": thinking}
                events += self._delta("thinking", delta_event)
            if delta.get("content"):
                events += self._delta("text", {"type": "text_delta", "text": delta["content"]})
            for call in delta.get("tool_calls") or ():
                events += self._tool_delta(call)
            if choice.get("finish_reason"):
                events += self._close()
        return events

    def finish(self) -> list[Event]:
        if self._done:
            return []
        self._done = True
        acc = self.accumulator
        events = self._start({}) + self._close()
        reason, sequence = stop_reason(acc.finish_reason, acc.matched_stop)
        events.append(
            (
                "message_delta",
                {
                    "type": "message_delta",
                    "delta": {"stop_reason": reason or "end_turn", "stop_sequence": sequence},
                    "usage": anthropic_usage(acc.usage),
                },
            )
        )
        events.append(("message_stop", {"type": "message_stop"}))
        return events

    def reply(self) -> Message:
        """What the model answered, as a neutral assistant message (for the history)."""
        return decode_reply(self.accumulator.message())

    def _start(self, chunk: Mapping[str, Any]) -> list[Event]:
        if self._started:
            return []
        self._started = True
        message = {
            "id": self._message_id or str(chunk.get("id") or ""),
            "type": "message",
            "role": "assistant",
            "model": self._model or str(chunk.get("model") or ""),
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": anthropic_usage(None),
        }
        return [("message_start", {"type": "message_start", "message": message})]

    def _open_block(self, kind: str, block: dict[str, Any]) -> list[Event]:
        events = self._close()
        self._open = kind
        data = {"type": "content_block_start", "index": self._next_index, "content_block": block}
        return [*events, ("content_block_start", data)]

    def _close(self) -> list[Event]:
        if self._open is None:
            return []
        self._open = None
        index = self._next_index
        self._next_index += 1
        return [("content_block_stop", {"type": "content_block_stop", "index": index})]

    def _delta(self, kind: str, delta: dict[str, Any]) -> list[Event]:
        events: list[Event] = []
        if self._open != kind:
            empty: dict[str, Any] = (
                {"type": "text", "text": ""}
                if kind == "text"
                else {"type": "thinking", "thinking": "", "signature": ""}
            )
            events = self._open_block(kind, empty)
        data = {"type": "content_block_delta", "index": self._next_index, "delta": delta}
        return [*events, ("content_block_delta", data)]

    def _tool_delta(self, call: Mapping[str, Any]) -> list[Event]:
        delta = call_delta(call, self._open, self._calls_begun)
        events: list[Event] = []
        if delta.starts:
            block = {"type": "tool_use", "id": delta.id, "name": delta.name, "input": {}}
            events = self._open_block(delta.key, block)
        if delta.arguments:
            json_delta = {"type": "input_json_delta", "partial_json": delta.arguments}
            data = {"type": "content_block_delta", "index": self._next_index, "delta": json_delta}
            events.append(("content_block_delta", data))
        return events
