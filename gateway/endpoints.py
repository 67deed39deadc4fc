"""The two client-facing dialects as the HTTP layer needs them.

An endpoint decodes a request body into a transcript, and writes the stream of OpenAI
chunks that the pipeline lets through back in its own dialect: as SSE frames while
streaming, or assembled into one response. Errors take the dialect's own shape.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from fastapi.responses import JSONResponse

from gateway.dialects import anthropic_messages, openai_chat
from gateway.dialects.errors import DialectError, anthropic_error_body, openai_error_body
from gateway.dialects.responses import (
    AnthropicStreamTranslator,
    ChunkAccumulator,
    format_sse,
    to_anthropic_response,
)
from gateway.request_cache import Codec
from gateway.transcript import Transcript
from gateway.upstream import UpstreamError


@dataclass(frozen=True)
class Endpoint:
    name: str
    decode: Callable[[Any], Transcript]
    codec: Codec
    error_body: Callable[[DialectError], dict[str, Any]]
    anthropic: bool

    def error(self, err: DialectError, headers: Mapping[str, str] | None = None) -> JSONResponse:
        return JSONResponse(self.error_body(err), status_code=err.status, headers=headers)

    def upstream_error(self, exc: UpstreamError) -> JSONResponse:
        """An upstream refusal (a 4xx such as context too long) passed on in this dialect."""
        detail = exc.body.get("error", exc.body) if isinstance(exc.body, dict) else exc.body
        message = detail.get("message") if isinstance(detail, dict) else None
        status = exc.status if exc.status and 400 <= exc.status < 500 else 502
        kind = "invalid_request_error" if status < 500 else "api_error"
        return self.error(DialectError(f"upstream: {message or exc}", status=status, kind=kind))

    async def stream(self, chunks: AsyncIterator[dict[str, Any]]) -> AsyncIterator[bytes]:
        """SSE frames; an upstream failure after the first byte ends the stream with an
        error event, since the status line is already sent."""
        translator = AnthropicStreamTranslator() if self.anthropic else None
        try:
            async for chunk in chunks:
                if translator is None:
                    yield format_sse(None, chunk)
                else:
                    for event, data in translator.feed(chunk):
                        yield format_sse(event, data)
        except UpstreamError as exc:
            err = DialectError(f"upstream failed mid-stream: {exc}", status=502, kind="api_error")
            yield format_sse("error" if self.anthropic else None, self.error_body(err))
            return
        if translator is None:
            yield format_sse(None, "[DONE]")
        else:
            for event, data in translator.finish():
                yield format_sse(event, data)

    async def response(self, chunks: AsyncIterator[dict[str, Any]]) -> dict[str, Any]:
        acc = ChunkAccumulator()
        async for chunk in chunks:
            acc.feed(chunk)
        completion = {
            "id": acc.id,
            "object": "chat.completion",
            "created": int(time.time()),
            "model": acc.model,
            "choices": [
                {
                    "index": 0,
                    "message": acc.message(),
                    "finish_reason": acc.finish_reason,
                    "stop_reason": acc.matched_stop,
                }
            ],
            "usage": dict(acc.usage or {}),
        }
        return to_anthropic_response(completion) if self.anthropic else completion


OPENAI = Endpoint(
    "openai",
    openai_chat.decode_request,
    Codec("openai", openai_chat.decode_envelope, openai_chat.decode_item),
    openai_error_body,
    anthropic=False,
)
ANTHROPIC = Endpoint(
    "anthropic",
    anthropic_messages.decode_request,
    Codec("anthropic", anthropic_messages.decode_envelope, anthropic_messages.decode_item),
    anthropic_error_body,
    anthropic=True,
)
