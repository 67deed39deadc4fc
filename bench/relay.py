"""A plain relay, the floor under ``bench/overhead.py``'s added latency: what any Python
gateway on this stack pays for its extra hop, with none of foldgate's logic.

It does what foldgate does to every request's bytes and nothing else: reads the body
(uvicorn, httptools), parses it and encodes it again (orjson), posts it upstream as a
stream with foldgate's own upstream client (``gateway.upstream``: one aiohttp session, its
SSE parsing and timeouts), and writes every chunk back to the client. No store, no
rendering, no routing, no checks.

The HTTP hops' alternatives, for ``bench/hops.py`` to measure against that floor: the
server's protocol (``--http h11``) and event loop (``--loop asyncio``), and the upstream
client: ``aiohttp-chunks`` (one aiohttp session, the body read in whatever chunks arrive
and split into SSE lines, no per-line timeout), ``aiohttp-lines`` (read line by line as
``gateway.upstream`` does, without its per-line timeout) or ``httpx`` (an
``httpx.AsyncClient``, the same chunk reading).

    .venv/bin/python bench/relay.py --port 8300 --upstream http://127.0.0.1:8100
        [--upstream http://127.0.0.1:8101 ...]
        [--http httptools|h11] [--loop uvloop|asyncio]
        [--client foldgate|aiohttp-chunks|aiohttp-lines|httpx]
"""

from __future__ import annotations

import argparse
import itertools
import sys
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any, Protocol

import aiohttp
import httpx
import orjson
import uvicorn

# Run as a script: put the repo first, before bench/ (whose store.py shadows the package).
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gateway.sse import DONE, SSEReader
from gateway.upstream import UpstreamClient

SSE = [(b"content-type", b"text/event-stream")]
JSON = {"content-type": "application/json"}
CLIENTS = ("foldgate", "aiohttp-chunks", "aiohttp-lines", "httpx")


class ChunkClient(Protocol):
    async def chunks(self, url: str, body: Any) -> AsyncIterator[dict[str, Any]]: ...

    async def close(self) -> None: ...


class FoldgateClient:
    """``gateway.upstream.UpstreamClient`` as the gateway calls it."""

    def __init__(self) -> None:
        self.client = UpstreamClient()

    async def chunks(self, url: str, body: Any) -> AsyncIterator[dict[str, Any]]:
        stream = await self.client.open_chat_stream(url, body)
        async for chunk in stream:
            yield chunk

    async def close(self) -> None:
        await self.client.close()


def sse_chunks(reader: SSEReader, data: bytes) -> list[dict[str, Any]]:
    return [orjson.loads(e.data) for e in reader.feed(data) if e.data != DONE]


class AiohttpChunks:
    def __init__(self) -> None:
        self.session: aiohttp.ClientSession | None = None

    def post(self, url: str, body: Any) -> Any:
        """The chat request on one pooled session (opened at the first)."""
        if self.session is None:
            self.session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))
        return self.session.post(
            f"{url}/v1/chat/completions", data=orjson.dumps(body), headers=JSON
        )

    async def chunks(self, url: str, body: Any) -> AsyncIterator[dict[str, Any]]:
        reader = SSEReader()
        async with self.post(url, body) as resp:
            async for data in resp.content.iter_any():
                for chunk in sse_chunks(reader, data):
                    yield chunk

    async def close(self) -> None:
        if self.session is not None:
            await self.session.close()


class AiohttpLines(AiohttpChunks):
    """aiohttp read line by line as ``gateway.upstream`` reads, without its per-line
    idle timeout: what the timeout costs."""

    async def chunks(self, url: str, body: Any) -> AsyncIterator[dict[str, Any]]:
        reader = SSEReader()
        async with self.post(url, body) as resp:
            while raw := await resp.content.readline():
                event = reader.line(raw)
                if event is not None and event.data != DONE:
                    yield orjson.loads(event.data)


class HttpxChunks:
    def __init__(self) -> None:
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
        self.client = httpx.AsyncClient(limits=limits, timeout=None)

    async def chunks(self, url: str, body: Any) -> AsyncIterator[dict[str, Any]]:
        reader = SSEReader()
        request = self.client.build_request(
            "POST", f"{url}/v1/chat/completions", content=orjson.dumps(body), headers=JSON
        )
        resp = await self.client.send(request, stream=True)
        try:
            async for data in resp.aiter_raw():
                for chunk in sse_chunks(reader, data):
                    yield chunk
        finally:
            await resp.aclose()

    async def close(self) -> None:
        await self.client.aclose()


def make_client(name: str) -> ChunkClient:
    clients: dict[str, type[ChunkClient]] = {
        "foldgate": FoldgateClient,
        "aiohttp-chunks": AiohttpChunks,
        "aiohttp-lines": AiohttpLines,
        "httpx": HttpxChunks,
    }
    return clients[name]()


class PlainRelay:
    """ASGI app: POST /v1/chat/completions relayed to the ``upstreams`` in turn (one request
    each, round-robin); GET /health."""

    def __init__(self, upstreams: Sequence[str], client: ChunkClient) -> None:
        self.upstreams = itertools.cycle(upstreams)
        self.client = client

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await self.client.close()
            await send({"type": "lifespan.shutdown.complete"})
            return
        if scope["method"] == "GET":
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b"ok"})
            return
        raw = bytearray()
        while True:
            message = await receive()
            raw.extend(message.get("body", b""))
            if not message.get("more_body"):
                break
        body = orjson.loads(raw)
        started = False
        async for chunk in self.client.chunks(next(self.upstreams), body):
            if not started:
                await send({"type": "http.response.start", "status": 200, "headers": SSE})
                started = True
            frame = b"data: " + orjson.dumps(chunk) + b"\n\n"
            await send({"type": "http.response.body", "body": frame, "more_body": True})
        if not started:
            await send({"type": "http.response.start", "status": 200, "headers": SSE})
        await send({"type": "http.response.body", "body": b"data: [DONE]\n\n"})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument(
        "--upstream",
        required=True,
        action="append",
        help="base URL of an upstream; several: round-robin, a request each",
    )
    parser.add_argument("--http", choices=("httptools", "h11"), default="httptools")
    parser.add_argument("--loop", choices=("uvloop", "asyncio"), default="uvloop")
    parser.add_argument("--client", choices=CLIENTS, default="foldgate")
    args = parser.parse_args()
    uvicorn.run(
        PlainRelay([u.rstrip("/") for u in args.upstream], make_client(args.client)),
        host="127.0.0.1",
        port=args.port,
        http=args.http,
        loop=args.loop,
        log_level="warning",
        access_log=False,
    )


if __name__ == "__main__":
    main()
