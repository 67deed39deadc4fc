"""POST /v1/responses through the gateway (fake upstream), driven by the unmodified OpenAI
SDK where a client would use it: stateless re-sends, ``previous_response_id``, bad input."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import openai
import pytest
from openai import AsyncOpenAI

from gateway.dialects.base import Exchange
from gateway.dialects.openai_responses import OPENAI_RESPONSES
from gateway.upstream import UpstreamError
from loadtests.fake_upstream import ScriptedReply
from tests.gateway.conftest import store_at

TOOLS = [
    {
        "type": "function",
        "name": "exec_command",
        "description": "Run a shell command.",
        "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}},
    }
]
CALL = ScriptedReply("Let me look.", [("exec_command", '{"cmd": "ls"}')])


def sdk(url: str, session: str) -> AsyncOpenAI:
    return AsyncOpenAI(
        base_url=f"{url}/v1", api_key="unused", default_headers={"x-session-id": session}
    )


async def test_create_with_a_function_tool_then_continue_by_id(gateway_with_fake, store_url):
    async with gateway_with_fake([CALL, ScriptedReply("Two files.")]) as (url, fake):
        client = sdk(url, "stateful")
        first = await client.responses.create(
            model="m", instructions="Be brief.", input="list the files", tools=TOOLS
        )
        assert first.status == "completed"
        kinds = [item.type for item in first.output]
        assert kinds == ["message", "function_call"]
        call = first.output[1]
        assert (call.name, call.arguments) == ("exec_command", '{"cmd": "ls"}')
        assert first.output_text == "Let me look."
        assert first.usage is not None and first.usage.input_tokens > 0

        # Stateful mode: only the new item, the rest comes from the store.
        second = await client.responses.create(
            model="m",
            previous_response_id=first.id,
            input=[{"type": "function_call_output", "call_id": call.call_id, "output": "a.py"}],
            tools=TOOLS,
        )
        assert second.output_text == "Two files."
        sent = fake.requests[-1]["messages"]
        assert [m["role"] for m in sent] == ["system", "user", "assistant", "tool"]
        assert "Be brief." in json.dumps(sent[0])
        assert sent[2]["tool_calls"][0]["id"] == call.call_id
        assert "a.py" in sent[3]["content"]
    async with store_at(store_url) as store:
        history = (await store.load("default", "stateful")).messages
        assert [m["role"] for m in history] == ["system", "user", "assistant", "tool"]
        assert len(await store.list_sessions("default")) == 1


async def test_streaming_create_and_the_stream_helper(gateway_with_fake):
    async with gateway_with_fake([CALL, ScriptedReply("All done.")]) as (url, _):
        client = sdk(url, "streamed")
        stream = await client.responses.create(
            model="m", input="list the files", tools=TOOLS, stream=True
        )
        events = [event async for event in stream]
        kinds = [e.type for e in events]
        assert kinds[:2] == ["response.created", "response.in_progress"]
        assert kinds[-1] == "response.completed"
        assert "response.function_call_arguments.done" in kinds
        done = [e.item for e in events if e.type == "response.output_item.done"]
        assert done[-1].type == "function_call" and done[-1].arguments == '{"cmd": "ls"}'
        final = events[-1].response
        assert final.id == events[0].response.id and final.usage is not None

        async with client.responses.stream(model="m", input="and now?") as managed:
            texts = [e.delta async for e in managed if e.type == "response.output_text.delta"]
            response = await managed.get_final_response()
        assert "".join(texts) == "All done." == response.output_text


async def test_codex_style_resends_only_append(gateway_with_fake, store_url):
    """Codex sends ``store: false`` and the whole input each step."""
    items: list[dict[str, Any]] = [
        {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "r"}]},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "go"}]},
    ]
    async with gateway_with_fake([CALL] * 4) as (url, fake):
        client = sdk(url, "codex")
        for step in range(3):
            body = {"model": "m", "input": items, "tools": TOOLS, "store": False}
            response = await client.responses.create(**body)
            assert len(fake.requests) == step + 1
            items = [
                *items,
                *(item.model_dump(exclude_none=True) for item in response.output),
                {
                    "type": "function_call_output",
                    "call_id": response.output[-1].call_id,
                    "output": f"out {step}",
                },
            ]
        again = await client.responses.create(model="m", input=items[:4], tools=TOOLS, store=False)
        assert again.status == "completed"
        with pytest.raises(openai.BadRequestError) as err:  # store: false keeps nothing
            await client.responses.create(model="m", previous_response_id=response.id, input="x")
        assert err.value.body["param"] == "previous_response_id"
        assert err.value.body["code"] == "previous_response_not_found"
    async with store_at(store_url) as store:
        stored = await store.load("default", "codex", 0)
        assert len(stored.messages) == 2 + 2 * 2  # developer, user, then two steps
        with pytest.raises(Exception, match="no branch"):
            await store.load("default", "codex", 1)  # re-sends and the shorter one: no fork


BAD = [
    ("unknown item type", {"model": "m", "input": [{"type": "telepathy"}]}),
    (
        "function_call_output without its call",
        {"model": "m", "input": [{"type": "function_call_output", "call_id": "x", "output": "r"}]},
    ),
    ("wrong type", {"model": "m", "input": "x", "max_output_tokens": "many"}),
    ("input missing", {"model": "m"}),
    ("unknown previous response", {"model": "m", "input": "x", "previous_response_id": "resp_no"}),
    # Ids the store cannot hold: a 400 naming the field, not the store's ValueError (a 500).
    ("previous response id with NUL", {"model": "m", "input": "x", "previous_response_id": "r\0"}),
    (
        "previous response id too long",
        {"model": "m", "input": "x", "previous_response_id": "r" * 600},
    ),
    ("bad params header", {"model": "m", "input": "x", "_header": "[1]"}),
    (
        "params header with an integer orjson reads as a float",
        {"model": "m", "input": "x", "_header": '{"logit_bias": {"1": 123456789012345678901}}'},
    ),
]


@pytest.mark.parametrize(("why", "body"), BAD, ids=[c[0] for c in BAD])
async def test_bad_input_is_a_4xx_in_the_responses_shape(
    gateway_with_fake, client, store_url, why, body
):
    headers = {"x-foldgate-params": body.pop("_header")} if "_header" in body else {}
    async with gateway_with_fake() as (url, fake):
        resp = await client.post(f"{url}/v1/responses", json=body, headers=headers)
        assert resp.status_code == 400, why
        error = resp.json()["error"]
        assert error["type"] == "invalid_request_error" and error["message"], why
        assert set(error) == {"message", "type", "param", "code"}
        if "previous_response_id" in body:
            assert error["param"] == "previous_response_id", why
        assert fake.requests == []
    async with store_at(store_url) as store:
        assert await store.list_sessions("default") == []


async def test_params_header_sets_fields_the_body_does_not(gateway_with_fake, client):
    header = json.dumps({"temperature": 0, "stop": ["\n"], "max_output_tokens": 99})
    body = {"model": "m", "input": "x", "max_output_tokens": 5}
    async with gateway_with_fake() as (url, fake):
        resp = await client.post(
            f"{url}/v1/responses", json=body, headers={"x-foldgate-params": header}
        )
        assert resp.status_code == 200
        sent = fake.requests[0]
        assert (sent["temperature"], sent["stop"], sent["max_tokens"]) == (0, ["\n"], 5)


async def test_an_upstream_refusal_keeps_its_code(gateway_with_fake, client):
    refusal = ScriptedReply(status=429, error_message="slow down")
    async with gateway_with_fake([refusal]) as (url, _):
        resp = await client.post(f"{url}/v1/responses", json={"model": "m", "input": "x"})
        assert resp.status_code == 429
        assert resp.json()["error"]["code"] == "rate_limit_exceeded"


async def test_a_stream_that_fails_midway_ends_with_response_failed():
    async def chunks() -> AsyncIterator[dict[str, Any]]:
        yield {"id": "c", "choices": [{"index": 0, "delta": {"content": "par"}}]}
        raise UpstreamError("connection reset", retryable=False)

    kept: list[str] = []

    async def remember(reply_id: str, reply: Any) -> None:
        kept.append(reply_id)

    frames = [
        f async for f in OPENAI_RESPONSES.stream(chunks(), Exchange({"model": "m"}, remember))
    ]
    events = [json.loads(f.decode().split("data: ", 1)[1]) for f in frames]
    assert [e["type"] for e in events][-2:] == ["response.output_text.delta", "response.failed"]
    failed = events[-1]["response"]
    assert failed["status"] == "failed" and failed["error"]["code"] == "server_error"
    assert kept == []  # a failed reply is not kept


async def test_a_restore_is_answered_inside_the_gateway(gateway_with_fake, store_url):
    """The restore loop runs for Responses clients too; they never see the restore call."""
    script = [
        ScriptedReply("", tool_calls=[("restore", '{"steps": "0"}')]),
        ScriptedReply("PROGRESS: read it\nSTALE: -\nDone."),
    ]
    items = [
        {"role": "user", "content": "fix the bug"},
        {"type": "function_call", "call_id": "c1", "name": "exec_command", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "1\timport os\n"},
    ]
    async with gateway_with_fake(script) as (url, fake):
        client = AsyncOpenAI(
            base_url=f"{url}/v1",
            api_key="unused",
            # the paper's setting: the restore tool is offered from the first request
            default_headers={"x-session-id": "restored", "x-foldgate-fold": "on"},
        )
        stream = await client.responses.create(model="m", input=items, tools=TOOLS, stream=True)
        events = [event async for event in stream]
        assert len(fake.requests) == 2  # the restore was answered, the model asked again
        assert "restored step 0" in json.dumps(fake.requests[1]["messages"])
    final = events[-1].response
    assert final.status == "completed"
    assert [item.type for item in final.output] == ["message"]  # no restore call shown
    assert final.output_text.endswith("Done.")
