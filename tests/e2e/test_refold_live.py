"""ReFold is never a net cost on the real path: the same session replayed through the gateway
to real vLLM-CPU replicas, once with ``refold`` (the default) and once with ``base``.

Measured with vLLM's own ``usage`` per request (prompt tokens, prefix-cached tokens): over
the whole session ReFold sends no more prompt tokens than base, and the share served from
the prefix cache stays within 2 points of base's. The tiny model never follows the fold
protocol, so this is the common case: the asks go unanswered and leave the rendering, and
what remains is deduplication at arrival, which never rewrites the cached prefix.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import openai
import pytest

from gateway.config import GatewayConfig
from tests.e2e.conftest import SERVED_NAME
from tests.e2e.trajectory_fixture import Trajectory, make_trajectory, record_figures
from tests.gateway.conftest import running_gateway

pytestmark = pytest.mark.e2e

MAX_TOKENS = 8


async def replay(client: openai.AsyncOpenAI, traj: Trajectory, strategy: str) -> list[int]:
    """Every request of the session, streamed; [prompt tokens, cached tokens] summed."""
    totals = [0, 0]
    for upto in range(len(traj.steps) + 1):
        stream = await client.chat.completions.create(
            model=SERVED_NAME,
            messages=traj.openai_messages(upto),
            tools=traj.openai_tools(),
            max_tokens=MAX_TOKENS,
            stream=True,
            stream_options={"include_usage": True},
            extra_body={"ignore_eos": True},
            extra_headers={"x-foldgate-strategy": strategy, "x-session-id": traj.tag},
        )
        usage = [chunk.usage async for chunk in stream if chunk.usage is not None][-1]
        totals[0] += usage.prompt_tokens
        totals[1] += (
            usage.prompt_tokens_details and usage.prompt_tokens_details.cached_tokens
        ) or 0
    return totals


async def test_refold_sends_no_more_than_base_and_keeps_the_cache(
    vllm_replicas: list[str], tmp_path: Path
) -> None:
    run = uuid.uuid4().hex[:12]
    # Same-length tags: the two sessions differ only in their tag, never share a prefix.
    refold_traj, base_traj = make_trajectory(f"rf-{run}"), make_trajectory(f"bs-{run}")
    cfg = GatewayConfig(
        store_url=f"sqlite:///{tmp_path}/store.db",
        replicas=tuple(vllm_replicas),
        probe_interval_s=0.5,
    )
    async with running_gateway(cfg) as gw:
        client = openai.AsyncOpenAI(base_url=f"{gw}/v1", api_key="x", max_retries=0, timeout=120)
        async with client:
            refold = await replay(client, refold_traj, "refold")
            base = await replay(client, base_traj, "base")
    share = {
        name: cached / prompt for name, (prompt, cached) in (("refold", refold), ("base", base))
    }
    record_figures(
        "refold_live",
        {
            "vllm_prompt_tokens_refold": refold[0],
            "vllm_prompt_tokens_base": base[0],
            "cached_share_refold": round(share["refold"], 4),
            "cached_share_base": round(share["base"], 4),
        },
    )
    assert refold[0] <= base[0], (refold, base)
    assert share["refold"] >= share["base"] - 0.02, share
