"""A real gateway (uvicorn on a free port, real store) in front of the FAKE upstream."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import replace
from pathlib import Path

import httpx
import pytest
import uvicorn

from gateway.app import create_app
from gateway.config import GatewayConfig
from gateway.http_server import uvicorn_config
from loadtests.fake_upstream import FakeUpstream, ScriptedReply
from store import open_store


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@asynccontextmanager
async def running_gateway(config: GatewayConfig) -> AsyncIterator[str]:
    """Serve ``create_app(config)`` with uvicorn until the block exits; yields its base URL."""
    port = free_port()
    server = uvicorn.Server(uvicorn_config(create_app(config), config, "127.0.0.1", port))
    task = asyncio.create_task(server.serve())
    while not server.started:
        if task.done():
            task.result()
        await asyncio.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await task


@pytest.fixture
def store_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path}/store.db"


@pytest.fixture
def gateway_with_fake(store_url: str):
    """``async with gateway_with_fake(script, **config) as (url, fake)``."""

    @asynccontextmanager
    async def start(script: list[ScriptedReply] = (), **overrides):
        fake = await FakeUpstream(script).start()
        config = replace(
            GatewayConfig(store_url=store_url, replicas=(fake.url,), probe_interval_s=0.5),
            **overrides,
        )
        try:
            async with running_gateway(config) as url:
                yield url, fake
        finally:
            await fake.stop()

    return start


@pytest.fixture
async def client() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(timeout=30) as c:
        yield c


@asynccontextmanager
async def store_at(url: str):
    store = open_store(url)
    try:
        yield store
    finally:
        await store.close()
