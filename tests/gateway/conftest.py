"""A real gateway (uvicorn on a free port, real store) in front of the FAKE upstream."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import fields, replace
from pathlib import Path
from typing import Any

import httpx
import pytest

from deploy.cpu.replicas import free_ports
from gateway.config import GatewayConfig
from gateway.dialects.base import Dialect
from gateway.identity import identify
from gateway.pipeline import Pipeline
from gateway.request_cache import Decoded
from gateway.steps.ingest import Ingested
from loadtests.fake_upstream import FakeUpstream, ScriptedReply
from loadtests.local_servers import running_gateway
from store import open_store


async def ingest(
    pipeline: Pipeline,
    dialect: Dialect,
    body: dict[str, Any],
    headers: Mapping[str, str],
    decoded: Decoded | None = None,
) -> Ingested:
    """A request through the pipeline's decode and ingest steps, without HTTP (the slot
    admission aside); ``decoded``: instead of the pipeline's own decode."""
    caller = identify(headers, pipeline.config, pipeline.tenants, pipeline.render.spec)
    if decoded is None:
        decoded = await pipeline.decode(dialect, body, headers, caller.tenant)
    return await pipeline.ingest(caller, decoded, body, headers)


ROOT = Path(__file__).resolve().parents[2]
# A loaded 2-core CI machine can take several seconds to import and start a gateway.
PROCESS_READY_S = 60.0


def config_toml(config: GatewayConfig) -> str:
    """The config file a gateway process reads: the store, replicas, keys and tenants, and
    every other scalar field ``config`` sets to something but its default."""
    defaults = GatewayConfig()
    scalars = [
        f"{f.name} = {json.dumps(getattr(config, f.name))}"
        for f in fields(GatewayConfig)
        if f.name not in {"store_url", "probe_interval_s"}
        and isinstance(getattr(config, f.name), bool | int | float | str)
        and getattr(config, f.name) != getattr(defaults, f.name)
    ]
    lines = [
        f"store_url = {json.dumps(config.store_url)}",
        f"replicas = {json.dumps(list(config.replicas))}",
        "probe_interval_s = 0.5",
        *scalars,
        "[api_keys]",
        *(f"{json.dumps(h)} = {json.dumps(t)}" for h, t in config.api_keys.items()),
    ]
    for tenant, settings in config.tenants.items():
        lines.append(f"[tenants.{json.dumps(tenant)}]")
        lines += [f"{name} = {json.dumps(value)}" for name, value in settings.items()]
    return "\n".join(lines) + "\n"


@asynccontextmanager
async def gateway_process(
    config: GatewayConfig, tmp_path: Path, port: int | None = None
) -> AsyncIterator[tuple[str, subprocess.Popen[bytes]]]:
    """``foldgate serve`` as its own process (the serve command itself: the whole CLI would
    import the offline wing too); yields its URL and process once ``/health`` answers."""
    name = f"gw-{uuid.uuid4().hex[:6]}"
    path = tmp_path / f"{name}.toml"
    path.write_text(config_toml(config))
    port = port or free_ports(1)[0]
    serve = ["-c", "from gateway.serve import serve; serve()", f"--config={path}", f"--port={port}"]
    # Its output goes to a file, not a pipe nobody reads: a gateway logging faster than a
    # full pipe drains (every refused accept logs a traceback) would block in its logger.
    log_path = tmp_path / f"{name}.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [sys.executable, *serve],
            env={**os.environ, "PYTHONPATH": str(ROOT)},
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + PROCESS_READY_S
        async with httpx.AsyncClient() as probe:
            while True:
                if proc.poll() is not None:
                    raise RuntimeError(log_path.read_text())
                try:
                    if (await probe.get(f"{url}/health")).status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                if time.monotonic() > deadline:
                    raise TimeoutError(f"gateway process not ready in {PROCESS_READY_S:g} s")
                await asyncio.sleep(0.05)
        yield url, proc
    finally:
        if proc.poll() is None:
            proc.terminate()
        proc.wait(10)


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
