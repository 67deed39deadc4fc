"""A streamed reply the upstream breaks off, through the whole gateway: each dialect's
stream ends with its own error event, carrying the replica's message and nothing more."""

import json
from typing import Any

import httpx
import pytest

from gateway.config import GatewayConfig
from loadtests.fake_upstream import FakeUpstream, ScriptedReply
from tests.gateway.conftest import running_gateway

BODIES: dict[str, dict[str, Any]] = {
    "/v1/chat/completions": {"model": "m", "messages": [{"role": "user", "content": "x"}]},
    "/v1/messages": {
        "model": "m",
        "max_tokens": 16,
        "messages": [{"role": "user", "content": "x"}],
    },
    "/v1/responses": {"model": "m", "input": "x"},
}


def last_event(text: str) -> dict[str, Any]:
    frames = [f for f in text.split("\n\n") if "data: " in f]
    return json.loads(frames[-1].split("data: ", 1)[1])


@pytest.mark.parametrize("path", BODIES)
async def test_an_upstream_error_event_ends_each_stream_in_its_dialects_shape(
    path: str, tmp_path
) -> None:
    fake = await FakeUpstream([ScriptedReply(breaks="error")]).start()
    config = GatewayConfig(store_url=f"sqlite:///{tmp_path}/store.db", replicas=(fake.url,))
    try:
        async with running_gateway(config) as url, httpx.AsyncClient(timeout=30) as client:
            resp = await client.post(f"{url}{path}", json={**BODIES[path], "stream": True})
    finally:
        await fake.stop()
    assert resp.status_code == 200  # the status line went out with the first chunk
    event = last_event(resp.text)
    message = "upstream failed mid-stream: engine failed"
    if path == "/v1/responses":
        assert event["type"] == "response.failed"
        assert event["response"]["error"] == {"code": "server_error", "message": message}
    elif path == "/v1/messages":
        assert event == {"type": "error", "error": {"type": "api_error", "message": message}}
    else:
        error = {"message": message, "type": "api_error", "param": None, "code": None}
        assert event == {"error": error}
    assert fake.url.split("//")[1] not in resp.text  # the replica is not named
