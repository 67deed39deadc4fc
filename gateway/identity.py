"""Who is asking (tenant) and which conversation this is (session).

Harnesses rarely send a session id, so the fallback is a digest of what stays fixed for a
whole run: tenant, system prompt and first user message.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import xxhash

from gateway.config import GatewayConfig
from gateway.tenants import hash_key
from gateway.transcript import Transcript

MAX_SESSION_ID_CHARS = 256


class UnknownApiKey(Exception):
    """The request's API key is not in the configured key-hash -> tenant table."""


def api_key_of(headers: Mapping[str, str]) -> str | None:
    auth = headers.get("authorization", "")
    if auth.lower().startswith("bearer "):
        return auth[7:].strip() or None
    return headers.get("x-api-key") or None


def resolve_tenant(headers: Mapping[str, str], config: GatewayConfig) -> str:
    """The tenant whose key the request carries; without configured keys, the default."""
    if not config.api_keys:
        return config.default_tenant
    key = api_key_of(headers)
    tenant = config.api_keys.get(hash_key(key)) if key is not None else None
    if tenant is None:
        raise UnknownApiKey("invalid or missing API key")
    return tenant


def resolve_session(
    headers: Mapping[str, str],
    body: Mapping[str, Any],
    tenant: str,
    transcript: Transcript,
    config: GatewayConfig,
) -> str:
    """Header, then body fields, then Anthropic ``metadata.user_id``, else a content digest."""
    metadata = body.get("metadata") if isinstance(body.get("metadata"), Mapping) else {}
    candidates = (
        headers.get(config.session_header),
        body.get("prompt_cache_key"),
        metadata.get("session_id"),
        body.get("user"),
        metadata.get("user_id"),
    )
    for value in candidates:
        if isinstance(value, str) and value.strip():
            return value.strip()[:MAX_SESSION_ID_CHARS]
    return _digest_session(tenant, transcript)


def _digest_session(tenant: str, transcript: Transcript) -> str:
    h = xxhash.xxh3_128()
    h.update(tenant.encode())
    system = next((m for m in transcript.messages if m.role == "system"), None)
    first_user = next((m for m in transcript.messages if m.role == "user"), None)
    for message in (system, first_user):
        h.update(b"\x00")
        if message is not None:
            h.update(message.text.encode())
    return "auto-" + h.hexdigest()
