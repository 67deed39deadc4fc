"""What a client-facing dialect is: one object per API the gateway serves.

A dialect names its route, decodes a request body into the neutral transcript (an
envelope, then its conversation items one at a time, so that ``request_cache`` decodes
only what a re-sent history adds), writes the upstream's chat chunks back in its own shape,
streamed or whole, and shapes errors as its clients expect. ``gateway.dialects.DIALECTS``
lists them; the app registers one route per dialect.
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from gateway.dialects.errors import DialectError
from gateway.transcript import Message, Transcript
from gateway.upstream import UpstreamError

log = logging.getLogger("foldgate")

Chunks = AsyncIterator[dict[str, Any]]


@dataclass(frozen=True)
class Exchange:
    """What a reply encoder may need from the request beside the upstream's chunks."""

    body: Mapping[str, Any]
    """The client's request body as sent."""
    remember: Callable[[str, Sequence[Message]], Awaitable[None]] | None = None
    """Keeps a finished reply under an id for later requests to continue from (the
    Responses API's ``previous_response_id``); None when nothing may be kept."""


class Dialect(ABC):
    """One client API: request decoding, reply encoding and error shape."""

    name: ClassVar[str]
    """Short name: metrics label, decode-cache key."""
    path: ClassVar[str]
    """The POST route it serves."""

    @abstractmethod
    def decode_envelope(self, body: Any) -> tuple[Transcript, list[Any]]:
        """Every check and field of the body but its conversation items: a transcript of the
        leading messages the envelope itself holds (a system prompt), tools and params, and
        the raw items to decode one by one with ``decode_item``."""

    @abstractmethod
    def decode_item(self, raw: Any, index: int, issued: set[str]) -> tuple[Message, ...]:
        """Raw item ``index`` as neutral messages, given the tool-call ids the earlier items
        issued (new ones are added to ``issued``). Depends on nothing else, so an unchanged
        item at the same index decodes the same."""

    def decode(self, body: Any) -> Transcript:
        """The whole body at once (what ``request_cache`` must equal)."""
        envelope, items = self.decode_envelope(body)
        issued: set[str] = set()
        decoded = [m for i, raw in enumerate(items) for m in self.decode_item(raw, i, issued)]
        return envelope.with_messages((*envelope.messages, *decoded))

    def continues(self, body: Mapping[str, Any]) -> str | None:
        """The id of a kept reply whose conversation this request goes on with, if any."""
        return None

    @abstractmethod
    def stream(self, chunks: Chunks, exchange: Exchange) -> AsyncIterator[bytes]:
        """The reply as server-sent events. The status line is sent before the first chunk,
        so an upstream failure after it must end the stream with the dialect's error event."""

    @abstractmethod
    async def response(self, chunks: Chunks, exchange: Exchange) -> dict[str, Any]:
        """The whole reply as one JSON body."""

    @abstractmethod
    def error_body(self, err: DialectError) -> dict[str, Any]:
        """The dialect's JSON error shape for ``err``."""

    def upstream_refusal(self, exc: UpstreamError) -> DialectError:
        """An upstream refusal (a 4xx such as context too long) as this gateway's error."""
        detail = exc.body.get("error", exc.body) if isinstance(exc.body, dict) else exc.body
        status = exc.status if exc.status and 400 <= exc.status < 500 else 502
        kind = "invalid_request_error" if status < 500 else "api_error"
        code = detail.get("code") if isinstance(detail, dict) else None
        message = upstream_message(exc)
        if not isinstance(code, str):
            code = refusal_code(status, message)
        return DialectError(f"upstream: {message}", status=status, kind=kind, code=code)


def mid_stream_error(exc: Exception) -> DialectError:
    """The error event that ends a stream whose status line is already sent; what is not
    an upstream failure is a bug, logged here with its traceback."""
    if isinstance(exc, UpstreamError):
        message = upstream_message(exc)
    elif isinstance(exc, DialectError):
        message = exc.message
    else:
        log.error("stream failed", exc_info=exc)
        message = "internal error"
    return DialectError(f"upstream failed mid-stream: {message}", status=502, kind="api_error")


def upstream_message(exc: UpstreamError) -> str:
    """What a client may read of an upstream failure: the replica's own error message when
    it sent one, else the kind of failure; never ``str(exc)``, which names the replica."""
    detail = exc.body.get("error", exc.body) if isinstance(exc.body, dict) else exc.body
    message = detail.get("message") if isinstance(detail, dict) else detail
    if isinstance(message, str) and message.strip():
        return message
    if exc.status and exc.status != 502:
        return f"the model server answered HTTP {exc.status}"
    return "the model server failed or stopped answering"


def refusal_code(status: int | None, message: str) -> str | None:
    """The OpenAI error code clients act on for an upstream refusal: they compact on
    ``context_length_exceeded`` and back off on ``rate_limit_exceeded``."""
    if status == 429:
        return "rate_limit_exceeded"
    if status == 400 and "context length" in message.lower():
        return "context_length_exceeded"
    return None
