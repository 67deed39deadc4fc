"""Tenant from the API key; session id from header, body fields, or a content digest."""

from __future__ import annotations

import pytest

from gateway.config import GatewayConfig
from gateway.identity import UnknownApiKey, resolve_session, resolve_tenant
from gateway.tenants import hash_key
from gateway.transcript import Transcript, text_message

CONFIG = GatewayConfig()
TRANSCRIPT = Transcript((text_message("system", "sys"), text_message("user", "task")))


def session(
    headers: dict, body: dict, transcript: Transcript = TRANSCRIPT, tenant: str = "t"
) -> str:
    return resolve_session(headers, body, tenant, transcript, CONFIG)


def test_order_of_session_sources():
    body = {
        "prompt_cache_key": "pck",
        "metadata": {"session_id": "meta-sid", "user_id": "uid"},
        "user": "end-user",
    }
    assert session({"x-session-id": "hdr"}, body) == "hdr"
    assert session({}, body) == "pck"
    body.pop("prompt_cache_key")
    assert session({}, body) == "meta-sid"
    body["metadata"].pop("session_id")
    assert session({}, body) == "uid"
    body.pop("metadata")
    # OpenAI's ``user`` is the end user, who runs many sessions: not a session id.
    assert session({}, body) == session({}, {})


def test_header_name_is_configurable():
    config = GatewayConfig(session_header="x-run")
    assert resolve_session({"x-run": "r1"}, {}, "t", TRANSCRIPT, config) == "r1"
    assert resolve_session({"x-session-id": "no"}, {}, "t", TRANSCRIPT, config).startswith("auto-")


def test_digest_is_stable_per_tenant_system_and_first_user_message():
    first = session({}, {})
    longer = Transcript((*TRANSCRIPT.messages, text_message("assistant", "reply")))
    assert session({}, {}, longer) == first
    assert session({}, {}, tenant="other") != first
    other_task = Transcript((text_message("system", "sys"), text_message("user", "another")))
    assert session({}, {}, other_task) != first


def test_tenant_from_api_key():
    config = GatewayConfig(api_keys={hash_key("k1"): "acme"})
    assert resolve_tenant({"authorization": "Bearer k1"}, config) == "acme"
    assert resolve_tenant({"x-api-key": "k1"}, config) == "acme"
    with pytest.raises(UnknownApiKey):
        resolve_tenant({"x-api-key": "k2"}, config)
    with pytest.raises(UnknownApiKey):  # the stored hash is not a key
        resolve_tenant({"x-api-key": hash_key("k1")}, config)
    assert resolve_tenant({}, GatewayConfig()) == "default"
