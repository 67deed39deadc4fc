"""OpenAI Responses (``POST /v1/responses``), translated to Chat Completions for the replicas.

Requests (``responses_decode``): ``instructions`` and ``input`` become the transcript, the
items of one model turn one assistant message; function tools become chat tools, hosted
ones are left out; parameters are converted to chat fields.

Replies (``responses_events``): the chat chunk stream becomes the Responses event stream,
ending with exactly one of ``response.completed`` or ``response.failed``. A reply cut at
``max_output_tokens`` ends with ``response.completed`` whose response says ``status:
"incomplete"`` and why (``incomplete_details``): harnesses such as Codex take
``response.completed`` as the end of a turn and treat any other ending as a broken stream,
and a cut reply is a turn the harness can continue. Unless the request says ``store:
false``, the reply is kept (``Exchange.remember``) before the final event, so a request
naming it in ``previous_response_id`` continues its conversation.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Mapping
from typing import Any

from gateway.dialects.base import Chunks, Dialect, Exchange
from gateway.dialects.chunks import format_sse
from gateway.dialects.errors import DialectError, mid_stream_error
from gateway.dialects.fields import RESPONSES
from gateway.dialects.openai_chat import openai_error_body
from gateway.dialects.responses_decode import decode_envelope, decode_item, group_items
from gateway.dialects.responses_events import Event, ResponseWriter
from gateway.transcript import Message, Transcript

log = logging.getLogger("foldgate")


class OpenAIResponses(Dialect):
    """OpenAI Responses: the API Codex speaks."""

    name = RESPONSES
    items_field = "input"
    path = "/v1/responses"

    def decode_envelope(self, body: Any) -> tuple[Transcript, list[Any]]:
        return decode_envelope(body)

    def decode_item(self, raw: Any, index: int, issued: set[str]) -> tuple[Message, ...]:
        return decode_item(raw, index, issued)

    def continues(self, body: Mapping[str, Any]) -> str | None:
        previous = body.get("previous_response_id")
        return previous if isinstance(previous, str) and previous else None

    async def stream(self, chunks: Chunks, exchange: Exchange) -> AsyncIterator[bytes]:
        writer = ResponseWriter(exchange.body)
        async for event in self._events(writer, chunks, exchange):
            yield format_sse(event["type"], event)

    async def response(self, chunks: Chunks, exchange: Exchange) -> dict[str, Any]:
        writer = ResponseWriter(exchange.body)
        async for _ in self._events(writer, chunks, exchange, streamed=False):
            pass
        return writer.snapshot()

    async def _events(
        self, writer: ResponseWriter, chunks: Chunks, exchange: Exchange, streamed: bool = True
    ) -> AsyncIterator[Event]:
        """Every event of the reply, ending in exactly one terminal event. Not ``streamed``,
        nothing has reached the client: a failure raises, for the error answer it calls for
        (an upstream's 502, a store outage's 503 with Retry-After)."""
        for event in writer.start():
            yield event
        try:
            async for chunk in chunks:
                for event in writer.feed(chunk):
                    yield event
            events = writer.finish()
            if exchange.remember is not None and exchange.body.get("store") is not False:
                issued: set[str] = set()
                reply = [
                    m
                    for i, group in enumerate(group_items(writer.output))
                    for m in self.decode_item(group, i, issued)
                ]
                await exchange.remember(writer.id, reply)
        except Exception as exc:  # the status line is sent: the stream must still end well
            if not streamed:
                raise
            log.warning("response %s failed mid-stream: %r", writer.id, exc)
            yield writer.failed(mid_stream_error(exc))
            return
        for event in events:
            yield event
        yield writer.terminal()

    def error_body(self, err: DialectError) -> dict[str, Any]:
        return openai_error_body(err)


OPENAI_RESPONSES = OpenAIResponses()
