"""The replica pool: static URLs or a headless-service DNS name, probed in the background.

Every `probe_interval_s` the pool re-resolves DNS (when configured), then for each replica
GETs `/health` and, when healthy, scrapes `/metrics`. All HTTP goes through one shared
aiohttp session. A replica turns unhealthy after `failure_threshold` failed probes in a row;
one good probe brings it back. The outcomes of the gateway's requests, which failover
reports, go to each replica's circuit breaker (router/breaker.py): repeated failures take
the replica out, and half-open trial requests bring it back.

`healthy()`: replicas whose probes pass and whose breaker is not open (what the gateway
can serve with). `routable()`: those a new request may go to now (a half-open replica takes
one request at a time).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import socket
import time
from collections.abc import Callable, Sequence
from types import TracebackType
from typing import Self
from urllib.parse import urlsplit

import aiohttp

from router.breaker import BreakerState, CircuitBreaker
from router.metrics import MetricsParseError, ReplicaMetrics, parse_vllm_metrics
from router.replica import Replica
from router.telemetry import BREAKER_OPENED, BREAKER_STATE, REPLICA_HEALTHY

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
        breaker_failures: int = 3,
        breaker_open_s: float = 5.0,
        breaker_max_open_s: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
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
        self._breaker = (breaker_failures, breaker_open_s, breaker_max_open_s)
        CircuitBreaker(*self._breaker)  # refuse bad settings now, not at the first replica
        self._clock = clock
        self._replicas: dict[str, Replica] = {u: self._new_replica(u) for u in normalized}
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
        """Replicas whose probes pass and whose breaker is not open."""
        now = self._clock()
        return [
            r
            for r in self._replicas.values()
            if r.healthy and self._breaker_state(r, now) is not BreakerState.OPEN
        ]

    def routable(self) -> list[Replica]:
        """Healthy replicas a new request may go to now: a half-open breaker admits one
        request at a time. (Requests routed concurrently may both see it idle.)"""
        now = self._clock()
        return [r for r in self._replicas.values() if r.healthy and self._admits(r, now)]

    def retry_after_s(self) -> int:
        """When a request that found no routable replica may find one: the seconds until the
        earliest replica's breaker lets a trial through, or, for a replica its probes took
        out, until the next probe (at least 1; an admitting replica that is busy with a
        trial or was already tried: 1)."""
        now = self._clock()
        waits = [
            max(
                self._breaker_wait(r, now),
                0.0 if r.healthy else self.probe_interval_s,
            )
            for r in self._replicas.values()
        ]
        return max(1, math.ceil(min(waits, default=self.probe_interval_s)))

    def _breaker_wait(self, replica: Replica, now: float) -> float:
        before = replica.breaker.state
        wait = replica.breaker.open_for(now)
        self._breaker_changed(replica, before)
        return wait

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
            _remove_series(url)

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
        """A request failed at the replica's fault (connection error, 5xx, timeout)."""
        now = self._clock()
        before = self._breaker_state(replica, now)
        replica.breaker.record_failure(now)
        self._breaker_changed(replica, before)

    def report_success(self, replica: Replica) -> None:
        """The replica answered a request (a 4xx included: the request's fault)."""
        now = self._clock()
        before = self._breaker_state(replica, now)
        replica.breaker.record_success(now)
        replica.served_at = now
        self._breaker_changed(replica, before)

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
        since, replica.probed_at = replica.probed_at, self._clock()
        try:
            async with self._session.get(f"{replica.url}/health") as resp:
                await resp.read()
                ok, why = resp.status == 200, f"/health returned {resp.status}"
        except TimeoutError as exc:
            if since is not None and replica.served_at is not None and replica.served_at >= since:
                # The replica answered requests since the last round. The timeout is this
                # process's: with its event loop busy on CPU work (large histories, many
                # sessions) the reply waits behind it and the timer fires first; taking the
                # replica down for that turns a slow gateway into one that refuses all.
                log.info("replica %s: /health timed out but requests succeed", replica.url)
                return
            ok, why = False, f"/health failed: {exc!r}"
        except aiohttp.ClientError as exc:
            ok, why = False, f"/health failed: {exc!r}"
        if not ok:
            replica.failed_probes += 1
            if replica.failed_probes >= self._failure_threshold:
                self._set_health(replica, False, why)
            return
        replica.failed_probes = 0
        self._set_health(replica, True, "/health ok")
        self._breaker_state(replica, self._clock())  # a cool-down's end shows in the gauge
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

    def _admits(self, replica: Replica, now: float) -> bool:
        before = replica.breaker.state
        admits = replica.breaker.admits(now, busy=replica.in_flight > 0)
        self._breaker_changed(replica, before)
        return admits

    def _breaker_state(self, replica: Replica, now: float) -> BreakerState:
        before = replica.breaker.state
        state = replica.breaker.current(now)
        self._breaker_changed(replica, before)
        return state

    def _breaker_changed(self, replica: Replica, before: BreakerState) -> None:
        after = replica.breaker.state
        if after is before:
            return
        if after is BreakerState.OPEN:
            why = f"for {replica.breaker.cooldown_s:g} s: " + (
                "the trial request failed"
                if before is BreakerState.HALF_OPEN
                else f"{replica.breaker.failures} requests failed in a row"
            )
        elif after is BreakerState.HALF_OPEN:
            why = "cool-down over: one trial request at a time"
        else:
            why = "a trial request succeeded"
        log.warning("replica %s: circuit breaker %s (%s)", replica.url, after.name.lower(), why)
        BREAKER_STATE.labels(replica=replica.url).set(after)
        if after is BreakerState.OPEN:
            BREAKER_OPENED.labels(replica=replica.url).inc()

    def _new_replica(self, url: str) -> Replica:
        BREAKER_STATE.labels(replica=url).set(BreakerState.CLOSED)
        return Replica(url, breaker=CircuitBreaker(*self._breaker))

    def _set_health(self, replica: Replica, healthy: bool, why: str) -> None:
        if replica.healthy != healthy:
            # Down is a warning: it refuses requests, and a log at the default level must say why.
            level = logging.INFO if healthy else logging.WARNING
            log.log(
                level,
                "replica %s is now %s (%s)",
                replica.url,
                "healthy" if healthy else "down",
                why,
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
            _remove_series(url)
        for url in urls:
            if url not in self._replicas:
                log.info("replica %s joined via DNS %s", url, self._dns_name)
                self._replicas[url] = self._new_replica(url)

    def _url_for(self, address: str) -> str:
        host = f"[{address}]" if ":" in address else address
        return f"{self._scheme}://{host}:{self._port}"


def _remove_series(url: str) -> None:
    for series in (REPLICA_HEALTHY, BREAKER_STATE, BREAKER_OPENED):
        with contextlib.suppress(KeyError):
            series.remove(url)
