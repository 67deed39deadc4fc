"""Restore inside the gateway, against a scripted FAKE upstream that asks for a restore."""

from __future__ import annotations

import json

import pytest

from loadtests.fake_upstream import ScriptedReply
from tests.gateway.conftest import store_at

FILE_TEXT = "     1\timport os\n     2\tprint(os.getcwd())\n"
TOOLS = [{"type": "function", "function": {"name": "bash", "parameters": {"type": "object"}}}]


def tool_history() -> list[dict]:
    return [
        {"role": "system", "content": "You are a coding agent."},
        {"role": "user", "content": "Fix the bug."},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "bash", "arguments": '{"cmd": "cat -n a.py"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": FILE_TEXT},
    ]


def text_history() -> list[dict]:
    return [
        {"role": "system", "content": "You are a coding agent. Reply with one bash block."},
        {"role": "user", "content": "Fix the bug."},
        {"role": "assistant", "content": "Look at it.\n```bash\ncat -n a.py\n```"},
        {"role": "user", "content": FILE_TEXT},
    ]


def sse_chunks(text: str) -> list[dict]:
    out = []
    for line in text.splitlines():
        if line.startswith("data: ") and line != "data: [DONE]":
            out.append(json.loads(line[6:]))
    return out


@pytest.mark.parametrize("stream", [False, True])
async def test_tool_restore_is_answered_inside_the_gateway(
    gateway_with_fake, client, store_url, stream
):
    script = [
        ScriptedReply("", tool_calls=[("restore", '{"steps": "0"}')]),
        ScriptedReply("PROGRESS: read a.py\nSTALE: -\nAll done."),
    ]
    async with gateway_with_fake(script) as (url, fake):
        body = {"model": "m", "messages": tool_history(), "tools": TOOLS, "stream": stream}
        resp = await client.post(
            f"{url}/v1/chat/completions",
            json=body,
            # the paper's setting: the restore tool is offered from the first request
            headers={"x-session-id": "s1", "x-foldgate-fold": "on"},
        )
        assert resp.status_code == 200, resp.text
        if stream:
            chunks = sse_chunks(resp.text)
            text = "".join(
                c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"]
            )
            calls = [
                c for c in chunks if c["choices"] and c["choices"][0]["delta"].get("tool_calls")
            ]
            finish = [
                c["choices"][0]["finish_reason"]
                for c in chunks
                if c["choices"] and c["choices"][0]["finish_reason"]
            ]
            assert calls == []
            assert finish == ["stop"]
        else:
            message = resp.json()["choices"][0]["message"]
            text = message["content"]
            assert not message.get("tool_calls")
            assert resp.json()["choices"][0]["finish_reason"] == "stop"
        assert text.endswith("All done.")
        assert len(fake.requests) == 2
        offered = [t["function"]["name"] for t in fake.requests[0]["tools"]]
        assert offered == ["bash", "restore"]
        second = fake.requests[1]["messages"]
        assert second[-2]["tool_calls"][0]["function"]["name"] == "restore"
        assert second[-1]["role"] == "tool" and FILE_TEXT in second[-1]["content"]
    async with store_at(store_url) as store:
        stored = await store.load("default", "s1")
        assert len(stored.messages) == 4
        turns = stored.gateway_turns[3]
        assert [t["role"] for t in turns] == ["assistant", "tool"]
        assert FILE_TEXT in turns[1]["parts"][0]["text"]


@pytest.mark.parametrize("stream", [False, True])
async def test_text_action_restore_never_reaches_the_harness(
    gateway_with_fake, client, store_url, stream
):
    script = [
        ScriptedReply("Let me see it again.\n```bash\nrestore 0\n```"),
        ScriptedReply("Now I know.\n```bash\necho fixed\n```"),
    ]
    async with gateway_with_fake(script) as (url, fake):
        body = {"model": "m", "messages": text_history(), "stream": stream}
        resp = await client.post(
            f"{url}/v1/chat/completions",
            json=body,
            headers={"x-session-id": "t1", "x-foldgate-fold": "on"},
        )
        assert resp.status_code == 200, resp.text
        if stream:
            text = "".join(
                c["choices"][0]["delta"].get("content") or ""
                for c in sse_chunks(resp.text)
                if c["choices"]
            )
        else:
            text = resp.json()["choices"][0]["message"]["content"]
        assert "restore" not in text
        assert text == "Let me see it again.\nNow I know.\n```bash\necho fixed\n```"
        second = fake.requests[1]["messages"]
        assert second[-2] == {"role": "assistant", "content": "```bash\nrestore 0\n```"}
        assert FILE_TEXT in second[-1]["content"]
    async with store_at(store_url) as store:
        stored = await store.load("default", "t1")
        assert [t["role"] for t in stored.gateway_turns[3]] == ["assistant", "user"]


async def test_anthropic_streaming_restore(gateway_with_fake, client, store_url):
    script = [
        ScriptedReply("", tool_calls=[("restore", '{"steps": "0"}')]),
        ScriptedReply("Done."),
    ]
    body = {
        "model": "m",
        "max_tokens": 64,
        "stream": True,
        "system": "You are a coding agent.",
        "tools": [{"name": "bash", "input_schema": {"type": "object"}}],
        "messages": [
            {"role": "user", "content": "Fix the bug."},
            {
                "role": "assistant",
                "content": [
                    {"type": "tool_use", "id": "tu_1", "name": "bash", "input": {"cmd": "cat"}}
                ],
            },
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": "tu_1", "content": FILE_TEXT}],
            },
        ],
    }
    async with gateway_with_fake(script) as (url, fake):
        resp = await client.post(
            f"{url}/v1/messages", json=body, headers={"x-session-id": "a1", "x-foldgate-fold": "on"}
        )
        assert resp.status_code == 200, resp.text
        events = [line[7:] for line in resp.text.splitlines() if line.startswith("event: ")]
        assert events[0] == "message_start" and events[-1] == "message_stop"
        assert "tool_use" not in resp.text
        assert '"stop_reason":"end_turn"' in resp.text
        assert len(fake.requests) == 2


async def test_restore_loop_is_bounded(gateway_with_fake, client):
    script = [ScriptedReply("", tool_calls=[("restore", '{"steps": "0"}')]) for _ in range(10)]
    async with gateway_with_fake(script, max_restores=3) as (url, fake):
        body = {"model": "m", "messages": tool_history(), "tools": TOOLS}
        resp = await client.post(
            f"{url}/v1/chat/completions", json=body, headers={"x-foldgate-fold": "on"}
        )
        assert resp.status_code == 200
        assert len(fake.requests) == 4
        assert not resp.json()["choices"][0]["message"].get("tool_calls")


async def test_mixed_reply_passes_other_calls_and_records_restore(
    gateway_with_fake, client, store_url
):
    script = [
        ScriptedReply("", tool_calls=[("bash", '{"cmd": "ls"}'), ("restore", '{"steps": "0"}')]),
        ScriptedReply("next"),
    ]
    async with gateway_with_fake(script) as (url, fake):
        body = {"model": "m", "messages": tool_history(), "tools": TOOLS}
        resp = await client.post(
            f"{url}/v1/chat/completions",
            json=body,
            headers={"x-session-id": "m1", "x-foldgate-fold": "on"},
        )
        calls = resp.json()["choices"][0]["message"]["tool_calls"]
        assert [c["function"]["name"] for c in calls] == ["bash"]
        assert resp.json()["choices"][0]["finish_reason"] == "tool_calls"
        assert len(fake.requests) == 1
        nxt = [
            *tool_history(),
            resp.json()["choices"][0]["message"],
            {"role": "tool", "tool_call_id": calls[0]["id"], "content": "a.py"},
        ]
        resp = await client.post(
            f"{url}/v1/chat/completions",
            json={"model": "m", "messages": nxt, "tools": TOOLS},
            headers={"x-session-id": "m1", "x-foldgate-fold": "on"},
        )
        assert resp.status_code == 200
        sent = fake.requests[1]["messages"]
        assert any(m["role"] == "tool" and FILE_TEXT in (m["content"] or "") for m in sent[4:])


HARNESS_RESTORE = {
    "type": "function",
    "function": {"name": "restore", "parameters": {"type": "object"}},
}


@pytest.mark.parametrize("strategy", ["base", "refold"])
async def test_a_harness_tool_named_restore_goes_to_the_harness(
    gateway_with_fake, client, strategy
):
    # The harness's own `restore` (e.g. restoring a backup) is its tool, never the gateway's.
    script = [ScriptedReply("", tool_calls=[("restore", '{"path": "a.py"}')])]
    async with gateway_with_fake(script) as (url, fake):
        body = {"model": "m", "messages": tool_history(), "tools": [*TOOLS, HARNESS_RESTORE]}
        headers = {"x-foldgate-strategy": strategy, "x-foldgate-fold": "on"}
        resp = await client.post(f"{url}/v1/chat/completions", json=body, headers=headers)
        assert resp.status_code == 200, resp.text
        calls = resp.json()["choices"][0]["message"]["tool_calls"]
        assert [(c["function"]["name"], c["function"]["arguments"]) for c in calls] == [
            ("restore", '{"path": "a.py"}')
        ]
        assert len(fake.requests) == 1
        offered = [t["function"]["name"] for t in fake.requests[0]["tools"]]
        # ReFold's own tool, offered from the first request in this setting, takes a name
        # the harness does not use.
        assert offered == (
            ["bash", "restore", "foldgate_restore"] if strategy == "refold" else ["bash", "restore"]
        )


async def test_the_gateways_renamed_restore_tool_is_answered(gateway_with_fake, client):
    script = [
        ScriptedReply("", tool_calls=[("foldgate_restore", '{"steps": "0"}')]),
        ScriptedReply("Done."),
    ]
    async with gateway_with_fake(script) as (url, fake):
        body = {"model": "m", "messages": tool_history(), "tools": [*TOOLS, HARNESS_RESTORE]}
        resp = await client.post(
            f"{url}/v1/chat/completions", json=body, headers={"x-foldgate-fold": "on"}
        )
        assert resp.status_code == 200, resp.text
        assert resp.json()["choices"][0]["message"]["content"] == "Done."
        assert len(fake.requests) == 2
        assert FILE_TEXT in fake.requests[1]["messages"][-1]["content"]


@pytest.mark.parametrize("strategy", ["base", "cliff", "refold"])
async def test_a_restore_the_gateway_never_offered_reaches_the_harness(
    gateway_with_fake, client, strategy
):
    # Nothing offered a restore (base; or refold asking nothing yet, nothing folded): a
    # text reply that is just a `restore 0` block, or a call of a tool that was never
    # offered, is the model's own and goes to the harness unchanged.
    text_script = [ScriptedReply("```bash\nrestore 0\n```")]
    async with gateway_with_fake(text_script, budget=100_000) as (url, fake):
        body = {"model": "m", "messages": text_history()}
        resp = await client.post(
            f"{url}/v1/chat/completions",
            json=body,
            headers={"x-foldgate-strategy": strategy, "x-foldgate-fold": "off"},
        )
        assert resp.status_code == 200, resp.text
        assert resp.json()["choices"][0]["message"]["content"] == "```bash\nrestore 0\n```"
        assert len(fake.requests) == 1
    tool_script = [ScriptedReply("", tool_calls=[("restore", '{"steps": "0"}')])]
    async with gateway_with_fake(tool_script, budget=100_000) as (url, fake):
        body = {"model": "m", "messages": tool_history(), "tools": TOOLS}
        resp = await client.post(
            f"{url}/v1/chat/completions",
            json=body,
            headers={"x-foldgate-strategy": strategy, "x-foldgate-fold": "off"},
        )
        assert resp.status_code == 200, resp.text
        calls = resp.json()["choices"][0]["message"]["tool_calls"]
        assert [c["function"]["name"] for c in calls] == ["restore"]
        assert len(fake.requests) == 1
