"""The HTTP client to vLLM replicas: one shared aiohttp session per process.

Requests always go upstream as streaming OpenAI chat completions, whatever the client asked
for: one code path reads every reply chunk by chunk (restore detection, accounting), and a
non-streaming client gets the chunks assembled. Nothing is retried here; the router's
failover decides, and only before the first chunk reached the client.

Timeouts: connecting, the first chunk (queueing and prefill), then the gap between two
chunks; a generation may run as long as it keeps streaming.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson

from gateway.sse import DONE, SSEReader
from router import UpstreamFailed


class UpstreamError(UpstreamFailed):
    """The upstream answered with an error or broke off.

    ``retryable`` (connection failures and 5xx before any chunk) tells the router's
    failover it may try another replica; ``body`` is what the upstream said, for errors the
    client should see (a 4xx such as context too long).
    """

    def __init__(
        self, message: str, *, retryable: bool, status: int = 502, body: Any = None
    ) -> None:
        super().__init__(message, retryable=retryable, status=status)
        self.body = body


@dataclass
class UpstreamClient:
    connect_timeout_s: float = 5.0
    first_chunk_timeout_s: float = 600.0
    idle_timeout_s: float = 120.0
    _session: aiohttp.ClientSession | None = None

    async def session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=self.connect_timeout_s),
                connector=aiohttp.TCPConnector(limit=0, ttl_dns_cache=30),
            )
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    async def get_json(self, url: str) -> Any:
        session = await self.session()
        async with session.get(
            url, timeout=aiohttp.ClientTimeout(total=self.idle_timeout_s)
        ) as resp:
            resp.raise_for_status()
            return await resp.json()

    async def open_chat_stream(
        self, base_url: str, body: Mapping[str, Any], headers: Mapping[str, str] | None = None
    ) -> ChatStream:
        """POST a streaming chat completion and wait for its first chunk.

        Returns once the first chunk is in hand, so every failure a retry could fix is
        raised from here, before the caller has sent anything to its client.
        """
        try:
            async with asyncio.timeout(self.first_chunk_timeout_s):
                return await self._open(base_url, body, headers)
        except TimeoutError as exc:
            raise UpstreamError(
                f"{base_url}: no first chunk within {self.first_chunk_timeout_s:g} s",
                retryable=True,
            ) from exc

    async def _open(
        self, base_url: str, body: Mapping[str, Any], headers: Mapping[str, str] | None
    ) -> ChatStream:
        session = await self.session()
        try:
            # orjson: encoding a 128 KB history takes a tenth of the json module's time.
            resp = await session.post(
                f"{base_url}/v1/chat/completions",
                data=orjson.dumps(body),
                headers={**(headers or {}), "content-type": "application/json"},
            )
        except (aiohttp.ClientError, OSError) as exc:
            raise UpstreamError(f"{base_url}: {exc!r}", retryable=True) from exc
        if resp.status != 200:
            text = await resp.text()
            resp.release()
            try:
                detail: Any = json.loads(text)
            except ValueError:
                detail = text
            raise UpstreamError(
                f"{base_url} answered {resp.status}: {text[:300]}",
                retryable=resp.status >= 500,
                status=resp.status,
                body=detail,
            )
        stream = ChatStream(resp, self.idle_timeout_s)
        try:
            await stream.prefetch()
        except BaseException:
            # An error, the first-chunk timeout, or the client gone (the request cancelled):
            # closing the connection is what tells the replica to stop.
            resp.close()
            raise
        return stream


class ChatStream:
    """Parsed ``chat.completion.chunk`` dicts of one upstream SSE response."""

    def __init__(self, resp: aiohttp.ClientResponse, idle_timeout_s: float | None = None) -> None:
        self._resp = resp
        self._idle_timeout_s = idle_timeout_s
        self._started = False  # a chunk has arrived
        self._first: dict[str, Any] | None = None
        self._events = self._parse()

    async def prefetch(self) -> None:
        try:
            self._first = await anext(self._events)
        except StopAsyncIteration as exc:
            raise UpstreamError(
                "upstream closed the stream before any chunk", retryable=True
            ) from exc

    async def _lines(self) -> AsyncIterator[bytes]:
        """The response's lines; after the first chunk, each within the idle timeout (the
        first is bounded by the caller's first-chunk timeout)."""
        content = self._resp.content
        while True:
            if not self._started:
                raw = await content.readline()
            else:
                async with asyncio.timeout(self._idle_timeout_s):
                    raw = await content.readline()
            if not raw:
                return
            yield raw

    async def _parse(self) -> AsyncIterator[dict[str, Any]]:
        reader = SSEReader()
        try:
            async for raw in self._lines():
                event = reader.line(raw)
                if event is None:
                    continue
                if event.data == DONE:
                    return
                chunk = orjson.loads(event.data)
                if "error" in chunk:
                    raise UpstreamError(
                        f"upstream stream error: {chunk['error']}", retryable=False, body=chunk
                    )
                self._started = True
                yield chunk
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise UpstreamError(
                f"upstream stream broke: {exc!r}", retryable=not self._started
            ) from exc

    async def __aiter__(self) -> AsyncIterator[dict[str, Any]]:
        finished = False
        try:
            if self._first is not None:
                first, self._first = self._first, None
                yield first
            async for chunk in self._events:
                yield chunk
            finished = True
        finally:
            # A reply left unread (the client went away, an error) closes the connection,
            # which aborts the generation on the replica; a finished one is pooled again.
            if finished:
                self._resp.release()
            else:
                self._resp.close()

    def close(self) -> None:
        """Abort the reply: the connection is closed, and the replica stops generating."""
        self._resp.close()
