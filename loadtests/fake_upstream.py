"""A FAKE vLLM upstream: answers instantly with scripted replies.

For fault injection (scripted restore calls, errors) and for measuring the gateway's own
overhead, never in place of vLLM where model serving is what is tested. It speaks the
subset of vLLM's OpenAI API the gateway uses: streaming chat completions with usage,
``/health``, ``/metrics`` (idle gauges) and ``/v1/models``.
"""

from __future__ import annotations

import asyncio
import json
import socket
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

FAKE_MODEL = "fake-model"


@dataclass
class ScriptedReply:
    """One reply: text and/or tool calls ``(name, arguments_json)``; or an HTTP error."""

    content: str = "ok"
    tool_calls: list[tuple[str, str]] = field(default_factory=list)
    status: int = 200
    error_message: str = "fake upstream error"
    chunk_chars: int = 8
    chunk_delay_s: float = 0.0  # pause before each chunk after the first (a decoding model)
    first_chunk_delay_s: float = 0.0  # pause before the response starts (queueing, prefill)
    # And this much more per prompt token (as the usage counts them): a prefill's length.
    prefill_s_per_token: float = 0.0
    # A replica's fault after ``breaks_after`` chunks: "drop" (the connection is cut),
    # "error" (an error event, as vLLM sends when generation fails), "not_json" (a data line
    # that is not JSON), "cut_line" (the stream ends inside a line); None: no fault.
    breaks: str | None = None
    breaks_after: int = 1

    def __post_init__(self) -> None:
        if self.breaks is not None and self.breaks not in BREAKS:
            raise ValueError(f"unknown fault {self.breaks!r}; known: {', '.join(BREAKS)}")


BREAKS = ("drop", "error", "not_json", "cut_line")


class FakeUpstream:
    """Replies from ``script`` in order, then ``default`` forever; records every request
    (``record=False``: none, for a long benchmark run).

    ``max_model_len``: a context window, reported by ``/v1/models`` as vLLM does; a prompt
    longer than it (counted as the usage below counts it) is refused with vLLM's 400, and
    recorded in ``refused``. ``models_status``: what ``/v1/models`` answers (a server
    without the route answers 404).
    """

    def __init__(
        self,
        script: Iterable[ScriptedReply] = (),
        default: ScriptedReply | None = None,
        max_model_len: int | None = None,
        record: bool = True,
        models_status: int = 200,
    ):
        self.script: deque[ScriptedReply] = deque(script)
        self.default = default or ScriptedReply()
        self.max_model_len = max_model_len
        self.record = record
        self.models_status = models_status
        self.requests: list[dict[str, Any]] = []
        self.refused: list[dict[str, Any]] = []
        # Requests whose connection the gateway closed before the reply ended (cancelled).
        self.aborted: list[dict[str, Any]] = []
        self._runner: web.AppRunner | None = None
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self, port: int = 0) -> FakeUpstream:
        app = web.Application(client_max_size=256 * 1024 * 1024)
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_get("/health", self._health)
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/v1/models", self._models)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        sock = socket.socket()
        sock.bind(("127.0.0.1", port))
        self.port = sock.getsockname()[1]
        site = web.SockSite(self._runner, sock)
        await site.start()
        return self

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def _health(self, request: web.Request) -> web.Response:
        return web.Response(text="")

    async def _metrics(self, request: web.Request) -> web.Response:
        return web.Response(
            text="vllm:num_requests_running 0\nvllm:num_requests_waiting 0\n"
            "vllm:kv_cache_usage_perc 0\n"
        )

    async def _models(self, request: web.Request) -> web.Response:
        if self.models_status != 200:
            return web.json_response({"detail": "Not Found"}, status=self.models_status)
        model: dict[str, Any] = {"id": FAKE_MODEL, "object": "model"}
        if self.max_model_len is not None:
            model["max_model_len"] = self.max_model_len
        return web.json_response({"object": "list", "data": [model]})

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        prompt_tokens = self.prompt_tokens(body)
        if self.max_model_len is not None and prompt_tokens > self.max_model_len:
            if self.record:
                self.refused.append(body)
            message = (
                f"This model's maximum context length is {self.max_model_len} tokens. However,"
                f" your prompt contains {prompt_tokens} input tokens, which exceeds this limit"
                " even without any output tokens. Please reduce the length of the input prompt."
            )
            return web.json_response(
                {"error": {"message": message, "type": "BadRequestError"}}, status=400
            )
        if self.record:
            self.requests.append(body)
        reply = self.script.popleft() if self.script else self.default
        if reply.status != 200:
            return web.json_response(
                {"error": {"message": reply.error_message, "type": "BadRequestError"}},
                status=reply.status,
            )
        resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
        try:
            before = reply.first_chunk_delay_s + reply.prefill_s_per_token * prompt_tokens
            if before:
                await self._pause(request, before)
            await resp.prepare(request)
            for i, chunk in enumerate(self.chunks(reply, prompt_tokens=prompt_tokens)):
                if i and reply.chunk_delay_s:
                    await self._pause(request, reply.chunk_delay_s)
                line = f"data: {json.dumps(chunk)}\n\n".encode()
                if i == reply.breaks_after and reply.breaks is not None:
                    await self._break(request, resp, reply.breaks, line)
                    return resp
                await resp.write(line)
            await resp.write(b"data: [DONE]\n\n")
            await resp.write_eof()
        except ConnectionError:
            if self.record:
                self.aborted.append(body)
        return resp

    @staticmethod
    async def _break(
        request: web.Request, resp: web.StreamResponse, fault: str, line: bytes
    ) -> None:
        """End the reply with ``fault`` (``ScriptedReply.breaks``) where ``line`` was next."""
        if fault == "drop":
            assert request.transport is not None
            request.transport.abort()
            return
        if fault == "error":
            error = {"error": {"message": "engine failed", "type": "InternalServerError"}}
            await resp.write(f"data: {json.dumps(error)}\n\n".encode())
        elif fault == "not_json":
            await resp.write(b"data: {this is not json\n\n")
        else:  # cut_line
            await resp.write(line[: len(line) // 2])
        await resp.write_eof()

    @staticmethod
    async def _pause(request: web.Request, seconds: float) -> None:
        """Sleep, but notice a closed connection as a real engine does (it aborts then)."""
        deadline = asyncio.get_running_loop().time() + seconds
        while asyncio.get_running_loop().time() < deadline:
            if request.transport is None or request.transport.is_closing():
                raise ConnectionResetError("the client closed the connection")
            await asyncio.sleep(0.01)

    @staticmethod
    def prompt_tokens(body: dict[str, Any]) -> int:
        """The fake's token count of a request: a quarter of its messages' JSON."""
        return len(json.dumps(body["messages"])) // 4

    @staticmethod
    def chunks(reply: ScriptedReply, prompt_tokens: int) -> list[dict[str, Any]]:
        base = {
            "id": "chatcmpl-fake",
            "object": "chat.completion.chunk",
            "created": 0,
            "model": FAKE_MODEL,
        }

        def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
            return {**base, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}

        out = [chunk({"role": "assistant", "content": ""})]
        text = reply.content
        for start in range(0, len(text), reply.chunk_chars):
            out.append(chunk({"content": text[start : start + reply.chunk_chars]}))
        for index, (name, arguments) in enumerate(reply.tool_calls):
            out.append(
                chunk(
                    {
                        "tool_calls": [
                            {
                                "index": index,
                                "id": f"call_fake_{index}",
                                "type": "function",
                                "function": {"name": name, "arguments": ""},
                            }
                        ]
                    }
                )
            )
            half = len(arguments) // 2
            for piece in (arguments[:half], arguments[half:]):
                out.append(
                    chunk({"tool_calls": [{"index": index, "function": {"arguments": piece}}]})
                )
        out.append(chunk({}, "tool_calls" if reply.tool_calls else "stop"))
        out.append(
            {
                **base,
                "choices": [],
                "usage": {
                    "prompt_tokens": prompt_tokens,
                    "completion_tokens": len(text) // 4 + 1,
                    "total_tokens": prompt_tokens + len(text) // 4 + 1,
                    "prompt_tokens_details": {"cached_tokens": 0},
                },
            }
        )
        return out


async def serve_forever(port: int) -> None:
    """``python -m loadtests.fake_upstream PORT``: an instant fake upstream for benchmarks.

    It records nothing: kept bodies grew its heap by every history of the run, and its
    collector's pauses (up to 160 ms) landed in the benchmarks' added-latency samples."""
    await FakeUpstream(record=False).start(port)
    await asyncio.Event().wait()


if __name__ == "__main__":
    import sys

    asyncio.run(serve_forever(int(sys.argv[1])))
