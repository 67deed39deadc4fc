"""The HTTP surface: FastAPI routes over the pipeline, errors in each dialect's own shape.

No ``from __future__ import annotations`` here: Ray Serve's ingress resolves these route
signatures at run time.
"""

import asyncio
import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from functools import partial
from typing import Any

import orjson
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.background import BackgroundTask
from starlette.types import ASGIApp, Receive, Scope, Send

from gateway import metrics
from gateway.config import GatewayConfig
from gateway.dialects import DIALECTS
from gateway.dialects.base import Dialect, Exchange
from gateway.dialects.errors import DialectError, too_large, upstream_broke_off, upstream_refusal
from gateway.dialects.fields import within_depth
from gateway.disconnect import ClientGone, EventStream, unless_disconnected
from gateway.exposure import ReplicaLabels, header_value
from gateway.identity import UnknownApiKey, resolve_tenant
from gateway.pipeline import Pipeline
from gateway.quotas import Lease, QuotaExceeded
from gateway.sessions_api import sessions_router
from gateway.tenants import check_key_hashes, routing_policies
from gateway.upstream import UpstreamClient, UpstreamError
from router import NoHealthyReplica, ReplicaPool, get_preset, make_tenant_policy
from store import SessionTooLarge, StoreUnavailable, open_store

log = logging.getLogger("foldgate")

RETRY_AFTER_S = "2"
# Request fields as a JSON object, for harnesses that can add headers but cannot set
# sampling fields in the body (Codex: ``http_headers`` in its provider config). The body's
# own fields win.
PARAMS_HEADER = "x-foldgate-params"
# Deeper JSON than any agent sends (tool schemas nest a few tens of levels): past it a
# body would reach recursion limits downstream (orjson writes at most 254 levels upstream).
MAX_JSON_DEPTH = 128


def create_app(config: GatewayConfig) -> FastAPI:
    """The gateway app; opens the store and starts the replica pool in its lifespan."""
    check_key_hashes(config.api_keys)
    state: dict[str, Any] = {}
    replicas = ReplicaLabels(config.cache_salt_secret, config.debug)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
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
        pool = _make_pool(config)
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
        state["pipeline"] = app.state.pipeline = Pipeline(config, store, pool, policy, upstream)
        try:
            yield
        finally:
            await state["pipeline"].drain()
            await upstream.close()
            await pool.close()
            await store.close()

    app = FastAPI(title="foldgate", lifespan=lifespan, docs_url=None, redoc_url=None)

    async def handle(dialect: Dialect, request: Request) -> Response:
        try:
            return await answer(dialect, request)
        except Exception:  # a bug: the client still gets its dialect's error shape
            request_id = uuid.uuid4().hex
            log.exception("unexpected error on %s (request %s)", dialect.path, request_id)
            err = DialectError(
                f"internal error (request id {request_id})", status=500, kind="api_error"
            )
            return JSONResponse(
                dialect.error_body(err), status_code=500, headers={"x-request-id": request_id}
            )

    async def answer(dialect: Dialect, request: Request) -> Response:
        received = time.perf_counter()
        pipeline: Pipeline = state["pipeline"]
        strategy = request.headers.get(config.strategy_header) or config.strategy
        status = "error"
        lease: Lease | None = None

        def error(err: DialectError, headers: Mapping[str, str] | None = None) -> Response:
            return JSONResponse(dialect.error_body(err), status_code=err.status, headers=headers)

        try:
            # Who is asking, and whether the tenant may ask now, before the body is read.
            tenant = resolve_tenant(request.headers, config)
            lease = await pipeline.quotas.admit(tenant)
            body = _with_header_params(
                await _read_json(request, config.max_body_bytes, config.body_timeout_s),
                request.headers,
            )
            decoded = await pipeline.decode(dialect, body, request.headers)
            prepared = await pipeline.prepare(decoded, body, request.headers)
            prepared.received = received
            strategy = prepared.strategy
            replica, rendered_tokens, chunks = await unless_disconnected(
                request, pipeline.run(prepared)
            )
            headers = {
                "x-foldgate-session": header_value(prepared.session),
                "x-foldgate-replica": replicas.label(replica.url),
                "x-foldgate-prompt-tokens-raw": str(prepared.raw_tokens),
                "x-foldgate-prompt-tokens-rendered": str(rendered_tokens),
            }
            exchange = Exchange(body, remember=partial(pipeline.remember_reply, prepared))
            status = "ok"
            if prepared.stream:
                # The slot comes back when the stream ends or is closed, or, for a client
                # gone before the first frame (the stream never starts), after the response.
                stream = _released(dialect.stream(_broken_off_named(chunks), exchange), lease)
                release, lease = BackgroundTask(lease.release), None
                return EventStream(
                    stream, media_type="text/event-stream", headers=headers, background=release
                )
            reply = await unless_disconnected(request, dialect.response(chunks, exchange))
            return JSONResponse(reply, headers=headers)
        except ClientGone:
            return Response(status_code=499)  # no one reads it: the client left
        except DialectError as exc:
            return error(exc)
        except UnknownApiKey as exc:
            return error(DialectError(str(exc), status=401, kind="authentication_error"))
        except QuotaExceeded as exc:
            return error(
                DialectError(
                    str(exc), status=429, kind="rate_limit_error", code="rate_limit_exceeded"
                ),
                headers={"retry-after": str(exc.retry_after_s)},
            )
        except SessionTooLarge as exc:
            return error(too_large(str(exc)))
        except StoreUnavailable as exc:
            log.warning("store unavailable: %s", exc)
            return error(
                DialectError(
                    "session store unavailable, retry", status=503, kind="overloaded_error"
                ),
                headers={"retry-after": RETRY_AFTER_S},
            )
        except NoHealthyReplica as exc:
            log.warning("no replica: %s", exc)  # names the replicas: for the log only
            return error(
                DialectError(
                    "no model server available, retry", status=503, kind="overloaded_error"
                ),
                headers={"retry-after": str(exc.retry_after_s)},  # the breakers' next trial
            )
        except UpstreamError as exc:
            log.warning("upstream refused: %s", exc)
            return error(upstream_refusal(exc.status, exc.body))
        finally:
            if lease is not None:
                await lease.release()
            metrics.REQUESTS.labels(dialect.name, metrics.strategy_label(strategy), status).inc()

    def route(dialect: Dialect) -> Callable[[Request], Awaitable[Response]]:
        async def serve(request: Request) -> Response:
            return await handle(dialect, request)

        return serve

    for dialect in DIALECTS:
        app.add_api_route(dialect.path, route(dialect), methods=["POST"], name=dialect.name)
    app.add_middleware(DialectEndpoints, routes={d.path: route(d) for d in DIALECTS})

    @app.get("/v1/models")
    async def models() -> Response:
        pipeline: Pipeline = state["pipeline"]
        data = await pipeline.models()
        return JSONResponse({"object": "list", "data": data})

    @app.get("/health")
    async def health() -> Response:
        pipeline: Pipeline = state["pipeline"]
        healthy = [replicas.label(r.url) for r in pipeline.pool.healthy()]
        body = {"status": "ok" if healthy else "degraded", "healthy_replicas": healthy}
        return JSONResponse(body, status_code=200 if healthy else 503)

    app.include_router(sessions_router(lambda: state["pipeline"], config, replicas.hide))

    @app.get("/metrics")
    async def prometheus() -> Response:
        return Response(generate_latest(), media_type=CONTENT_TYPE_LATEST)

    return app


class DialectEndpoints:
    """ASGI middleware: a POST to a dialect's endpoint is answered here, ahead of FastAPI's
    routing (matching every route, solving the endpoint's dependencies, an exit stack and
    an exception middleware per request), which adds nothing to these endpoints: they take
    the raw request and answer every error themselves. Everything else goes on to FastAPI,
    where the same routes stay registered (the OpenAPI schema lists them)."""

    def __init__(
        self, app: ASGIApp, routes: Mapping[str, Callable[[Request], Awaitable[Response]]]
    ) -> None:
        self.app = app
        self.routes = routes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        endpoint = self.routes.get(scope["path"]) if scope["type"] == "http" else None
        if endpoint is None or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        response = await endpoint(Request(scope, receive, send))
        await response(scope, receive, send)


def _with_header_params(body: dict[str, Any], headers: Mapping[str, str]) -> dict[str, Any]:
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
    return {**params, **body}


def _make_pool(config: GatewayConfig) -> ReplicaPool:
    probe = {
        "probe_interval_s": config.probe_interval_s,
        "breaker_failures": config.breaker_failures,
        "breaker_open_s": config.breaker_open_s,
        "breaker_max_open_s": config.breaker_max_open_s,
    }
    if config.replica_dns:
        host, _, port = config.replica_dns.rpartition(":")
        return ReplicaPool(dns_name=host, port=int(port), **probe)
    return ReplicaPool(config.replicas, **probe)


async def _broken_off_named(chunks: AsyncIterator[dict[str, Any]]) -> AsyncIterator[dict[str, Any]]:
    """The reply's chunks; an upstream failure after the status line is raised as the
    dialect error its stream ends with (dialects know nothing of the upstream client)."""
    try:
        async for chunk in chunks:
            yield chunk
    except UpstreamError as exc:
        raise upstream_broke_off(exc.status, exc.body) from exc


async def _released(stream: AsyncIterator[bytes], lease: Lease) -> AsyncIterator[bytes]:
    """``stream``, giving the request's slot back when it ends (or the client leaves)."""
    try:
        async for frame in stream:
            yield frame
    finally:
        await lease.release()


async def _read_json(request: Request, limit: int, timeout_s: float) -> dict[str, Any]:
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
    try:
        # orjson: a 128 KB history parses in half the time of the json module's.
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise DialectError(f"request body is not valid JSON: {exc}") from exc
    if not isinstance(body, dict):
        raise DialectError("request body must be a JSON object")
    if not within_depth(body, MAX_JSON_DEPTH):
        raise DialectError(f"request body is nested deeper than {MAX_JSON_DEPTH} levels")
    return body
