"""``context_management`` on /v1/messages through the request path, against a scripted FAKE
upstream that records what the gateway sent: the edits reach the rendered context only,
the reply carries ``applied_edits`` (whole, and on the stream's final ``message_delta``),
a cleared result is restored inside the gateway, and a bad edit is a 400 storing nothing."""

from __future__ import annotations

import json

import pytest

from gateway.dialects.anthropic_context import CLEAR_THINKING, CLEAR_TOOL_USES
from loadtests.fake_upstream import ScriptedReply
from tests.fold.test_context_edits import CALLS, claude_code_body
from tests.gateway.conftest import store_at

HEADERS = {"x-session-id": "cm1", "anthropic-beta": "context-management-2025-06-27"}
CLEAR_ALL_BUT_TWO = {
    "type": CLEAR_TOOL_USES,
    "trigger": {"type": "input_tokens", "value": 1000},
    "keep": {"type": "tool_uses", "value": 2},
}


def events(text: str) -> list[tuple[str, dict]]:
    out, name = [], None
    for line in text.splitlines():
        if line.startswith("event: "):
            name = line[7:]
        elif line.startswith("data: "):
            out.append((name, json.loads(line[6:])))
    return out


def tool_contents(request: dict) -> list[str]:
    return [m["content"] for m in request["messages"] if m["role"] == "tool"]


@pytest.mark.parametrize("stream", [False, True])
async def test_applied_edits_in_the_reply_and_only_in_the_rendering(
    gateway_with_fake, client, store_url, stream
):
    edits = [
        {"type": CLEAR_THINKING, "keep": {"type": "thinking_turns", "value": 1}},
        CLEAR_ALL_BUT_TWO,
    ]
    body = {**claude_code_body(), "context_management": {"edits": edits}, "stream": stream}
    async with gateway_with_fake([ScriptedReply("Fixed.")]) as (url, fake):
        resp = await client.post(f"{url}/v1/messages", json=body, headers=HEADERS)
        assert resp.status_code == 200, resp.text
        if stream:
            deltas = [d for e, d in events(resp.text) if e == "message_delta"]
            assert len(deltas) == 1
            managed = deltas[0]["context_management"]
        else:
            managed = resp.json()["context_management"]
        applied = managed["applied_edits"]
        assert [e["type"] for e in applied] == [CLEAR_THINKING, CLEAR_TOOL_USES]
        assert applied[0]["cleared_thinking_turns"] == 4
        assert applied[1]["cleared_tool_uses"] == 3
        assert all(e["cleared_input_tokens"] > 0 for e in applied)
        (sent,) = fake.requests
        contents = tool_contents(sent)
        assert all(
            c.startswith(f"[{CALLS[s][0]} result cleared") for s, c in enumerate(contents[:3])
        )
        assert contents[3:] == [c[2] for c in CALLS[3:]]
        assert [t["function"]["name"] for t in sent["tools"]][-1] == "restore"
        assert "context_management" not in sent
    async with store_at(store_url) as store:
        stored = await store.load("default", "cm1")
        texts = [m["parts"][0]["text"] for m in stored.messages if m["role"] == "tool"]
        assert texts == [c[2] for c in CALLS]  # the history keeps every byte


async def test_no_edit_applied_is_an_empty_list(gateway_with_fake, client):
    body = {**claude_code_body(), "context_management": {"edits": [{"type": CLEAR_TOOL_USES}]}}
    async with gateway_with_fake([ScriptedReply("ok")]) as (url, fake):
        resp = await client.post(f"{url}/v1/messages", json=body, headers=HEADERS)
        assert resp.status_code == 200, resp.text
        assert resp.json()["context_management"] == {"applied_edits": []}
        assert tool_contents(fake.requests[0]) == [c[2] for c in CALLS]
        resp = await client.post(f"{url}/v1/messages", json=claude_code_body(), headers=HEADERS)
        assert "context_management" not in resp.json()


async def test_a_cleared_result_is_restored_inside_the_gateway(gateway_with_fake, client):
    script = [
        ScriptedReply("", tool_calls=[("restore", '{"steps": "1"}')]),
        ScriptedReply("Seen it."),
    ]
    body = {**claude_code_body(), "context_management": {"edits": [CLEAR_ALL_BUT_TWO]}}
    async with gateway_with_fake(script) as (url, fake):
        resp = await client.post(f"{url}/v1/messages", json=body, headers=HEADERS)
        assert resp.status_code == 200, resp.text
        assert [b["type"] for b in resp.json()["content"]] == ["text"]
        assert len(fake.requests) == 2
        again = fake.requests[1]["messages"]
        assert again[-2]["tool_calls"][0]["function"]["name"] == "restore"
        assert again[-1]["content"] == f"[restored step 1]\n{CALLS[1][2]}"


async def test_a_bad_edit_is_a_400_that_stores_nothing(gateway_with_fake, client, store_url):
    body = {**claude_code_body(), "context_management": {"edits": [{"type": "clear_all_20990101"}]}}
    async with gateway_with_fake() as (url, fake):
        resp = await client.post(f"{url}/v1/messages", json=body, headers=HEADERS)
        assert resp.status_code == 400
        err = resp.json()
        assert err["type"] == "error" and err["error"]["type"] == "invalid_request_error"
        assert "context_management.edits[0].type" in err["error"]["message"]
        assert fake.requests == []
    async with store_at(store_url) as store:
        assert await store.list_sessions("default") == []
