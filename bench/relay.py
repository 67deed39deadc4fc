"""A plain relay, the floor under ``bench/overhead.py``'s added latency: what any Python
gateway on this stack pays for its extra hop, with none of foldgate's logic.

It does what foldgate does to every request's bytes and nothing else: reads the body
(uvicorn, httptools), parses it and encodes it again (orjson), posts it upstream as a
stream with foldgate's own upstream client (``gateway.upstream``: one aiohttp session, its
SSE parsing and timeouts), and writes every chunk back to the client. No store, no
rendering, no routing, no checks.

    .venv/bin/python bench/relay.py --port 8300 --upstream http://127.0.0.1:8100
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import orjson
import uvicorn

# Run as a script: put the repo first, before bench/ (whose store.py shadows the package).
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gateway.upstream import UpstreamClient

SSE = [(b"content-type", b"text/event-stream")]


class PlainRelay:
    """ASGI app: POST /v1/chat/completions relayed to ``upstream``; GET /health."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream
        self.client = UpstreamClient()

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
        stream = await self.client.open_chat_stream(self.upstream, body)
        await send({"type": "http.response.start", "status": 200, "headers": SSE})
        async for chunk in stream:
            frame = b"data: " + orjson.dumps(chunk) + b"\n\n"
            await send({"type": "http.response.body", "body": frame, "more_body": True})
        await send({"type": "http.response.body", "body": b"data: [DONE]\n\n"})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--upstream", required=True, help="base URL of the upstream")
    args = parser.parse_args()
    uvicorn.run(
        PlainRelay(args.upstream.rstrip("/")),
        host="127.0.0.1",
        port=args.port,
        http="httptools",
        log_level="warning",
        access_log=False,
    )


if __name__ == "__main__":
    main()
