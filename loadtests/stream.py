"""One streamed reply, read the way a load test measures it.

Both dialects stream server-sent events: OpenAI Chat Completions as ``data:`` chunks ending
with ``data: [DONE]``, Anthropic Messages as named events ending with ``message_stop``. The
reader notes when the first generated token arrived, the token usage the server reported,
whether the stream ended properly, and any error the server sent after the status line.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

from gateway.sse import DONE, SSEEvent, SSEReader
from loadtests.sessions import Dialect


class ReplyStream:
    def __init__(self, dialect: Dialect, clock: Callable[[], float] = time.perf_counter) -> None:
        self.dialect = dialect
        self.clock = clock
        self.first_token_at: float | None = None
        self.done = False
        self.error: str | None = None
        self.prompt_tokens: int | None = None
        self.cached_tokens: int | None = None
        self.completion_tokens: int | None = None
        self._reader = SSEReader()

    def feed(self, data: bytes) -> None:
        for event in self._reader.feed(data):
            self._event(event)

    @property
    def problem(self) -> str | None:
        """Why this stream counts as a failure, or None."""
        if self.error is not None:
            return f"error event in stream: {self.error}"
        if not self.done:
            return "stream ended before its final event"
        if self.prompt_tokens is None:
            return "stream carried no usage"
        return None

    def _event(self, sse: SSEEvent) -> None:
        if sse.data == DONE:
            self.done = True
            return
        event, data = sse.event, sse.data.decode("utf-8", errors="replace")
        try:
            payload = json.loads(data)
        except json.JSONDecodeError:
            self.error = f"malformed event data: {data[:200]}"
            return
        if not isinstance(payload, dict):
            return
        if event == "error" or "error" in payload:
            self.error = json.dumps(payload.get("error", payload))[:1000]
        elif self.dialect == "anthropic":
            self._anthropic(event or str(payload.get("type")), payload)
        else:
            self._openai(payload)

    def _token(self) -> None:
        if self.first_token_at is None:
            self.first_token_at = self.clock()

    def _openai(self, chunk: dict[str, Any]) -> None:
        for choice in chunk.get("choices") or ():
            delta = choice.get("delta") or {}
            if any(
                delta.get(k) for k in ("content", "reasoning", "reasoning_content", "tool_calls")
            ):
                self._token()
        usage = chunk.get("usage")
        if usage:
            self.prompt_tokens = int(usage.get("prompt_tokens") or 0)
            details = usage.get("prompt_tokens_details") or {}
            self.cached_tokens = int(details.get("cached_tokens") or 0)
            self.completion_tokens = int(usage.get("completion_tokens") or 0)

    def _anthropic(self, event: str, payload: dict[str, Any]) -> None:
        if event == "content_block_delta":
            self._token()
        elif event == "message_delta":
            usage = payload.get("usage") or {}
            cached = int(usage.get("cache_read_input_tokens") or 0)
            created = int(usage.get("cache_creation_input_tokens") or 0)
            self.prompt_tokens = int(usage.get("input_tokens") or 0) + cached + created
            self.cached_tokens = cached
            self.completion_tokens = int(usage.get("output_tokens") or 0)
        elif event == "message_stop":
            self.done = True
