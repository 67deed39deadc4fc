"""``foldgate sessions`` against a running gateway (the CLI talks HTTP to it)."""

from __future__ import annotations

import asyncio
import json

from click.testing import CliRunner

from gateway import sessions_api
from gateway.cli import main
from gateway.tenants import hash_key
from tests.gateway.agent_session import SESSION, STEPS, drive, started


async def cli(*args: str) -> tuple[int, str]:
    # In a thread: the gateway answering the CLI runs on this test's event loop.
    result = await asyncio.to_thread(
        CliRunner().invoke, main, ["sessions", *args], env={"COLUMNS": "200"}
    )
    return result.exit_code, result.output


async def test_list_and_show_print_the_sessions_figures(gateway_with_fake, client):
    async with gateway_with_fake(api_keys={hash_key("k"): "team"}) as (url, _fake):
        await drive(client, url, {"authorization": "Bearer k"})
        code, listing = await cli("--url", url, "--api-key", "k", "list")
        assert code == 0, listing
        assert SESSION in listing and f"{STEPS}" in listing
        code, raw = await cli("--url", url, "--api-key", "k", "list", "--json")
        summary = json.loads(raw)[0]
        assert summary["id"] == SESSION and summary["requests"] == STEPS
        assert f"{summary['raw_tokens']:,}" in listing
        code, shown = await cli("--url", url, "--api-key", "k", "show", SESSION, "--request", "7")
        assert code == 0, shown
        assert "what the model saw at request 7" in shown
        for marker in ("stub", "fold", "chunk boundary", "cached prefix", "[step 1]"):
            assert marker in shown, marker
        code, other = await cli("--url", url, "--api-key", "k", "show", "nope")
        assert code == 1 and "404: no session 'nope'" in other
        code, denied = await cli("--url", url, "list")
        assert code == 1 and "401: invalid or missing API key" in denied


async def test_list_follows_the_pages(gateway_with_fake, client, monkeypatch):
    monkeypatch.setattr(sessions_api, "DEFAULT_PAGE", 2)
    names = [f"p{i}" for i in range(5)]
    async with gateway_with_fake() as (url, _fake):
        await started(client, url, names)
        code, raw = await cli("--url", url, "list", "--json")
    assert code == 0, raw
    assert [s["id"] for s in json.loads(raw)] == names[::-1]


async def test_an_unreachable_gateway_is_reported():
    code, out = await cli("--url", "http://127.0.0.1:9", "list")
    assert code == 1 and "cannot reach the gateway at http://127.0.0.1:9" in out
