"""The reply side every dialect shares: the upstream's ``chat.completion.chunk`` stream
assembled into one reply, and server-sent-event framing.

Every reply is read from a vLLM replica as a stream of OpenAI chat chunks; each dialect
writes that stream back in its own shape (``gateway.dialects.base.Dialect``).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from gateway.dialects.errors import DialectError

_THINKING_FIELDS = ("reasoning_content", "reasoning")


def upstream_error(message: str) -> DialectError:
    """A reply the upstream sent that cannot be written back (HTTP 502)."""
    return DialectError(message, status=502, kind="api_error")


def first_choice(chunk: Mapping[str, Any]) -> Iterator[tuple[Mapping[str, Any], Mapping[str, Any]]]:
    """The chunk's entries for choice 0, each with its delta: the gateway keeps, restores and
    accounts the first choice only."""
    for choice in chunk.get("choices") or ():
        if choice.get("index", 0) == 0:
            yield choice, choice.get("delta") or {}


def thinking_field(message: Mapping[str, Any]) -> str:
    """The field carrying thinking: vLLM has sent ``reasoning_content``, ``reasoning`` or
    both with the same text, so the first one present wins."""
    return next((n for n in _THINKING_FIELDS if isinstance(message.get(n), str)), "")


def thinking_text(message: Mapping[str, Any]) -> str | None:
    name = thinking_field(message)
    return message[name] if name else None


@dataclass(frozen=True)
class CallDelta:
    """One streamed tool-call delta, as a reply writer needs it."""

    key: str  # "call:<index>": the block or item the call is written in
    starts: bool  # its first delta: the writer opens the call's block or item
    id: str
    name: str
    arguments: str


def call_delta(call: Mapping[str, Any], open_key: str | None, begun: set[int]) -> CallDelta:
    """A tool-call delta read against the block the writer has open (``open_key``) and the
    calls already begun (``begun``, updated). Calls stream one after another, as vLLM and
    OpenAI send them; a call that resumes after another block began cannot be written as
    one block and is refused (502)."""
    index = int(call.get("index", 0))
    fn = call.get("function") or {}
    key = f"call:{index}"
    starts = open_key != key
    if starts:
        if index in begun:
            raise upstream_error(f"tool call {index} resumed after another block started")
        begun.add(index)
    return CallDelta(
        key, starts, call.get("id") or "", fn.get("name") or "", fn.get("arguments") or ""
    )


class ChunkAccumulator:
    """Assembles streamed ``chat.completion.chunk`` dicts (first choice) into one reply."""

    def __init__(self) -> None:
        self.content: list[str] = []
        self.thinking: list[str] = []
        self.thinking_field = ""  # the field the first thinking delta came in
        self.calls: dict[int, dict[str, Any]] = {}
        self.finish_reason: str | None = None
        self.matched_stop: Any = None
        self.usage: Mapping[str, Any] | None = None
        self.id = ""
        self.model = ""

    def feed(self, chunk: Mapping[str, Any]) -> None:
        self.id = self.id or str(chunk.get("id") or "")
        self.model = self.model or str(chunk.get("model") or "")
        if chunk.get("usage"):
            self.usage = chunk["usage"]
        for choice, delta in first_choice(chunk):
            thinking = thinking_text(delta)
            if thinking is not None:
                if not self.thinking:
                    self.thinking_field = thinking_field(delta)
                self.thinking.append(thinking)
            if isinstance(delta.get("content"), str):
                self.content.append(delta["content"])
            for call in delta.get("tool_calls") or ():
                slot = self.calls.setdefault(
                    call.get("index", 0), {"id": "", "name": "", "arguments": []}
                )
                fn = call.get("function") or {}
                slot["id"] = slot["id"] or call.get("id") or ""
                slot["name"] += fn.get("name") or ""
                slot["arguments"].append(fn.get("arguments") or "")
            if choice.get("finish_reason"):
                self.finish_reason = choice["finish_reason"]
                self.matched_stop = choice.get("stop_reason")

    def message(self) -> dict[str, Any]:
        """The reply as a chat completion's assistant message dict."""
        out: dict[str, Any] = {"role": "assistant", "content": "".join(self.content) or None}
        if self.thinking:
            out[self.thinking_field] = "".join(self.thinking)
        if self.calls:
            out["tool_calls"] = [
                {
                    "id": slot["id"],
                    "type": "function",
                    "function": {"name": slot["name"], "arguments": "".join(slot["arguments"])},
                }
                for _, slot in sorted(self.calls.items())
            ]
        return out

    def completion(self) -> dict[str, Any]:
        """The whole reply as a non-streaming ``chat.completion``."""
        return {
            "id": self.id,
            "object": "chat.completion",
            "created": int(time.time()),
            "model": self.model,
            "choices": [
                {
                    "index": 0,
                    "message": self.message(),
                    "finish_reason": self.finish_reason,
                    "stop_reason": self.matched_stop,
                }
            ],
            "usage": dict(self.usage or {}),
        }


def format_sse(event: str | None, data: Mapping[str, Any] | str) -> bytes:
    """One server-sent-events frame; ``event`` None for OpenAI-style data-only frames."""
    head = f"event: {event}\n".encode() if event else b""
    if isinstance(data, str):
        return b"%sdata: %s\n\n" % (head, data.encode())
    return b"%sdata: %s\n\n" % (head, _json(data))


def _json(data: Mapping[str, Any]) -> bytes:
    """Compact JSON (UTF-8, not \\u-escaped: the same document). orjson takes a tenth of the
    json module's time per frame; what it refuses (integers past 64 bits, keys that are
    not strings) the json module writes."""
    try:
        return orjson.dumps(data)
    except TypeError:
        return json.dumps(data, separators=(",", ":")).encode()
