"""What a client names and asks for, through a real gateway and store (FAKE upstream):
the sessions API's path and query parameters, session ids from headers, bodies and paths
(one check, one key), and vLLM's own request fields. Every refusal is a 4xx in its API's
shape, and nothing refused reaches the upstream or writes to the store."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Callable
from urllib.parse import quote

import httpx
import pytest

from gateway.dialects.errors import DialectError
from gateway.identity import MAX_SESSION_ID_CHARS, header_text, session_id
from gateway.tenants import PRIORITY_RANGE, REFUSED_FIELDS, TEMPLATE_ARGUMENTS, Tenants
from tests.gateway.conftest import store_at
from tests.gateway.test_tenancy import ACME, BETA, chat, tenant_config

MAX_NUMBER = 2**63 - 1


def sqlite_writes(store_url: str) -> Callable[[], int]:
    """SQLite's ``data_version``: it moves whenever another connection commits."""
    conn = sqlite3.connect(store_url.removeprefix("sqlite:///"))
    return lambda: conn.execute("PRAGMA data_version").fetchone()[0]


async def settled(client: httpx.AsyncClient, url: str, session: str, requests: int = 1) -> None:
    """Wait until the session's accounting (written after each reply) shows ``requests``."""
    for _ in range(200):
        resp = await client.get(f"{url}/v1/sessions/{quote(session, safe='')}")
        if resp.status_code == 200 and resp.json()["requests"] >= requests:
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"session {session!r} never showed {requests} requests")


def openai_error(resp: httpx.Response, status: int, param: str | None) -> str:
    """The message of an OpenAI-shaped error with ``status`` and ``param``."""
    assert resp.status_code == status, (resp.request.url, resp.text)
    error = resp.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}, error
    assert error["param"] == param, (resp.request.url, error)
    return error["message"]


# --- the sessions API's parameters -------------------------------------------------------

MALFORMED_NUMBERS = [
    "٣",  # Arabic-Indic three: ``isdigit`` and ``int`` take it
    "²",  # superscript two: ``isdigit`` takes it, ``int`` refuses it
    "１",  # fullwidth one
    "1" * 5000,  # past ``int``'s 4,300 digits
    "9" * 19,  # past the store's integers
    str(MAX_NUMBER + 1),
    "-1", "+1", " 1", "1 ", "1.0", "1e3", "0x1", "", "1,000", "one",
]  # fmt: skip


async def test_malformed_numbers_are_400s_and_unknown_ones_404s(gateway_with_fake, client):
    async with gateway_with_fake() as (url, _fake):
        resp = await client.post(
            f"{url}/v1/chat/completions", json=chat("hi"), headers={"x-session-id": "s1"}
        )
        assert resp.status_code == 200
        await settled(client, url, "s1")
        base = f"{url}/v1/sessions/s1"
        for value in [*MALFORMED_NUMBERS, "0"]:
            resp = await client.get(f"{base}/render", params={"request": value})
            message = openai_error(resp, 400, "request")
            assert "request must be an integer from 1" in message and len(message) < 200
        for value in MALFORMED_NUMBERS:
            for path, params in ((base, {}), (f"{base}/render", {"request": "1"})):
                resp = await client.get(path, params={**params, "branch": value})
                assert "branch must be an integer from 0" in openai_error(resp, 400, "branch")
        # Well-formed numbers the session does not have: 404.
        for value in ("2", "0002", str(MAX_NUMBER)):
            resp = await client.get(f"{base}/render", params={"request": value})
            openai_error(resp, 404, None)
        for value in ("1", str(MAX_NUMBER)):
            openai_error(await client.get(base, params={"branch": value}), 404, None)
        resp = await client.get(f"{base}/render", params={"request": "1", "branch": "0"})
        assert resp.status_code == 200 and resp.json()["request"] == 1


async def test_malformed_path_ids_are_400s_naming_the_parameter(gateway_with_fake, client):
    async with gateway_with_fake() as (url, _fake):
        for encoded, named in (
            ("a%00b", "U+0000, a control character"),
            ("a%0Ab", "U+000A, a control character"),
            ("a%E2%80%AEb", "U+202E, an invisible formatting character"),  # right-to-left
            ("a%C2%A0b", "U+00A0, a space other than U+0020"),
        ):
            for suffix in ("", "/render?request=1"):
                resp = await client.get(f"{url}/v1/sessions/{encoded}{suffix}")
                assert named in openai_error(resp, 400, "session_id")
        for unknown in ("nope", "%20", "nope/render?request=1"):
            openai_error(await client.get(f"{url}/v1/sessions/{unknown}"), 404, None)


# --- every valid session id is addressable ---------------------------------------------

ADDRESSED_IDS = [
    "job/render",  # ends in the render route's suffix
    "render",
    "a/b",
    "a/b/render",
    "sesión-ü",
    "セッション/render",
    "100%",
    "q?x=1#frag",
    "emoji-👩‍💻",  # a zero-width joiner sequence
    "x" * 300,  # past the limit: kept as its start and a digest
]


async def test_every_stored_id_addresses_its_session(gateway_with_fake, client):
    async with gateway_with_fake() as (url, _fake):
        for sid in ADDRESSED_IDS:
            resp = await client.post(
                f"{url}/v1/chat/completions", json=chat(sid, prompt_cache_key=sid)
            )
            assert resp.status_code == 200, (sid, resp.text)
        listed = [s["id"] for s in (await client.get(f"{url}/v1/sessions")).json()["data"]]
        assert sorted(listed) == sorted(session_id(sid, "s") for sid in ADDRESSED_IDS)
        for sid in ADDRESSED_IDS:
            stored = session_id(sid, "s")
            await settled(client, url, stored)
            for name in (sid, stored):  # the id as sent, and as listed, percent-encoded
                path = f"{url}/v1/sessions/{quote(name, safe='')}"
                detail = await client.get(path)
                assert detail.status_code == 200 and detail.json()["id"] == stored, detail.text
                view = await client.get(f"{path}/render", params={"request": "1"})
                assert view.status_code == 200, (sid, view.text)
                assert view.json()["history"][-1]["text"] == sid
        # The URLs that worked before still do: slashes in an id need no encoding, and a
        # literal /render suffix is the render route.
        assert (await client.get(f"{url}/v1/sessions/a/b")).json()["id"] == "a/b"
        resp = await client.get(f"{url}/v1/sessions/a/b/render", params={"request": "1"})
        assert resp.json()["history"][-1]["text"] == "a/b"
        resp = await client.get(f"{url}/v1/sessions/job/render")  # session "job", rendered
        assert openai_error(resp, 400, "request").endswith(
            "the query parameter request=N is required"
        )


# --- session ids: one check, UTF-8 headers, one key from every source -------------------


def test_header_bytes_are_read_as_utf8_else_latin1():
    as_asgi = {"x": "sesión-ü".encode().decode("latin-1"), "y": "caf\xe9", "z": "plain"}
    assert header_text(as_asgi, "x") == "sesión-ü"
    assert header_text(as_asgi, "y") == "café"  # not UTF-8: latin-1, as before
    assert header_text(as_asgi, "z") == "plain" and header_text(as_asgi, "none") is None
    assert header_text({"x": "セッション"}, "x") == "セッション"  # text already


def test_a_session_id_is_printable_text_and_the_refusal_names_the_character():
    newer = "\U0001fae8"  # an emoji of Unicode 15, unassigned in Python 3.11's tables
    for good in (
        "sesión-ü", "セッション", "emoji-👩‍💻", "a b", "ﷺ", "pua\ue000", newer,
        "x" * MAX_SESSION_ID_CHARS,
    ):  # fmt: skip
        assert session_id(good, "s") == good
    for bad, named in (
        ("a\tb", "U+0009, a control character"),
        ("a\x85b", "U+0085, a control character"),
        ("a\u202eb", "U+202E, an invisible formatting character"),
        ("a\ufeffb", "U+FEFF, an invisible formatting character"),
        ("a\u2028b", "U+2028, a line separator"),
        ("a\u3000b", "U+3000, a space other than U+0020"),
        ("a\U000e0001b", "U+E0001, an invisible formatting character"),
        ("x" * 4097, "at most 4096 characters; this one has 4097"),
    ):
        with pytest.raises(DialectError) as err:
            session_id(bad, "x-session-id")
        assert err.value.param == "x-session-id"
        assert str(err.value).endswith(named), err.value


async def test_utf8_header_ids_round_trip_with_body_and_path_ids(
    gateway_with_fake, client, store_url
):
    async with gateway_with_fake() as (url, fake):
        # Refused, with the character named, before anything is sent or stored.
        writes = sqlite_writes(store_url)
        before, sent = writes(), len(fake.requests)
        for header, named in (
            (b"tab\tid", "U+0009, a control character"),  # what HTTP lets through
            ("c1\u0085x".encode(), "U+0085, a control character"),
            ("a\u202eb".encode(), "U+202E, an invisible formatting character"),
        ):
            resp = await client.post(
                f"{url}/v1/chat/completions", json=chat("x"), headers={"x-session-id": header}
            )
            assert named in openai_error(resp, 400, "x-session-id")
        assert (writes(), len(fake.requests)) == (before, sent)
        for sid in ("sesión-ü", "セッション", "café"):
            header = sid.encode("latin-1" if sid == "café" else "utf-8")
            sources = (
                ({"x-session-id": header}, {}),
                ({}, {"prompt_cache_key": sid}),
                ({}, {"metadata": {"session_id": sid}}),
            )
            for n, (headers, fields) in enumerate(sources):
                body = chat(f"{sid} {n}", **fields)
                resp = await client.post(f"{url}/v1/chat/completions", json=body, headers=headers)
                assert resp.status_code == 200, (sid, resp.text)
                assert resp.headers["x-foldgate-session"] == quote(sid, safe="")
            await settled(client, url, sid, requests=3)
        # A blank id names no session: the content digest does.
        blank = {"x-session-id": "\u3000\u3000".encode()}
        resp = await client.post(f"{url}/v1/chat/completions", json=chat("x"), headers=blank)
        assert resp.headers["x-foldgate-session"].startswith("auto-")
    async with store_at(store_url) as store:
        listed = await store.list_sessions("default")
    assert sorted(s for s in listed if not s.startswith("auto-")) == sorted(
        ["sesión-ü", "セッション", "café"]
    )


# --- vLLM's request fields ---------------------------------------------------------------

ROUTES = {
    "/v1/chat/completions": chat("hi"),
    "/v1/messages": {**chat("hi"), "max_tokens": 8},
    "/v1/responses": {"model": "m", "input": "hi"},
}
# A value of each refused field that asks for something leaving it out does not.
ASKING = {
    "chat_template": "{{ messages[0].content }}",
    "documents": [{"title": "t", "text": "d"}],
    "add_special_tokens": True,
    "mm_processor_kwargs": {"max_pixels": 10**9},
    "media_io_kwargs": {"image": {"x": 1}},
    "vllm_xargs": {"session_id": "another-tenants"},
    "request_id": "chosen-by-client",
    "add_generation_prompt": False,
    "continue_final_message": True,
    "echo": True,
    "truncate_prompt_tokens": 10,
    "truncation_side": "left",
    "prompt_logprobs": 1,
    "return_token_ids": True,
    "return_prompt_text": True,
}


def test_every_refused_field_is_exercised():
    assert ASKING.keys() == REFUSED_FIELDS.keys()


def refusal_of(route: str, resp: httpx.Response) -> tuple[str, str | None]:
    assert resp.status_code == 400, resp.text
    if route == "/v1/messages":
        assert resp.json()["type"] == "error"
        return resp.json()["error"]["message"], None
    error = resp.json()["error"]
    return error["message"], error["param"]


async def test_vllm_fields_that_change_the_rendering_are_refused_naming_them(
    gateway_with_fake, client, store_url
):
    async with gateway_with_fake(**tenant_config()) as (url, fake):
        writes = sqlite_writes(store_url)
        before = writes()
        for route, base in ROUTES.items():
            for name, value in ASKING.items():
                resp = await client.post(f"{url}{route}", json={**base, name: value}, headers=ACME)
                message, param = refusal_of(route, resp)
                assert f"{name} is not accepted: " in message, message
                assert param in (name, None)
            for key in sorted(TEMPLATE_ARGUMENTS):
                body = {**base, "chat_template_kwargs": {"enable_thinking": False, key: "x"}}
                message, param = refusal_of(
                    route, await client.post(f"{url}{route}", json=body, headers=ACME)
                )
                assert repr(key) in message and param in (f"chat_template_kwargs.{key}", None)
        # ...from the params header too.
        resp = await client.post(
            f"{url}/v1/chat/completions",
            json=chat("hi"),
            headers={**ACME, "x-foldgate-params": '{"chat_template": "{{ 1 }}"}'},
        )
        assert refusal_of("/v1/chat/completions", resp)[1] == "chat_template"
        assert fake.requests == [] and writes() == before


async def test_neutral_values_pass_and_the_tenants_allowance_lets_fields_through(
    gateway_with_fake, client
):
    tenants = {"beta": {"upstream_fields": ["chat_template", "ec_transfer_params"]}}
    neutral = {
        "add_generation_prompt": True,
        "continue_final_message": False,
        "echo": False,
        "add_special_tokens": False,
        "return_token_ids": False,
        "request_id": None,
        "chat_template_kwargs": {"enable_thinking": False},
        "top_k": 5,
    }
    own = {"session_id": "another-tenants-session", "ec_transfer_params": {"x": 1}}
    async with gateway_with_fake(**tenant_config(tenants=tenants)) as (url, fake):
        for headers in (ACME, BETA):
            body = chat("hi", **neutral, **own)
            resp = await client.post(f"{url}/v1/chat/completions", json=body, headers=headers)
            assert resp.status_code == 200, resp.text
        resp = await client.post(
            f"{url}/v1/chat/completions", json=chat("hi", chat_template="{{ 1 }}"), headers=BETA
        )
        assert resp.status_code == 200, resp.text
        resp = await client.post(
            f"{url}/v1/chat/completions", json=chat("hi", chat_template="{{ 1 }}"), headers=ACME
        )
        assert refusal_of("/v1/chat/completions", resp)[1] == "chat_template"
        acme, beta, beta_template = fake.requests
    for sent in (acme, beta):
        assert {k: sent.get(k) for k in neutral} == neutral
        assert "session_id" not in sent
    assert "ec_transfer_params" not in acme and beta["ec_transfer_params"] == {"x": 1}
    assert beta_template["chat_template"] == "{{ 1 }}"


def test_upstream_fields_allow_only_what_a_tenant_may_be_trusted_with():
    Tenants({"acme": {"upstream_fields": ["chat_template", "priority", "vllm_xargs"]}}, None)
    for name in ("request_id", "echo", "continue_final_message", "cache_salt", "session_id"):
        with pytest.raises(ValueError, match="upstream_fields"):
            Tenants({"acme": {"upstream_fields": [name]}}, None)


def test_an_allowed_priority_is_an_integer_the_gateway_can_scale():
    """With ``upstream_priority`` the gateway sends a client's priority times its classes:
    past ``PRIORITY_RANGE`` that left int64 (orjson refused it: a 500), and a string was
    silently replaced by the tenant's configured priority."""
    tenants = Tenants({"acme": {"upstream_fields": ["priority"]}}, None)
    for value in (2**63, PRIORITY_RANGE[1] + 1, PRIORITY_RANGE[0] - 1, "1", 1.5, True):
        with pytest.raises(DialectError) as info:
            tenants.check_request_fields("acme", {"priority": value})
        assert info.value.param == "priority"
    for value in (*PRIORITY_RANGE, 0, None):
        tenants.check_request_fields("acme", {"priority": value})
    tenants.check_request_fields("beta", {"priority": "dropped: beta may not send it"})
    with pytest.raises(ValueError, match="priority must be an integer between"):
        Tenants({"acme": {"priority": 2**62}}, None)
