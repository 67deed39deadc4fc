"""uvicorn as ``foldgate serve`` runs it, with the limits a public endpoint needs.

uvicorn's own ``limit_concurrency`` counts every open connection with the requests in
flight and answers past it with a plain-text 503. A connection that sends a request line
and a header and then nothing costs its client nothing, so about a thousand of them,
without a key, took every slot from authenticated traffic for as long as the header
timeout held them. Here a connection takes a share of the gateway only for what it does:

- Requests in flight (headers complete) are bounded by ``max_concurrency``
  (``RequestLimit``); past it the 503 is in the endpoint's error shape, with
  ``retry-after``. Connections still sending their headers, or idle between two
  requests, do not count.
- A connection still sending a request's headers is closed after ``header_timeout_s``,
  and each peer address keeps at most ``header_connections_per_client`` of them
  (``HeaderPhase``): one more closes that peer's oldest, so a client flooding slow
  connections cannot lock its own complete requests out either (theirs pass the phase
  within a round trip). All peers together keep at most ``header_connections_total``
  connections waiting for a request's headers, idle keep-alive ones included: one more
  closes the oldest of all, so slow or idle connections from many addresses cannot take
  every file descriptor of the process either (then no connection at all was accepted,
  authenticated or not), while a complete request's connection, younger than the slow
  ones, passes the phase long before it would be the oldest.
- Idle keep-alive connections close after ``keep_alive_s`` (uvicorn's own timer), or
  earlier when the oldest of all connections waiting must go.

The body's own read timeout is the app's (``GatewayConfig.body_timeout_s``); an
unauthenticated request is answered before its body is read.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable

import uvicorn
from starlette.types import ASGIApp, Receive, Scope, Send
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from gateway.config import GatewayConfig
from gateway.dialects import DIALECTS
from gateway.dialects.openai_chat import openai_error_body
from gateway.http_errors import ErrorRule, error_response, fixed_retry_after


class Overloaded(Exception):
    """The gateway process already serves ``max_concurrency`` requests."""


OVERLOAD_ERRORS = {
    Overloaded: ErrorRule(
        503,
        "overloaded_error",
        message="the gateway is at its request limit, retry",
        retry_after=fixed_retry_after,
    )
}
# Each dialect's endpoint answers in its API's error shape; the rest in OpenAI's.
_ERROR_BODIES = {d.path: d.error_body for d in DIALECTS}


class RequestLimit:
    """ASGI middleware: at most ``max_requests`` HTTP requests in flight (a streamed reply
    until its last byte); one more is answered at once with ``Overloaded``'s 503."""

    def __init__(self, app: ASGIApp, max_requests: int) -> None:
        self.app = app
        self.max_requests = max_requests
        self.in_flight = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if self.in_flight >= self.max_requests:
            error_body = _ERROR_BODIES.get(scope["path"], openai_error_body)
            response = error_response(Overloaded(), error_body, table=OVERLOAD_ERRORS)
            await response(scope, receive, send)
            return
        self.in_flight += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self.in_flight -= 1


class HeaderPhase:
    """Connections waiting for a request's headers: still sending them (``enter``), at most
    ``per_client`` per peer address, or idle between two requests (``idle``); at most
    ``total`` of both, of all peers. Each returns the close callbacks of the connections it
    pushes out: that peer's oldest still sending, then the oldest of all."""

    def __init__(self, per_client: int, total: int) -> None:
        if per_client < 1:
            raise ValueError(f"header_connections_per_client must be >= 1, got {per_client}")
        if total < 1:
            raise ValueError(f"header_connections_total must be >= 1, got {total}")
        self.per_client = per_client
        self.total = total
        # every connection waiting, oldest first -> (its peer, its close, still sending?)
        self._all: dict[object, tuple[str, Callable[[], None], bool]] = {}
        # peer -> its connections still sending headers, oldest first
        self._sending: dict[str, dict[object, None]] = {}

    def enter(
        self, client: str, connection: object, close: Callable[[], None]
    ) -> list[Callable[[], None]]:
        """``connection`` started sending a request's headers."""
        self.leave(client, connection)
        self._all[connection] = (client, close, True)
        sending = self._sending.setdefault(client, {})
        sending[connection] = None
        pushed_out = []
        while len(sending) > self.per_client:
            pushed_out.append(self._drop(next(iter(sending))))
        return pushed_out + self._within_total()

    def idle(
        self, client: str, connection: object, close: Callable[[], None]
    ) -> list[Callable[[], None]]:
        """``connection`` answered its request and waits for the next one."""
        self.leave(client, connection)
        self._all[connection] = (client, close, False)
        return self._within_total()

    def leave(self, client: str, connection: object) -> None:
        """``connection`` is no longer waiting (headers complete, or closed)."""
        if connection in self._all:  # else pushed out before, or never in
            self._drop(connection)

    def waiting(self, client: str | None = None) -> int:
        """Connections of ``client`` still sending headers now; None: all connections
        waiting, of all peers."""
        return len(self._all) if client is None else len(self._sending.get(client, ()))

    def _within_total(self) -> list[Callable[[], None]]:
        return [self._drop(next(iter(self._all))) for _ in range(len(self._all) - self.total)]

    def _drop(self, connection: object) -> Callable[[], None]:
        client, close, sending = self._all.pop(connection)
        if sending:
            waiting = self._sending[client]
            del waiting[connection]
            if not waiting:
                del self._sending[client]
        return close


class TurnWrites:
    """A connection's transport whose writes made in one turn of the event loop go out as
    one, once the callbacks ready in that turn have run (``call_soon``): a streamed reply's
    status line, headers and the frames that were ready with them are one send instead of
    one each. uvicorn writes every ASGI message at once, ~7 sends for a short streamed
    reply, and on a node's loopback the sender's CPU pays the delivery too: ~10% of the
    requests per CPU-second at 16 sessions (bench/overhead.py). Nothing waits for a timer
    or a size: a frame that is the only one ready goes out in the turn it was written in.
    ``close`` writes what is pending first. Everything else is the transport's own."""

    __slots__ = ("_pending", "_transport")

    def __init__(self, transport: asyncio.Transport) -> None:
        self._transport = transport
        self._pending: list[bytes] = []

    def write(self, data: bytes) -> None:
        if not self._pending:
            asyncio.get_running_loop().call_soon(self.flush)
        self._pending.append(data)

    def flush(self) -> None:
        pending, self._pending = self._pending, []
        if pending and not self._transport.is_closing():
            self._transport.write(pending[0] if len(pending) == 1 else b"".join(pending))

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def __getattr__(self, name: str) -> object:
        return getattr(self._transport, name)


def gateway_protocol(header_timeout_s: float, phase: HeaderPhase) -> type[HttpToolsProtocol]:
    """uvicorn's HTTP/1.1 protocol, closing connections whose headers do not arrive within
    ``header_timeout_s`` or that ``phase`` pushes out (while sending headers or idle)."""

    class GatewayProtocol(HttpToolsProtocol):
        _header_timer: asyncio.TimerHandle | None = None

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(TurnWrites(transport))  # type: ignore[arg-type]
            self._await_headers()

        def on_message_begin(self) -> None:
            super().on_message_begin()
            # The first request's clock started with the connection; a keep-alive
            # connection's next request starts its own with its first byte.
            if self._header_timer is None:
                self._await_headers()

        def on_headers_complete(self) -> None:
            self._headers_done()
            super().on_headers_complete()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            # Kept alive for a next request (uvicorn armed its keep-alive timer).
            if not self.transport.is_closing() and self.timeout_keep_alive_task is not None:
                for pushed_out in phase.idle(self._peer(), self, self.transport.close):
                    pushed_out()

        def connection_lost(self, exc: Exception | None) -> None:
            self._headers_done()
            super().connection_lost(exc)

        def _peer(self) -> str:
            return self.client[0] if self.client else ""

        def _await_headers(self) -> None:
            close = self.transport.close
            self._header_timer = self.loop.call_later(header_timeout_s, close)
            for pushed_out in phase.enter(self._peer(), self, close):
                pushed_out()

        def _headers_done(self) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None
            phase.leave(self._peer(), self)

    return GatewayProtocol


def uvicorn_config(app: ASGIApp, config: GatewayConfig, host: str, port: int) -> uvicorn.Config:
    phase = HeaderPhase(config.header_connections_per_client, config.header_connections_total)
    return uvicorn.Config(
        RequestLimit(app, config.max_concurrency),
        host=host,
        port=port,
        http=gateway_protocol(config.header_timeout_s, phase),
        timeout_keep_alive=max(1, math.ceil(config.keep_alive_s)),
        log_level="warning",
        access_log=False,
    )
