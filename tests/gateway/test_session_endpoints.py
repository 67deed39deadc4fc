"""GET /v1/sessions, /v1/sessions/{id}, /v1/sessions/{id}/render over a real gateway and
store, with the fake upstream recording what it was sent."""

from __future__ import annotations

import asyncio
import json

from click.testing import CliRunner

from gateway.cli import main
from gateway.config import GatewayConfig
from gateway.tenants import hash_key
from loadtests.fake_upstream import ScriptedReply
from tests.gateway.agent_session import SESSION, STEPS, TOOLS, drive, history, started


def texts(upstream_messages: list[dict]) -> list[tuple[str, str]]:
    """(role, text) of each message a replica received (content: a string or text parts)."""
    out = []
    for m in upstream_messages:
        content = m.get("content") or ""
        if isinstance(content, list):
            content = "".join(p.get("text", "") for p in content)
        out.append((m["role"], content))
    return out


async def test_session_figures_come_from_its_requests(gateway_with_fake, client):
    async with gateway_with_fake() as (url, fake):
        await drive(client, url)
        listing = (await client.get(f"{url}/v1/sessions")).json()
        detail = (await client.get(f"{url}/v1/sessions/{SESSION}")).json()
    assert listing["object"] == "list" and [s["id"] for s in listing["data"]] == [SESSION]
    summary = listing["data"][0]
    log = detail["log"]
    assert [r["request"] for r in log] == list(range(1, STEPS + 1))
    assert [r["messages"] for r in log] == [len(history(i)) for i in range(STEPS)]
    assert summary["requests"] == STEPS
    assert summary["raw_tokens"] == sum(r["raw_tokens"] for r in log)
    assert summary["rendered_tokens"] == sum(r["rendered_tokens"] for r in log)
    # The fake reports prompt tokens as len(json of the messages it got) / 4.
    assert summary["upstream_prompt_tokens"] == sum(
        len(json.dumps(body["messages"])) // 4 for body in fake.requests
    )
    # Clients see a label for the replica, never its address (no debug setting here).
    assert summary["replica"].startswith("replica-")
    assert {r["replica"] for r in log} == {summary["replica"]}
    assert fake.url not in json.dumps([listing, detail])
    # Step 1 repeats step 0 and step 2 is marked stale: once they are below the chunk
    # boundary (7 steps, k=3: steps 0-2), the context holds a stub and a fold.
    assert (summary["stubs"], summary["folds"]) == (1, 1)
    assert summary["strategy"] == "refold" and summary["branches"] == 1


async def test_render_at_request_n_is_what_the_replica_received(gateway_with_fake, client):
    # The last request's first answer asks for a restore: the gateway answers it and asks
    # again, so the view of that request shows the restore exchange (its last attempt).
    script = [ScriptedReply() for _ in range(STEPS - 1)]
    script += [ScriptedReply("", tool_calls=[("restore", '{"steps": "1"}')]), ScriptedReply()]
    async with gateway_with_fake(script) as (url, fake):
        await drive(client, url)
        views = [
            (await client.get(f"{url}/v1/sessions/{SESSION}/render?request={n}")).json()
            for n in range(1, STEPS + 1)
        ]
    sent = [*fake.requests[: STEPS - 1], fake.requests[STEPS]]
    for view, body in zip(views, sent, strict=True):
        assert [(m["role"], m["text"]) for m in view["rendered"]] == texts(body["messages"])
    last = views[-1]
    assert last["record"]["restores"] == 1
    gateway_turns = [h for h in last["history"] if h["gateway"]]
    assert [h["role"] for h in gateway_turns] == ["assistant", "tool"]
    assert "[restored step 1]" in gateway_turns[1]["text"]
    kinds = [m["kind"] for m in last["rendered"]]
    assert kinds.count("stub") == last["stats"]["stubs"] == 1
    assert kinds.count("fold") == last["stats"]["folded_steps"] == 1
    stub = next(m for m in last["rendered"] if m["kind"] == "stub")
    assert last["history"][stub["source"]]["text"] == last["history"][3]["text"]  # step 0's
    assert last["chunk_boundary"]["step"] == 3
    boundary = last["rendered"][last["chunk_boundary"]["rendered_index"]]
    assert last["history"][boundary["source"]]["step"] == 3
    # Request 7 only appended to request 6's context: all of 6 is its cached prefix.
    assert last["cached_prefix"]["messages"] == len(views[-2]["rendered"])
    assert views[0]["cached_prefix"] is None
    assert all(m["kind"] in {"verbatim", "labelled"} for m in views[0]["rendered"])
    # Request 6 moved the chunk boundary and folded step 2: the replica's cached prefix
    # from request 5 ends where the fold rewrote what it had sent.
    folded = next(m["index"] for m in views[5]["rendered"] if m["kind"] == "fold")
    assert views[5]["cached_prefix"]["messages"] == folded


async def test_a_tenant_sees_only_its_own_sessions(gateway_with_fake, client):
    keys = {hash_key("key-a"): "alice", hash_key("key-b"): "bob"}
    alice = {"authorization": "Bearer key-a"}
    bob = {"authorization": "Bearer key-b"}
    async with gateway_with_fake(api_keys=keys) as (url, _fake):
        await drive(client, url, alice)
        assert [
            s["id"] for s in (await client.get(f"{url}/v1/sessions", headers=alice)).json()["data"]
        ] == [SESSION]
        assert (await client.get(f"{url}/v1/sessions", headers=bob)).json()["data"] == []
        for path in (f"/v1/sessions/{SESSION}", f"/v1/sessions/{SESSION}/render?request=1"):
            resp = await client.get(url + path, headers=bob)
            assert resp.status_code == 404
            assert resp.json()["error"]["type"] == "not_found_error"
            assert resp.json()["error"]["message"] == f"no session {SESSION!r} for tenant 'bob'"
        resp = await client.get(f"{url}/v1/sessions")
        assert resp.status_code == 401 and resp.json()["error"]["type"] == "authentication_error"


async def test_bad_queries_get_openai_errors(gateway_with_fake, client):
    async with gateway_with_fake() as (url, _fake):
        body = {"model": "m", "messages": history(0), "tools": TOOLS}
        headers = {"x-session-id": "a/b"}  # ids may hold slashes
        assert (
            await client.post(f"{url}/v1/chat/completions", json=body, headers=headers)
        ).is_success
        base = f"{url}/v1/sessions/a%2Fb"
        cases = {
            f"{base}/render": (400, "request"),
            f"{base}/render?request=0": (400, "request"),
            f"{base}/render?request=x": (400, "request"),
            f"{base}/render?request=2": (404, None),
            f"{base}?branch=-1": (400, "branch"),
            f"{base}?branch=5": (404, None),
            f"{url}/v1/sessions/nope": (404, None),
            f"{url}/v1/sessions/nope/render?request=1": (404, None),
        }
        for _ in range(100):  # the request's accounting lands after its reply
            if (await client.get(f"{base}/render?request=1")).status_code == 200:
                break
            await asyncio.sleep(0.02)
        for path, (status, param) in cases.items():
            resp = await client.get(path)
            assert resp.status_code == status, (path, resp.text)
            assert set(resp.json()["error"]) == {"message", "type", "param", "code"}
            assert resp.json()["error"]["param"] == param
        assert (await client.get(f"{base}")).json()["id"] == "a/b"
        assert (await client.get(f"{url}/ui")).status_code == 404  # off unless enabled


def test_the_page_is_switched_on_by_config_env_or_flag(monkeypatch, tmp_path):
    assert GatewayConfig.load().ui is False
    config_file = tmp_path / "gw.toml"
    config_file.write_text("ui = true\n")
    assert GatewayConfig.load(config_file).ui is True
    monkeypatch.setenv("FOLDGATE_UI", "false")
    assert GatewayConfig.load(config_file).ui is False
    assert GatewayConfig.load(config_file, ui=True).ui is True  # what --ui passes
    assert "--ui" in CliRunner().invoke(main, ["serve", "--help"]).output


async def test_sessions_are_listed_in_pages_newest_first(gateway_with_fake, client):
    names = [f"p{i}" for i in range(5)]
    async with gateway_with_fake() as (url, _fake):
        await started(client, url, names)
        pages, after = [], None
        while True:
            query = {"limit": 2} if after is None else {"limit": 2, "after": after}
            page = (await client.get(f"{url}/v1/sessions", params=query)).json()
            ids = [s["id"] for s in page["data"]]
            assert page["object"] == "list"
            assert (page["first_id"], page["last_id"]) == (ids[0], ids[-1])
            pages.append(ids)
            if not page["has_more"]:
                break
            after = page["next_cursor"]
        assert pages == [["p4", "p3"], ["p2", "p1"], ["p0"]]
        # The default page holds all; reading the pages used their sessions, the last read
        # (p0) most recently.
        whole = (await client.get(f"{url}/v1/sessions")).json()
        assert [s["id"] for s in whole["data"]] == names and whole["has_more"] is False
        for query, status in (
            ("limit=0", 400),
            ("limit=1001", 400),
            ("limit=x", 400),
            ("after=nope", 400),
        ):
            resp = await client.get(f"{url}/v1/sessions?{query}")
            assert resp.status_code == status, (query, resp.text)
            assert resp.json()["error"]["param"] == query.split("=")[0]
