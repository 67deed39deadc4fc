"""The Redis backend's connection: one pool per store, its scripts and its deadline."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any

import redis.asyncio as aioredis
import redis.exceptions as rexc
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from store.errors import StoreUnavailable
from store.redis.keys import RedisKeys

_UNAVAILABLE = (rexc.ConnectionError, rexc.TimeoutError, TimeoutError, OSError)


class RedisDatabase:
    """A client of one Redis (``client``), the key names (``keys``) and the session TTL."""

    def __init__(
        self, url: str, *, timeout_s: float, namespace: str, max_connections: int, ttl_s: float
    ) -> None:
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be positive, got {timeout_s}")
        self.timeout_s = timeout_s
        self.keys = RedisKeys(namespace)
        self.ttl_ms = max(1, int(ttl_s * 1000))
        self._where = url.split("@")[-1]  # never echo a password in errors
        # One immediate retry replaces a pooled connection that went stale (Redis restarted).
        # Every write is safe to repeat: ingest is idempotent, the CAS scripts recognise
        # their own earlier success, gateway turns carry a token. The overall deadline
        # (asyncio.timeout in ``guard``) still bounds the call.
        self.client = aioredis.Redis.from_url(
            url,
            socket_timeout=timeout_s,
            socket_connect_timeout=timeout_s,
            retry=Retry(NoBackoff(), 1),
            max_connections=max_connections,
        )
        self._scripts: dict[str, Any] = {}

    def script(self, source: str) -> Any:
        """The registered script of ``source`` (``store.redis.scripts``)."""
        if source not in self._scripts:
            self._scripts[source] = self.client.register_script(source)
        return self._scripts[source]

    async def run_scripts(
        self,
        calls: Sequence[tuple[str, Sequence[Any], Sequence[Any]]],
        then: Callable[[Any], Any] | None = None,
    ) -> list[Any]:
        """Scripts (``(source, keys, args)``), then what ``then`` adds to the pipeline, in
        one round trip. By digest (EVALSHA): redis-py's pipelined scripts would first ask
        ``SCRIPT EXISTS`` every time; a script Redis lacks (after a restart) is loaded and
        the round trip repeated, which every script here allows (none wrote anything)."""
        scripts = [(self.script(source), keys, args) for source, keys, args in calls]
        for _ in range(2):
            pipe = self.client.pipeline(transaction=False)
            for script, keys, args in scripts:
                pipe.evalsha(script.sha, len(keys), *keys, *args)
            if then is not None:
                then(pipe)
            replies = await pipe.execute(raise_on_error=False)
            if not any(isinstance(r, rexc.NoScriptError) for r in replies):
                for r in replies:
                    if isinstance(r, Exception):
                        raise r
                return replies
            for script, _, _ in scripts:
                await self.client.script_load(script.script)
        raise rexc.NoScriptError("scripts vanished again right after loading them")

    @asynccontextmanager
    async def guard(self) -> AsyncIterator[None]:
        """The call's deadline; a Redis that cannot be reached raises ``StoreUnavailable``."""
        try:
            async with asyncio.timeout(self.timeout_s):
                yield
        except _UNAVAILABLE as e:
            raise StoreUnavailable(f"redis at {self._where} is unavailable: {e!r}") from e

    async def close(self) -> None:
        await self.client.aclose()
