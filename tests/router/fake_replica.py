"""A fake vLLM replica: a real aiohttp server whose answers the test controls."""

from __future__ import annotations

import asyncio

from aiohttp import web


def vllm_metrics_text(running: float = 0, waiting: float = 0, kv: float = 0.0) -> str:
    """A minimal vLLM V1 /metrics page."""
    labels = '{engine="0",model_name="tiny"}'
    return (
        "# TYPE vllm:num_requests_running gauge\n"
        f"vllm:num_requests_running{labels} {running}\n"
        "# TYPE vllm:num_requests_waiting gauge\n"
        f"vllm:num_requests_waiting{labels} {waiting}\n"
        "# TYPE vllm:kv_cache_usage_perc gauge\n"
        f"vllm:kv_cache_usage_perc{labels} {kv}\n"
    )


class FakeReplica:
    """A real aiohttp server on a free port whose /health, /metrics and completion answers
    the test controls: fault injection for the pool and failover tests."""

    def __init__(self) -> None:
        self.health_status = 200
        self.health_delay_s = 0.0
        # CPU work on the event loop before /health answers: the server shares the test's
        # loop, so this stalls the prober's process too, as a gateway's own pipeline does.
        self.health_loop_stall_s = 0.0
        self.metrics_text = vllm_metrics_text()
        self.completion_status = 200
        self.completion_calls = 0
        self._runner: web.AppRunner | None = None
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self) -> None:
        app = web.Application()
        app.router.add_get("/health", self._health)
        app.router.add_get("/metrics", self._metrics)
        app.router.add_post("/v1/completions", self._completion)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", self.port)
        await site.start()
        self.port = self._runner.addresses[0][1]

    async def stop(self) -> None:
        """Take the server down: further connections are refused."""
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def _health(self, request: web.Request) -> web.Response:
        await asyncio.sleep(self.health_delay_s)
        loop = asyncio.get_running_loop()
        busy_until = loop.time() + self.health_loop_stall_s
        while loop.time() < busy_until:
            pass
        return web.Response(status=self.health_status)

    async def _metrics(self, request: web.Request) -> web.Response:
        return web.Response(text=self.metrics_text)

    async def _completion(self, request: web.Request) -> web.Response:
        self.completion_calls += 1
        return web.json_response({"replica": self.url}, status=self.completion_status)
