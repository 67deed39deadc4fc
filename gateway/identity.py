"""Who is asking (tenant, and how it wants to be served) and which conversation this is
(session), each resolved once per request.

The tenant comes from the API key, before the body is read; with it, the strategy and
ReFold's fold mode (a header, else the tenant's setting, else the gateway's) and the
tenant's limits (``Caller``). The session needs the decoded body. Harnesses rarely send a
session id, so the fallback is a digest of what stays fixed for a whole run: tenant,
system prompt and first user message.
"""

from __future__ import annotations

import hashlib
import unicodedata
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import xxhash

from gateway.config import GatewayConfig
from gateway.dialects.errors import DialectError
from gateway.fold.spec import StrategySpec
from gateway.tenants import Tenants, hash_key
from gateway.transcript import Transcript

MAX_SESSION_ID_CHARS = 256
# Longer than any harness's id by far; past it an id is refused, so the check and the
# digest cost a client at most this much, not as much as its body can hold.
MAX_SESSION_ID_INPUT = 4096
# An id over the limit keeps this much of itself, readable in listings, before the digest.
_LONG_ID_KEPT = 200
# The Unicode categories an id may not hold, by what they are: nothing shows them (or
# shows them as a space that is not one), they break lines, or they reorder the text around
# them (bidi controls), so an id could look like another one. Unassigned code points pass:
# they may be a newer Unicode's emoji.
_UNPRINTABLE = {
    "Cc": "a control character",
    "Cf": "an invisible formatting character",
    "Cs": "a lone surrogate",
    "Zl": "a line separator",
    "Zp": "a paragraph separator",
    "Zs": "a space other than U+0020",
}
# Allowed all the same: the space, and the zero-width (non-)joiners that emoji sequences
# and Persian and Indic scripts are written with.
_ORDINARY = frozenset(" \u200c\u200d")


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


@dataclass(frozen=True, slots=True)
class Caller:
    """The tenant a request comes from and how it is to be served: the strategy (parsed
    once, here), ReFold's fold mode, the tenant's token budget (None: the gateway's) and
    session size cap."""

    tenant: str
    strategy: StrategySpec
    fold: str
    budget: int | None
    max_bytes: int | None


def identify(
    headers: Mapping[str, str],
    config: GatewayConfig,
    tenants: Tenants,
    spec: Callable[[str | StrategySpec], StrategySpec],
) -> Caller:
    """The request's ``Caller``; ``UnknownApiKey`` for a key the gateway does not know;
    ``spec`` parses the strategy text (a 400 for one that names no strategy)."""
    tenant = resolve_tenant(headers, config)
    settings = tenants.settings(tenant)
    fold = headers.get(config.fold_header) or config.tenant_fold.get(tenant) or config.fold
    return Caller(
        tenant,
        spec(requested_strategy(headers, config, settings.strategy)),
        fold,
        settings.budget,
        settings.session_bytes,
    )


def header_text(headers: Mapping[str, str], name: str) -> str | None:
    """A header's value as the client wrote it. ASGI hands header bytes over decoded as
    latin-1; clients write non-ASCII text as UTF-8, so bytes that are valid UTF-8 are read
    as UTF-8, and any others stay latin-1."""
    value = headers.get(name)
    if value is None or value.isascii():
        return value
    try:
        return value.encode("latin-1").decode("utf-8")
    except (UnicodeEncodeError, UnicodeDecodeError):  # text already, or not UTF-8
        return value


def requested_strategy(
    headers: Mapping[str, str],
    config: GatewayConfig,
    tenant_default: StrategySpec | None = None,
) -> str | StrategySpec:
    """The strategy header, else the tenant's default, else the gateway's."""
    return headers.get(config.strategy_header) or tenant_default or config.strategy


def resolve_session(
    headers: Mapping[str, str],
    body: Mapping[str, Any],
    tenant: str,
    transcript: Transcript,
    config: GatewayConfig,
) -> str:
    """Header, then ``prompt_cache_key`` / ``metadata.session_id``, then Anthropic
    ``metadata.user_id``, else a content digest.

    OpenAI's ``user`` names the end user, not a conversation: one user runs many sessions,
    so it is not an id here. Every id passes ``session_id``.
    """
    metadata = body.get("metadata") if isinstance(body.get("metadata"), Mapping) else {}
    candidates = (
        (config.session_header, header_text(headers, config.session_header)),
        ("prompt_cache_key", body.get("prompt_cache_key")),
        ("metadata.session_id", metadata.get("session_id")),
        ("metadata.user_id", metadata.get("user_id")),
    )
    for source, value in candidates:
        if value is not None:
            session = session_id(value, source)
            if session:
                return session
    return _digest_session(tenant, transcript)


def session_id(value: Any, source: str) -> str:
    """A client's session id as the gateway keys it ("" for a blank one, which names none).

    The one check of a session id, wherever it comes from (a header, the body, the sessions
    API's path): at most ``MAX_SESSION_ID_INPUT`` characters of printable text, i.e. none
    of the ``_UNPRINTABLE`` categories (controls, invisible formatting, line breaks, odd
    spaces) but the zero-width joiners of ordinary text; any other id is refused (400
    naming ``source`` and what is wrong). Surrounding whitespace is dropped. An id over
    ``MAX_SESSION_ID_CHARS`` keeps its start and gains a digest of the whole id, so two
    long ids that share a prefix stay two sessions and one long id always names the same
    one.
    """
    if not isinstance(value, str):
        raise DialectError("a session id must be a string", param=source)
    value = value.strip()
    if len(value) > MAX_SESSION_ID_INPUT:
        raise DialectError(
            f"a session id is at most {MAX_SESSION_ID_INPUT} characters; this one has {len(value)}",
            param=source,
        )
    if not value.isprintable():  # the common case checked at C speed
        for char in value:
            kind = _UNPRINTABLE.get(unicodedata.category(char))
            if kind is not None and char not in _ORDINARY:
                raise DialectError(
                    f"a session id must be printable text; it holds U+{ord(char):04X}, {kind}",
                    param=source,
                )
    if len(value) > MAX_SESSION_ID_CHARS:
        digest = hashlib.sha256(value.encode()).hexdigest()[:32]
        value = f"{value[:_LONG_ID_KEPT]}~{digest}"
    return value


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
