"""The replica pool: static URLs or a headless-service DNS name, probed in the background.

Every `probe_interval_s` the pool re-resolves DNS (when configured), then for each replica
GETs `/health` and, when healthy, scrapes `/metrics`. All HTTP goes through one shared
aiohttp session. A replica turns unhealthy after `failure_threshold` failed probes in a row,
or at once when the gateway reports a failed request; one good probe brings it back.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import Sequence
from types import TracebackType
from typing import Self
from urllib.parse import urlsplit

import aiohttp

from router.metrics import MetricsParseError, ReplicaMetrics, parse_vllm_metrics
from router.replica import Replica
from router.telemetry import REPLICA_HEALTHY

log = logging.getLogger(__name__)


def _normalize_url(url: str) -> str:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"replica URL must be http(s)://host[:port], got {url!r}")
    return url.rstrip("/")


class ReplicaPool:
    def __init__(
        self,
        urls: Sequence[str] = (),
        *,
        dns_name: str | None = None,
        port: int | None = None,
        scheme: str = "http",
        probe_interval_s: float = 2.0,
        timeout_s: float = 1.0,
        failure_threshold: int = 2,
    ) -> None:
        if bool(urls) == bool(dns_name):
            raise ValueError("ReplicaPool needs exactly one of: replica URLs, dns_name")
        if dns_name and port is None:
            raise ValueError("ReplicaPool with dns_name needs the replicas' port")
        if scheme not in ("http", "https"):
            raise ValueError(f"scheme must be http or https, got {scheme!r}")
        if probe_interval_s <= 0 or timeout_s <= 0:
            raise ValueError("probe_interval_s and timeout_s must be positive")
        if failure_threshold < 1:
            raise ValueError(f"failure_threshold must be >= 1, got {failure_threshold}")
        normalized = [_normalize_url(u) for u in urls]
        if len(set(normalized)) != len(normalized):
            raise ValueError(f"duplicate replica URLs in {list(urls)!r}")
        self._replicas: dict[str, Replica] = {u: Replica(u) for u in normalized}
        self._dns_name = dns_name
        self._port = port
        self._scheme = scheme
        self.probe_interval_s = probe_interval_s
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._failure_threshold = failure_threshold
        self._session: aiohttp.ClientSession | None = None
        self._task: asyncio.Task[None] | None = None

    @property
    def replicas(self) -> list[Replica]:
        return list(self._replicas.values())

    def healthy(self) -> list[Replica]:
        return [r for r in self._replicas.values() if r.healthy]

    def get(self, url: str) -> Replica | None:
        return self._replicas.get(url)

    async def start(self) -> None:
        """Probe once (so routing has health and load from the start), then keep probing."""
        if self._session is not None:
            raise RuntimeError("ReplicaPool already started")
        self._session = aiohttp.ClientSession(timeout=self._timeout)
        await self.probe_once()
        self._task = asyncio.create_task(self._probe_loop(), name="replica-pool-probe")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        if self._session is not None:
            await self._session.close()
            self._session = None
        for url in self._replicas:
            with contextlib.suppress(KeyError):
                REPLICA_HEALTHY.remove(url)

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    def report_failure(self, replica: Replica) -> None:
        """The gateway saw a connection error or 5xx: stop routing there until a probe passes."""
        replica.consecutive_failures += 1
        self._set_health(replica, False, "request failed")

    async def probe_once(self) -> None:
        """One round: refresh DNS membership, then probe every replica concurrently."""
        if self._session is None:
            raise RuntimeError("ReplicaPool.probe_once() before start()")
        if self._dns_name is not None:
            await self._refresh_dns()
        await asyncio.gather(*(self._probe(r) for r in self.replicas))

    async def _probe_loop(self) -> None:
        while True:
            await asyncio.sleep(self.probe_interval_s)
            try:
                await self.probe_once()
            except Exception:
                # A bug in one round must not silently end health checking for good.
                log.exception("replica probe round failed")

    async def _probe(self, replica: Replica) -> None:
        assert self._session is not None
        try:
            async with self._session.get(f"{replica.url}/health") as resp:
                await resp.read()
                ok, why = resp.status == 200, f"/health returned {resp.status}"
        except (aiohttp.ClientError, TimeoutError) as exc:
            ok, why = False, f"/health failed: {exc!r}"
        if not ok:
            replica.consecutive_failures += 1
            if replica.consecutive_failures >= self._failure_threshold:
                self._set_health(replica, False, why)
            return
        replica.consecutive_failures = 0
        self._set_health(replica, True, "/health ok")
        replica.metrics = await self._scrape(replica)

    async def _scrape(self, replica: Replica) -> ReplicaMetrics | None:
        assert self._session is not None
        try:
            async with self._session.get(f"{replica.url}/metrics") as resp:
                resp.raise_for_status()
                return parse_vllm_metrics(await resp.text())
        except (aiohttp.ClientError, TimeoutError, MetricsParseError) as exc:
            # Unknown load is better than a stale one; routing then sees only in-flight counts.
            log.warning("metrics scrape of %s failed: %r", replica.url, exc)
            return None

    def _set_health(self, replica: Replica, healthy: bool, why: str) -> None:
        if replica.healthy != healthy:
            log.info(
                "replica %s is now %s (%s)", replica.url, "healthy" if healthy else "down", why
            )
        replica.healthy = healthy
        REPLICA_HEALTHY.labels(replica=replica.url).set(1 if healthy else 0)

    async def _refresh_dns(self) -> None:
        assert self._dns_name is not None
        loop = asyncio.get_running_loop()
        try:
            infos = await loop.getaddrinfo(self._dns_name, self._port, type=socket.SOCK_STREAM)
        except OSError as exc:
            # Keep the last known members: a resolver hiccup must not empty the pool.
            log.warning(
                "resolving %s failed, keeping %d replicas: %r",
                self._dns_name,
                len(self._replicas),
                exc,
            )
            return
        urls = sorted({self._url_for(info[4][0]) for info in infos})
        for url in set(self._replicas) - set(urls):
            log.info("replica %s left DNS %s", url, self._dns_name)
            del self._replicas[url]
            with contextlib.suppress(KeyError):
                REPLICA_HEALTHY.remove(url)
        for url in urls:
            if url not in self._replicas:
                log.info("replica %s joined via DNS %s", url, self._dns_name)
                self._replicas[url] = Replica(url)

    def _url_for(self, address: str) -> str:
        host = f"[{address}]" if ":" in address else address
        return f"{self._scheme}://{host}:{self._port}"
