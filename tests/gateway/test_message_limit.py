"""``max_messages``: a request's conversation items are counted before any is decoded; one
over the limit is a 413 in the dialect's shape naming the limit, and stores nothing."""

from __future__ import annotations

import pytest

from tests.gateway.conftest import store_at

LIMIT = 3  # odd: the conversation at the limit ends with the user


def chat(n: int) -> dict:
    roles = ["user", "assistant"]
    return {
        "model": "m",
        "messages": [{"role": roles[i % 2], "content": f"m{i}"} for i in range(n)],
    }


def messages(n: int) -> dict:
    return {**chat(n), "max_tokens": 8}


def responses(n: int) -> dict:
    roles = ["user", "assistant"]
    items = [{"type": "message", "role": roles[i % 2], "content": f"m{i}"} for i in range(n)]
    return {"model": "m", "input": items}


def error_message(route: str, payload: dict) -> str:
    return payload["error"]["message"]


@pytest.mark.parametrize(
    "route,body",
    [("/v1/chat/completions", chat), ("/v1/messages", messages), ("/v1/responses", responses)],
)
async def test_one_item_over_the_limit_is_a_413(gateway_with_fake, client, store_url, route, body):
    async with gateway_with_fake(max_messages=LIMIT) as (url, fake):
        at = await client.post(f"{url}{route}", json=body(LIMIT), headers={"x-session-id": "a"})
        assert at.status_code == 200, at.text
        over = await client.post(
            f"{url}{route}", json=body(LIMIT + 1), headers={"x-session-id": "b"}
        )
        assert over.status_code == 413, over.text
        payload = over.json()
        if route == "/v1/messages":
            assert payload["type"] == "error"
            assert payload["error"]["type"] == "request_too_large"
        else:
            assert payload["error"]["type"] == "request_too_large"
        assert f"limit of {LIMIT} (max_messages)" in error_message(route, payload)
        assert len(fake.requests) == 1
    async with store_at(store_url) as store:
        assert len(await store.list_sessions("default")) == 1
