"""The chat chunk stream as OpenAI Responses events (``openai_responses``).

Events come in the API's order (``response.created``, ``response.in_progress``, per item
``response.output_item.added``, ``response.content_part.added``, deltas, their ``.done``
events, ``response.output_item.done`` with the whole item); the caller ends the stream with
exactly one of ``terminal`` (``response.completed``) or ``failed`` (``response.failed``).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Mapping
from typing import Any

from gateway.dialects.chunks import ChunkAccumulator, call_delta, first_choice, thinking_text
from gateway.dialects.errors import DialectError

Event = dict[str, Any]


class ResponseWriter:
    """Writes a chat chunk stream as Responses events; ``snapshot`` is the response."""

    def __init__(self, body: Mapping[str, Any]) -> None:
        self.id = f"resp_{uuid.uuid4().hex}"
        self.body = body
        self.created = int(time.time())
        self.acc = ChunkAccumulator()
        self.output: list[dict[str, Any]] = []  # finished items
        self.status = "in_progress"
        self._open: dict[str, Any] | None = None  # the item being streamed
        self._open_key = ""  # "reasoning", "text" or "call:<index>"
        self._open_text: list[str] = []  # its text or arguments so far
        self._calls_begun: set[int] = set()
        self._sequence = 0
        self._error: dict[str, Any] | None = None

    def snapshot(self) -> dict[str, Any]:
        body = self.body
        usage = self.acc.usage or {}
        prompt = int(usage.get("prompt_tokens") or 0)
        cached = int((usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0)
        completion = int(usage.get("completion_tokens") or 0)
        reason = "max_output_tokens" if self.status == "incomplete" else None
        return {
            "id": self.id,
            "object": "response",
            "created_at": self.created,
            "status": self.status,
            "error": self._error,
            "incomplete_details": {"reason": reason} if reason else None,
            "instructions": body.get("instructions"),
            "max_output_tokens": body.get("max_output_tokens"),
            "model": body.get("model"),
            "output": list(self.output),
            "parallel_tool_calls": body.get("parallel_tool_calls", True),
            "previous_response_id": body.get("previous_response_id"),
            "store": body.get("store", True),
            "temperature": body.get("temperature"),
            "text": body.get("text") or {"format": {"type": "text"}},
            "tool_choice": body.get("tool_choice", "auto"),
            "tools": body.get("tools") or [],
            "top_p": body.get("top_p"),
            "truncation": body.get("truncation", "disabled"),
            "metadata": body.get("metadata") or {},
            "usage": {
                "input_tokens": prompt,
                "input_tokens_details": {"cached_tokens": cached},
                "output_tokens": completion,
                "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": prompt + completion,
            }
            if self.acc.usage
            else None,
        }

    def _event(self, kind: str, **data: Any) -> Event:
        event = {"type": kind, "sequence_number": self._sequence, **data}
        self._sequence += 1
        return event

    def start(self) -> list[Event]:
        return [
            self._event("response.created", response=self.snapshot()),
            self._event("response.in_progress", response=self.snapshot()),
        ]

    def feed(self, chunk: Mapping[str, Any]) -> list[Event]:
        self.acc.feed(chunk)
        events: list[Event] = []
        for _, delta in first_choice(chunk):
            thinking = thinking_text(delta)
            if thinking:
                events += self._content_delta("reasoning", thinking)
            if delta.get("content"):
                events += self._content_delta("text", delta["content"])
            for call in delta.get("tool_calls") or ():
                events += self._call_delta(call)
        return events

    def finish(self) -> list[Event]:
        """Close the open item; the terminal event follows (``terminal``)."""
        self.status = "incomplete" if self.acc.finish_reason == "length" else "completed"
        return self._close()

    def terminal(self) -> Event:
        return self._event("response.completed", response=self.snapshot())

    def failed(self, err: DialectError) -> Event:
        """The terminal event of a stream that ``err`` broke off (``mid_stream_error``)."""
        self.status = "failed"
        self._error = {"code": err.code or "server_error", "message": err.message}
        return self._event("response.failed", response=self.snapshot())

    def _item_ref(self) -> dict[str, Any]:
        assert self._open is not None
        return {"item_id": self._open["id"], "output_index": len(self.output)}

    def _begin(self, key: str, item: dict[str, Any]) -> list[Event]:
        events = self._close()
        self._open, self._open_key, self._open_text = item, key, []
        return [
            *events,
            self._event(
                "response.output_item.added", output_index=len(self.output), item=dict(item)
            ),
        ]

    def _content_delta(self, key: str, text: str) -> list[Event]:
        """A reasoning (``key`` "reasoning") or text ("text") delta, opening its item first."""
        events: list[Event] = []
        if self._open_key != key:
            if key == "reasoning":
                item: dict[str, Any] = {"type": "reasoning", "summary": [], "content": []}
                part: dict[str, Any] = {"type": "reasoning_text", "text": ""}
            else:
                item = {"type": "message", "role": "assistant", "status": "in_progress"}
                item["content"] = []
                part = {"type": "output_text", "text": "", "annotations": []}
            prefix = "rs" if key == "reasoning" else "msg"
            events = self._begin(key, {"id": f"{prefix}_{uuid.uuid4().hex}", **item})
            events.append(
                self._event(
                    "response.content_part.added", **self._item_ref(), content_index=0, part=part
                )
            )
        self._open_text.append(text)
        kind, extra = (
            ("response.reasoning_text.delta", {})
            if key == "reasoning"
            else ("response.output_text.delta", {"logprobs": []})
        )
        events.append(self._event(kind, **self._item_ref(), content_index=0, delta=text, **extra))
        return events

    def _call_delta(self, call: Mapping[str, Any]) -> list[Event]:
        delta = call_delta(call, self._open_key, self._calls_begun)
        events: list[Event] = []
        if delta.starts:
            item = {
                "id": f"fc_{uuid.uuid4().hex}",
                "type": "function_call",
                "status": "in_progress",
                "call_id": delta.id or f"call_{uuid.uuid4().hex}",
                "name": delta.name,
                "arguments": "",
            }
            events = self._begin(delta.key, item)
        if delta.arguments:
            self._open_text.append(delta.arguments)
            events.append(
                self._event(
                    "response.function_call_arguments.delta",
                    **self._item_ref(),
                    delta=delta.arguments,
                )
            )
        return events

    def _close(self) -> list[Event]:
        if self._open is None:
            return []
        item, ref, text = self._open, self._item_ref(), "".join(self._open_text)
        events: list[Event] = []
        if item["type"] == "reasoning":
            part = {"type": "reasoning_text", "text": text}
            events.append(
                self._event("response.reasoning_text.done", **ref, content_index=0, text=text)
            )
            events.append(
                self._event("response.content_part.done", **ref, content_index=0, part=part)
            )
            item = {**item, "content": [part]}
        elif item["type"] == "message":
            part = {"type": "output_text", "text": text, "annotations": []}
            events.append(
                self._event(
                    "response.output_text.done", **ref, content_index=0, text=text, logprobs=[]
                )
            )
            events.append(
                self._event("response.content_part.done", **ref, content_index=0, part=part)
            )
            item = {**item, "status": "completed", "content": [part]}
        else:
            events.append(
                self._event(
                    "response.function_call_arguments.done",
                    **ref,
                    name=item["name"],
                    arguments=text,
                )
            )
            item = {**item, "status": "completed", "arguments": text}
        events.append(
            self._event("response.output_item.done", output_index=ref["output_index"], item=item)
        )
        self.output.append(item)
        self._open, self._open_key = None, ""
        return events
