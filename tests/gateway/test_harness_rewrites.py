"""Re-sent histories that the harness itself shortened or restarted, in the harnesses' real
shapes, through the request path against a scripted FAKE upstream that records what the
gateway sent: Claude Code's microcompaction continues its branch with the replica's prefix
intact, a compaction summary keeps its session, and provider compaction items pass
through byte for byte."""

from __future__ import annotations

import copy

from loadtests.fake_upstream import ScriptedReply
from store.branches import MICROCOMPACTED, microcompacted
from tests.fold.test_context_edits import CALLS, claude_code_body
from tests.gateway.conftest import store_at

# Claude Code names its session in metadata.user_id (2.1: user_<hash>_account_..._session_<id>)
USER_ID = "user_5e1f_account_3c9a_session_0b7d2f0e-6c1a-4f55-9d5e-2f3b0a1c9e77"
# Claude Code's compaction summary, as the recorded sessions' first user message after one
COMPACTION_SUMMARY = (
    "This session is being continued from a previous conversation that ran out of context. "
    "The summary below covers the earlier portion of the conversation.\n\nAnalysis:\n"
    "1. The user asked to fix the failing tests in app.py ..."
)


def with_session(body: dict) -> dict:
    return {**body, "metadata": {"user_id": USER_ID}}


def microcompacted_resend(body: dict, cleared: int) -> dict:
    """``body`` as Claude Code re-sends it after microcompaction: the first ``cleared`` tool
    results' content replaced by the placeholder, a new user turn appended."""
    resend = copy.deepcopy(body)
    seen = 0
    for message in resend["messages"]:
        for block in message["content"] if isinstance(message["content"], list) else ():
            if block.get("type") == "tool_result" and seen < cleared:
                block["content"] = MICROCOMPACTED
                seen += 1
    resend["messages"].append({"role": "assistant", "content": [{"type": "text", "text": "Done."}]})
    resend["messages"].append(
        {"role": "user", "content": [{"type": "text", "text": "Now the docs."}]}
    )
    return resend


async def test_a_microcompacted_resend_continues_its_branch(gateway_with_fake, client, store_url):
    first = with_session(claude_code_body())
    second = microcompacted_resend(first, cleared=3)
    async with gateway_with_fake([ScriptedReply("ok"), ScriptedReply("ok")]) as (url, fake):
        for body in (first, second):
            resp = await client.post(f"{url}/v1/messages", json=body)
            assert resp.status_code == 200, resp.text
        sent_first, sent_second = fake.requests
        # The replica is sent what it holds, then only the new turns.
        n = len(sent_first["messages"])
        assert sent_second["messages"][:n] == sent_first["messages"]
        assert len(sent_second["messages"]) == n + 2
    async with store_at(store_url) as store:
        (session,) = await store.list_sessions("default")
        stored = await store.load("default", session)
        assert stored.parent is None and stored.fork_index == 0  # the branch continued
        tool_texts = [m["parts"][0]["text"] for m in stored.messages if m["role"] == "tool"]
        assert tool_texts == [c[2] for c in CALLS]  # every result's bytes, none replaced
        assert len(stored.messages) == n + 2


def test_only_a_placeholder_for_the_same_call_is_recognised() -> None:
    stored = [
        {"role": "tool", "tool_call_id": "toolu_1", "parts": [{"type": "text", "text": "out"}]},
        {"role": "tool", "tool_call_id": "toolu_2", "parts": [{"type": "text", "text": "out2"}]},
    ]
    placeholder = [{"type": "text", "text": MICROCOMPACTED}]
    sent = [
        {"role": "tool", "tool_call_id": "toolu_1", "parts": placeholder},
        {"role": "tool", "tool_call_id": "toolu_9", "parts": placeholder},
        {"role": "tool", "tool_call_id": "toolu_3", "parts": placeholder},
    ]
    assert microcompacted(sent, stored) == [0]


async def test_a_compaction_summary_keeps_its_session_and_prefix(
    gateway_with_fake, client, store_url
):
    first = with_session(claude_code_body())
    compacted = {
        **first,
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": COMPACTION_SUMMARY}]},
            {"role": "assistant", "content": [{"type": "text", "text": "Continuing."}]},
            {"role": "user", "content": [{"type": "text", "text": "Go on."}]},
        ],
    }
    async with gateway_with_fake([ScriptedReply("ok"), ScriptedReply("ok")]) as (url, fake):
        for body in (first, compacted):
            resp = await client.post(f"{url}/v1/messages", json=body)
            assert resp.status_code == 200, resp.text
        sent_first, sent_second = fake.requests
        # The system prompt and tools, which the replica holds, lead both requests.
        assert sent_second["messages"][0] == sent_first["messages"][0]
        assert sent_second["tools"] == sent_first["tools"]
        assert sent_second["messages"][1]["content"] == COMPACTION_SUMMARY
    async with store_at(store_url) as store:
        (session,) = await store.list_sessions("default")
        head = await store.load("default", session)
        # A branch of the session from the shared system prompt; the old branch is kept whole.
        assert head.parent is not None and head.fork_index == 1
        old = await store.load("default", session, head.parent)
        assert len(old.messages) == 1 + 2 * len(CALLS) + 1


ANTHROPIC_COMPACTION = {
    "type": "compaction",
    "content": "Summary: the tests in app.py fail on an off-by-one in main(); fixed in util.py.",
    "signature": "EqQBCkYIBxgCKkD9cm9tIHRoZSBwcm92aWRlcg==",
    "cache_control": {"type": "ephemeral"},
}


async def test_an_anthropic_compaction_block_passes_through(gateway_with_fake, client, store_url):
    body = with_session(
        {
            **claude_code_body(0),
            "messages": [
                {"role": "user", "content": "Fix the failing tests."},
                {"role": "assistant", "content": [ANTHROPIC_COMPACTION]},
                {"role": "user", "content": "Go on."},
            ],
        }
    )
    async with gateway_with_fake([ScriptedReply("ok")]) as (url, fake):
        resp = await client.post(f"{url}/v1/messages", json=body)
        assert resp.status_code == 200, resp.text
        (sent,) = fake.requests
        # a chat model reads the summary as text
        assert sent["messages"][2]["content"] == [
            {"type": "text", "text": ANTHROPIC_COMPACTION["content"]}
        ]
    async with store_at(store_url) as store:
        (session,) = await store.list_sessions("default")
        stored = await store.load("default", session)
        # every byte of it but the cache marker, which the gateway never keeps (volatile.py)
        kept = {k: v for k, v in ANTHROPIC_COMPACTION.items() if k != "cache_control"}
        assert stored.messages[2]["parts"] == [{"type": "opaque", "data": kept}]


RESPONSES_COMPACTION = {
    "type": "compaction",
    "id": "cmp_68f1c0a2b3d4",
    "encrypted_content": "gAAAAABo8cC_Zm9sZGdhdGUgbmV2ZXIgcmVhZHMgdGhpcw==",
}


async def test_a_responses_compaction_item_passes_through(gateway_with_fake, client, store_url):
    body = {
        "model": "m",
        "prompt_cache_key": "019a4c1e-codex-thread",
        "instructions": "You are Codex.",
        "input": [
            {
                "type": "message",
                "role": "user",
                "content": [{"type": "input_text", "text": "fix it"}],
            },
            RESPONSES_COMPACTION,
            {
                "type": "message",
                "role": "user",
                "content": [{"type": "input_text", "text": "go on"}],
            },
        ],
    }
    async with gateway_with_fake([ScriptedReply("ok")]) as (url, fake):
        resp = await client.post(f"{url}/v1/responses", json=body)
        assert resp.status_code == 200, resp.text
        (sent,) = fake.requests
        assert sent["messages"][2]["role"] == "assistant"
        assert RESPONSES_COMPACTION["encrypted_content"] not in str(sent["messages"])
    async with store_at(store_url) as store:
        stored = await store.load("default", "019a4c1e-codex-thread")
        assert stored.messages[2]["parts"] == [{"type": "opaque", "data": RESPONSES_COMPACTION}]
