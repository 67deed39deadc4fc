"""uvicorn as ``foldgate serve`` runs it, with the limits a public endpoint needs.

uvicorn bounds idle keep-alive connections and concurrency itself, but not how long a
client may take to send a request's headers: a connection that sends half a request would
be held forever. The protocol here closes it after ``header_timeout_s``; the body's own
read timeout is the app's (``GatewayConfig.body_timeout_s``).
"""

from __future__ import annotations

import asyncio
import math

import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from gateway.config import GatewayConfig


def header_timeout_protocol(header_timeout_s: float) -> type[HttpToolsProtocol]:
    """uvicorn's HTTP/1.1 protocol, closing connections whose headers do not arrive in time."""

    class HeaderTimeoutProtocol(HttpToolsProtocol):
        _header_timer: asyncio.TimerHandle | None = None

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._arm()

        def on_message_begin(self) -> None:
            super().on_message_begin()
            self._arm()  # every request of a keep-alive connection

        def on_headers_complete(self) -> None:
            self._disarm()
            super().on_headers_complete()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

        def _arm(self) -> None:
            self._disarm()
            self._header_timer = self.loop.call_later(header_timeout_s, self.transport.close)

        def _disarm(self) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None

    return HeaderTimeoutProtocol


def uvicorn_config(app: object, config: GatewayConfig, host: str, port: int) -> uvicorn.Config:
    return uvicorn.Config(
        app,
        host=host,
        port=port,
        http=header_timeout_protocol(config.header_timeout_s),
        timeout_keep_alive=max(1, math.ceil(config.keep_alive_s)),
        limit_concurrency=config.max_concurrency,
        log_level="warning",
        access_log=False,
    )
