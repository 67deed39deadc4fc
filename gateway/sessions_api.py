"""The session endpoints (``/v1/sessions...``) and the inspector page (``/ui``).

A caller sees only its own tenant's sessions (the tenant comes from its API key, as for
every other request); someone else's session is as unknown as one that never existed: 404.
Errors take OpenAI's shape.

No ``from __future__ import annotations`` here: Ray Serve's ingress resolves these route
signatures at run time.
"""

import logging
from collections.abc import Awaitable, Callable
from importlib import resources
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from gateway import session_view
from gateway.config import GatewayConfig
from gateway.dialects.errors import DialectError
from gateway.dialects.openai_chat import openai_error_body
from gateway.fold.renderer import Renderer
from gateway.identity import UnknownApiKey, resolve_tenant
from gateway.pipeline import Pipeline
from store import NotFound, StoreUnavailable

log = logging.getLogger("foldgate")

RETRY_AFTER_S = "2"
UI_FILES = {"": ("index.html", "text/html"), "inspector.js": ("inspector.js", "text/javascript")}


def sessions_router(
    pipeline: Callable[[], Pipeline], config: GatewayConfig, shown: Callable[[Any], Any]
) -> APIRouter:
    """The routes; ``pipeline`` gives the app's pipeline once its lifespan started it;
    ``shown`` is what a client may see of a built answer (replica labels, not URLs)."""
    router = APIRouter()

    async def answer(
        request: Request, build: Callable[[str], Awaitable[dict[str, Any]]]
    ) -> Response:
        try:
            tenant = resolve_tenant(request.headers, config)
            return JSONResponse(shown(await build(tenant)))
        except UnknownApiKey as exc:
            return _error(DialectError(str(exc), status=401, kind="authentication_error"))
        except DialectError as exc:
            return _error(exc)
        except (NotFound, session_view.NoSuchRequest) as exc:
            return _error(DialectError(str(exc), status=404, kind="not_found_error"))
        except StoreUnavailable as exc:
            log.warning("store unavailable: %s", exc)
            return _error(
                DialectError("session store unavailable, retry", status=503, kind="api_error"),
                {"retry-after": RETRY_AFTER_S},
            )

    @router.get("/v1/sessions")
    async def list_sessions(request: Request) -> Response:
        async def build(tenant: str) -> dict[str, Any]:
            data = await session_view.summaries(pipeline().store, tenant)
            return {"object": "list", "data": data}

        return await answer(request, build)

    # Before the detail route: a session id may contain slashes (``:path``).
    @router.get("/v1/sessions/{session_id:path}/render")
    async def render(session_id: str, request: Request) -> Response:
        async def build(tenant: str) -> dict[str, Any]:
            number = _int_param(request, "request", required=True)
            branch = _int_param(request, "branch", required=False)
            p = pipeline()
            budget = p.tenants.settings(tenant).budget

            def renderer_for(strategy: str, fold: str) -> Renderer:
                return p.renderer(strategy, fold, budget)

            return await session_view.request_view(
                p.store, renderer_for, tenant, _known(session_id), number, branch
            )

        return await answer(request, build)

    @router.get("/v1/sessions/{session_id:path}")
    async def show(session_id: str, request: Request) -> Response:
        async def build(tenant: str) -> dict[str, Any]:
            branch = _int_param(request, "branch", required=False)
            return await session_view.detail(pipeline().store, tenant, _known(session_id), branch)

        return await answer(request, build)

    if config.ui:

        @router.get("/ui")
        @router.get("/ui/{name}")
        async def ui(name: str = "") -> Response:
            if name not in UI_FILES:
                return Response(status_code=404)
            filename, media_type = UI_FILES[name]
            body = resources.files("gateway").joinpath("ui", filename).read_bytes()
            return Response(body, media_type=media_type, headers={"cache-control": "no-cache"})

    return router


def _error(err: DialectError, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse(openai_error_body(err), status_code=err.status, headers=headers)


def _known(session_id: str) -> str:
    """A session id the store could hold; anything else names no session."""
    if not session_id or len(session_id) > 512 or "\x00" in session_id:
        raise NotFound(f"no session {session_id[:80]!r}")
    return session_id


def _int_param(request: Request, name: str, *, required: bool) -> int | None:
    """A non-negative integer query parameter (``request`` numbers start at 1)."""
    raw = request.query_params.get(name)
    if raw is None:
        if required:
            raise DialectError(f"the query parameter {name}=N is required", param=name)
        return None
    lowest = 1 if name == "request" else 0
    if not raw.isdigit() or int(raw) < lowest:
        raise DialectError(f"{name} must be an integer >= {lowest}, got {raw!r}", param=name)
    return int(raw)
