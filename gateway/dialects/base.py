"""What a client-facing dialect is: one object per API the gateway serves.

A dialect names its route, decodes a request body into the neutral transcript (an
envelope, then its conversation items one at a time, so that ``request_cache`` decodes
only what a re-sent history adds), writes the upstream's chat chunks back in its own shape,
streamed or whole, and shapes errors as its clients expect. ``gateway.dialects.DIALECTS``
lists them; the app registers one route per dialect.

The reply's chunks raise ``DialectError`` for a failure a client may read about (the
request path turns an upstream's into one: ``errors.upstream_broke_off``); any other
exception is a bug.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from gateway.dialects.anthropic_context import AppliedEdit
from gateway.dialects.errors import DialectError
from gateway.transcript import Message, Transcript

Chunks = AsyncIterator[dict[str, Any]]


@dataclass(frozen=True)
class Exchange:
    """What a reply encoder may need from the request beside the upstream's chunks."""

    body: Mapping[str, Any]
    """The client's request body as sent."""
    remember: Callable[[str, Sequence[Message]], Awaitable[None]] | None = None
    """Keeps a finished reply under an id for later requests to continue from (the
    Responses API's ``previous_response_id``); None when nothing may be kept."""
    context_edits: tuple[AppliedEdit, ...] | None = None
    """The context edits the gateway applied for the request's ``context_management``
    (None: it asked for none), for the reply to report."""


class Dialect(ABC):
    """One client API: request decoding, reply encoding and error shape."""

    name: ClassVar[str]
    """Short name: metrics label, decode-cache key."""
    path: ClassVar[str]
    """The POST route it serves."""
    items_field: ClassVar[str | None] = None
    """The body field holding the conversation items a harness re-sends as they grow (a
    body is parsed after the part the session's previous body shared: ``resent_body``)."""

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
        """The dialect's JSON error shape for ``err``, naming every kind (``ERROR_KINDS``)
        with its API's error type."""
