"""The HTTP surface: one route table over the pipeline, errors in each API's own shape.

Each dialect's endpoint has its handler (``DialectRoute``); what an exception is answered
with is one table (``gateway.http_errors``).

No ``from __future__ import annotations`` here: Ray Serve's ingress resolves these route
signatures at run time.
"""

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest
from starlette.background import BackgroundTask
from starlette.types import ASGIApp, Receive, Scope, Send

from gateway import metrics
from gateway.config import GatewayConfig
from gateway.dialects import DIALECTS
from gateway.dialects.base import Dialect
from gateway.disconnect import ClientGone, EventStream
from gateway.exposure import LabelledMetrics, ReplicaLabels, header_value
from gateway.http_errors import error_response
from gateway.open_files import AcceptErrorLog
from gateway.pipeline import Pipeline
from gateway.sessions_api import SessionEndpoints
from gateway.steps.reply import Reply
from gateway.tenants import check_key_hashes, routing_policies
from gateway.upstream import UpstreamClient
from router import ReplicaPool, get_preset, make_tenant_policy
from store import open_store

log = logging.getLogger("foldgate")

Endpoint = Callable[..., Awaitable[Response]]


class Gateway:
    """What the routes share: the pipeline (started by the app's lifespan) and what
    clients are shown of the replicas."""

    def __init__(self, config: GatewayConfig) -> None:
        self.config = config
        self.replicas = ReplicaLabels(config.cache_salt_secret, config.debug)
        self._pipeline: Pipeline | None = None

    @property
    def pipeline(self) -> Pipeline:
        assert self._pipeline is not None, "the app's lifespan starts the pipeline"
        return self._pipeline

    @asynccontextmanager
    async def lifespan(self, app: FastAPI) -> AsyncIterator[None]:
        """Open the store, start the replica pool and the pipeline; close them after."""
        config = self.config
        AcceptErrorLog.install(asyncio.get_running_loop())
        if not config.api_keys:
            log.warning(
                "no API keys configured: every client shares tenant %r (its sessions, "
                "quotas and the replicas' prefix cache)",
                config.default_tenant,
            )
        store = open_store(
            config.store_url,
            digest_cache_bytes=config.digest_cache_bytes,
            digest_cache_callbacks=metrics.cache_callbacks("store_digests"),
        )
        pool = make_pool(config)
        await pool.start()
        upstream = UpstreamClient(
            config.connect_timeout_s, config.upstream_timeout_s, config.upstream_idle_timeout_s
        )
        policy = make_tenant_policy(
            *routing_policies(config.tenants, config.policy),
            assignments=store,
            ttl_s=config.assignment_ttl_s,
            rehome_margin=config.rehome_margin,
            cost=get_preset(config.cost_model),
        )
        # Also on app.state: in-process drivers (the fuzz suite) wait on its accounting.
        self._pipeline = app.state.pipeline = Pipeline(config, store, pool, policy, upstream)
        try:
            yield
        finally:
            await self._pipeline.drain()
            self._pipeline.offload.close()
            await upstream.close()
            await pool.close()
            await store.close()

    async def models(self) -> Response:
        data = await self.pipeline.models()
        return JSONResponse({"object": "list", "data": data})

    async def health(self) -> Response:
        healthy = [self.replicas.label(r.url) for r in self.pipeline.pool.healthy()]
        body = {"status": "ok" if healthy else "degraded", "healthy_replicas": healthy}
        return JSONResponse(body, status_code=200 if healthy else 503)

    async def prometheus(self) -> Response:
        """The metrics, replicas as clients are shown them: a scraper needs no key."""
        shown = LabelledMetrics(REGISTRY, self.replicas)
        return Response(generate_latest(shown), media_type=CONTENT_TYPE_LATEST)


class DialectRoute:
    """The handler of one dialect's endpoint: the pipeline's reply as a response, or the
    error it raised in the dialect's shape."""

    def __init__(self, dialect: Dialect, gateway: Gateway) -> None:
        self.dialect = dialect
        self.gateway = gateway

    async def handle(self, request: Request) -> Response:
        try:
            reply = await self.gateway.pipeline.serve(self.dialect, request)
        except ClientGone:
            return Response(status_code=499)  # no one reads it: the client left
        except Exception as exc:
            return error_response(exc, self.dialect.error_body, where=self.dialect.path)
        return self.response(reply)

    def response(self, reply: Reply) -> Response:
        headers = {
            "x-foldgate-session": header_value(reply.session),
            "x-foldgate-replica": self.gateway.replicas.label(reply.replica),
            "x-foldgate-prompt-tokens-raw": str(reply.raw_tokens),
            "x-foldgate-prompt-tokens-rendered": str(reply.rendered_tokens),
            "x-foldgate-admission-wait": f"{reply.admission_wait_s:.3f}",
            "x-foldgate-admission": reply.admission,
        }
        if reply.frames is not None:
            release = BackgroundTask(reply.release) if reply.release else None
            return EventStream(
                reply.frames, media_type="text/event-stream", headers=headers, background=release
            )
        return JSONResponse(reply.body, headers=headers)


def create_app(config: GatewayConfig) -> FastAPI:
    """The gateway app; opens the store and starts the replica pool in its lifespan."""
    check_key_hashes(config.api_keys)
    gateway = Gateway(config)
    app = FastAPI(title="foldgate", lifespan=gateway.lifespan, docs_url=None, redoc_url=None)
    dialect_routes = {d.path: DialectRoute(d, gateway).handle for d in DIALECTS}
    for path, methods, endpoint, name in routes(gateway, dialect_routes):
        app.add_api_route(path, endpoint, methods=methods, name=name)
    app.add_middleware(DialectEndpoints, routes=dialect_routes)
    return app


def routes(
    gateway: Gateway, dialect_routes: Mapping[str, Endpoint]
) -> list[tuple[str, list[str], Endpoint, str]]:
    """The route table: (path, methods, handler, name)."""
    sessions = SessionEndpoints(lambda: gateway.pipeline, gateway.config, gateway.replicas.hide)
    return [
        *((d.path, ["POST"], dialect_routes[d.path], d.name) for d in DIALECTS),
        ("/v1/models", ["GET"], gateway.models, "models"),
        ("/health", ["GET"], gateway.health, "health"),
        ("/metrics", ["GET"], gateway.prometheus, "prometheus"),
        *((path, ["GET"], handler, handler.__name__) for path, handler in sessions.routes()),
    ]


class DialectEndpoints:
    """ASGI middleware: a POST to a dialect's endpoint is answered here, ahead of FastAPI's
    routing (matching every route, solving the endpoint's dependencies, an exit stack and
    an exception middleware per request), which adds nothing to these endpoints: they take
    the raw request and answer every error themselves. Everything else goes on to FastAPI,
    where the same routes stay registered (the OpenAPI schema lists them)."""

    def __init__(self, app: ASGIApp, routes: Mapping[str, Endpoint]) -> None:
        self.app = app
        self.routes = routes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        endpoint = self.routes.get(scope["path"]) if scope["type"] == "http" else None
        if endpoint is None or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        response = await endpoint(Request(scope, receive, send))
        await response(scope, receive, send)


def make_pool(config: GatewayConfig) -> ReplicaPool:
    """The replica pool: the configured URLs, or a DNS name's A records."""
    probe: dict[str, Any] = {
        "probe_interval_s": config.probe_interval_s,
        "breaker_failures": config.breaker_failures,
        "breaker_open_s": config.breaker_open_s,
        "breaker_max_open_s": config.breaker_max_open_s,
    }
    if config.replica_dns:
        host, _, port = config.replica_dns.rpartition(":")
        return ReplicaPool(dns_name=host, port=int(port), **probe)
    return ReplicaPool(config.replicas, **probe)
