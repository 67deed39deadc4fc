"""What the store keeps of a session driven through the gateway."""

from __future__ import annotations

from tests.gateway.conftest import store_at


def anthropic_turns(n: int, *, marked: int) -> list[dict]:
    """``n`` user/assistant exchanges; ``cache_control`` on message ``marked`` only, as
    Claude Code marks its newest block each turn."""
    messages = []
    for i in range(n):
        messages.append({"role": "user", "content": [{"type": "text", "text": f"question {i}"}]})
        messages.append({"role": "assistant", "content": [{"type": "text", "text": f"answer {i}"}]})
    messages.append({"role": "user", "content": [{"type": "text", "text": f"question {n}"}]})
    block = messages[marked]["content"][0]
    block["cache_control"] = {"type": "ephemeral"}
    return messages


async def test_moving_cache_control_does_not_fork_the_history(gateway_with_fake, client, store_url):
    async with gateway_with_fake() as (url, fake):
        for step in range(1, 4):
            messages = anthropic_turns(step, marked=2 * step)
            body = {"model": "m", "max_tokens": 8, "messages": messages}
            resp = await client.post(
                f"{url}/v1/messages", json=body, headers={"x-session-id": "cc"}
            )
            assert resp.status_code == 200, resp.text
        assert len(fake.requests) == 3
    async with store_at(store_url) as store:
        stored = await store.load("default", "cc")
        assert stored.branch_id == 0 and stored.parent is None
        assert len(stored.messages) == 7
        totals = await store.get_counts("default", "cc", 0)
        assert totals["requests"] == 3
        assert totals["upstream_prompt_tokens"] > 0 and totals["raw_tokens"] > 0
        assert 0 < totals["last_prompt_tokens"] <= totals["upstream_prompt_tokens"]


async def test_a_diverging_history_is_kept_as_a_new_branch(gateway_with_fake, client, store_url):
    base = [{"role": "user", "content": "task"}, {"role": "assistant", "content": "plan A"}]
    async with gateway_with_fake() as (url, _fake):
        for history in (
            [*base, {"role": "user", "content": "go on"}],
            [
                base[0],
                {"role": "assistant", "content": "plan B"},
                {"role": "user", "content": "go"},
            ],
        ):
            resp = await client.post(
                f"{url}/v1/chat/completions",
                json={"model": "m", "messages": history},
                headers={"x-session-id": "fork"},
            )
            assert resp.status_code == 200
    async with store_at(store_url) as store:
        first = await store.load("default", "fork", 0)
        second = await store.load("default", "fork", 1)
        assert [m["parts"][0]["text"] for m in first.messages] == ["task", "plan A", "go on"]
        assert second.parent == 0 and second.fork_index == 1
        assert [m["parts"][0]["text"] for m in second.messages] == ["task", "plan B", "go"]


async def test_sticky_cost_routes_with_the_sessions_accounting(
    gateway_with_fake, client, store_url
):
    """The cost-aware policy serves a session through the gateway and keeps it on its
    replica; the gateway reads the session's last prompt from its accounting for it."""
    async with gateway_with_fake(policy="sticky_cost", debug=True) as (url, fake):
        for step in range(1, 4):
            body = {"model": "m", "max_tokens": 8, "messages": anthropic_turns(step, marked=1)}
            resp = await client.post(
                f"{url}/v1/messages", json=body, headers={"x-session-id": "cost"}
            )
            assert resp.status_code == 200, resp.text
            assert resp.headers["x-foldgate-replica"] == fake.url
        assert len(fake.requests) == 3
    async with store_at(store_url) as store:
        assert (await store.get_counts("default", "cost", 0))["last_prompt_tokens"] > 0
        assert await store.get_assignment("default", "cost") == fake.url
