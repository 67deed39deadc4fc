"""Decode: the client's body read within the gateway's limits and decoded in its dialect.

Only what the session's previous request did not hold is parsed (``ResentBodies``: the
bytes after the previous body's last item) and decoded (``DecodeCache``); a request that
continues a kept reply is decoded after the conversation the store kept for it
(``gateway.steps.kept``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

import orjson
from starlette.requests import ClientDisconnect, Request

from gateway.config import GatewayConfig
from gateway.dialects.base import Dialect
from gateway.dialects.errors import DialectError, too_large
from gateway.dialects.fields import within_depth
from gateway.disconnect import ClientGone
from gateway.offload import Offload, is_large
from gateway.request_cache import DecodeCache, Decoded, continued, session_ids
from gateway.resent_body import MAX_JSON_DEPTH, ResentBodies, parse_object, wide_integer
from gateway.steps.kept import kept_conversation
from gateway.tokens import BYTES_PER_TOKEN
from store import SessionStore

# Request fields as a JSON object, for harnesses that can add headers but cannot set
# sampling fields in the body (Codex: ``http_headers`` in its provider config). The body's
# own fields win.
PARAMS_HEADER = "x-foldgate-params"
__all__ = ["MAX_JSON_DEPTH", "PARAMS_HEADER", "Decoder", "read_json", "with_header_params"]


class Decoder:
    def __init__(self, config: GatewayConfig, store: SessionStore, offload: Offload) -> None:
        self.config = config
        self.store = store
        self.offload = offload
        self.cache = DecodeCache(config.decode_cache_bytes, config.max_messages)
        self.bodies = ResentBodies(config.decode_cache_bytes, config.max_messages)

    async def read(self, request: Request, dialect: Dialect, tenant: str) -> dict[str, Any]:
        """The request's JSON body, with the params header's fields it does not set; parsed
        after what the session's previous body held (the session as its header names it:
        the body is not read yet)."""
        session = request.headers.get(self.config.session_header)
        body = await read_json(
            request,
            self.config.max_body_bytes,
            self.config.body_timeout_s,
            self.bodies,
            (tenant, dialect.name, session),
            dialect.items_field,
        )
        return with_header_params(body, request.headers)

    async def decode(
        self, dialect: Dialect, body: Any, headers: Mapping[str, str], tenant: str
    ) -> Decoded:
        """``body`` decoded (volatile markers dropped); a large one in the worker thread
        (``gateway.offload``)."""
        previous = dialect.continues(body) if isinstance(body, dict) else None
        if previous is not None:
            session, kept = await kept_conversation(self.store, tenant, previous)
            large = is_large(len(kept) + _items(dialect, body), _declared_tokens(headers))
            return await self.offload.run(
                large, None, continued, dialect, body, session, kept, self.config.max_messages
            )
        ids = (
            session_ids(headers, body, self.config.session_header) if isinstance(body, dict) else ()
        )
        large = is_large(_items(dialect, body), _declared_tokens(headers))
        return await self.offload.run(
            large, None, self.cache.decode, dialect, body, ids, tenant=tenant
        )


def _items(dialect: Dialect, body: Any) -> int:
    """How many conversation items ``body`` holds, as far as it can tell before decoding."""
    field = dialect.items_field
    items = body.get(field) if isinstance(body, dict) and field else None
    return len(items) if isinstance(items, list) else 0


def _declared_tokens(headers: Mapping[str, str]) -> int:
    """The body's declared length, in estimated tokens (0 when not declared)."""
    declared = headers.get("content-length", "")
    return int(declared) // BYTES_PER_TOKEN if declared.isdigit() else 0


def with_header_params(body: dict[str, Any], headers: Mapping[str, str]) -> dict[str, Any]:
    """``body`` with the fields of the params header it does not set itself."""
    raw = headers.get(PARAMS_HEADER)
    if raw is None:
        return body
    try:
        params = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise DialectError(f"not valid JSON: {exc}", param=PARAMS_HEADER) from exc
    if not isinstance(params, dict):
        raise DialectError("must be a JSON object", param=PARAMS_HEADER)
    if not within_depth(params, MAX_JSON_DEPTH):
        raise DialectError(f"nested deeper than {MAX_JSON_DEPTH} levels", param=PARAMS_HEADER)
    if (literal := wide_integer(raw.encode("latin-1"))) is not None:  # as the body's
        raise DialectError(
            f"holds the integer {literal}, beyond the 64-bit range", param=PARAMS_HEADER
        )
    return {**params, **body}


async def read_json(
    request: Request,
    limit: int,
    timeout_s: float,
    bodies: ResentBodies | None = None,
    key: tuple[Any, ...] = (),
    items_field: str | None = None,
) -> dict[str, Any]:
    """The body as a JSON object: 415 for a compressed one (it is read as sent), 413 over
    ``limit`` bytes, 408 past ``timeout_s``, ``ClientGone`` when the client leaves before
    its end, 400 for anything but a JSON object nested at most ``MAX_JSON_DEPTH`` levels
    (``parse_object``; with ``bodies``, after the prefix the session's previous body under
    ``key`` shares)."""
    encoding = request.headers.get("content-encoding", "")
    if encoding.strip().lower() not in ("", "identity"):
        raise DialectError(
            f"{encoding!r} is not supported; send the body uncompressed",
            param="content-encoding",
            status=415,
        )
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > limit:
        raise too_large(f"request body of {declared} bytes exceeds the limit of {limit}")
    raw = bytearray()
    try:
        async with asyncio.timeout(timeout_s):
            async for piece in request.stream():
                raw.extend(piece)
                if len(raw) > limit:
                    raise too_large(f"request body exceeds the limit of {limit} bytes")
    except TimeoutError as exc:
        raise DialectError(
            f"request body not received within {timeout_s:g} s", status=408, kind="timeout_error"
        ) from exc
    except ClientDisconnect as exc:  # gone before the body's end: no one reads an answer
        raise ClientGone from exc
    if bodies is None:
        return parse_object(raw)
    return bodies.parse(raw, key, items_field)
