"""Reply: the upstream's chunks written back in the client's dialect, whole or streamed.

A streamed reply gives the request's slot among the tenant's requests in flight back
when the stream ends or is closed (``frames``), or, for a client gone before the first
frame (the stream never starts), after the response (``release``), which then also settles
the reply no one read (``unread``: the upstream closed, the admission share ended): an
async generator never started runs none of its cleanup, its ``finally`` included.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from starlette.requests import Request

from gateway.dialects.base import Dialect, Exchange
from gateway.dialects.errors import upstream_broke_off
from gateway.disconnect import unless_disconnected
from gateway.steps.admit import Lease
from gateway.steps.forward import Opened
from gateway.steps.ingest import Ingested
from gateway.upstream import UpstreamError


@dataclass(frozen=True, slots=True)
class Reply:
    """What the client gets: its session, the replica that served it, the prompt's token
    estimates (as sent and as rendered), the seconds it waited for working-set admission
    and how admission let it go, and the reply, whole or as frames; ``release`` runs after
    a streamed response, however it went."""

    session: str
    replica: str
    raw_tokens: int
    rendered_tokens: int
    admission_wait_s: float
    admission: str
    body: dict[str, Any] | None = None
    frames: AsyncIterator[bytes] | None = None
    release: Callable[[], Awaitable[None]] | None = None


async def reply(
    dialect: Dialect,
    request: Request,
    ingested: Ingested,
    opened: Opened,
    chunks: AsyncIterator[dict[str, Any]],
    exchange: Exchange,
    lease: Lease,
    admission_wait_s: float = 0.0,
    admission: str = "off",
    unread: Callable[[], None] = lambda: None,
) -> Reply:
    """The reply; a streamed one takes ``lease`` with it. ``unread`` settles ``chunks`` if
    they are never read (idempotent; a no-op once they were read to their end)."""
    head = (
        ingested.session, opened.replica.url, ingested.raw_tokens, opened.tokens,
        admission_wait_s, admission,
    )  # fmt: skip
    if ingested.stream:
        frames = released(dialect.stream(broken_off_named(chunks), exchange), lease)

        async def after() -> None:
            unread()
            await lease.release()

        return Reply(*head, frames=frames, release=after)
    try:
        body = await unless_disconnected(request, dialect.response(chunks, exchange))
    except BaseException:
        unread()
        raise
    return Reply(*head, body=body)


async def broken_off_named(chunks: AsyncIterator[dict[str, Any]]) -> AsyncIterator[dict[str, Any]]:
    """The reply's chunks; an upstream failure after the status line is raised as the
    dialect error its stream ends with (dialects know nothing of the upstream client)."""
    try:
        async for chunk in chunks:
            yield chunk
    except UpstreamError as exc:
        raise upstream_broke_off(exc.status, exc.body) from exc


async def released(stream: AsyncIterator[bytes], lease: Lease) -> AsyncIterator[bytes]:
    """``stream``, giving the request's slot back when it ends (or the client leaves)."""
    try:
        async for frame in stream:
            yield frame
    finally:
        await lease.release()
