"""Tenants do not share a real vLLM-CPU replica's prefix cache: the gateway salts every
upstream request with its tenant (``cache_salt``), whatever salt the client sends.

One replica, so that routing cannot be what keeps the tenants apart. The same prompt is
sent by tenant A, again by A (full reuse: every whole block cached), then by B (nothing
cached), and again by B with a salt of its own choosing in the body (full reuse of B's
entry: the client's salt is replaced by B's).
"""

from __future__ import annotations

import uuid
from pathlib import Path

import httpx
import pytest

from deploy.cpu.replicas import DEFAULT_BLOCK_SIZE
from gateway.config import GatewayConfig
from gateway.tenants import hash_key
from tests.e2e.conftest import SERVED_NAME
from tests.gateway.conftest import running_gateway

pytestmark = pytest.mark.e2e

BLOCK = DEFAULT_BLOCK_SIZE


async def test_identical_prompts_share_cached_tokens_only_within_a_tenant(
    vllm_replicas: list[str], tmp_path: Path
) -> None:
    config = GatewayConfig(
        store_url=f"sqlite:///{tmp_path}/store.db",
        replicas=(vllm_replicas[0],),
        probe_interval_s=0.5,
        api_keys={hash_key("key-a"): "tenant-a", hash_key("key-b"): "tenant-b"},
        cache_salt_secret="e2e-secret",
    )
    prompt = f"{uuid.uuid4()} " + " ".join(f"line {i}: the quick brown fox" for i in range(120))
    body = {
        "model": SERVED_NAME,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": 2,
        "ignore_eos": True,
    }
    cached: dict[str, int] = {}
    prompt_tokens = 0
    async with running_gateway(config) as gw, httpx.AsyncClient(timeout=120) as client:
        for name, key, extra in (
            ("a first", "key-a", {}),
            ("a again", "key-a", {}),
            ("b", "key-b", {}),
            ("b with a client salt", "key-b", {"cache_salt": "anything"}),
        ):
            resp = await client.post(
                f"{gw}/v1/chat/completions",
                json={**body, **extra},
                headers={
                    "authorization": f"Bearer {key}",
                    "x-foldgate-strategy": "base",
                    # one session id for all: a session is the tenant's own all the same
                    "x-session-id": "same-session",
                },
            )
            assert resp.status_code == 200, resp.text
            usage = resp.json()["usage"]
            prompt_tokens = usage["prompt_tokens"]
            cached[name] = usage["prompt_tokens_details"]["cached_tokens"]
    print(f"\nprompt tokens {prompt_tokens}, cached tokens per request: {cached}")
    assert prompt_tokens > 20 * BLOCK
    assert cached["a first"] == 0
    assert cached["a again"] == (prompt_tokens - 1) // BLOCK * BLOCK  # every whole block
    assert cached["b"] == 0
    assert cached["b with a client salt"] == cached["a again"]
