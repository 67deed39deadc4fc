"""The HTTP client to vLLM replicas: one shared aiohttp session per process.

Requests always go upstream as streaming OpenAI chat completions, whatever the client asked
for: one code path reads every reply chunk by chunk (restore detection, accounting), and a
non-streaming client gets the chunks assembled. Nothing is retried here; the router's
failover decides, and only while nothing reached the client: before the first chunk, or,
for a client that waits for the whole reply, before the reply is read to its end
(``ChatStream.read_whole``).

Whatever a replica sends, its faults leave here as ``UpstreamError`` (a failure of the
replica): a stream cut or cut inside a line, a ``data:`` line that is not a chunk object, a
``/v1/models`` that answers an error or no model listing.

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
from aiohttp.http_exceptions import HttpProcessingError

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
        """``url``'s JSON body; a replica that does not answer one (unreachable, a non-2xx,
        a timeout, a body that is not JSON) raises ``UpstreamError``."""
        session = await self.session()
        try:
            async with session.get(
                url, timeout=aiohttp.ClientTimeout(total=self.idle_timeout_s)
            ) as resp:
                resp.raise_for_status()
                return await resp.json()
        except (aiohttp.ClientError, OSError, TimeoutError, ValueError) as exc:
            raise UpstreamError(f"{url}: {exc!r}", retryable=True) from exc

    async def served_models(self, base_url: str) -> list[dict[str, Any]]:
        """The replica's ``/v1/models`` entries, each with a string ``id``; a replica that
        answers no such listing raises ``UpstreamError``."""
        answer = await self.get_json(f"{base_url}/v1/models")
        entries = answer.get("data") if isinstance(answer, dict) else None
        if not isinstance(entries, list) or not all(
            isinstance(e, dict) and isinstance(e.get("id"), str) for e in entries
        ):
            raise UpstreamError(f"{base_url}/v1/models: not a model listing", retryable=True)
        return entries

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
        self._holding = False  # chunks are held until the reply is whole (``read_whole``)
        self._first: dict[str, Any] | None = None
        self._whole: list[dict[str, Any]] | None = None
        self._events = self._parse()
        self._waiting_since: float | None = None  # loop time a pending line read began
        self._watchdog: asyncio.TimerHandle | None = None

    async def read_whole(self) -> None:
        """Read the rest of the reply now (each chunk within the idle timeout), holding its
        chunks for the iteration: none of it reached the client yet, so a break anywhere in
        it is retryable."""
        self._holding = True
        self._whole = [chunk async for chunk in self]

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
        loop = asyncio.get_running_loop()
        while True:
            self._waiting_since = loop.time()
            if self._watchdog is None and self._started and self._idle_timeout_s is not None:
                self._watchdog = loop.call_at(
                    self._waiting_since + self._idle_timeout_s, self._watch
                )
            raw = await content.readline()
            self._waiting_since = None
            if not raw:
                return
            yield raw

    def _watch(self) -> None:
        """The idle timeout as one timer per stream, armed by a read and re-armed only when
        it comes due (a timeout around each line's read cost a tenth of the relay's CPU).
        Only a pending read counts, as a read's own timeout would: a client slow to take
        the reply is not an idle replica, and with no read pending the timer lapses until
        the next read (a stream no one reads any more is not kept alive by it). Past it,
        the pending read fails with TimeoutError."""
        assert self._idle_timeout_s is not None
        self._watchdog = None
        since = self._waiting_since
        if since is None:
            return
        loop = asyncio.get_running_loop()
        if loop.time() - since >= self._idle_timeout_s:
            self._resp.content.set_exception(
                TimeoutError(f"no line within the idle timeout of {self._idle_timeout_s} s")
            )
        else:
            self._watchdog = loop.call_at(since + self._idle_timeout_s, self._watch)

    def _stop_watching(self) -> None:
        if self._watchdog is not None:
            self._watchdog.cancel()
            self._watchdog = None

    async def _parse(self) -> AsyncIterator[dict[str, Any]]:
        reader = SSEReader()
        try:
            async for raw in self._lines():
                if not raw.endswith(b"\n"):
                    raise self._broke("the stream ended inside a line")
                event = reader.line(raw)
                if event is None:
                    continue
                if event.data == DONE:
                    return
                chunk = parse_chunk(event.data)
                if chunk is None:
                    raise self._broke(f"not a chunk: {event.data[:100]!r}")
                if "error" in chunk:
                    raise self._error_event(chunk)
                self._started = True
                yield chunk
        except (aiohttp.ClientError, HttpProcessingError, TimeoutError) as exc:
            # HttpProcessingError: a line past the read buffer's limit, among others.
            raise self._broke(repr(exc)) from exc
        raise self._broke("the stream ended before [DONE]")

    def _error_event(self, chunk: dict[str, Any]) -> UpstreamError:
        """An error event: the request's fault when it carries a 4xx ``code`` (vLLM streams
        its refusals so), else the replica's, as a break is."""
        error = chunk["error"]
        code = error.get("code") if isinstance(error, dict) else None
        if isinstance(code, int) and 400 <= code < 500:
            return UpstreamError(
                f"upstream refused: {error}", retryable=False, status=code, body=chunk
            )
        return self._broke(f"error event {error}", body=chunk)

    def _broke(self, why: str, body: Any = None) -> UpstreamError:
        """The replica broke off: retryable while nothing of the reply reached the client."""
        return UpstreamError(
            f"upstream stream broke: {why}",
            retryable=self._holding or not self._started,
            body=body,
        )

    async def __aiter__(self) -> AsyncIterator[dict[str, Any]]:
        if self._whole is not None:
            for chunk in self._whole:
                yield chunk
            return
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
            self._stop_watching()
            if finished:
                self._resp.release()
            else:
                self._resp.close()

    def close(self) -> None:
        """Abort the reply: the connection is closed, and the replica stops generating."""
        self._stop_watching()
        self._resp.close()


def parse_chunk(data: bytes) -> dict[str, Any] | None:
    """A ``data:`` line's ``chat.completion.chunk`` (or error event); None when it is not
    one: not JSON, not an object, or ``choices``, a ``delta`` or ``usage`` of the wrong type
    (which the dialects read without checking)."""
    try:
        chunk = orjson.loads(data)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(chunk, dict) or not isinstance(chunk.get("usage") or {}, dict):
        return None
    choices = chunk.get("choices") or []
    if not isinstance(choices, list):
        return None
    for choice in choices:
        if not isinstance(choice, dict) or not isinstance(choice.get("delta") or {}, dict):
            return None
        calls = (choice.get("delta") or {}).get("tool_calls") or []
        if not isinstance(calls, list) or not all(map(is_call_delta, calls)):
            return None
    return chunk


def is_call_delta(call: Any) -> bool:
    """A tool-call delta: an object with an integer ``index`` and string (or absent) ``id``,
    ``function.name`` and ``function.arguments``."""
    if not isinstance(call, dict) or not isinstance(call.get("index", 0), int):
        return False
    fn = call.get("function") or {}
    return isinstance(fn, dict) and all(
        isinstance(v, str)
        for v in (call.get("id") or "", fn.get("name") or "", fn.get("arguments") or "")
    )
