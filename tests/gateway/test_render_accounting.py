"""Every token ReFold adds or removes is counted: gateway metrics and per-session totals,
against a scripted FAKE upstream (no model is needed to render)."""

from __future__ import annotations

import re

from loadtests.fake_upstream import ScriptedReply
from tests.gateway.conftest import store_at

OUTPUT = "\n".join(f"PASSED tests/test_mod.py::test_case_{i} in 0.0{i}s" for i in range(20))
TOOLS = [{"type": "function", "function": {"name": "bash", "parameters": {"type": "object"}}}]


def history(steps: int) -> list[dict]:
    messages: list[dict] = [{"role": "user", "content": "Run the tests."}]
    for i in range(steps):
        call = {"id": f"c{i}", "type": "function"}
        call["function"] = {"name": "bash", "arguments": '{"command": "pytest -q"}'}
        messages.append({"role": "assistant", "content": "running", "tool_calls": [call]})
        messages.append({"role": "tool", "tool_call_id": f"c{i}", "content": OUTPUT})
    return messages


def counter(metrics: str, kind: str) -> float:
    found = re.search(rf'^foldgate_render_tokens_total{{kind="{kind}"}} (\S+)$', metrics, re.M)
    return float(found.group(1)) if found else 0.0


async def test_stubs_and_asks_are_counted_in_metrics_and_session_totals(
    gateway_with_fake, client, store_url
) -> None:
    script = [ScriptedReply("ok")] * 3
    async with gateway_with_fake(script) as (url, fake):
        before = (await client.get(f"{url}/metrics")).text
        for steps in (1, 2, 3):
            body = {"model": "m", "messages": history(steps), "tools": TOOLS}
            resp = await client.post(
                f"{url}/v1/chat/completions", json=body, headers={"x-session-id": "acc"}
            )
            assert resp.status_code == 200, resp.text
        after = (await client.get(f"{url}/metrics")).text
        sent = [r["messages"][-1]["content"] for r in fake.requests]
    # step 0 carried the ask (first request), step 1 was a duplicate of step 0 from the start
    assert "[context protocol:" in sent[0] and "[context protocol:" not in sent[2]
    assert sent[1].startswith("[duplicate of step 0 (`pytest -q`): this entire output")
    assert counter(after, "removed_by_stubs") > counter(before, "removed_by_stubs")
    assert counter(after, "added") > counter(before, "added")  # the asks, while shown
    added = re.compile(r"^foldgate_added_latency_seconds_count (\S+)$", re.M)
    assert float(added.search(after)[1]) - float(added.search(before)[1]) == 3  # type: ignore[index]
    async with store_at(store_url) as store:
        totals = await store.get_counts("default", "acc", 0)
    assert totals["requests"] == 3
    assert totals["rendered_tokens_removed_by_stubs"] > 0


async def test_folding_is_switched_per_request_and_per_tenant(gateway_with_fake, client) -> None:
    body = {"model": "m", "messages": history(1), "tools": TOOLS}
    async with gateway_with_fake([ScriptedReply("ok")] * 3, tenant_fold={"default": "off"}) as (
        url,
        fake,
    ):
        for headers in ({"x-session-id": "t"}, {"x-session-id": "r", "x-foldgate-fold": "auto"}):
            resp = await client.post(f"{url}/v1/chat/completions", json=body, headers=headers)
            assert resp.status_code == 200, resp.text
        bad = await client.post(
            f"{url}/v1/chat/completions", json=body, headers={"x-foldgate-fold": "sometimes"}
        )
        sent = [r["messages"][-1]["content"] for r in fake.requests]
    assert sent[0] == OUTPUT  # the tenant's setting: no ask
    assert "[context protocol:" in sent[1]  # the request's header wins
    assert bad.status_code == 400 and "x-foldgate-fold" in bad.text
